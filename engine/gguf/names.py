"""mlx-lm parameter names -> llama.cpp tensor names, with llama.cpp's own tables.

The ``gguf`` package carries the map convert_hf_to_gguf uses (``TensorNameMap``: Hugging Face
module paths -> GGUF names, per architecture). mlx-lm's parameter paths are Hugging Face's for
almost every module, so looking them up there gives the GGUF name; the few modules mlx-lm names
its own way (stacked experts under ``switch_mlp``, DeepSeek's absorbed MLA projections, the
gated-delta ``dt_bias``) are mapped here to the llama.cpp tensor kind that holds them.
"""

from __future__ import annotations

import re
from functools import lru_cache

from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, MODEL_TENSOR, TENSOR_NAMES
from gguf.tensor_mapping import TensorNameMap

_ARCH_BY_NAME = {name: arch for arch, name in MODEL_ARCH_NAMES.items()}

# mlx-lm module path (after "model.layers.N.") -> llama.cpp tensor kind, for modules that have
# no Hugging Face name in gguf's table.
_MLX_ONLY = {
    "mlp.experts.gate_proj": MODEL_TENSOR.FFN_GATE_EXP,
    "mlp.experts.up_proj": MODEL_TENSOR.FFN_UP_EXP,
    "mlp.experts.down_proj": MODEL_TENSOR.FFN_DOWN_EXP,
    "block_sparse_moe.experts.gate_proj": MODEL_TENSOR.FFN_GATE_EXP,
    "block_sparse_moe.experts.up_proj": MODEL_TENSOR.FFN_UP_EXP,
    "block_sparse_moe.experts.down_proj": MODEL_TENSOR.FFN_DOWN_EXP,
    "self_attn.embed_q": MODEL_TENSOR.ATTN_K_B,
    "self_attn.unembed_out": MODEL_TENSOR.ATTN_V_B,
}
# mlx-lm parameters stored under another suffix (the converter renames dt_bias to dt_proj.bias).
_MLX_ONLY_PARAMS = {
    "linear_attn.dt_bias": (MODEL_TENSOR.SSM_DT, ".bias"),
}
_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.(.+)$")


def model_arch(name: str) -> MODEL_ARCH | None:
    """The ``gguf`` package's enum for a ``general.architecture`` string."""
    return _ARCH_BY_NAME.get(name)


@lru_cache(maxsize=64)
def _name_map(arch: MODEL_ARCH, n_blocks: int) -> TensorNameMap:
    return TensorNameMap(arch, n_blocks)


def canonical(param: str) -> str:
    """An mlx-lm parameter path as the Hugging Face checkpoint would spell it (and as the
    converter renames it before looking it up)."""
    param = param.replace("language_model.", "")
    param = param.replace("e_score_correction_bias", "e_score_correction.bias")
    return param.replace(".switch_mlp.", ".experts.")


def gguf_names(arch: str, n_blocks: int, param: str) -> list[str]:
    """The GGUF tensor names that may hold mlx-lm parameter ``param`` of an ``arch`` model: the
    one gguf's table gives, and for a bare parameter (GPT-OSS's ``sinks``) that name with the
    ``.weight`` the converter appends."""
    name = gguf_name(arch, n_blocks, param)
    if name is None:
        return []
    return [name] if name.endswith((".weight", ".bias")) else [name, name + ".weight"]


def gguf_name(arch: str, n_blocks: int, param: str) -> str | None:
    """The GGUF tensor name holding mlx-lm parameter ``param`` of an ``arch`` model, or None."""
    enum = model_arch(arch)
    if enum is None:
        return None
    name = canonical(param)
    found = _name_map(enum, n_blocks).get_name(name, try_suffixes=(".weight", ".bias"))
    if found is not None:
        return found
    match = _LAYER.match(name)
    if match is None:
        return None
    bid, rest = match.groups()
    if rest in _MLX_ONLY_PARAMS:
        kind, suffix = _MLX_ONLY_PARAMS[rest]
        return TENSOR_NAMES[kind].format(bid=bid) + suffix
    stem, _, suffix = rest.rpartition(".")
    if stem in _MLX_ONLY:
        return TENSOR_NAMES[_MLX_ONLY[stem]].format(bid=bid) + "." + suffix
    return None


def tensor_name(kind: MODEL_TENSOR, bid: int | None = None, suffix: str = ".weight") -> str:
    """llama.cpp's name for a tensor kind (``blk.{bid}.`` filled in)."""
    name = TENSOR_NAMES[kind]
    return (name.format(bid=bid) if bid is not None else name) + suffix
