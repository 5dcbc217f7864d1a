"""``mlxcel generate``: load a model, decode from one prompt, stream the text to stdout, and end
with a one-line performance summary.

Extension points: ``add_arguments`` builds the flag set (speculative flags are added on top of
it), ``run`` decides which decode path serves the parsed arguments, and ``stream_plain`` is the
plain path that writes tokens as they come.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from mlxcel.engine.decode.plain import generate_tokens
from mlxcel.engine.errors import PromptError
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.grammar_matcher import GrammarMatcher, new_matcher
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.sampling.random_keys import resolve_seed
from mlxcel.server.cli.generate_distributed import add_distributed_args, load_generate_target
from mlxcel.server.cli.generate_grammar import add_grammar_args, read_grammar
from mlxcel.server.cli.generate_output import TextOut, format_summary, make_cache, max_new_tokens
from mlxcel.server.cli.generate_speculative import add_speculative_args, check_speculative_args, run_speculative
from mlxcel.server.cli.parser import CliArgumentParser

DEFAULT_N_PREDICT = 256

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The plain-generation flags (llama.cpp spellings where llama.cpp has one)."""
    model = parser.add_argument_group("model")
    model.add_argument("-m", "--model", help="GGUF file or MLX/Hugging Face model directory "
                       "(default: the built-in SmolLM2-135M-Instruct)")
    model.add_argument("--hf-repo", "-hfr", help="Hugging Face repo to load (from the local cache when offline)")
    model.add_argument("--hf-file", "-hff", help="file within --hf-repo (a GGUF); default: the whole snapshot")

    prompt = parser.add_argument_group("prompt")
    src = prompt.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", help="the prompt text")
    src.add_argument("-f", "--file", type=Path, help="read the prompt from a file")
    prompt.add_argument("--no-chat-template", action="store_true",
                        help="use the prompt as raw text instead of a user message in the model's chat template")

    gen = parser.add_argument_group("generation")
    gen.add_argument("-n", "--n-predict", type=int, default=DEFAULT_N_PREDICT,
                     help=f"tokens to generate (default {DEFAULT_N_PREDICT}; -1: until EOS or the context is full)")
    gen.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy (default 0.8)")
    gen.add_argument("--top-k", type=int, default=40, help="top-k (default 40; 0 = off)")
    gen.add_argument("--top-p", type=float, default=0.95, help="top-p (default 0.95; 1.0 = off)")
    gen.add_argument("--min-p", type=float, default=0.05, help="min-p (default 0.05; 0.0 = off)")
    gen.add_argument("--repeat-penalty", type=float, default=1.0, help="repetition penalty (default 1.0 = off)")
    gen.add_argument("--repeat-last-n", type=int, default=64,
                     help="tokens the repetition penalty looks back over (default 64; -1: whole context)")
    gen.add_argument("-s", "--seed", type=int, default=-1, help="random seed (default -1: a fresh one)")
    gen.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")
    gen.add_argument("--max-kv-size", type=int, default=None,
                     help="cap the KV cache at this many tokens (a rotating window); default: unbounded")
    gen.add_argument("--prefill-step", type=int, default=512, help="prompt tokens per prefill chunk (default 512)")
    return parser


def build_parser() -> CliArgumentParser:
    parser = add_arguments(CliArgumentParser(prog="mlxcel generate", description="Generate text from a prompt."))
    return add_distributed_args(add_speculative_args(add_grammar_args(parser)))


def validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Range checks argparse cannot express; each failure is a usage error."""
    if args.n_predict < -1:
        parser.error(f"--n-predict must be -1 or >= 0, got {args.n_predict}")
    if args.top_k < 0:
        parser.error(f"--top-k must be >= 0, got {args.top_k}")
    if not 0.0 <= args.top_p <= 1.0:
        parser.error(f"--top-p must be within [0, 1], got {args.top_p}")
    if not 0.0 <= args.min_p <= 1.0:
        parser.error(f"--min-p must be within [0, 1], got {args.min_p}")
    if args.repeat_penalty <= 0:
        parser.error(f"--repeat-penalty must be > 0, got {args.repeat_penalty}")
    if args.max_kv_size is not None and args.max_kv_size < 1:
        parser.error(f"--max-kv-size must be >= 1, got {args.max_kv_size}")
    if args.prefill_step < 1:
        parser.error(f"--prefill-step must be >= 1, got {args.prefill_step}")


def read_prompt(args: argparse.Namespace) -> str:
    if args.file is not None:
        try:
            text = args.file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PromptError(f"cannot read the prompt file {args.file}: {exc}") from exc
    elif args.prompt is not None:
        text = args.prompt
    else:
        raise PromptError("no prompt given; pass -p TEXT or -f FILE")
    if not text.strip():
        raise PromptError("the prompt is empty")
    return text


def encode_prompt(loaded, text: str, use_chat_template: bool = True) -> list[int]:
    """Token ids for ``text``: as a user message in the model's chat template when it has one
    (and ``use_chat_template``), else raw, with BOS prepended when the model wants it."""
    tokenizer = loaded.tokenizer
    if use_chat_template and loaded.chat_template:
        try:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], chat_template=loaded.chat_template,
                add_generation_prompt=True, tokenize=False,
            )
        except Exception as exc:  # a broken template in the checkpoint is bad input, not a crash
            raise PromptError(f"the model's chat template failed to render: {exc}") from exc
    tokens = list(tokenizer.encode(text, add_special_tokens=False))
    bos = loaded.bos_token_id
    if loaded.add_bos and bos is not None and (not tokens or tokens[0] != bos):
        tokens.insert(0, bos)
    if not tokens:
        raise PromptError("the prompt encodes to no tokens")
    return tokens


def sampler_params(args: argparse.Namespace):
    return SamplerParams(
        temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
        ignore_eos=args.ignore_eos, seed=resolve_seed(args.seed),
    )


def stream_plain(loaded, prompt: list[int], params, args: argparse.Namespace, out=None,
                 grammar: GrammarMatcher | None = None):
    """The plain decode path: write each token's text as it is generated; return the last
    ``DecodeStep`` (None when nothing was generated). ``grammar`` constrains it."""
    out = out or sys.stdout
    chain = SamplerChain(params, vocab_size=loaded.vocab_size, eos_token_ids=loaded.eos_token_ids,
                         tokenizer=loaded.tokenizer)
    text = TextOut(loaded.tokenizer, out, set() if params.ignore_eos else loaded.eos_token_ids)
    last = None
    for step in generate_tokens(loaded.model, prompt, chain, cache=make_cache(loaded, args),
                                max_tokens=max_new_tokens(args, loaded, len(prompt)), seed=params.seed,
                                prefill_step=args.prefill_step, grammar=grammar):
        last = step
        text.add([step.token])
    text.close()
    return last


def run(args: argparse.Namespace) -> int:
    """Load, encode, decode, summarise. Speculative paths branch from here."""
    text = read_prompt(args)  # before loading: a bad prompt fails fast
    start = time.perf_counter()
    loaded = load_generate_target(args, getattr(args, "argv", []))
    log.info("loaded %s (%s) from %s in %.2f s", loaded.name, loaded.source, loaded.path,
             time.perf_counter() - start)
    prompt = encode_prompt(loaded, text, use_chat_template=not args.no_chat_template)
    params = sampler_params(args)
    log.info("prompt: %d tokens; sampler: %s", len(prompt), params)
    spec = getattr(args, "grammar_spec", None)
    grammar = new_matcher(spec, loaded.tokenizer, loaded.vocab_size, loaded.eos_token_ids) if spec else None
    if args.drafter is not None:
        return run_speculative(args, loaded, prompt, params, grammar=grammar)
    last = stream_plain(loaded, prompt, params, args, grammar=grammar)
    if last is None:
        print(f"[Performance] prompt: {len(prompt)} tokens | generation: 0 tokens")
    else:
        print(format_summary(last))
    return 0


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv)
    validate(parser, args)
    args.grammar_spec = read_grammar(parser, args)
    check_speculative_args(parser, args)
    return run(args)
