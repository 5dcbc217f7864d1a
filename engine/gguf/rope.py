"""``{arch}.rope.scaling.*`` GGUF metadata -> a Hugging Face style ``rope_scaling`` dict.

Llama 3.x files carry their scaling as a ``rope_freqs`` tensor of per-frequency divisors rather
than as parameters; for those we declare llama3 scaling and the llama architecture replaces
the computed frequencies with the stored ones (``architectures.llama.apply_rope_freqs``).
Phi-3's LongRoPE factors are tensors too (``rope_factors_long/short``); its architecture reads
them (``architectures.phi3``).
"""

from __future__ import annotations

from typing import Any

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.gguf.metadata import ArchMetadata


def rope_scaling(meta: ArchMetadata, has_rope_freqs: bool) -> dict[str, Any] | None:
    kind = meta.raw("rope.scaling.type")
    factor = meta.raw("rope.scaling.factor")
    original = meta.raw("rope.scaling.original_context_length")
    if has_rope_freqs:
        return {"rope_type": "llama3", "factor": 1.0, "original_max_position_embeddings": int(original or 8192)}
    if not kind or kind == "none" or not factor or float(factor) == 1.0:
        return None
    if kind == "linear":
        return {"rope_type": "linear", "type": "linear", "factor": float(factor)}
    if kind == "yarn":
        out: dict[str, Any] = {"rope_type": "yarn", "type": "yarn", "factor": float(factor)}
        if original:
            out["original_max_position_embeddings"] = int(original)
        for gguf_key, hf_key in (("rope.scaling.yarn_beta_fast", "beta_fast"),
                                 ("rope.scaling.yarn_beta_slow", "beta_slow")):
            if meta.has(gguf_key):
                out[hf_key] = meta.float(gguf_key)
        return out
    raise ModelLoadError(f"{meta.source}: unsupported RoPE scaling type {kind!r} in GGUF metadata "
                         f"(architecture {meta.arch!r}); mlxcel reads linear and yarn scaling")
