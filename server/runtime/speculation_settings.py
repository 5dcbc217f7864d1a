"""What the command line asks of speculation, resolved and checked without loading anything: the
drafter kind (``drafters.registry.choose``, as ``mlxcel generate`` resolves it; several n-gram types
combine), the block bounds and the n-gram drafters' options (``--spec-ngram-*``, ``-lcs`` / ``-lcd``).
A speculative command line that cannot work is refused here, at startup, in a fraction of a second;
``speculation.Speculation`` loads what this describes.

Each n-gram type drafts at most its own size, as upstream's: ngram-simple ``--spec-ngram-simple-size-m``
(default 32 here), map-k / map-k4v their ``-size-m`` (48), ngram-mod ``--spec-ngram-mod-n-max`` (64),
ngram-cache 8; a combination's block is the largest of its members'. ``--spec-draft-n-max`` sizes the
other kinds' blocks only, as upstream's does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from mlxcel.drafters.lookup.options import CACHE_BLOCK
from mlxcel.drafters.registry import (
    NGRAM_CACHE,
    NGRAM_MAP_K,
    NGRAM_MAP_K4V,
    NGRAM_MOD,
    PROMPT_LOOKUP,
    Choice,
    CombinedKind,
    DrafterChoiceError,
    DrafterKind,
    LookupOptions,
    choose,
    upstream_type,
)
from mlxcel.engine.speculative.switches import probe_mode, stochastic_accept_enabled
from mlxcel.server.runtime.config import ServerConfig

SpeculationError = DrafterChoiceError  # a speculative command line that cannot be honoured


@dataclass(frozen=True)
class SpeculationSettings:
    choice: Choice
    n_max: int | None  # None: the model-based drafter's own block (resolved when it loads)
    n_min: int = 0
    lookup: LookupOptions = LookupOptions(governed=True)
    synth_probs: tuple[float, ...] = ()  # benchmarking only: --spec-synth-len / --spec-synth-rates

    @property
    def kind(self) -> DrafterKind:
        return self.choice.kind

    @property
    def spec_type(self) -> str:
        """The upstream type name(s) this setup answers to (``speculative.types``)."""
        return upstream_type(self.kind)


def _switch(name: str, value: object, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "on", "true", "yes", "enabled"):
        return True
    if text in ("0", "off", "false", "no", "disabled"):
        return False
    raise SpeculationError(f"{name} {value!r}: expected on or off")


def resolve(config: ServerConfig) -> SpeculationSettings | None:
    """The speculative setup a parsed ``ServerConfig`` asks for; None for a plain server."""
    lookup = lookup_options(config)  # checked whatever the type, as upstream checks the flags when parsing
    types = [t.strip() for t in (config.spec_type or "").split(",") if t.strip()]
    choice = choose(spec_types=types, draft_kind=config.draft_kind, draft_model=config.draft_model,
                    draft_hf=config.draft_hf, spec_default=config.spec_default)
    if choice is None:
        return None
    kind = choice.kind
    n_min = config.spec_draft_n_min if config.spec_draft_n_min is not None else 0
    n_max = ngram_block(kind, lookup) if kind.combines else config.spec_draft_n_max
    if n_max is None:
        n_max = kind.default_block  # None for a model-based kind: the drafter's own
    if n_max is not None and n_max < 1:
        raise SpeculationError(f"the draft block must be at least 1 token (got {n_max})")
    if n_min < 0 or (n_max is not None and n_min > n_max):
        raise SpeculationError(f"--spec-draft-n-min must be between 0 and the block length {n_max} (got {n_min})")
    if NGRAM_CACHE in members(kind):
        _check_cache_files(lookup)
    stochastic_accept_enabled()  # a bad switch value fails at startup, not on the first request
    if kind.model_based:
        probe_mode()
    synth = synthetic_probs(config, kind, n_max)
    return SpeculationSettings(choice=choice, n_max=n_max, n_min=n_min, lookup=lookup, synth_probs=synth)


def members(kind: DrafterKind) -> tuple[DrafterKind, ...]:
    """The kinds a setup drafts with: a combination's members, else the kind itself."""
    return kind.members if isinstance(kind, CombinedKind) else (kind,)


def ngram_block(kind: DrafterKind, lookup: LookupOptions) -> int:
    """The block of an n-gram kind: its own size flag's (upstream's ``n_max`` per implementation), the
    largest of them for a combination."""
    blocks = {PROMPT_LOOKUP.name: PROMPT_LOOKUP.default_block if lookup.block is None else lookup.block, NGRAM_MAP_K.name: lookup.map_k.size_m,
              NGRAM_MAP_K4V.name: lookup.map_k4v.size_m, NGRAM_MOD.name: lookup.mod.n_max,
              NGRAM_CACHE.name: CACHE_BLOCK}
    return max(blocks.get(m.name, m.default_block or 0) for m in members(kind))


