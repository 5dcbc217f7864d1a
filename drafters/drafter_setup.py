"""A chosen drafter kind made ready against its target, once, the same way for ``mlxcel generate``
and the server (each keeps only what is its own: the CLI its one session, the server its per-request
settings and the shared verify forward's cost model).

:func:`set_up` declines a target whose recurrent state a verify round cannot restore (nothing is
loaded then), loads the kind through its declared loader, caps the block at what a model-based
drafter proposes, and runs the block-versus-chain exactness probe for every verify width a
probe-gated drafter can use, so no request, and no generation figure, pays for it. What it found
comes back as lines for the caller to say its own way (the CLI on stderr, the server in its log).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxcel.drafters.loading import load
from mlxcel.drafters.registry import Choice, LookupOptions
from mlxcel.drafters.source import DrafterSource
from mlxcel.engine.cache.recurrent import unsupported_reason
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.speculative.exactness_probe import probe_at_load


@dataclass(frozen=True)
class DrafterSetup:
    """What :func:`set_up` made of a choice: a source of per-sequence drafters and the block, or why
    this target does not speculate at all."""

    source: DrafterSource | None  # None: declined
    n_max: int  # drafts per round: what was asked, at most what a model-based drafter proposes (0: declined)
    declined: str | None = None  # why the target cannot speculate (``cache.recurrent.unsupported_reason``)
    capped_from: int | None = None  # the block asked for, when the drafter proposes fewer (n_max is then its own)
    probe_line: str | None = None  # the exactness probe's verdict, for a probe-gated drafter


def set_up(choice: Choice, target: LoadedModel, *, n_max: int | None = None,
           lookup: LookupOptions = LookupOptions(), prefill_step: int = 512) -> DrafterSetup:
    """Ready ``choice`` against ``target``; ``n_max``: the block asked for (None: the kind's own, or what
    its model-based drafter declares)."""
    why = unsupported_reason(target.model, target.make_cache)
    if why is not None:
        return DrafterSetup(None, 0, declined=why)
    source = load(choice, target, lookup=lookup, prefill_step=prefill_step)
    block = source.declared_block if n_max is None else n_max
    capped_from = None
    if choice.kind.model_based and block > source.declared_block:
        capped_from, block = block, source.declared_block
    drafter = source.model_drafter
    probe_line = None
    if drafter is not None and drafter.probe_gated:
        probe_line = probe_at_load(target.model, drafter, block, vocab_size=target.vocab_size)
    return DrafterSetup(source, block, capped_from=capped_from, probe_line=probe_line)
