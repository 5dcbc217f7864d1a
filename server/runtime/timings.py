"""The ``timings`` object of every completion response.

Nine base keys in upstream's order (``cache_n`` first). ``prompt_ms`` covers the time from the
request's arrival (queue wait included) to the end of its prefill; ``predicted_ms`` runs from the
end of prefill (the first token is sampled from the prefill logits) to the last token. Per-token and
per-second figures are derived as upstream derives them: the prompt rate over ``prompt_n`` tokens,
the generation rate over the ``predicted_n - 1`` tokens decoded after the first.

Speculative decoding appends ``draft_n``, ``draft_n_accepted``, ``draft_rounds`` and ``draft_kind``
— present only when a drafter ran at least one verify round; :func:`draft_timings` is the one place
that adds them, formatting the session's counters (the CLI's acceptance line formats the same
counters, ``engine.speculative.report``).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxcel.engine.speculative.session import SpeculativeCounters


def draft_timings(counters: SpeculativeCounters | None) -> dict:
    """The draft keys of ``timings`` for a session's counters (none before its first verify round)."""
    if counters is None or counters.rounds <= 0:
        return {}
    return {"draft_n": counters.proposed, "draft_n_accepted": counters.accepted,
            "draft_rounds": counters.rounds, "draft_kind": counters.kind}


@dataclass
class Timings:
    cache_n: int = 0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    draft: SpeculativeCounters | None = None

    def to_json(self) -> dict:
        # times to the microsecond, as upstream's clock gives them; the rates come from those very
        # figures, so a client recomputing a rate from the body gets the same number
        prompt_ms = round(self.prompt_ms, 3)
        predicted_ms = round(max(self.predicted_ms, 0.001), 3) if self.predicted_n else 0.0
        prompt_per_token = prompt_ms / self.prompt_n if self.prompt_n > 0 else 0.0
        decoded = self.predicted_n - 1
        predicted_per_token = predicted_ms / decoded if decoded > 0 else 0.0
        out = {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_per_token,
            "prompt_per_second": 1e3 / prompt_per_token if prompt_per_token > 0 else 0.0,
            "predicted_n": self.predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_per_token,
            "predicted_per_second": 1e3 / predicted_per_token if predicted_per_token > 0 else 0.0,
        }
        out.update(draft_timings(self.draft))
        return out
