"""Prefill: a sequence's tokens run through the target into its cache, the output head run for the
last position only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from mlxcel.engine.errors import PromptError

DEFAULT_PREFILL_STEP = 512


def prefill(model: Any, tokens: Sequence[int], cache: list[Any], step: int = DEFAULT_PREFILL_STEP) -> mx.array:
    """Run ``tokens`` through ``model``, extending ``cache``; return the last position's logits ``[V]``.

    All but the last token go in chunks of ``step`` whose logits are never evaluated (only the
    cache is), so the output head runs for one position only; then the last token alone. The
    returned logits are lazy: evaluate them (or a token picked from them) to finish."""
    if len(tokens) == 0:
        raise PromptError("nothing to prefill: the prompt is empty")
    step = max(1, int(step))
    head = list(tokens[:-1])
    for i in range(0, len(head), step):
        model(mx.array(head[i : i + step])[None], cache=cache)
        mx.eval([c.state for c in cache])
        mx.clear_cache()
    return model(mx.array(tokens[-1:])[None], cache=cache)[0, -1]
