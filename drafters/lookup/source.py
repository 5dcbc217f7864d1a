"""The n-gram kinds' loaders (each kind's ``load`` in the registry): nothing to read from disk but the
optional ``-lcs`` / ``-lcd`` cache files, only each kind's parameters to fix (``request.lookup``, the
registry's ``LookupOptions``).

Prompt lookup: the command line's own runs draft with the declared class, which pauses after a block
with nothing accepted; the server's governed runs (``lookup.governed``) draft with
``governor.GovernedPromptLookupDrafter``, whose governor decides when a row proposes. The other kinds'
drafters keep state across a slot's requests (``slot_source``); ngram-mod's table is one for the whole
source, shared by every slot, as upstream shares it."""

from __future__ import annotations

from mlxcel.drafters.lookup import cache_file
from mlxcel.drafters.lookup.governor import GovernedPromptLookupDrafter
from mlxcel.drafters.lookup.ngram_cache import SharedCaches, SlotCounts
from mlxcel.drafters.lookup.ngram_mod import ModTable, SlotStreak
from mlxcel.drafters.lookup.options import CACHE_BLOCK
from mlxcel.drafters.lookup.slot_source import SlotStateSource
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
    block = request.default_block if lookup.block is None else lookup.block
    return DrafterSource(make, block, f"prompt-lookup (n-gram {lo}..{hi}, {how})")


def load_map(request: SourceRequest) -> DrafterSource:
    """ngram-map-k and ngram-map-k4v (the declared class says which): each slot keeps its keys' memory."""
    cls = request.drafter
    options = request.lookup.map_k4v if cls.counts_values else request.lookup.map_k
    return SlotStateSource(lambda n_min, ngram_max, memory: cls(options, memory, n_min=n_min), dict, options.size_m,
                           f"{cls.kind} (key {options.size_n} tokens, value up to {options.size_m}"
                           + (f", min hits {options.min_hits})" if cls.counts_values else ")"))


def load_mod(request: SourceRequest) -> DrafterSource:
    """ngram-mod: one table for the server, each slot its low-acceptance streak."""
    cls = request.drafter
    options = request.lookup.mod
    table = ModTable(options.n_match)
    return SlotStateSource(lambda n_min, ngram_max, streak: cls(table, options, streak, block_min=n_min), SlotStreak,
                           options.n_max,
                           f"ngram-mod (n-gram {options.n_match} tokens, drafts {options.n_min}..{options.n_max})")


def load_cache(request: SourceRequest) -> DrafterSource:
    """ngram-cache: each slot its context cache; the ``-lcd`` / ``-lcs`` files read once, shared."""
    cls = request.drafter
    options = request.lookup.cache
    shared = SharedCaches()
    files = []
    if options.dynamic_path:
        shared.dynamic = cache_file.load(options.dynamic_path)
        files.append(f"dynamic {options.dynamic_path}: {len(shared.dynamic)} n-grams")
    if options.static_path:
        shared.static = cache_file.load(options.static_path)
        files.append(f"static {options.static_path}: {len(shared.static)} n-grams")
    return SlotStateSource(lambda n_min, ngram_max, counts: cls(counts, shared, CACHE_BLOCK, n_min=n_min), SlotCounts,
                           CACHE_BLOCK,
                           "ngram-cache (per-slot context cache" + "".join(f"; {f}" for f in files) + ")")
