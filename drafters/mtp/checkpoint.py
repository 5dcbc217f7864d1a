"""Multi-token-prediction (MTP) weights: where each published format keeps them, read by hand.

An MTP module predicts the token after next from two inputs at one position: the embedding of
the token there and the target's final hidden state one position earlier. It is a *fusion*
(RMS-normalise each input, concatenate, project ``2H -> H``), one or more decoder layers of the
target's own kind, and a final RMSNorm before the target's output head. The target's
embeddings and head are shared, never duplicated.

mlx-lm's loaders drop these weights when they load the target (``sanitize`` filters them), so
this module reads them straight from the safetensors files. Layouts recognised:

``qwen3-next`` (Qwen3-Next, Qwen3.5): keys ``mtp.fc`` (the ``2H -> H`` projection),
    ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``, ``mtp.layers.{j}.*`` (decoder
    layers applied in sequence inside one module) and ``mtp.norm``; ``mtp_num_hidden_layers``
    in the (text) config. Concatenation order [embedding, hidden]. Every RMSNorm of this family
    stores ``w`` for a scale of ``1 + w`` (zero-centred), so 1 is added on load. The module's
    output after ``mtp.norm`` is the hidden it chains on.
``deepseek-nextn`` (DeepSeek-V3/R1, GLM-4.5 and other ``num_nextn_predict_layers`` models):
    the MTP modules are extra decoder layers ``model.layers.{N + d}`` past the
    ``num_hidden_layers = N`` real ones, each with ``enorm`` (embedding), ``hnorm`` (hidden),
    ``eh_proj`` and ``shared_head.norm``, plus optional copies ``embed_tokens`` /
    ``shared_head.head`` of the target's tables (ignored: they are the target's). Order
    [embedding, hidden]; the chained hidden is the layer output before ``shared_head.norm``.
``mimo`` (Xiaomi MiMo): ``model.mtp_layers.{d}`` with ``token_layernorm``,
    ``hidden_layernorm``, ``input_proj``, ``final_layernorm``; order [hidden, embedding]; the
    chained hidden is the output after ``final_layernorm``.

Two sources:

* *internal*: the ``mtp`` weights sit inside the target checkpoint (``load_internal_mtp``);
* *assistant*: a separate directory holding only the MTP module(s), as SGLang's NextN export
  writes it: the target's config.json with ``num_hidden_layers`` set to the number of modules
  and ``architectures`` ``["DeepseekV3ForCausalLMNextN"]`` (or ``Glm4MoeForCausalLMNextN``),
  weights ``model.layers.{d}.{enorm,hnorm,eh_proj,shared_head.norm,...}``, embeddings and head
  left out because the assistant binds to the target's (``load_assistant_mtp``).

An MoE MTP layer's per-expert tensors are stacked into mlx-lm's switch-layer layout, so the
layer loads into a copy of the target's own MoE layer. Fused expert tensors and DeepSeek's MLA
attention (which mlx-lm re-factors at load) do not fit that copy and are refused with the
mismatch named.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx

from mlxcel.drafters.mtp.structure import NEXTN_ARCHITECTURE_SUFFIX, is_assistant_checkpoint
from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model.config_file import read_config_json

QWEN3_NEXT = "qwen3-next"
DEEPSEEK_NEXTN = "deepseek-nextn"
MIMO = "mimo"
LAYOUTS = (QWEN3_NEXT, DEEPSEEK_NEXTN, MIMO)

EMBEDDING_FIRST = "embedding-first"
HIDDEN_FIRST = "hidden-first"



@dataclass
class MtpModuleWeights:
    """One MTP module: fusion, decoder layers (names relative to the layer), final norm."""

    embed_norm: mx.array
    hidden_norm: mx.array
    proj: mx.array  # [H, 2H]
    blocks: list[dict[str, mx.array]]
    final_norm: mx.array


@dataclass
class MtpCheckpoint:
    """Every MTP module a checkpoint holds, in depth order, and how to wire them."""

    layout: str
    source: str  # "internal" | "assistant"
    path: Path
    concat: str  # EMBEDDING_FIRST | HIDDEN_FIRST
    chain_normed: bool  # the next step conditions on the output after the final norm
    eps: float
    modules: list[MtpModuleWeights] = field(default_factory=list)

    @property
    def hidden_size(self) -> int:
        return int(self.modules[0].proj.shape[0])


def text_config(config: dict) -> dict:
    """The language model's part of a config.json (multimodal configs nest it)."""
    return config.get("text_config") or config


