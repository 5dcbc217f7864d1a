"""Speculative decoding on ``mlxcel generate``: the flags, the drafter they choose, and the run.

The flags mirror the server's: ``-md``/``--draft-model``, ``--draft-kind`` and ``--spec-type``
choose a kind through ``drafters.registry.choose`` exactly as ``mlxcel-server`` does (``-md`` a
drafter-only checkpoint alone runs it on its round loop; an ordinary model drafts as a draft
model), so every kind the server runs runs here, on the same ``SpeculativeSession``, with the
same tokens for the same seed. ``--prompt-lookup`` is ``--draft-kind prompt-lookup``; its
n-gram bounds are ``--prompt-lookup-min/-max``. ``--num-draft-tokens`` (``--draft-max``,
``--spec-draft-n-max``) caps the block; its default is the kind's (``DrafterKind.default_block``,
or what a model-based drafter declares).

``generate`` hooks in three places: ``add_speculative_args(parser)`` when building its parser,
``check_speculative_args(parser, args)`` before it loads the target (so flags that cannot work
fail before any weights are read), and, once the target is loaded and the prompt encoded,
``run_speculative(args, loaded, prompt, params)`` when ``args.drafter`` is set.

After every speculative run the acceptance report goes to stdout, after the performance line:
``[Speculative acceptance] ...`` (or ``... declined: ...`` when a greedy-only drafter meets a
sampling request, which is then decoded plainly), with ``MLXCEL_SPECULATIVE_ACCEPT_DIAG=1`` the
diagnostic line, and for prompt lookup its own counters line.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from mlxcel.drafters.drafter_setup import set_up
from mlxcel.drafters.registry import (
    LOOKUP_NGRAM_MAX,
    LOOKUP_NGRAM_MIN,
    PROMPT_LOOKUP,
    Choice,
    LookupOptions,
    choose,
    kind_names,
)
from mlxcel.engine.decode.speculative import speculative_generate
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.sampling.grammar_matcher import GrammarMatcher
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.report import report_lines
from mlxcel.engine.speculative.session import PlainSteps, SpeculativeSession
from mlxcel.engine.speculative.switches import diagnostics_enabled, probe_mode, stochastic_accept_enabled
from mlxcel.server.cli.generate_output import TextOut, format_summary, max_new_tokens


def add_speculative_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("speculative decoding")
    group.add_argument("--draft-model", "-md", "--model-draft", dest="draft_model", metavar="PATH",
                       help="the drafter: a small model sharing the target's vocabulary (GGUF file or model "
                            "directory), or a DFlash / DSpark / Muse Glimmer / NextN MTP checkpoint directory "
                            "(recognised by structure)")
    group.add_argument("--draft-kind", metavar="KIND", help=f"the drafter kind ({kind_names()}); "
                       "default: what -md is, by structure")
    group.add_argument("--spec-type", metavar="TYPES", help="llama-server's speculative types (ngram-simple, "
                       "draft-simple, draft-dflash, draft-dspark, draft-mtp, ...), as mlxcel-server reads them")
    group.add_argument("--num-draft-tokens", "--draft-max", "--spec-draft-n-max", dest="num_draft_tokens", type=int,
                       default=None, metavar="K",
                       help="the most tokens drafted per verify round (default: the kind's block)")
    group.add_argument("--prompt-lookup", action="store_true",
                       help="draft by copying what followed the latest earlier occurrence of the last "
                            "n tokens in the prompt and output (no draft model); same as --draft-kind prompt-lookup")
    group.add_argument("--prompt-lookup-min", type=int, default=None, metavar="N",
                       help=f"shortest n-gram prompt lookup matches (default {LOOKUP_NGRAM_MIN})")
    group.add_argument("--prompt-lookup-max", type=int, default=None, metavar="N",
                       help=f"longest n-gram prompt lookup matches (default {LOOKUP_NGRAM_MAX})")
    return parser


def check_speculative_args(parser: argparse.ArgumentParser, args: argparse.Namespace,
                           err: TextIO | None = None) -> None:
    """Usage errors via ``parser.error``; flags that choose no workable drafter raise
    ``DrafterChoiceError`` (an ``MlxcelError``). Sets ``args.drafter`` to the registry's
    :class:`Choice` (None without speculation) and says on ``err`` what it resolved."""
    err = err or sys.stderr
    if args.draft_model and args.prompt_lookup:
        parser.error("--draft-model and --prompt-lookup are alternatives; pass one")
    if args.num_draft_tokens is not None and args.num_draft_tokens < 1:
        parser.error(f"--num-draft-tokens must be >= 1, got {args.num_draft_tokens}")
    lookup_flags = args.prompt_lookup_min is not None or args.prompt_lookup_max is not None
    lo = LOOKUP_NGRAM_MIN if args.prompt_lookup_min is None else args.prompt_lookup_min
    hi = max(LOOKUP_NGRAM_MAX, lo) if args.prompt_lookup_max is None else args.prompt_lookup_max
    args.prompt_lookup_min, args.prompt_lookup_max = lo, hi
    types = [t.strip() for t in (args.spec_type or "").split(",") if t.strip()]
    kind = "prompt-lookup" if args.prompt_lookup else args.draft_kind
    if args.prompt_lookup and args.draft_kind and args.draft_kind != "prompt-lookup":
        parser.error(f"--prompt-lookup and --draft-kind {args.draft_kind} are alternatives; pass one")
    choice = choose(spec_types=types, draft_kind=kind, draft_model=args.draft_model)
    args.drafter = choice
    if lookup_flags and (choice is None or choice.kind is not PROMPT_LOOKUP):
        parser.error("--prompt-lookup-min/--prompt-lookup-max only apply with --prompt-lookup")
    if choice is None:
        return
    if choice.kind is PROMPT_LOOKUP and not 1 <= lo <= hi:
        parser.error(f"prompt lookup needs 1 <= --prompt-lookup-min <= --prompt-lookup-max (got {lo}, {hi})")
    if getattr(args, "max_kv_size", None) is not None:
        parser.error("--max-kv-size cannot be combined with speculative decoding: a rotating cache "
                     "cannot rewind rejected drafts once its window has wrapped")
    stochastic_accept_enabled()  # a bad switch value fails before anything loads
    diagnostics_enabled()
    if choice.kind.model_based:
        probe_mode()
    for note in choice.notes:
        print(note, file=err)


def make_session(args: argparse.Namespace, target: LoadedModel, params: SamplerParams,
                 choice: Choice, grammar: GrammarMatcher | None = None, err: TextIO | None = None) -> SpeculativeSession:
    """Ready the chosen drafter against ``target`` (``drafters.drafter_setup``, as the server does) and
    open the run's session (constrained by ``grammar``, the run's matcher, when given): declined
    (decoded plainly, said so on the report line) when the target's recurrent state cannot be
    restored after a verify round; for a probe-gated drafter the exactness probe has run, before the
    prompt, for every width it can use (its one line goes to ``err``), so it is not in the generation
    figures."""
    lookup = LookupOptions(ngram_min=args.prompt_lookup_min, ngram_max=args.prompt_lookup_max)
    setup = set_up(choice, target, n_max=args.num_draft_tokens, lookup=lookup, prefill_step=args.prefill_step)
    if setup.declined is not None:
        return SpeculativeSession(PlainSteps(), params, n_max=0, kind=choice.kind.loop,
                                  declined="speculation needs the target's state restored after a verify round, "
                                           f"and {setup.declined}")
    if setup.probe_line is not None:
        print(setup.probe_line, file=err or sys.stderr)
    return SpeculativeSession(setup.source.new(), params, n_max=setup.n_max, diagnostics=diagnostics_enabled(),
                              kind=choice.kind.loop, grammar=grammar,
                              eos_ids=target.eos_token_ids)


def run_speculative(args: argparse.Namespace, loaded: LoadedModel, prompt: list[int], params: SamplerParams,
                    out: TextIO | None = None, grammar: GrammarMatcher | None = None) -> int:
    """Decode with the chosen drafter, streaming text to ``out``; then the performance line and
    the acceptance report."""
    out = out or sys.stdout
    session = make_session(args, loaded, params, args.drafter, grammar)
    text = TextOut(loaded.tokenizer, out, set() if params.ignore_eos else loaded.eos_token_ids)
    last = None
    for step in speculative_generate(loaded, session, prompt, max_tokens=max_new_tokens(args, loaded, len(prompt)),
                                     prefill_step=args.prefill_step):
        last = step
        text.add(step.tokens)
    text.close()
    if last is None:
        out.write(f"[Performance] prompt: {len(prompt)} tokens | generation: 0 tokens\n")
    else:
        out.write(format_summary(last) + "\n")
    for line in report_lines(session.counters, diagnostics=session.diagnostics, drafter=session.drafter,
                             declined=session.declined_because):
        out.write(line + "\n")
    out.flush()
    return 0
