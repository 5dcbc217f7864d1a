"""The contract between a drafter kind's loader and everything above it.

A kind declares its loader once, on its ``registry.DrafterKind`` (``load = "module:function"``);
``loading.load`` calls it with a :class:`SourceRequest` and gets back either a
:class:`DrafterSource` (a kind that needs nothing of the target's network: prompt lookup, a draft
model) or, for a model-based kind, its network: a ``ModelDrafter``, not yet bound, which
``loading`` binds to the target the same way for every such kind.

This module sits below every kind's package and imports none of them, nor the registry, so a kind's
loader can import it without one kind reaching another (the ``drafter-kinds`` import contract).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.speculative.drafter import Drafter, ModelDrafter


class DrafterSource:
    """A loaded kind: makes one fresh drafter per sequence (:meth:`new`). ``declared_block`` is
    the kind's default block once loaded (a model-based drafter's is its checkpoint's)."""

    def __init__(self, make: Callable[[int, int | None], Drafter], declared_block: int, description: str,
                 model_drafter: ModelDrafter | None = None):
        self._make = make
        self.declared_block = declared_block
        self.description = description
        self.model_drafter = model_drafter  # the bound network every sequence's drafter shares

    def new(self, n_min: int = 0, ngram_max: int | None = None, slot: int | None = None) -> Drafter:
        """A drafter for one sequence; ``n_min`` lets a drafter retract blocks too short to verify, and
        ``ngram_max`` (prompt lookup only) overrides the longest n-gram it matches. ``slot``: the server
        slot the sequence runs in (None: a sequence of its own, as the CLI's); a kind whose drafters keep
        state across a slot's requests (the n-gram cache) overrides this to hand them that slot's state."""
        return self._make(n_min, ngram_max)


@dataclass(frozen=True)
class SourceRequest:
    """What a kind's loader is handed. ``drafter`` is the class the kind declares (a loader builds
    from it rather than naming it again); ``config`` is the ``-md`` checkpoint's config.json, read
    once by the loader's caller (``{}`` without one)."""

    drafter: type[Drafter]
    target: LoadedModel | None  # None only for a bare network loaded by tests and benchmarks
    draft_model: str | None = None  # -md
    draft_hf: str | None = None  # -hfd
    config: dict = field(default_factory=dict)
    default_block: int | None = None  # the kind's declared block (None: what a model-based drafter declares)
    target_vocab_size: int | None = None  # the target's vocabulary size (what ``target`` says, when given)
    prefill_step: int = 512
    lookup: Any = None  # prompt lookup's settings (``registry.LookupOptions``); other kinds ignore them

    @property
    def vocab_size(self) -> int | None:
        return self.target.vocab_size if self.target is not None else self.target_vocab_size