def _safetensors_files(path: Path, wanted) -> list[Path]:
    """The safetensors files that hold keys ``wanted(key)`` accepts: read off the index when the
    checkpoint is sharded (so a large target's other shards are never opened), else all."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        names = sorted({f for k, f in weight_map.items() if wanted(k)})
        return [path / n for n in names]
    return sorted(path.glob("*.safetensors"))


def read_weights(path: Path, wanted) -> dict[str, mx.array]:
    """Every tensor under ``path`` whose name ``wanted`` accepts."""
    out: dict[str, mx.array] = {}
    for f in _safetensors_files(path, wanted):
        for k, v in mx.load(str(f)).items():
            if wanted(k):
                out[k] = v
    return out


def detect_layout(config: dict, keys) -> str | None:
    """Which MTP layout a target checkpoint's tensor names carry, or None."""
    keys = list(keys)
    if any(k.startswith("mtp.fc.") for k in keys):
        return QWEN3_NEXT
    if any(k.startswith("model.mtp_layers.") for k in keys):
        return MIMO
    n = int(text_config(config).get("num_hidden_layers") or 0)
    if any(k.startswith(f"model.layers.{n}.eh_proj.") for k in keys):
        return DEEPSEEK_NEXTN
    return None


def _is_mtp_key(config: dict):
    n = int(text_config(config).get("num_hidden_layers") or 0)
    pattern = re.compile(r"^model\.layers\.(\d+)\.")

    def wanted(key: str) -> bool:
        if key.startswith(("mtp.", "model.mtp_layers.")):
            return True
        m = pattern.match(key)
        return bool(m) and int(m.group(1)) >= n

    return wanted


def _take(weights: dict[str, mx.array], name: str, where: Path) -> mx.array:
    if name not in weights:
        raise ModelLoadError(f"{where}: MTP weight {name} is missing")
    return weights[name]


def _block(weights: dict[str, mx.array], prefix: str, skip: tuple[str, ...], where: Path) -> dict[str, mx.array]:
    """The decoder-layer tensors under ``prefix``, renamed relative to the layer."""
    block = {k[len(prefix):]: v for k, v in weights.items()
             if k.startswith(prefix) and not k[len(prefix):].startswith(skip)}
    if not block:
        raise ModelLoadError(f"{where}: the MTP decoder layer {prefix.rstrip('.')} has no weights")
    return _stack_experts(block, f"{where}: MTP layer {prefix.rstrip('.')}")


_EXPERT = re.compile(r"^(.*)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.(weight|scales|biases)$")


def _stack_experts(block: dict[str, mx.array], where: str) -> dict[str, mx.array]:
    """Per-expert tensors ``mlp.experts.{e}.{gate,up,down}_proj.*`` (how DeepSeek-V3, GLM-4.5
    and Qwen3-Next store an MoE layer) stacked into ``mlp.switch_mlp.{proj}.*`` ``[E, ...]``,
    the layout of mlx-lm's ``SwitchGLU`` that the target's own MoE layers use."""
    out: dict[str, mx.array] = {}
    groups: dict[tuple[str, str, str], dict[int, mx.array]] = {}
    for k, v in block.items():
        m = _EXPERT.match(k)
        if m:
            groups.setdefault((m.group(1), m.group(3), m.group(4)), {})[int(m.group(2))] = v
        else:
            out[k] = v
    for (prefix, proj, param), experts in groups.items():
        if sorted(experts) != list(range(len(experts))):
            missing = sorted(set(range(max(experts) + 1)) - set(experts))
            raise ModelLoadError(f"{where}: experts {missing} of {prefix}.experts.*.{proj} are missing")
        out[f"{prefix}.switch_mlp.{proj}.{param}"] = mx.stack([experts[e] for e in range(len(experts))])
    return out


