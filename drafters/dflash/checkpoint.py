"""Loading DFlash-family drafter checkpoints: DFlash, LFM2 DSpark and the Muse Glimmer assistant.

All three are a ``config.json`` plus safetensors with no ``embed_tokens`` and no ``lm_head`` (the
drafter borrows both from its target). Where each format keeps what:

* **DFlash** (z-lab's ``*-DFlash-b16``): ``architectures: ["DFlashDraftModel"]``, the backbone
  fields of a Qwen3 config at the top level, and ``dflash_config`` = {``target_layer_ids``,
  ``mask_token_id``} with ``block_size`` at the top level (or inside ``dflash_config``). A block
  is ``[pending, mask * (block_size - 1)]``; rows 1.. are the proposals. Tensors: ``fc.weight``,
  ``hidden_norm.weight``, ``layers.N.{input_layernorm, post_attention_layernorm}.weight``,
  ``layers.N.self_attn.{q,k,v,o}_proj.weight``, ``layers.N.self_attn.{q,k}_norm.weight``,
  ``layers.N.mlp.{gate,up,down}_proj.weight``, ``norm.weight``.
* **LFM2 DSpark** (LiquidAI): ``architectures: ["Lfm2DSparkDraftModel"]``, ``model_type: qwen3``,
  the same backbone and tensors plus ``markov_head.markov_w1.weight`` ``[V, r]`` and
  ``markov_head.markov_w2.weight`` ``[V, r]`` (``markov_rank`` r, top level or in
  ``dflash_config``); ``target_layer_ids`` / ``mask_token_id`` / ``num_target_layers`` inside
  ``dflash_config``; ``block_size`` counts *proposals* (every row of
  ``[pending, mask * (block_size - 1)]`` proposes the next token); ``rope_is_neox_style: false``
  means GPT-J-style (MLX "traditional") RoPE. Its ``confidence_head.*`` tensors, if present, are
  not used (acceptance is decided by the target, not by a confidence gate).
* **Muse Glimmer assistant** (Meta): ``model_type: muse_glimmer_assistant`` /
  ``architectures: ["MuseGlimmerAssistantModel"]``, ``target_layer_ids`` / ``mask_token_id`` /
  ``block_size`` at the top level, all layers ``sliding_attention`` with ``sliding_window``,
  RoPE in ``rope_parameters``; its context projection is named ``encoder.fc.weight`` and
  ``encoder.output_norm_enc.weight`` (our ``fc`` / ``hidden_norm``). Attention inside the
  block is bidirectional, as for the other two.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxcel.drafters.dflash.network import DFlashNetwork, DFlashSpec
from mlxcel.drafters.dflash.structure import dflash_family
from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model.config_file import read_config_json

# Tensor-name differences of the Muse Glimmer assistant format.
_RENAMES = {"encoder.fc.": "fc.", "encoder.output_norm_enc.": "hidden_norm."}
_UNUSED = ("confidence_head.",)
_BORROWED = ("embed_tokens", "lm_head")


def _need(config: dict, key: str, where: str):
    if key not in config:
        raise ModelLoadError(f"{where}: config.json lacks {key!r}")
    return config[key]


def read_spec(config: dict, where: str = "drafter") -> DFlashSpec:
    """The network description of a DFlash / DSpark / Muse Glimmer assistant config.json."""
    family = dflash_family(config)
    if family is None:
        raise ModelLoadError(f"{where} is not a DFlash-family drafter (no dflash_config, DFlashDraftModel, "
                             "Lfm2DSparkDraftModel or muse_glimmer_assistant in config.json)")
    inner = config.get("dflash_config") or {}
    merged = {**config, **inner}  # dflash_config wins for the fields it carries
    layers = int(_need(config, "num_hidden_layers", where))
    layer_types = tuple(config.get("layer_types") or ["full_attention"] * layers)
    if len(layer_types) != layers:
        raise ModelLoadError(f"{where}: layer_types has {len(layer_types)} entries for {layers} layers")
    unknown = set(layer_types) - {"full_attention", "sliding_attention"}
    if unknown:
        raise ModelLoadError(f"{where}: unsupported layer_types {sorted(unknown)}")
    window = config.get("sliding_window")
    if "sliding_attention" in layer_types and not window:
        raise ModelLoadError(f"{where}: sliding_attention layers need sliding_window")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_theta = float(config.get("rope_theta") or rope.get("rope_theta") or 10000.0)
    scaling = config.get("rope_scaling")
    if scaling and (scaling.get("rope_type") or scaling.get("type")) == "default":
        scaling = None
    hidden = int(_need(config, "hidden_size", where))
    heads = int(_need(config, "num_attention_heads", where))
    block_size = int(merged.get("block_size") or 16)
    markov_rank = int(merged.get("markov_rank") or 0)
    if family == "dspark" and markov_rank <= 0:
        raise ModelLoadError(f"{where}: a DSpark drafter needs markov_rank > 0")
    spec = DFlashSpec(
        family=family,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        intermediate_size=int(_need(config, "intermediate_size", where)),
        rms_norm_eps=float(config.get("rms_norm_eps") or 1e-6),
        rope_theta=rope_theta,
        target_layer_ids=tuple(int(i) for i in _need(merged, "target_layer_ids", where)),
        mask_token_id=int(_need(merged, "mask_token_id", where)),
        block_size=block_size,
        layer_types=layer_types,
        sliding_window=int(window) if window else None,
        rope_traditional=config.get("rope_is_neox_style") is False,
        rope_scaling=scaling,
        max_position_embeddings=int(config.get("max_position_embeddings") or 131072),
        markov_rank=markov_rank,
        num_target_layers=merged.get("num_target_layers"),
        vocab_size=config.get("vocab_size"),
    )
    if spec.max_proposals < 1:
        raise ModelLoadError(f"{where}: block_size {block_size} leaves no room for a proposal")
    if not spec.target_layer_ids:
        raise ModelLoadError(f"{where}: target_layer_ids is empty")
    return spec


def _weights(path: Path) -> dict[str, mx.array]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path}: no *.safetensors weights next to config.json")
    out: dict[str, mx.array] = {}
    for f in files:
        try:
            out.update(mx.load(str(f)))
        except Exception as exc:  # a truncated or foreign file
            raise ModelLoadError(f"{f}: cannot read safetensors ({exc})") from exc
    renamed = {}
    for name, value in out.items():
        for old, new in _RENAMES.items():
            if name.startswith(old):
                name = new + name[len(old):]
                break
        if name.startswith("model."):  # some exports nest the backbone under model.
            name = name[len("model."):]
        if name.startswith(_UNUSED) or any(part in name for part in _BORROWED):
            continue
        renamed[name] = value
    return renamed


def load_dflash_checkpoint(path: str | Path, *,
                           dtype: mx.Dtype | None = mx.float32) -> tuple[DFlashNetwork, DFlashSpec]:
    """Read a DFlash-family drafter directory into a ready network (weights cast to ``dtype``;
    float32 on this project's CPU build, as targets are)."""
    path = Path(path).expanduser()
    config = read_config_json(
        path, f"{path}: a DFlash-family drafter is a directory with config.json and safetensors")
    spec = read_spec(config, str(path))
    weights = _weights(path)
    if spec.markov_rank and spec.vocab_size is None:
        spec = _with_vocab(spec, weights)
    network = DFlashNetwork(spec)
    expected = {k for k, _ in _flatten(network.parameters())}
    missing = sorted(expected - set(weights))
    extra = sorted(set(weights) - expected)
    if missing or extra:
        detail = (f"missing {missing[:4]}" if missing else "") + (" " if missing and extra else "") + \
                 (f"unexpected {extra[:4]}" if extra else "")
        raise ModelLoadError(f"{path}: the {spec.family} drafter's tensors do not match its config.json ({detail})")
    if dtype is not None:
        weights = {k: v.astype(dtype) for k, v in weights.items()}
    try:
        network.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc
    mx.eval(network.parameters())
    network.eval()
    return network, spec


def _with_vocab(spec: DFlashSpec, weights: dict) -> DFlashSpec:
    return replace(spec, vocab_size=int(weights["markov_head.markov_w1.weight"].shape[0]))


def _flatten(params, prefix=""):
    return tree_flatten(params, prefix)