def lookup_options(config: ServerConfig) -> LookupOptions:
    """The n-gram drafters' options from the ``--spec-ngram-*`` and lookup-cache flags (upstream's
    defaults for those not given), refused as upstream refuses them."""
    size_n = config.spec_ngram_simple_size_n
    if size_n is not None and size_n < 1:
        raise SpeculationError(f"--spec-ngram-simple-size-n must be >= 1 (got {size_n})")
    base = LookupOptions(governed=True)
    lookup = replace(base, **_given(
        ngram_max=size_n, block=config.spec_ngram_simple_size_m,
        adaptive=_switch("--draft-adaptive", config.draft_adaptive, True),
        map_k=replace(base.map_k, **_given(size_n=config.spec_ngram_map_k_size_n, size_m=config.spec_ngram_map_k_size_m,
                                           min_hits=config.spec_ngram_map_k_min_hits)),
        map_k4v=replace(base.map_k4v, **_given(size_n=config.spec_ngram_map_k4v_size_n,
                                               size_m=config.spec_ngram_map_k4v_size_m,
                                               min_hits=config.spec_ngram_map_k4v_min_hits)),
        mod=replace(base.mod, **_given(n_match=config.spec_ngram_mod_n_match, n_min=config.spec_ngram_mod_n_min,
                                       n_max=config.spec_ngram_mod_n_max)),
        cache=replace(base.cache, static_path=config.lookup_cache_static,
                      dynamic_path=config.lookup_cache_dynamic)))
    why = lookup.map_k.check("map-k") or lookup.map_k4v.check("map-k4v") or lookup.mod.check()
    if why is not None:
        raise SpeculationError(why)
    return lookup


def _given(**values) -> dict:
    """The values that were given (not None)."""
    return {k: v for k, v in values.items() if v is not None}


def _check_cache_files(lookup: LookupOptions) -> None:
    """-lcs / -lcd must name readable files (upstream aborts when it cannot read one); their contents are
    read when ngram-cache loads."""
    for flag, path in (("-lcs/--lookup-cache-static", lookup.cache.static_path),
                       ("-lcd/--lookup-cache-dynamic", lookup.cache.dynamic_path)):
        if path and not Path(path).expanduser().is_file():
            raise SpeculationError(f"{flag} {path}: no such file (ngram-cache reads it at startup)")


def synthetic_probs(config: ServerConfig, kind: DrafterKind, n_max: int | None) -> tuple[float, ...]:
    """The per-position conditional acceptance probabilities of ``--spec-synth-len`` or
    ``--spec-synth-rates`` (benchmarking only), checked as upstream checks them: one rate per draft,
    each in [0, 1] and none above the one before; a mean length in [1, n_max + 1], turned into the
    geometric rates that give it."""
    length, text = config.spec_synth_len, config.spec_synth_rates
    if length is None and text is None:
        return ()
    if length is not None and text is not None:
        raise SpeculationError("synthetic acceptance length and rates are mutually exclusive")
    if kind.model_based or n_max is None:
        raise SpeculationError("synthetic acceptance runs with a draft model or the n-gram drafters, not on the "
                               f"{kind.loop} round loop")
    if text is not None:
        try:
            rates = [float(part) for part in text.split(",")]
        except ValueError:
            raise SpeculationError(f"--spec-synth-rates {text!r}: expected comma-separated numbers") from None
        if len(rates) != n_max:
            raise SpeculationError(f"synthetic acceptance rates must contain {n_max} values, got {len(rates)}")
        if any(not (0.0 <= r <= 1.0) for r in rates):
            raise SpeculationError("synthetic acceptance rates must be finite and within [0, 1]")
        if any(b > a for a, b in zip(rates, rates[1:])):
            raise SpeculationError("synthetic acceptance rates must be monotonically non-increasing")
    else:
        if not (1.0 <= length <= n_max + 1):
            raise SpeculationError(f"synthetic acceptance length must be finite and within [1, {n_max + 1}]")
        p = 1.0 if length == n_max + 1 else _geometric_rate(length - 1.0, n_max)
        rates = [p ** (i + 1) for i in range(n_max)]
    out, previous = [], 1.0
    for rate in rates:  # unconditional rates -> the chance of accepting a draft once those before it were
        out.append(rate / previous if previous > 0 else 0.0)
        previous = rate
    return tuple(out)


def _geometric_rate(mean_accepted: float, n: int) -> float:
    """The p with p + p^2 + ... + p^n == mean_accepted (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(48):
        mid = (lo + hi) / 2
        if sum(mid ** (j + 1) for j in range(n)) < mean_accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