def _zero_centred(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Qwen3-Next family: every RMSNorm weight (``*norm*.weight``, 1-D: ``mtp.norm``,
    ``pre_fc_norm_embedding``, ``input_layernorm``, ``q_norm``...) stores ``scale - 1``."""
    return {k: (v + 1.0 if v.ndim == 1 and re.search(r"norm[^.]*\.weight$", k) else v) for k, v in weights.items()}


_NEXTN_FUSION = ("enorm.", "hnorm.", "eh_proj.", "shared_head.", "embed_tokens.")
_MIMO_FUSION = ("token_layernorm.", "hidden_layernorm.", "input_proj.", "final_layernorm.")


def _nextn_module(weights, prefix: str, where: Path) -> MtpModuleWeights:
    return MtpModuleWeights(
        embed_norm=_take(weights, prefix + "enorm.weight", where),
        hidden_norm=_take(weights, prefix + "hnorm.weight", where),
        proj=_take(weights, prefix + "eh_proj.weight", where),
        blocks=[_block(weights, prefix, _NEXTN_FUSION, where)],
        final_norm=_take(weights, prefix + "shared_head.norm.weight", where),
    )


def parse_mtp(layout: str, config: dict, weights: dict[str, mx.array], path: Path, source: str,
              first_index: int | None = None) -> MtpCheckpoint:
    """Build the ``MtpCheckpoint`` of ``layout`` from raw tensors. ``first_index`` is the layer
    number of the first DeepSeek-style module (``num_hidden_layers`` inside a target, 0 in a
    NextN export)."""
    tc = text_config(config)
    eps = float(tc.get("rms_norm_eps") or 1e-6)
    if layout == QWEN3_NEXT:
        weights = _zero_centred(weights)
        depth = int(tc.get("mtp_num_hidden_layers") or 1)
        module = MtpModuleWeights(
            embed_norm=_take(weights, "mtp.pre_fc_norm_embedding.weight", path),
            hidden_norm=_take(weights, "mtp.pre_fc_norm_hidden.weight", path),
            proj=_take(weights, "mtp.fc.weight", path),
            blocks=[_block(weights, f"mtp.layers.{j}.", (), path) for j in range(depth)],
            final_norm=_take(weights, "mtp.norm.weight", path),
        )
        return MtpCheckpoint(layout, source, path, EMBEDDING_FIRST, True, eps, [module])
    if layout == DEEPSEEK_NEXTN:
        start = int(tc.get("num_hidden_layers") or 0) if first_index is None else first_index
        count = 0
        while f"model.layers.{start + count}.eh_proj.weight" in weights:
            count += 1
        if count == 0:
            raise ModelLoadError(f"{path}: no MTP module model.layers.{start}.eh_proj found")
        modules = [_nextn_module(weights, f"model.layers.{start + d}.", path) for d in range(count)]
        return MtpCheckpoint(layout, source, path, EMBEDDING_FIRST, False, eps, modules)
    if layout == MIMO:
        count = 0
        while f"model.mtp_layers.{count}.input_proj.weight" in weights:
            count += 1
        modules = []
        for d in range(count):
            p = f"model.mtp_layers.{d}."
            modules.append(MtpModuleWeights(
                embed_norm=_take(weights, p + "token_layernorm.weight", path),
                hidden_norm=_take(weights, p + "hidden_layernorm.weight", path),
                proj=_take(weights, p + "input_proj.weight", path),
                blocks=[_block(weights, p, _MIMO_FUSION, path)],
                final_norm=_take(weights, p + "final_layernorm.weight", path),
            ))
        return MtpCheckpoint(layout, source, path, HIDDEN_FIRST, True, eps, modules)
    raise ModelLoadError(f"unknown MTP layout {layout!r}")


def load_internal_mtp(target_path: str | Path) -> MtpCheckpoint:
    """The MTP modules stored inside a target checkpoint directory."""
    path = Path(target_path).expanduser()
    if not path.is_dir():
        raise ModelLoadError(f"{path}: MTP heads are read from a checkpoint directory (a GGUF target carries "
                             "no MTP layers mlxcel can read)")
    config = read_config_json(path, f"{path} has no config.json")
    weights = read_weights(path, _is_mtp_key(config))
    layout = detect_layout(config, weights)
    if layout is None:
        raise ModelLoadError(f"{path} has no MTP layers (no mtp.*, model.mtp_layers.* or "
                             f"model.layers.{{num_hidden_layers}}.eh_proj weights)")
    return parse_mtp(layout, config, weights, path, "internal")


def load_assistant_mtp(path: str | Path) -> MtpCheckpoint:
    """The MTP module(s) of a separate NextN assistant directory."""
    path = Path(path).expanduser()
    config = read_config_json(path, f"{path} has no config.json")
    if not is_assistant_checkpoint(config):
        raise ModelLoadError(f"{path} is not an MTP assistant checkpoint (architectures "
                             f"{config.get('architectures')!r}; expected one ending in {NEXTN_ARCHITECTURE_SUFFIX})")
    weights = read_weights(path, lambda k: k.startswith("model.layers."))
    indices = sorted({int(m.group(1)) for k in weights if (m := re.match(r"model\.layers\.(\d+)\.eh_proj\.", k))})
    if not indices:
        raise ModelLoadError(f"{path}: no model.layers.{{d}}.eh_proj weight; not a NextN export")
    return parse_mtp(DEEPSEEK_NEXTN, config, weights, path, "assistant", first_index=indices[0])


def load_mtp(target_path: str | Path, assistant_path: str | Path | None = None) -> MtpCheckpoint:
    """The assistant's modules when ``assistant_path`` is given, else the target's own."""
    if assistant_path is not None:
        return load_assistant_mtp(assistant_path)
    return load_internal_mtp(target_path)


def reload_mtp(checkpoint: MtpCheckpoint) -> MtpCheckpoint:
    """The same modules read again from where ``checkpoint`` came from."""
    if checkpoint.source == "assistant":
        return load_assistant_mtp(checkpoint.path)
    return load_internal_mtp(checkpoint.path)
