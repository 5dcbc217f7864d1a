"""The one object the rest of mlxcel holds for a loaded model."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.nn as nn
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache
from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxcel.engine.model.kv_types import KvQuant
from mlxcel.engine.model.lora_set import AdapterSet


@dataclass
class LoadedModel:
    """A ready-to-run model: an mlx-lm module, its tokenizer, and what we know about it.

    ``model(tokens[B, L], cache=cache)`` returns logits ``[B, L, vocab]``.
    """

    model: nn.Module
    tokenizer: TokenizerWrapper
    config: dict[str, Any]
    path: Path
    source: str  # "gguf" | "mlx" (a Hugging Face / MLX directory)
    name: str = ""
    chat_template: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    adapters: AdapterSet | None = None  # LoRA adapters (engine.model.lora), None without --lora
    vision: Any = None  # the vision tower (engine.vision.tower.VisionTower), None for a text-only model
    kv_quant: KvQuant | None = None  # -ctk/-ctv quantized (engine.model.kv_types), None: full precision

    @property
    def vocab_size(self) -> int:
        return int(self.config.get("vocab_size") or self.model.args.vocab_size)

    @property
    def eos_token_ids(self) -> set[int]:
        return set(self.tokenizer.eos_token_ids)

    @property
    def bos_token_id(self) -> int | None:
        return self.tokenizer.bos_token_id

    @property
    def add_bos(self) -> bool:
        """Whether a raw-text prompt gets the BOS token prepended."""
        return bool(self.metadata.get("add_bos", self.bos_token_id is not None))

    @property
    def context_length(self) -> int:
        return int(self.config.get("max_position_embeddings") or 4096)

    def make_cache(self) -> list[Any]:
        """A fresh per-layer KV cache for one sequence: mlx-lm's, with its plain attention layers
        quantized when ``kv_quant`` says so (sliding-window layers keep full precision)."""
        cache = make_prompt_cache(self.model)
        quant = self.kv_quant
        if quant is None:
            return cache
        return [QuantizedKVCache(group_size=quant.group, bits=quant.bits) if type(c) is KVCache else c for c in cache]
