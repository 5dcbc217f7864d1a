"""The BERT-family encoder in MLX: one network for ``bert``, ``nomic-bert`` and ``jina-bert-v2``,
the three differing only where :class:`EncoderSpec` says (positions, fused q/k/v, feed-forward).

It computes what llama.cpp's BERT graph computes (``result_embd``: the last layer's output, one row
per token) for one sequence at a time, attending over the whole of it in both directions. There is
no cache: an encoder reads its input once, so a sequence is one forward however long it is, and the
attention scores are worked out a block of queries at a time so that a long input (an 8192-token
jina input) never holds every head's full score matrix at once.

Parameters are named after llama.cpp's tensors (``blk.3.attn_q.weight``), so a GGUF file's tensors
load by their own names. GELU is the tanh form ggml uses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn

from mlxcel.engine.errors import MlxcelError
from mlxcel.engine.gguf.architectures.bert import EncoderSpec


class EncoderOnlyError(MlxcelError, TypeError):
    """A decoder's KV cache asked of an encoder, which has none and generates no text (``mlxcel
    generate`` prints it as the reason; a ``TypeError`` too, as the cache code's own "not a cache I
    can use" is)."""


# attention score elements (heads x queries x keys) held at once; past it, queries go in blocks
SCORE_BUDGET = 1 << 25


