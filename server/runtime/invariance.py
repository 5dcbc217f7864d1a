"""Whether a request's tokens can depend on what runs beside it, checked once when the server starts,
and what the scheduler does where they could.

Two properties of the backend in use make every row's tokens its own whatever its neighbours are:

* **batch composition**: a row's logits in a batched forward are bitwise its logits alone
  (``exactness_probe.batch_invariant``, on the ragged batch or mlx-lm's batch cache, whichever
  the model's rows share). Where this fails, every row forwards alone on its own cache (the
  batch-invariant mode, ``MLXCEL_BATCH_INVARIANT``): plain rows, prompts and verify rounds alike;
* **block width**: a verify block scored in one forward is bitwise its tokens scored one by one
  (``exactness_probe.block_verdict``, at widths up to the drafter's block). The model-based
  drafters are gated by it already (``drafters.drafter_setup``); here prompt lookup, the n-gram
  family and the draft model are too. Where it fails, their rows verify alone, token by token.

Where either fails the draft cap is the request's own constant (no cost model: the cap would follow
the batch's width and the machine's timings, so the drafts, and with an inexact block forward the
tokens, would follow them too). On mlxcel's fused CPU ops both hold by construction; the probe is
what tells for MLX's kernels (Metal, CUDA, ``MLXCEL_KERNELS=mlx``) and for float32 weights over
OpenBLAS, whose sgemm rounds a row by the matrix's height.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mlxcel.drafters import prediction
from mlxcel.engine.platform.ragged_ops import runs_fused
from mlxcel.engine.platform.settings import settings
from mlxcel.engine.speculative.exactness_probe import batch_invariant, block_verdict

log = logging.getLogger(__name__)

PROBED_WIDTHS = (2, 3, 5, 9)  # verify widths probed for a token drafter (and its own block + 1)
PREDICTION_BLOCK = prediction.BLOCK  # the widest block a prediction drafts


@dataclass(frozen=True)
class Invariance:
    rows_alone: bool  # every row forwards alone (batch composition changes a row's bits, or asked for)
    chain_verify: bool  # token drafters verify alone, token by token (a block forward is not exact)

    @property
    def constant_caps(self) -> bool:
        return self.rows_alone or self.chain_verify


def check(loaded, *, n_slots: int, ragged: bool, speculation) -> Invariance:
    """The start-up check for a server of ``n_slots`` slots whose rows share ``ragged`` (the ragged
    batch) or mlx-lm's batch cache; logs one line saying what was found and what it means. A server
    without a drafter checks the block width when its first request with a prediction arrives
    (:func:`blocks_exact`); one whose drafter reads the target's hidden states is gated by its own
    probe."""
    mode = settings().batch_invariant
    if runs_fused(loaded.model):  # mlxcel's fused CPU ops: both hold by construction (their kernel tests)
        log.info("Batch invariance: the fused CPU ops give a row the same bits in any batch and at any width")
        return Invariance(mode == "on" and n_slots > 1, False)
    if n_slots <= 1 or mode == "off":
        alone = False
        found = "one slot" if n_slots <= 1 else "not checked (MLXCEL_BATCH_INVARIANT=off)"
    elif mode == "on":
        alone, found = True, "every row alone (MLXCEL_BATCH_INVARIANT=on)"
    else:
        same = _probe(lambda: batch_invariant(loaded.model, vocab_size=loaded.vocab_size, ragged=ragged,
                                              make_cache=loaded.make_cache))
        alone = not same
        found = ("a row's logits are the same beside other rows" if same
                 else "a row's logits change with the rows beside it: every row forwards alone")
    chain = False
    if speculation is not None and speculation.source is not None and not speculation.kind.model_based:
        chain = not blocks_exact(loaded, speculation.settings.n_max)
        found += ("; a verify block is not its tokens one by one: drafted rows verify alone, token by token"
                  if chain else "; a verify block scores as its tokens one by one")
    result = Invariance(alone, chain)
    caps = " (draft caps fixed per request)" if speculation is not None and result.constant_caps else ""
    log.info("Batch invariance: %s%s", found, caps)
    return result


def blocks_exact(loaded, n_max: int) -> bool:
    """Whether verify blocks of up to ``n_max`` drafts score as their tokens one by one (probed at a
    few widths and the largest; memoized per model and width by the probe)."""
    widths = sorted({*PROBED_WIDTHS, n_max + 1})
    return _probe(lambda: all(block_verdict(loaded.model, w, vocab_size=loaded.vocab_size,
                                            make_cache=loaded.make_cache, quiet=True).exact for w in widths))


def _probe(run) -> bool:
    """A probe's verdict; one the backend cannot run (a cache it cannot batch) leaves things as they
    were, with a warning."""
    try:
        return run()
    except Exception as exc:  # the probe's own forwards failed: nothing to learn from it
        log.warning("Batch invariance: the probe could not run (%s: %s); rows batch as before",
                    type(exc).__name__, exc)
        return True
