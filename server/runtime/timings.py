"""The ``timings`` object of every completion response.

Nine base keys in upstream's order (``cache_n`` first). ``prompt_ms`` covers the time from the
request's arrival (queue wait included) to the end of its prefill; ``predicted_ms`` runs from the
end of prefill (the first token is sampled from the prefill logits) to the last token. Per-token and
per-second figures are derived as upstream derives them: the prompt rate over ``prompt_n`` tokens,
the generation rate over the ``predicted_n - 1`` tokens decoded after the first.

Speculative decoding appends ``draft_n``, ``draft_n_accepted``, ``draft_rounds`` and ``draft_kind``
— present only when a drafter ran at least one verify round; :class:`DraftStats` is the one place
that adds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DraftStats:
    """What a drafter did for one request (filled by the speculative path)."""

    kind: str = ""
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0

    def to_json(self) -> dict:
        if self.rounds <= 0:
            return {}
        return {"draft_n": self.drafted, "draft_n_accepted": self.accepted,
                "draft_rounds": self.rounds, "draft_kind": self.kind}


@dataclass
class Timings:
    cache_n: int = 0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    draft: DraftStats = field(default_factory=DraftStats)

    def to_json(self) -> dict:
        prompt_per_token = self.prompt_ms / self.prompt_n if self.prompt_n > 0 else 0.0
        decoded = self.predicted_n - 1
        predicted_per_token = self.predicted_ms / decoded if decoded > 0 else 0.0
        out = {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": round(self.prompt_ms, 3),
            "prompt_per_token_ms": prompt_per_token,
            "prompt_per_second": 1e3 / prompt_per_token if prompt_per_token > 0 else 0.0,
            "predicted_n": self.predicted_n,
            "predicted_ms": round(max(self.predicted_ms, 0.001), 3) if self.predicted_n else 0.0,
            "predicted_per_token_ms": predicted_per_token,
            "predicted_per_second": 1e3 / predicted_per_token if predicted_per_token > 0 else 0.0,
        }
        out.update(self.draft.to_json())
        return out
