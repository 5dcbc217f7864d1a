"""Speculative decoding on ``mlxcel generate``: the flags and the run.

``generate_command`` hooks in three places: ``add_speculative_args(parser)`` when building its
parser, ``check_speculative_args(parser, args)`` before it loads the target (so a drafter-only
checkpoint or a ``--draft-kind`` is refused before any weights are read), and, once the target
is loaded and the prompt encoded, ``run_speculative(args, loaded, prompt, params)`` when
``speculative_requested(args)``.

After every speculative run the acceptance report goes to stdout, after the performance line:
``[Speculative acceptance] ...``, with ``MLXCEL_SPECULATIVE_ACCEPT_DIAG=1`` the diagnostic line,
and for prompt lookup its own counters line.
"""

from __future__ import annotations

import argparse
import sys

DEFAULT_NUM_DRAFT_TOKENS = 4
DEFAULT_LOOKUP_MIN = 1
DEFAULT_LOOKUP_MAX = 3
# Encoded by target and drafter alike when both come from one tokenizer family.
VOCAB_PROBE = "Speculative decoding: x = f(y) + 42; naïve café, 東京, emoji \U0001f600.\n\tdef g(): return None"


def add_speculative_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("speculative decoding")
    group.add_argument("--draft-model", "-md", "--model-draft", dest="draft_model", metavar="PATH",
                       help="a small model sharing the target's vocabulary (GGUF file or model directory) "
                            "that drafts tokens for the target to verify")
    group.add_argument("--num-draft-tokens", "--draft-max", dest="num_draft_tokens", type=int,
                       default=DEFAULT_NUM_DRAFT_TOKENS, metavar="K",
                       help=f"tokens drafted per verify round (default {DEFAULT_NUM_DRAFT_TOKENS})")
    group.add_argument("--draft-kind", metavar="KIND",
                       help="not available on generate (it runs the classic draft-model loop only); "
                            "kind-specific round loops run in mlxcel-server")
    group.add_argument("--prompt-lookup", action="store_true",
                       help="draft by copying what followed the latest earlier occurrence of the last "
                            "n tokens in the prompt and output (no draft model)")
    group.add_argument("--prompt-lookup-min", type=int, default=None, metavar="N",
                       help=f"shortest n-gram prompt lookup matches (default {DEFAULT_LOOKUP_MIN})")
    group.add_argument("--prompt-lookup-max", type=int, default=None, metavar="N",
                       help=f"longest n-gram prompt lookup matches (default {DEFAULT_LOOKUP_MAX})")
    return parser


def speculative_requested(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "draft_model", None) or getattr(args, "prompt_lookup", False))


def check_speculative_args(parser: argparse.ArgumentParser, args: argparse.Namespace, err=None) -> None:
    """Usage errors via ``parser.error``; a drafter-only checkpoint or an explicit ``--draft-kind``
    raises ``MlxcelError`` (in that order: the checkpoint's own refusal is the more useful one).
    Without ``--draft-kind``, prints the auto-detected drafter kind and the path that runs."""
    from mlxcel.drafters.registry import (
        auto_detected_kind_lines,
        detect_drafter_kind,
        explicit_kind_error,
        read_drafter_config,
        refuse_drafter_only_checkpoint,
    )

    err = err or sys.stderr
    if args.draft_model and args.prompt_lookup:
        parser.error("--draft-model and --prompt-lookup are alternatives; pass one")
    if args.num_draft_tokens < 1:
        parser.error(f"--num-draft-tokens must be >= 1, got {args.num_draft_tokens}")
    if not args.prompt_lookup and (args.prompt_lookup_min is not None or args.prompt_lookup_max is not None):
        parser.error("--prompt-lookup-min/--prompt-lookup-max only apply with --prompt-lookup")
    lo = DEFAULT_LOOKUP_MIN if args.prompt_lookup_min is None else args.prompt_lookup_min
    hi = max(DEFAULT_LOOKUP_MAX, lo) if args.prompt_lookup_max is None else args.prompt_lookup_max
    if args.prompt_lookup and not 1 <= lo <= hi:
        parser.error(f"prompt lookup needs 1 <= --prompt-lookup-min <= --prompt-lookup-max (got {lo}, {hi})")
    args.prompt_lookup_min, args.prompt_lookup_max = lo, hi

    if speculative_requested(args):  # a bad switch value fails before anything loads
        from mlxcel.engine.speculative.acceptance import stochastic_accept_enabled
        from mlxcel.engine.speculative.session import diagnostics_enabled

        stochastic_accept_enabled()
        diagnostics_enabled()
    config = read_drafter_config(args.draft_model) if args.draft_model else {}
    if args.draft_model:
        refuse_drafter_only_checkpoint(args.draft_model, config)
    if args.draft_kind:
        raise explicit_kind_error(args.draft_kind)
    if speculative_requested(args) and getattr(args, "max_kv_size", None) is not None:
        parser.error("--max-kv-size cannot be combined with speculative decoding: a rotating cache "
                     "cannot rewind rejected drafts once its window has wrapped")
    if args.draft_model:
        for line in auto_detected_kind_lines(detect_drafter_kind(config)):
            print(line, file=err)


