"""The MTP head network: one multi-token-prediction module bound to its target.

At entry ``j`` the module reads the target's final (post-norm) hidden state ``h_j`` at position
``j`` and the embedding of token ``x_{j+1}``, and predicts ``x_{j+2}``::

    x = proj(concat(embed_norm(E[x_{j+1}]), hidden_norm(h_j)))    # order per layout
    x = decoder_layers(x)                                          # its own KV cache
    logits = target_head(final_norm(x))

Its decoder layers are copies of one of the target's own attention layers (same mlx-lm class,
same attention and MLP code) with the MTP weights loaded into them, so no second transformer
implementation exists here; when the target runs quantized and the MTP weights are not, the copy
is dequantized first. Embeddings and output head are the target's, shared.

Chained drafting feeds the module's own output hidden (before or after ``final_norm``, as the
layout says) back in as the next entry's ``h``. Only the first module of a checkpoint is run,
as llama.cpp and vLLM do with one module; further depths are loaded but not chained.
"""

from __future__ import annotations

import copy
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache
from mlx_lm.utils import dequantize_model

from mlxcel.drafters.mtp.checkpoint import EMBEDDING_FIRST, MtpCheckpoint, MtpModuleWeights
from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.platform.lean_blocks import lean_blocks
from mlxcel.engine.platform.packed_modules import unpack_float_modules
from mlxcel.engine.speculative.target_features import final_norm, head_logits, inner_model


def attention_layer(model: nn.Module) -> nn.Module:
    """A full-attention decoder layer of the target to copy (hybrid models also have
    linear-attention layers; an MTP layer is always full attention)."""
    for layer in reversed(list(model.layers)):
        if hasattr(layer, "self_attn") and not getattr(layer, "is_linear", False) \
                and getattr(layer, "is_attention_layer", True):
            return layer
    raise ModelLoadError(f"{type(model).__module__}: the target has no full-attention layer to build "
                         "the MTP decoder layer from")


def _norm(weight: mx.array, eps: float, dtype) -> nn.RMSNorm:
    norm = nn.RMSNorm(weight.shape[0], eps=eps)
    norm.weight = weight.astype(dtype)
    return norm


class MtpModule(nn.Module):
    """Fusion, decoder layer(s) and final norm of one MTP depth."""

    def __init__(self, w: MtpModuleWeights, template: nn.Module, *, eps: float, concat: str, dtype):
        super().__init__()
        hidden = int(w.proj.shape[0])
        if w.proj.shape[1] != 2 * hidden:
            raise ModelLoadError(f"MTP projection has shape {tuple(w.proj.shape)}; expected [H, 2H]")
        self.embedding_first = concat == EMBEDDING_FIRST
        self.embed_norm = _norm(w.embed_norm, eps, dtype)
        self.hidden_norm = _norm(w.hidden_norm, eps, dtype)
        self.proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.proj.weight = w.proj.astype(dtype)
        self.blocks = []
        for i, weights in enumerate(w.blocks):
            block = copy.deepcopy(template)
            if unpack_float_modules(block):  # a float target's layer on the float kernel: plain layers
                lean_blocks(block)  # to load by name; a lean block's plan (the target's arrays) dropped
            if not any(k.endswith(".scales") for k in weights):
                dequantize_model(block)  # a quantized target's layer, float MTP weights
            try:
                block.load_weights([(k, v.astype(dtype)) for k, v in weights.items()], strict=True)
            except ValueError as exc:
                raise ModelLoadError(f"MTP decoder layer {i} does not fit the target's "
                                     f"{type(template).__name__}: {exc}") from exc
            self.blocks.append(block)
        self.final_norm = _norm(w.final_norm, eps, dtype)

    def __call__(self, embeds: mx.array, hidden: mx.array, cache: list[Any]) -> tuple[mx.array, mx.array]:
        """``embeds``, ``hidden``: ``[B, n, H]``. Returns (pre-norm output, normed output)."""
        e, h = self.embed_norm(embeds), self.hidden_norm(hidden)
        x = self.proj(mx.concatenate([e, h] if self.embedding_first else [h, e], axis=-1))
        mask = create_attention_mask(x, cache[0])
        for block, c in zip(self.blocks, cache):
            x = block(x, mask, c)
        return x, self.final_norm(x)


class MtpHead:
    """An MTP checkpoint bound to a loaded target: ``step`` runs entries through module 0."""

    def __init__(self, checkpoint: MtpCheckpoint, target_model: nn.Module):
        inner = inner_model(target_model)
        self.target_model = target_model
        self.embed_tokens = inner.embed_tokens
        self.chain_normed = checkpoint.chain_normed
        self.layout, self.source, self.path = checkpoint.layout, checkpoint.source, checkpoint.path
        norm_weight = final_norm(target_model).weight
        dtype = norm_weight.dtype
        hidden = checkpoint.hidden_size
        target_hidden = int(norm_weight.shape[0])
        if hidden != target_hidden:
            raise ModelLoadError(f"{checkpoint.path}: MTP hidden size {hidden} does not match the target's "
                                 f"{target_hidden}")
        template = attention_layer(target_model)
        self.module = MtpModule(checkpoint.modules[0], template, eps=checkpoint.eps,
                                concat=checkpoint.concat, dtype=dtype)

    def make_cache(self) -> list[Any]:
        return [KVCache() for _ in self.module.blocks]

    def step(self, tokens: list[int], hidden: mx.array, cache: list[Any]) -> tuple[mx.array, mx.array]:
        """Entries ``(hidden[i], tokens[i])``: ``hidden`` ``[n, H]`` (the state one position
        before each token). Returns logits ``[n, V]`` and the hidden each entry chains on ``[n, H]``."""
        embeds = self.embed_tokens(mx.array([tokens]))
        raw, normed = self.module(embeds, hidden[None].astype(embeds.dtype), cache)
        logits = head_logits(self.target_model, normed)
        return logits[0], (normed if self.chain_normed else raw)[0]
