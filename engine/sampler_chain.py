"""The sampler chain: logits -> the target's effective next-token distribution p.

PLACEHOLDER (being completed): bias -> penalties -> top-k/top-p/min-p -> temperature.
The public surface below is the contract the rest of the engine uses.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from .random_keys import position_key
from .sampling_params import SamplerParams


class SamplerChain:
    """Builds p for one request. Row ``i`` of a block of logits sees the history
    ``history + appended[:i]`` (the sequence as it would be had the earlier rows' tokens been
    emitted), which is how a verify round evaluates drafted positions."""

    def __init__(self, params: SamplerParams, *, vocab_size: int, eos_token_ids=(), tokenizer=None):
        self.params = params
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.tokenizer = tokenizer

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    def adjusted_logits(self, logits: mx.array, history: Sequence[int], appended: Sequence[int] = ()) -> mx.array:
        """Logits after token bias and penalties, shape ``[N, V]`` float32."""
        logits = logits.astype(mx.float32)
        bias = dict(self.params.logit_bias)
        if self.params.ignore_eos:
            for t in self.eos_token_ids:
                bias[t] = float("-inf")
        if bias:
            ids = mx.array(list(bias.keys()))
            vals = mx.array(list(bias.values()), dtype=mx.float32)
            logits = logits.at[:, ids].add(vals)
        return logits

    def distribution(self, logits: mx.array, history: Sequence[int], appended: Sequence[int] = (),
                     seed: int = 0, first_position: int = 0) -> mx.array:
        """The effective distribution p, shape ``[N, V]`` float32 (rows sum to 1)."""
        p = self.params
        x = self.adjusted_logits(logits, history, appended)
        if p.top_k > 0 and p.top_k < x.shape[-1]:
            kth = mx.sort(x, axis=-1)[:, -p.top_k][:, None]
            x = mx.where(x < kth, float("-inf"), x)
        x = x / max(p.temperature, 1e-6)
        return mx.softmax(x, axis=-1)

    def select(self, logits: mx.array, history: Sequence[int], appended: Sequence[int] = (),
               seed: int = 0, first_position: int = 0) -> list[int]:
        """One token per row: argmax when greedy, else a draw from p with the key of the row's
        absolute position (``first_position + i``)."""
        if self.greedy:
            return self.adjusted_logits(logits, history, appended).argmax(axis=-1).tolist()
        probs = self.distribution(logits, history, appended, seed, first_position)
        return [sample(probs[i], position_key(seed, first_position + i)) for i in range(probs.shape[0])]


def sample(probs: mx.array, key: mx.array) -> int:
    """Draw one token from a probability row with an explicit key."""
    return int(mx.random.categorical(mx.log(probs), key=key).item())
