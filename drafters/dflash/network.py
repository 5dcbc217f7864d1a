"""The DFlash-family drafter network: a few decoder layers that denoise a block of mask tokens in
one parallel forward, conditioned on the target's hidden states.

Shape of the computation (what the published DFlash, LFM2 DSpark and Muse Glimmer assistant
checkpoints describe; written here because neither mlx-lm nor mlx-vlm ships it as a library):

* The target's outputs at a few decoder layers (``target_layer_ids``), concatenated per token,
  go through ``fc`` (``len(ids) * H -> H``) and ``hidden_norm``: one *context* row per token the
  target has committed. Every layer attends to these rows through its own ``k_proj``/``v_proj``
  (and ``k_norm``), with RoPE at the tokens' absolute positions; they are kept in a per-layer
  context cache that only ever grows (a drafter never has to forget a committed token).
* The block (the pending token followed by mask tokens, embedded with the *target's* embedding
  table) runs through the layers as queries; its own keys and values are appended after the
  context for this forward only. Attention inside the block is bidirectional (non-causal): all
  block rows are scored at once. Sliding-attention layers see at most ``sliding_window - 1``
  context rows behind each query.
* The final ``norm`` gives hidden states that the *target's* LM head turns into logits.
* DSpark adds a low-rank Markov head: ``markov_w1`` (a ``[V, r]`` table) and ``markov_w2``
  (``r -> V``) add a bias that depends on the previous token, turning the parallel rows into a
  sequential greedy chain.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.qwen3 import MLP
from mlx_lm.models.rope_utils import initialize_rope


@dataclass(frozen=True)
class DFlashSpec:
    """Everything a DFlash-family config.json says about the network and its block."""

    family: str  # "dflash" | "dspark" | "muse-glimmer"
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    block_size: int
    layer_types: tuple[str, ...]
    sliding_window: int | None = None
    rope_traditional: bool = False
    rope_scaling: dict | None = None
    max_position_embeddings: int = 131072
    markov_rank: int = 0
    num_target_layers: int | None = None
    vocab_size: int | None = None

    @property
    def max_proposals(self) -> int:
        """Drafts one block can hold: DFlash/Muse spend row 0 on the pending token (block_size - 1
        proposals); a DSpark ``block_size`` counts proposals, every row is one."""
        return self.block_size if self.family == "dspark" else self.block_size - 1


class ContextCache:
    """One layer's context keys/values in temporal order (absolute positions ``offset - n ..
    offset``); ``keep`` caps how many are held (sliding layers)."""

    def __init__(self, keep: int | None = None):
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0  # context rows seen so far == absolute position of the next one
        self.keep = keep

    @property
    def held(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[2])

    def append(self, keys: mx.array, values: mx.array) -> None:
        n = keys.shape[2]
        if n == 0:
            return
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = mx.concatenate([self.keys, keys], axis=2)
            self.values = mx.concatenate([self.values, values], axis=2)
        self.offset += n
        if self.keep is not None and self.held > self.keep:
            self.keys = self.keys[..., -self.keep:, :]
            self.values = self.values[..., -self.keep:, :]

    @property
    def state(self):
        return [a for a in (self.keys, self.values) if a is not None]


class DraftAttention(nn.Module):
    def __init__(self, spec: DFlashSpec, sliding: bool):
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, d
        self.scale = d ** -0.5
        self.window = spec.sliding_window if sliding else None
        self.q_proj = nn.Linear(h, spec.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, spec.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, spec.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(spec.num_heads * d, h, bias=False)
        self.q_norm = nn.RMSNorm(d, eps=spec.rms_norm_eps)
        self.k_norm = nn.RMSNorm(d, eps=spec.rms_norm_eps)
        self.rope = initialize_rope(d, spec.rope_theta, spec.rope_traditional, spec.rope_scaling,
                                    spec.max_position_embeddings)

    def _heads(self, x: mx.array, n: int) -> mx.array:
        b, length, _ = x.shape
        return x.reshape(b, length, n, self.head_dim)

    def __call__(self, x: mx.array, ctx: mx.array, cache: ContextCache) -> mx.array:
        b, length, _ = x.shape
        # New context rows: keys/values at their absolute positions, kept for later rounds.
        ck = self.rope(self.k_norm(self._heads(self.k_proj(ctx), self.n_kv_heads)).transpose(0, 2, 1, 3),
                       offset=cache.offset)
        cv = self._heads(self.v_proj(ctx), self.n_kv_heads).transpose(0, 2, 1, 3)
        cache.append(ck, cv)
        start = cache.offset  # the block's first row (the pending token) sits right after the context
        q = self.rope(self.q_norm(self._heads(self.q_proj(x), self.n_heads)).transpose(0, 2, 1, 3), offset=start)
        bk = self.rope(self.k_norm(self._heads(self.k_proj(x), self.n_kv_heads)).transpose(0, 2, 1, 3),
                       offset=start)
        bv = self._heads(self.v_proj(x), self.n_kv_heads).transpose(0, 2, 1, 3)
        held = cache.held
        if held:
            keys = mx.concatenate([cache.keys, bk], axis=2)
            values = mx.concatenate([cache.values, bv], axis=2)
        else:
            keys, values = bk, bv
        mask = None
        if self.window is not None and held:
            # query i sits at start + i; context key j at start - held + j; the block is always visible
            query = start + mx.arange(length)[:, None]
            key_pos = start - held + mx.arange(held)[None]
            context_ok = (query - key_pos) < self.window
            mask = mx.concatenate([context_ok, mx.ones((length, length), dtype=mx.bool_)], axis=1)
        out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, length, -1))


class DraftLayer(nn.Module):
    def __init__(self, spec: DFlashSpec, sliding: bool):
        super().__init__()
        self.self_attn = DraftAttention(spec, sliding)
        self.mlp = MLP(spec.hidden_size, spec.intermediate_size)
        self.input_layernorm = nn.RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)

    def __call__(self, x: mx.array, ctx: mx.array, cache: ContextCache) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), ctx, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class MarkovHead(nn.Module):
    """DSpark's low-rank token-transition bias: ``markov_w2(markov_w1[previous token])``."""

    def __init__(self, vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)

    def __call__(self, previous: mx.array) -> mx.array:
        return self.markov_w2(self.markov_w1(previous))


class DFlashNetwork(nn.Module):
    def __init__(self, spec: DFlashSpec):
        super().__init__()
        self.spec = spec
        self.fc = nn.Linear(len(spec.target_layer_ids) * spec.hidden_size, spec.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        self.layers = [DraftLayer(spec, t == "sliding_attention") for t in spec.layer_types]
        self.norm = nn.RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        if spec.markov_rank > 0:
            self.markov_head = MarkovHead(spec.vocab_size, spec.markov_rank)

    def make_cache(self) -> list[ContextCache]:
        return [ContextCache(self.spec.sliding_window - 1 if t == "sliding_attention" else None)
                for t in self.spec.layer_types]

    def __call__(self, block_embeddings: mx.array, context_features: mx.array, cache: list[ContextCache]) -> mx.array:
        """``block_embeddings`` ``[1, L, H]``, ``context_features`` ``[1, S, len(ids) * H]`` (the rows
        the target committed since the last call; S may be 0): the block's final hidden states
        ``[1, L, H]``, normalised, for the target's head."""
        ctx = self.hidden_norm(self.fc(context_features))
        h = block_embeddings
        for layer, c in zip(self.layers, cache):
            h = layer(h, ctx, c)
        return self.norm(h)