def alibi_slopes(n_head: int, max_bias: float) -> mx.array:
    """llama.cpp's per-head ALiBi slopes (``ggml_soft_max_ext`` with ``max_bias``): powers of
    ``2^(-max_bias/n)`` for the largest power of two ``n`` of heads, odd powers of its square root
    for the rest."""
    n = 1 << int(math.floor(math.log2(n_head)))
    m0, m1 = 2.0 ** (-max_bias / n), 2.0 ** (-(max_bias / 2.0) / n)
    return mx.array([m0 ** (h + 1) if h < n else m1 ** (2 * (h - n) + 1) for h in range(n_head)], dtype=mx.float32)


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, slopes: mx.array | None) -> mx.array:
    """Bidirectional attention ``[B, heads, T, d]``, with ALiBi's ``-slope * |i - j|`` added to the
    scores when ``slopes`` is given, a block of queries at a time past :data:`SCORE_BUDGET`."""
    n_head, t = q.shape[1], q.shape[2]
    block = max(1, SCORE_BUDGET // (n_head * t))
    keys = mx.arange(t)
    out = []
    for start in range(0, t, block):
        stop = min(t, start + block)
        mask = None
        if slopes is not None:
            distance = mx.abs(mx.arange(start, stop)[:, None] - keys[None, :]).astype(mx.float32)
            mask = (-slopes[:, None, None] * distance)[None].astype(q.dtype)
        out.append(mx.fast.scaled_dot_product_attention(q[:, :, start:stop], k, v, scale=scale, mask=mask))
    return out[0] if len(out) == 1 else mx.concatenate(out, axis=2)


class EncoderLayer(nn.Module):
    """One post-norm layer: attention, residual, LayerNorm; feed-forward, residual, LayerNorm."""

    def __init__(self, spec: EncoderSpec):
        super().__init__()
        h, has = spec.hidden, spec.has
        self.spec = spec

        def linear(stem: str, n_in: int, n_out: int) -> nn.Linear:
            return nn.Linear(n_in, n_out, bias=has(f"{stem}.bias"))

        def norm(stem: str) -> nn.LayerNorm:
            return nn.LayerNorm(h, eps=spec.eps, affine=True, bias=has(f"{stem}.bias"))

        if spec.fused_qkv:
            self.attn_qkv = linear("attn_qkv", h, 3 * h)
        else:
            self.attn_q, self.attn_k, self.attn_v = (linear(s, h, h) for s in ("attn_q", "attn_k", "attn_v"))
        for stem in ("attn_q_norm", "attn_k_norm", "attn_norm_2"):
            if has(f"{stem}.weight"):
                setattr(self, stem, norm(stem))
        self.attn_output = linear("attn_output", h, h)
        self.attn_output_norm = norm("attn_output_norm")
        up_rows = 2 * spec.n_ff if spec.ffn == "geglu_fused" else spec.n_ff
        self.ffn_up = linear("ffn_up", h, up_rows)
        if has("ffn_gate.weight"):
            self.ffn_gate = linear("ffn_gate", h, spec.n_ff)
        self.ffn_down = linear("ffn_down", spec.n_ff, h)
        self.layer_output_norm = norm("layer_output_norm")

    def _qkv(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        if "attn_qkv" in self:
            return tuple(mx.split(self.attn_qkv(x), 3, axis=-1))
        return self.attn_q(x), self.attn_k(x), self.attn_v(x)

    def _attend(self, x: mx.array, slopes: mx.array | None) -> mx.array:
        spec = self.spec
        b, t, _ = x.shape
        q, k, v = self._qkv(x)
        if "attn_q_norm" in self:
            q = self.attn_q_norm(q)
        if "attn_k_norm" in self:
            k = self.attn_k_norm(k)
        q, k, v = (z.reshape(b, t, spec.n_head, spec.head_dim).transpose(0, 2, 1, 3) for z in (q, k, v))
        if spec.position == "rope":  # NeoX halves, positions 0..T-1
            q = mx.fast.rope(q, spec.rope_dims, traditional=False, base=spec.rope_base, scale=1.0, offset=0)
            k = mx.fast.rope(k, spec.rope_dims, traditional=False, base=spec.rope_base, scale=1.0, offset=0)
        out = attention(q, k, v, 1.0 / math.sqrt(spec.head_dim), slopes)
        return self.attn_output(out.transpose(0, 2, 1, 3).reshape(b, t, -1))

    def _feed_forward(self, x: mx.array) -> mx.array:
        kind = self.spec.ffn
        up = self.ffn_up(x)
        if kind == "gelu":
            hidden = nn.gelu_approx(up)
        elif kind == "swiglu":
            hidden = nn.silu(self.ffn_gate(x)) * up
        elif kind == "geglu":
            hidden = nn.gelu_approx(self.ffn_gate(x)) * up
        else:  # geglu_fused: the gate is the first half of ffn_up's rows
            gate, rest = mx.split(up, 2, axis=-1)
            hidden = nn.gelu_approx(gate) * rest
        return self.ffn_down(hidden)

    def __call__(self, x: mx.array, slopes: mx.array | None) -> mx.array:
        cur = self.attn_output_norm(self._attend(x, slopes) + x)
        if "attn_norm_2" in self:  # jina-bert-v2 code models: the layer input added once more
            cur = self.attn_norm_2(cur + x)
        return self.layer_output_norm(self._feed_forward(cur) + cur)


class Encoder(nn.Module):
    """``model(ids [B, T]) -> [B, T, hidden]``; :meth:`hidden_states` for one token list."""

    causal = False  # read by the rank pooling: a bidirectional model's summary row is the first

    def __init__(self, spec: EncoderSpec):
        super().__init__()
        self.spec = spec
        self.token_embd = nn.Embedding(spec.vocab_size, spec.hidden)
        if spec.n_token_types:
            self.token_types = nn.Embedding(spec.n_token_types, spec.hidden)
        if spec.position == "absolute":
            self.position_embd = nn.Embedding(spec.n_positions, spec.hidden)
        self.token_embd_norm = nn.LayerNorm(spec.hidden, eps=spec.eps)
        self.blk = [EncoderLayer(spec) for _ in range(spec.n_layer)]
        self._slopes = alibi_slopes(spec.n_head, spec.max_alibi_bias) if spec.position == "alibi" else None

    def make_cache(self) -> list:
        """Refused: an encoder keeps no cache (mlx-lm's ``make_prompt_cache`` asks the model first)."""
        raise EncoderOnlyError(f"this is an encoder-only ({self.spec.arch}) model: it computes embeddings and rerank "
                               "scores, not text, and has no KV cache; serve it with mlxcel-server --embeddings "
                               "(or --reranking)")

    def embed(self, ids: mx.array) -> mx.array:
        """Token embeddings, plus token type 0 ("sentence A", as llama.cpp always takes) and the
        absolute positions where the model has them, through the embedding LayerNorm."""
        x = self.token_embd(ids)
        if "token_types" in self:
            x = x + self.token_types(mx.zeros((1,), dtype=mx.int32))[0]
        if "position_embd" in self:
            x = x + self.position_embd(mx.arange(ids.shape[-1]))
        return self.token_embd_norm(x)

    def __call__(self, ids: mx.array) -> mx.array:
        if ids.shape[-1] > self.max_tokens:
            raise ValueError(f"{ids.shape[-1]} tokens exceed the model's {self.max_tokens} positions")
        x = self.embed(ids)
        for layer in self.blk:
            x = layer(x, self._slopes)
        return x

    @property
    def max_tokens(self) -> int:
        """The longest input: the position table's rows where positions are learned, else unbounded."""
        return self.spec.n_positions if self.spec.position == "absolute" else 1 << 31

    def hidden_states(self, tokens: Sequence[int]) -> mx.array:
        """``[T, hidden]``: every token's output of the last layer, the sequence in one forward."""
        out = self(mx.array([list(tokens)], dtype=mx.int32))[0]
        mx.eval(out)
        return out
