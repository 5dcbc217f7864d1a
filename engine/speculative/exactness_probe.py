"""Is scoring a block of ``w`` tokens in one forward bit-identical to ``w`` one-token forwards?

A verify round scores ``[pending, d_0, ..., d_{k-1}]`` in one forward of width ``w = k + 1``,
while plain decoding scores one token at a time. Mathematically the rows are the same; in
floating point they need not be: the width selects different matmul kernels, reduction orders
and attention masks (on this project's CPU build, f32 with OpenBLAS, widths 3 and up already
differ in the last bits on the tiny test models; on a GPU with quantized weights the width picks
the quantized-matmul kernel). "Temperature 0 is exactly greedy target decoding" therefore holds
for a block path only where the two agree bitwise, and this module checks that before a
model-based round loop (DFlash, DSpark, Muse Glimmer assistant, MTP) scores blocks in one
forward.

The probe, per (model, width): on a few synthetic draws (seeded random contexts and blocks), run
the same context into two fresh caches, then the block in one forward into one and token by
token into the other, and compare the logits bitwise. When the target has sliding-window
(rotating) caches the first draw's context is longer than the largest window, so the comparison
covers the wrapped-window case too (the other draws stay short: a probe runs once per width, but
on a 2048-token window every long draw is two long prefills). On a cache with recurrent layers
the block forward goes through the ``cache.recurrent.StateTape`` recording a verify round uses.
The verdict is memoized per (model, width); a failing verdict is logged once, and the round loop
then verifies drafted blocks token by token ("chain decoding"), which is exact by construction.

``MLXCEL_EXACTNESS_PROBE`` injects a verdict instead (for tests and measurement): ``auto``
(default: run the probe), ``pass`` (treat every width as exact: block verify), ``fail`` (treat
every width as inexact: chain verify).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

from mlxcel.engine.cache.batch import DecodeBatch
from mlxcel.engine.cache.ragged import RaggedBatch, StepPlan
from mlxcel.engine.cache.recurrent import StateTape
from mlxcel.engine.speculative.switches import PROBE_ENV, probe_mode

log = logging.getLogger(__name__)

PROBE_DRAWS = 3
_BASE_CONTEXT = 11  # context length of the first draw when no window has to be passed


@dataclass(frozen=True)
class ProbeVerdict:
    width: int
    exact: bool
    max_abs_diff: float  # the largest |block - chain| logit difference seen (0.0 when exact)
    draws: int
    source: str  # "probe" or "env"

    def describe(self) -> str:
        if self.source == "env":
            return f"width {self.width}: {'block' if self.exact else 'chain'} verify forced by {PROBE_ENV}"
        if self.exact:
            return f"width {self.width}: a block forward equals one-token forwards bitwise ({self.draws} draws)"
        return (f"width {self.width}: a block forward differs from one-token forwards (max |diff| "
                f"{self.max_abs_diff:.3g} over {self.draws} draws)")


_verdicts: dict[tuple[int, int], tuple[Any, ProbeVerdict]] = {}


def _window(cache: list[Any]) -> int:
    """The largest sliding window among the cache's layers (0 when none rotates)."""
    return max((int(c.max_size) for c in cache if isinstance(c, RotatingKVCache)), default=0)


