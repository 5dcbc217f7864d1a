"""Token probabilities as upstream shapes them (``completion_probabilities`` on native bodies,
``logprobs.content`` on OpenAI ones)."""

from __future__ import annotations

from mlxcel.server.http.token_text import TokenText
from mlxcel.server.runtime.task import TokenProb


def probs_json(probs: list[TokenProb], text: TokenText, post_sampling: bool, top_n: int | None = None) -> list[dict]:
    value_key, top_key = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")

    def entry(token: int, value: float) -> dict:
        raw = text.token_bytes(token)
        return {"id": token, "token": raw.decode("utf-8", errors="replace"), "bytes": list(raw), value_key: value}

    out = []
    for p in probs:
        top = p.top if top_n is None else p.top[:top_n]
        item = entry(p.id, p.value)
        item[top_key] = [entry(t, v) for t, v in top]
        out.append(item)
    return out