def load_drafter(args: argparse.Namespace, target):
    """The drafter the flags ask for."""
    from mlxcel.drafters.draft_model import DraftModelDrafter
    from mlxcel.drafters.lookup.prompt_lookup import PromptLookupDrafter
    from mlxcel.engine.model.loading import load_model

    if args.prompt_lookup:
        return PromptLookupDrafter(args.prompt_lookup_min, args.prompt_lookup_max)
    draft = load_model(args.draft_model)
    check_same_vocabulary(target, draft)
    return DraftModelDrafter(draft, target_vocab_size=target.vocab_size, prefill_step=args.prefill_step)


def check_same_vocabulary(target, draft) -> None:
    """A draft model must tokenize like the target (its ids are verified as the target's ids)."""
    from mlxcel.engine.errors import ModelLoadError

    t_ids = list(target.tokenizer.encode(VOCAB_PROBE, add_special_tokens=False))
    d_ids = list(draft.tokenizer.encode(VOCAB_PROBE, add_special_tokens=False))
    if t_ids != d_ids:
        raise ModelLoadError(
            f"the draft model {draft.name} does not share the target's vocabulary (the same text encodes to "
            "different token ids); pick a drafter from the target's model family"
        )


def run_speculative(args: argparse.Namespace, loaded, prompt: list[int], params, out=None) -> int:
    """Decode with the requested drafter, streaming text to ``out``; then the performance line
    and the acceptance report."""
    from mlxcel.engine.speculative.report import report_lines
    from mlxcel.engine.speculative.session import SpeculativeCounters, diagnostics_enabled, speculative_generate

    from mlxcel.server.cli.generate import TextOut, format_summary, max_new_tokens

    out = out or sys.stdout
    drafter = load_drafter(args, loaded)
    diagnostics = diagnostics_enabled()
    counters = SpeculativeCounters(rule="")
    text = TextOut(loaded.tokenizer, out, set() if params.ignore_eos else loaded.eos_token_ids)
    last = None
    for step in speculative_generate(loaded, drafter, prompt, params,
                                     max_tokens=max_new_tokens(args, loaded, len(prompt)),
                                     num_draft_tokens=args.num_draft_tokens, counters=counters,
                                     diagnostics=diagnostics, prefill_step=args.prefill_step):
        last = step
        text.add(step.tokens)
    text.close()
    if last is None:
        out.write(f"[Performance] prompt: {len(prompt)} tokens | generation: 0 tokens\n")
    else:
        out.write(format_summary(last) + "\n")
    for line in report_lines(counters, diagnostics=diagnostics, drafter=drafter):
        out.write(line + "\n")
    out.flush()
    return 0
