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
    return SpeculationSettings(choice=choice, n_max=n_max, n_min=n_min, lookup=lookup)