def probe(model: Any, width: int, *, vocab_size: int, draws: int = PROBE_DRAWS,
          make_cache: Callable[[], list[Any]] | None = None, seed: int = 0) -> ProbeVerdict:
    """Run the comparison now (no memo) and return the verdict."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    make_cache = make_cache or (lambda: make_prompt_cache(model))
    window = _window(make_cache())
    worst = 0.0
    exact = True
    for draw in range(draws):
        n_ctx = window + 3 if (window and draw == 0) else _BASE_CONTEXT + 5 * draw
        key = mx.random.key(seed * 1009 + draw * 7919 + width)
        tokens = mx.random.randint(0, vocab_size, (n_ctx + width,), key=key).tolist()
        context, block = tokens[:n_ctx], tokens[n_ctx:]
        one, chain = make_cache(), make_cache()
        model(mx.array([context]), cache=one)
        model(mx.array([context]), cache=chain)
        tape = StateTape.for_cache(model, one)  # verify rounds forward a block this way on recurrent layers
        with tape.recording() if tape is not None else nullcontext():
            together = model(mx.array([block]), cache=one)[0]
        apart = mx.concatenate([model(mx.array([[t]]), cache=chain)[0] for t in block], axis=0)
        same = bool(mx.array_equal(together, apart).item())
        if not same:
            exact = False
            worst = max(worst, float(mx.abs(together.astype(mx.float32) - apart.astype(mx.float32)).max().item()))
    return ProbeVerdict(width, exact, worst, draws, "probe")


def block_verdict(model: Any, width: int, *, vocab_size: int, make_cache: Callable[[], list[Any]] | None = None,
                  environ: Mapping[str, str] | None = None, quiet: bool = False) -> ProbeVerdict:
    """The memoized verdict for (``model``, ``width``); the first failing verdict per pair is
    logged (a warning: this path verifies token by token from now on) unless ``quiet`` (the caller
    reports it)."""
    mode = probe_mode(environ)
    if mode != "auto":
        return ProbeVerdict(width, mode == "pass", 0.0, 0, "env")
    key = (id(model), int(width))
    hit = _verdicts.get(key)
    if hit is not None and hit[0] is model:
        return hit[1]
    verdict = probe(model, width, vocab_size=vocab_size, make_cache=make_cache)
    _verdicts[key] = (model, verdict)  # the model is held so its id cannot be reused
    if quiet:
        return verdict
    if verdict.exact:
        log.info("Exactness probe: %s; drafted blocks are verified in one forward", verdict.describe())
    else:
        log.warning("Exactness probe: %s; falling back to chain decoding (drafted tokens verified one "
                    "forward at a time, exactly as plain decoding scores them)", verdict.describe())
    return verdict


def forget(model: Any | None = None) -> None:
    """Drop memoized verdicts (of one model, or all)."""
    for key in [k for k, (m, _) in _verdicts.items() if model is None or m is model]:
        del _verdicts[key]


def verify_widths(drafter: Any, n_max: int) -> list[int]:
    """Every verify width (rows: the pending token and the drafts) a probe-gated drafter can use with
    blocks of up to ``n_max`` drafts: a round near the end of a generation asks for fewer drafts, so
    every block from one draft up, and whatever else the drafter declares (``probe_widths``)."""
    widths = {k + 1 for k in range(1, max(1, n_max) + 1)}
    for k in range(1, max(1, n_max) + 1):
        widths.update(int(w) for w in drafter.probe_widths(k))
    return sorted(w for w in widths if w >= 2)


def probe_at_load(model: Any, drafter: Any, n_max: int, *, vocab_size: int,
                  environ: Mapping[str, str] | None = None) -> str:
    """Probe every width ``drafter`` can verify at (``verify_widths``) now, before any request, so
    no request's timings include a probe; return the one line that says what was found."""
    widths = verify_widths(drafter, n_max)
    verdicts = [block_verdict(model, w, vocab_size=vocab_size, environ=environ, quiet=True) for w in widths]
    block = [v.width for v in verdicts if v.exact]
    chain = [v.width for v in verdicts if not v.exact]
    if verdicts and verdicts[0].source == "env":
        how = f"forced by {PROBE_ENV}"
    else:
        worst = max((v.max_abs_diff for v in verdicts), default=0.0)
        how = f"{PROBE_DRAWS} draws per width" + (f", largest |block - chain| logit difference {worst:.3g}" if chain else "")
    return (f"Exactness probe at load for the {getattr(drafter, 'kind', 'model')} drafter, verify widths "
            f"{_ranges(widths)} ({how}): blocks verified in one forward at {_ranges(block) or 'none'}, "
            f"token by token (chain decoding) at {_ranges(chain) or 'none'}")


def _ranges(values: list[int]) -> str:
    out, run = [], []
    for v in sorted(values):
        if run and v == run[-1] + 1:
            run.append(v)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [v]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


# -- batch composition ------------------------------------------------------------------------------

_BATCH_CONTEXTS = (5, 12, 3)  # three rows of different lengths
_batch_verdicts: dict[int, tuple[Any, bool]] = {}


def batch_invariant(model: Any, *, vocab_size: int, ragged: bool,
                    make_cache: Callable[[], list[Any]] | None = None) -> bool:
    """Does a row get the same logits alone as beside other rows in one batched forward of the
    backend the server runs (``ragged``: the ragged batch, whose rows bring a pending token, a verify
    block or a prompt chunk; else mlx-lm's batch cache, one token a row)? Bitwise, every row of the
    batch against the same row alone, memoized per model. On mlxcel's fused CPU ops it holds by
    construction (tests/engine/platform/test_qmatmul.py); on float32 weights over OpenBLAS it does not
    (sgemm rounds a row by the matrix's height); on Metal and CUDA the kernels choose by shape."""
    hit = _batch_verdicts.get(id(model))
    if hit is not None and hit[0] is model:
        return hit[1]
    make_cache = make_cache or (lambda: make_prompt_cache(model))
    key = mx.random.key(4099)
    contexts = [mx.random.randint(0, vocab_size, (n,), key=mx.random.split(key, 3)[i]).tolist()
                for i, n in enumerate(_BATCH_CONTEXTS)]
    blocks = [c[-1:] + c[:3] for c in contexts] if ragged else [c[-1:] for c in contexts]
    blocks[1] = blocks[1][:1]  # widths 4, 1, 4: a verify block beside a decode step

    def forward(rows: list[int]) -> list[mx.array]:
        caches = {}
        for r in rows:
            caches[r] = make_cache()
            model(mx.array([contexts[r]]), cache=caches[r])
            mx.eval([c.state for c in caches[r]])
        if ragged:
            batch = RaggedBatch(model)
            for r in rows:
                batch.add(r, caches[r])
            plan = StepPlan()
            for r in rows:
                plan.add(r, blocks[r], batch.length(r))
            out = batch.forward(plan)
        else:
            batch = DecodeBatch(model)
            for r in rows:
                batch.add(r, caches[r])
            logits = batch.step([blocks[r][0] for r in rows])
            out = [logits[j][None] for j in range(len(rows))]
        mx.eval(out)
        return out

    together = forward([0, 1, 2])
    same = all(bool(mx.array_equal(forward([r])[0], together[r]).item()) for r in range(3))
    _batch_verdicts[id(model)] = (model, same)
    return same
