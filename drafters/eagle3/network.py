"""The EAGLE-3 drafter network: a fusion of three target layers, one decoder layer over [token
embedding; fused hidden state], its final norm and a head over the draft vocabulary.

The computation (what the published checkpoints, vLLM's ``llama_eagle3`` and llama.cpp's ``eagle3``
graph all describe; written here because mlx-lm ships no EAGLE-3 model):

* **fusion** (``fuse``): the target's hidden states at its low, middle and high layers,
  concatenated per token (``3 * H_target``), optionally RMS-normalised (``norm_before_fc``), go
  through ``fc`` to one row ``g`` of the draft's width ``H``.
* **the decoder layer** (``step``), at an entry pairing ``g`` (the target's state at position
  ``j``) with the embedding ``e`` of token ``j + 1``: ``input_layernorm(e)`` and ``hidden_norm(g)``
  are concatenated to ``2H`` and feed attention's q/k/v projections (the only place ``2H`` appears);
  the residual stream starts from ``g`` (or from ``hidden_norm(g)`` with ``norm_before_residual``),
  and the rest is a Llama layer: attention output added, ``post_attention_layernorm``, SwiGLU MLP
  added. Attention is causal over the layer's own KV cache, RoPE at the entry's position ``j``.
* **output**: the layer's output before ``norm`` is what the next chained entry uses as its ``g``
  (EAGLE-3 feeds the drafter its own state once it drafts past what the target has seen); after
  ``norm`` the head ``lm_head`` scores the draft vocabulary (``drafter.py`` maps it onto the target's).

``embed_tokens`` and ``lm_head`` are optional: a checkpoint without them borrows the target's.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache
from mlx_lm.models.rope_utils import initialize_rope

from mlxcel.drafters.eagle3.spec import Eagle3Spec


class Eagle3Attention(nn.Module):
    def __init__(self, spec: Eagle3Spec):
        super().__init__()
        h, d, bias = spec.hidden_size, spec.head_dim, spec.attention_bias
        self.n_heads, self.n_kv_heads = spec.num_heads, spec.num_kv_heads
        self.scale = d ** -0.5
        self.q_proj = nn.Linear(2 * h, spec.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(2 * h, spec.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(2 * h, spec.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(spec.num_heads * d, h, bias=bias)
        self.rope = initialize_rope(d, spec.rope_theta, False, spec.rope_scaling, spec.max_position_embeddings)

    def __call__(self, x: mx.array, mask, cache: KVCache) -> mx.array:
        b, n, _ = x.shape
        q = self.q_proj(x).reshape(b, n, self.n_heads, -1).transpose(0, 2, 1, 3)
        k = self.k_proj(x).reshape(b, n, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(b, n, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        q = self.rope(q, offset=cache.offset)
        k = self.rope(k, offset=cache.offset)
        k, v = cache.update_and_fetch(k, v)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, n, -1))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int, bias: bool):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Eagle3Layer(nn.Module):
    def __init__(self, spec: Eagle3Spec):
        super().__init__()
        h, eps = spec.hidden_size, spec.rms_norm_eps
        self.norm_before_residual = spec.norm_before_residual
        self.input_layernorm = nn.RMSNorm(h, eps=eps)
        self.hidden_norm = nn.RMSNorm(h, eps=eps)
        self.self_attn = Eagle3Attention(spec)
        self.post_attention_layernorm = nn.RMSNorm(h, eps=eps)
        self.mlp = SwiGLU(h, spec.intermediate_size, spec.mlp_bias)

    def __call__(self, embeds: mx.array, g: mx.array, cache: KVCache) -> mx.array:
        g_normed = self.hidden_norm(g)
        x = mx.concatenate([self.input_layernorm(embeds), g_normed], axis=-1)
        h = (g_normed if self.norm_before_residual else g) + self.self_attn(x, create_attention_mask(x, cache), cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Network(nn.Module):
    """``fc`` (+ ``input_norm``), ``layers[0]``, ``norm``, and the optional ``lm_head`` / ``embed_tokens``."""

    def __init__(self, spec: Eagle3Spec, *, fc_input: int, head_rows: int | None, embed_rows: int | None):
        super().__init__()
        self.spec = spec
        eps = spec.rms_norm_eps
        if spec.norm_before_fc:
            self.input_norm = nn.RMSNorm(fc_input, eps=eps)
        self.fc = nn.Linear(fc_input, spec.hidden_size, bias=False)
        self.layers = [Eagle3Layer(spec)]
        self.norm = nn.RMSNorm(spec.hidden_size, eps=eps)
        if head_rows is not None:
            self.lm_head = nn.Linear(spec.hidden_size, head_rows, bias=False)
        if embed_rows is not None:
            self.embed_tokens = nn.Embedding(embed_rows, spec.hidden_size)

    @property
    def fc_input(self) -> int:
        return int(self.fc.weight.shape[1])

    @property
    def has_head(self) -> bool:
        return "lm_head" in self

    @property
    def has_embeddings(self) -> bool:
        return "embed_tokens" in self

    def make_cache(self) -> list[KVCache]:
        return [KVCache()]

    def fuse(self, features: mx.array) -> mx.array:
        """``[n, fc_input]`` target features (the chosen layers side by side) -> ``[n, H]`` rows ``g``."""
        if self.spec.norm_before_fc:
            features = self.input_norm(features)
        return self.fc(features)

    def step(self, embeds: mx.array, g: mx.array, cache: list[KVCache]) -> mx.array:
        """Entries ``(g[i], embeds[i])`` (``[n, H]`` each) at the cache's next positions: the layer's
        outputs ``[n, H]`` before the final norm (what a chained entry takes as its ``g``)."""
        return self.layers[0](embeds[None], g[None].astype(embeds.dtype), cache[0])[0]

    def head(self, prenorm: mx.array) -> mx.array:
        """``[n, H]`` layer outputs -> ``[n, draft vocabulary]`` logits (own head only)."""
        return self.lm_head(self.norm(prenorm))
