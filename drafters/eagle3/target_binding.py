"""An EAGLE-3 checkpoint bound to the target it drafts for: which of the target's layers it reads,
what it borrows (embeddings, and the head when it has none), and its rows laid onto the target's
vocabulary. Every mismatch between drafter and target is refused here, at load, naming both sides.

Layers: EAGLE-3 numbers the states it reads by the decoder layer they *enter* (vLLM records the
residual stream before layer ``a``; llama.cpp the layer's input), so id ``a`` is the output of
layer ``a - 1`` (``TargetFeatures.layers[a - 1]``), and ``a == N`` the last layer's output before
the final norm. Id 0 would be the token embeddings themselves, which no published drafter reads
and the target forward does not record: refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from mlxcel.drafters.eagle3.checkpoint import Eagle3Checkpoint
from mlxcel.drafters.eagle3.network import Eagle3Network
from mlxcel.drafters.eagle3.spec import default_aux_layers
from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.sampling.filters import NEG_INF
from mlxcel.engine.speculative.target_features import embed, final_norm, head_logits, inner_model


@dataclass
class TargetBinding:
    """What the drafter reads and borrows from one target."""

    target: Any
    network: Eagle3Network
    feature_layers: tuple[int, ...]  # indices into TargetFeatures.layers
    vocab_size: int  # the target's vocabulary: the width of every proposal row
    gather: mx.array | None = None  # [V] the draft id scoring each target id (0 where none does)
    present: mx.array | None = None  # [V] whether a draft id scores it

    def embed(self, tokens: Sequence[int]) -> mx.array:
        """``[n, H]`` embeddings of target token ids: the drafter's own table, else the target's."""
        ids = mx.array([int(t) for t in tokens])
        return self.network.embed_tokens(ids) if self.network.has_embeddings else embed(self.target, ids)

    def target_row(self, state: mx.array) -> mx.array:
        """``[n, V]`` logits over the target's vocabulary from layer outputs ``state`` ``[n, H]``."""
        if not self.network.has_head:
            return _width(head_logits(self.target, self.network.norm(state)), self.vocab_size)
        logits = self.network.head(state)
        if self.gather is None:
            return _width(logits, self.vocab_size)
        return mx.where(self.present, logits[:, self.gather], NEG_INF)


def _width(logits: mx.array, vocab: int) -> mx.array:
    width = logits.shape[-1]
    if width >= vocab:
        return logits[:, :vocab]
    return mx.concatenate([logits, mx.full((logits.shape[0], vocab - width), NEG_INF, dtype=logits.dtype)], axis=-1)


def _feature_layers(checkpoint: Eagle3Checkpoint, n_layers: int) -> tuple[int, ...]:
    aux = checkpoint.spec.aux_layer_ids or default_aux_layers(n_layers)
    bad = [a for a in aux if not 1 <= a <= n_layers]
    if bad:
        raise ModelLoadError(f"{checkpoint.where}: the EAGLE-3 drafter reads the target's states entering layers "
                             f"{list(aux)}, but this target has {n_layers} layers (ids 1..{n_layers} can be read; "
                             "0, the embeddings, cannot)")
    return tuple(a - 1 for a in aux)


def _check_widths(checkpoint: Eagle3Checkpoint, target_model: Any, n_read: int) -> None:
    spec, network, where = checkpoint.spec, checkpoint.network, checkpoint.where
    width = int(final_norm(target_model).weight.shape[-1])  # never quantized, unlike the embedding table
    declared = spec.target_hidden_size or spec.hidden_size
    if declared != width or network.fc_input != n_read * width:
        raise ModelLoadError(f"{where}: the EAGLE-3 drafter fuses {n_read} target layers of width "
                             f"{network.fc_input // max(n_read, 1)} (declared {declared}); this target's hidden size "
                             f"is {width}: it was trained for another target")
    borrowed = [what for what, own in (("embeddings", network.has_embeddings), ("head", network.has_head)) if not own]
    if borrowed and width != spec.hidden_size:
        raise ModelLoadError(f"{where}: the EAGLE-3 drafter borrows the target's {' and '.join(borrowed)}, but its "
                             f"width {spec.hidden_size} is not the target's {width}")


def _vocabulary(checkpoint: Eagle3Checkpoint, target_model: Any, target_vocab_size: int | None) -> int:
    vocab = target_vocab_size or int(inner_model(target_model).embed_tokens.weight.shape[0])
    declared = checkpoint.spec.vocab_size
    if declared is not None and declared != vocab:
        raise ModelLoadError(f"{checkpoint.where}: the EAGLE-3 drafter was trained for a {declared}-token vocabulary; "
                             f"this target's has {vocab}")
    ids = checkpoint.target_ids
    if ids is not None and ids.size and int(ids.max()) >= vocab:
        raise ModelLoadError(f"{checkpoint.where}: d2t maps draft tokens to target id {int(ids.max())}, past this "
                             f"target's {vocab}-token vocabulary")
    return vocab


def bind_checkpoint(checkpoint: Eagle3Checkpoint, target_model: Any, target_vocab_size: int | None) -> TargetBinding:
    """``checkpoint`` checked against ``target_model`` and bound to it."""
    n_layers = len(inner_model(target_model).layers)
    layers = _feature_layers(checkpoint, n_layers)
    _check_widths(checkpoint, target_model, len(layers))
    vocab = _vocabulary(checkpoint, target_model, target_vocab_size)
    binding = TargetBinding(target_model, checkpoint.network, layers, vocab)
    if checkpoint.target_ids is not None:
        gather = np.zeros(vocab, dtype=np.int32)
        present = np.zeros(vocab, dtype=np.bool_)
        gather[checkpoint.target_ids] = np.arange(checkpoint.target_ids.size, dtype=np.int32)
        present[checkpoint.target_ids] = True
        binding.gather, binding.present = mx.array(gather), mx.array(present)
    return binding
