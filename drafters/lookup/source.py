"""Prompt lookup's loader (``registry.PROMPT_LOOKUP.load``): nothing to read from disk, only the
n-gram bounds to fix. The command line's own runs draft with the declared class, which pauses after
a block with nothing accepted; the server's governed runs (``lookup.governed``) draft with
``governor.GovernedPromptLookupDrafter``, whose governor decides when a row proposes."""

from __future__ import annotations

from mlxcel.drafters.lookup.governor import GovernedPromptLookupDrafter
from mlxcel.drafters.source import DrafterSource, SourceRequest
from mlxcel.engine.speculative.drafter import Drafter


def load_source(request: SourceRequest) -> DrafterSource:
    """A source of fresh prompt-lookup drafters with ``request.lookup``'s bounds (a request may lower the
    longest n-gram, never below the shortest)."""
    lookup = request.lookup
    lo, hi = lookup.ngram_min, max(lookup.ngram_min, lookup.ngram_max)
    if lookup.governed:
        def make(n_min: int, ngram_max: int | None) -> Drafter:
            return GovernedPromptLookupDrafter(lo, max(lo, ngram_max or hi), n_min=n_min, adaptive=lookup.adaptive)
        how = f"adaptive {'on' if lookup.adaptive else 'off'}"
    else:
        plain = request.drafter

        def make(n_min: int, ngram_max: int | None) -> Drafter:
            return plain(lo, max(lo, ngram_max or hi))
        how = "pauses after a block with nothing accepted"
    return DrafterSource(make, request.default_block, f"prompt-lookup (n-gram {lo}..{hi}, {how})")
