"""``gemma``, ``gemma2``, ``gemma3``: Google's Gemma 1-3 text models.

The converter stores every ``*norm.weight`` as ``1 + w`` (llama.cpp multiplies by the stored
value; Gemma's own RMSNorm, and mlx-lm's, add the 1), so the 1 is taken off again. Attention is
scaled by ``1/sqrt(head_dim)``, except for the 27B sizes, which llama.cpp recognises by their
layer count and scales by ``1/sqrt(hidden/heads)``: mlx-lm's ``query_pre_attn_scalar`` says the
same. Gemma 3 alternates five sliding-window layers with one global one unless the file says
otherwise (``attention.sliding_window_pattern``), with its own RoPE base for the local layers
(``rope.freq_base_swa``, 10000 when absent). mlx-lm's gemma2 has no sliding window, so a Gemma 2
file serves contexts up to its window (4096), where full attention is the same computation.
Gemma 3n's norms are stored as they are (no 1 added); its three AltUp projections arrive stacked
in one tensor, its activation sparsity as normal quantiles (``activation_sparsity_scale``).
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from mlxcel.engine.gguf.architectures.base import Architecture, Conversion, TensorIndex
from mlxcel.engine.gguf.metadata import ArchMetadata

log = logging.getLogger(__name__)


def _attention_scalar(config: dict, layers_27b: int) -> float:
    if config["num_hidden_layers"] == layers_27b:
        return config["hidden_size"] / config["num_attention_heads"]
    return float(config["head_dim"])


class Gemma(Architecture):
    name = "gemma"
    model_type = "gemma"
    hf_class = "GemmaForCausalLM"
    norm_offset = True


class Gemma2(Architecture):
    name = "gemma2"
    model_type = "gemma2"
    hf_class = "Gemma2ForCausalLM"
    norm_offset = True

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = self.common_config(meta, tensors, vocab_size)
        window = meta.int("attention.sliding_window", 4096)
        config.update(
            attn_logit_softcapping=meta.float("attn_logit_softcapping", 50.0),
            final_logit_softcapping=meta.float("final_logit_softcapping", 30.0),
            query_pre_attn_scalar=_attention_scalar(config, layers_27b=46),
        )
        if config["max_position_embeddings"] > window:
            log.warning("%s: serving contexts up to gemma2's sliding window (%d tokens, of %d trained): mlx-lm's "
                        "gemma2 attends over the whole context, which equals llama.cpp's sliding window only "
                        "within it", meta.source, window, config["max_position_embeddings"])
            config["max_position_embeddings"] = window
        return config


class Gemma3(Architecture):
    name = "gemma3"
    model_type = "gemma3_text"
    hf_class = "Gemma3ForCausalLM"
    norm_offset = True

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        config = self.common_config(meta, tensors, vocab_size)
        window = meta.int("attention.sliding_window", 0)
        config.update(
            rope_theta=meta.float("rope.freq_base", 1_000_000.0),
            rope_local_base_freq=meta.float("rope.freq_base_swa", 10_000.0),
            query_pre_attn_scalar=_attention_scalar(config, layers_27b=62),
            sliding_window=window or config["max_position_embeddings"],
            sliding_window_pattern=self._pattern(meta, config["num_hidden_layers"]) if window else 1,
        )
        return config

    def optional(self, param: str, config: dict, tensors: TensorIndex) -> bool:
        return param == "lm_head.weight" and "output.weight" not in tensors

    def prepare(self, model, weights: dict) -> None:
        if "lm_head.weight" not in weights:  # the head is the embedding matrix, as mlx-lm's sanitize decides
            model.tie_word_embeddings = True
            model.pop("lm_head")

    def _pattern(self, meta: ArchMetadata, n_layers: int) -> int:
        stored = meta.raw("attention.sliding_window_pattern")
        if stored is None:
            return 6
        if not hasattr(stored, "__len__"):
            return int(stored)
        flags = [bool(v) for v in stored][:n_layers]
        for period in range(1, n_layers + 1):
            if flags == [(i + 1) % period != 0 for i in range(n_layers)]:
                return period
        return -1  # refused in refusal()

    def refusal(self, meta: ArchMetadata, tensors: TensorIndex) -> str | None:
        if meta.float("final_logit_softcapping", 0.0):
            return "final logit soft-capping, which mlx-lm's gemma3_text does not apply"
        if meta.int("attention.sliding_window", 0) and self._pattern(meta, self.n_layers(meta)) < 0:
            return "a sliding-window layer pattern that is not one global layer every N, the only one mlx-lm builds"
        return None


_ALTUP = re.compile(r"^model\.language_model\.(altup_projections|altup_unembed_projections)\.(\d+)\.weight$")


class Gemma3n(Architecture):
    name = "gemma3n"
    model_type = "gemma3n"
    hf_class = "Gemma3nForCausalLM"

    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        text = self.common_config(meta, tensors, vocab_size)
        n = text["num_hidden_layers"]
        sliding = [bool(v) for v in meta.per_layer("attention.sliding_window_pattern", n)]
        scales = meta.per_layer("activation_sparsity_scale", n, float("-inf"))
        ff = [int(v) for v in meta.per_layer("feed_forward_length", n)]
        text.update(
            model_type="gemma3n_text",
            intermediate_size=ff if len(set(ff)) > 1 else ff[0],
            num_kv_shared_layers=meta.int("attention.shared_kv_layers", max(n - 20, 0)),
            vocab_size_per_layer_input=tensors.shape("per_layer_token_embd.weight")[0],
            sliding_window=meta.int("attention.sliding_window"),
            rope_local_base_freq=meta.float("rope.freq_base_swa", 10_000.0),
            rope_theta=meta.float("rope.freq_base", 1_000_000.0),
            final_logit_softcapping=meta.float("final_logit_softcapping", 30.0),
            layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
            activation_sparsity_pattern=[0.5 * (1.0 + math.erf(float(s) / math.sqrt(2.0))) for s in scales],
            hidden_size_per_layer_input=meta.int("embedding_length_per_layer_input"),
            altup_num_inputs=meta.int("altup.num_inputs", 4),
            altup_active_idx=meta.int("altup.active_idx", 0),
            altup_coef_clip=120.0,
            altup_correct_scale=True,
            laurel_rank=tensors.shape("blk.0.laurel_l.weight")[0],
        )
        return {**text, "model_type": "gemma3n", "text_config": dict(text)}

    def conversion(self, param: str, config: dict, meta: ArchMetadata, tensors: TensorIndex) -> Conversion | None:
        match = _ALTUP.match(param)
        if match is None:
            return super().conversion(param, config, meta, tensors)
        which, index = match.groups()
        stacked = "altup_proj.weight" if which == "altup_projections" else "altup_unembd_proj.weight"
        if stacked not in tensors:
            return None
        return Conversion((stacked,), value=lambda w, i=int(index): w[i])
