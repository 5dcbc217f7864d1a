"""Per-request sampling parameters, with llama-server's defaults.

The defaults are the ones llama-server reports in ``generation_settings`` (checked against the
captures in ``shared/reference/llama-server``). ``SamplerChain`` reads these fields; the server
validates ranges before it builds one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_DRY_BREAKERS = ("\n", ":", '"', "*")


@dataclass
class SamplerParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    repeat_last_n: int = 64  # -1: the whole context; 0: disabled
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64  # -1: the whole context; 0: disabled
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_BREAKERS
    # token id -> additive bias; float("-inf") bans the token.
    logit_bias: dict[int, float] = field(default_factory=dict)
    ignore_eos: bool = False
    # The fewest candidates a filter (typical-p, top-p, min-p, XTC) may leave; 0 and 1 both
    # mean "at least one".
    min_keep: int = 0
    seed: int = -1  # -1: a fresh random seed per request

    @property
    def greedy(self) -> bool:
        """Argmax decoding: no distribution is built and no randomness is drawn."""
        return self.temperature <= 0.0 or self.top_k == 1
