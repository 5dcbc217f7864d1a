"""What the command line asks of speculation, resolved and checked without loading anything: the
drafter kind (``drafters.registry.choose``, as ``mlxcel generate`` resolves it), the block bounds
and prompt lookup's options. A speculative command line that cannot work is refused here, at
startup, in a fraction of a second; ``speculation.Speculation`` loads what this describes."""

from __future__ import annotations

from dataclasses import dataclass

from mlxcel.drafters.registry import (
    PROMPT_LOOKUP,
    Choice,
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
        """The upstream type name this setup answers to (``speculative.types``)."""
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
    types = [t.strip() for t in (config.spec_type or "").split(",") if t.strip()]
    choice = choose(spec_types=types, draft_kind=config.draft_kind, draft_model=config.draft_model,
                    draft_hf=config.draft_hf, spec_default=config.spec_default)
    if choice is None:
        return None
    kind = choice.kind
    n_min = config.spec_draft_n_min if config.spec_draft_n_min is not None else 0
    n_max = config.spec_ngram_simple_size_m if kind is PROMPT_LOOKUP else config.spec_draft_n_max
    if n_max is None:
        n_max = kind.default_block  # None for a model-based kind: the drafter's own
    if n_max is not None and n_max < 1:
        raise SpeculationError(f"the draft block must be at least 1 token (got {n_max})")
    if n_min < 0 or (n_max is not None and n_min > n_max):
        raise SpeculationError(f"--spec-draft-n-min must be between 0 and the block length {n_max} (got {n_min})")
    lookup = LookupOptions(governed=True, adaptive=_switch("--draft-adaptive", config.draft_adaptive, True))
    if config.spec_ngram_simple_size_n is not None:
        if config.spec_ngram_simple_size_n < 1:
            raise SpeculationError(f"--spec-ngram-simple-size-n must be >= 1 (got {config.spec_ngram_simple_size_n})")
        lookup = LookupOptions(ngram_max=config.spec_ngram_simple_size_n, governed=True, adaptive=lookup.adaptive)
    stochastic_accept_enabled()  # a bad switch value fails at startup, not on the first request
    if kind.model_based:
        probe_mode()
    synth = synthetic_probs(config, kind, n_max)
    return SpeculationSettings(choice=choice, n_max=n_max, n_min=n_min, lookup=lookup, synth_probs=synth)


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
        raise SpeculationError("synthetic acceptance runs with a draft model or prompt lookup, not on the "
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
