"""Loading an EAGLE-3 drafter checkpoint directory (config.json + safetensors, either layout of
``spec.py``) into a ready network, and the checks every form shares (``build``, also used for
llama.cpp's GGUF conversion by ``gguf_checkpoint``).

Tensor names: the EAGLE-3 authors' checkpoints keep the decoder layer under ``midlayer.``, the
speculators ones under ``layers.0.``; some exports nest everything under ``model.``. Both carry
``fc.weight``, ``norm.weight``, ``lm_head.weight`` (the draft vocabulary's head), optionally
``embed_tokens.weight`` (Llama 3.3 70B's drafter has its own) and ``input_norm.weight``
(``norm_before_fc``), and the vocabulary maps: ``d2t`` (int, one per draft token: the *offset*
to add to the draft id to get the target id) and ``t2d`` (bool, one per target token: whether it
is in the draft vocabulary; not needed to draft, so not read).

A checkpoint whose head scores fewer tokens than the target has must carry ``d2t``; one without a
head borrows the target's and must not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from mlxcel.drafters.eagle3.network import Eagle3Network
from mlxcel.drafters.eagle3.spec import Eagle3Spec, read_spec
from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model.config_file import read_config_json

_VOCABULARY_MAPS = ("d2t", "t2d")


@dataclass
class Eagle3Checkpoint:
    """A loaded drafter: the network, its description, and ``target_ids`` (the target token id of
    each draft token, absolute; None when the draft vocabulary is the target's)."""

    network: Eagle3Network
    spec: Eagle3Spec
    target_ids: np.ndarray | None
    where: str


def _safetensors(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return [path / name for name in sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))]
    return sorted(path.glob("*.safetensors"))


def _tensors(path: Path) -> dict[str, mx.array]:
    files = _safetensors(path)
    if not files:
        raise ModelLoadError(f"{path}: no *.safetensors weights next to config.json")
    out: dict[str, mx.array] = {}
    for f in files:
        try:
            loaded = mx.load(str(f))
        except Exception as exc:  # a truncated or foreign file
            raise ModelLoadError(f"{f}: cannot read safetensors ({exc})") from exc
        for name, value in loaded.items():
            if name.startswith("model."):
                name = name[len("model."):]
            if name.startswith("midlayer."):
                name = "layers.0." + name[len("midlayer."):]
            out[name] = value
    return out


def target_ids_from_offsets(d2t: mx.array | None) -> np.ndarray | None:
    """``d2t`` as stored in the safetensors (offsets) -> absolute target ids."""
    if d2t is None:
        return None
    offsets = np.asarray(d2t.astype(mx.int64)).reshape(-1)
    return offsets + np.arange(offsets.size, dtype=np.int64)


def load_directory(path: str | Path, *, dtype: mx.Dtype | None = mx.float32) -> Eagle3Checkpoint:
    """Read an EAGLE-3 checkpoint directory (float32 by default, as targets run on this CPU build)."""
    path = Path(path).expanduser()
    config = read_config_json(path, f"{path}: an EAGLE-3 drafter is a directory with config.json and safetensors "
                                    "(or a GGUF file as llama.cpp converts it)")
    spec = read_spec(config, str(path))
    tensors = _tensors(path)
    d2t = tensors.pop("d2t", None)
    tensors.pop("t2d", None)
    return build(spec, tensors, target_ids_from_offsets(d2t), str(path), dtype=dtype)


def _check_vocabulary(spec: Eagle3Spec, head_rows: int | None, target_ids: np.ndarray | None, where: str) -> None:
    if head_rows is None:
        if target_ids is not None:
            raise ModelLoadError(f"{where}: a d2t vocabulary map but no lm_head to score the draft vocabulary")
        return
    declared = spec.draft_vocab_size
    if declared is not None and declared != head_rows:
        raise ModelLoadError(f"{where}: draft_vocab_size is {declared}, but lm_head scores {head_rows} tokens")
    if target_ids is None:
        if spec.vocab_size is not None and head_rows != spec.vocab_size:
            raise ModelLoadError(f"{where}: lm_head scores {head_rows} draft tokens, the target vocabulary has "
                                 f"{spec.vocab_size}, and there is no d2t map between them")
        return
    if target_ids.size != head_rows:
        raise ModelLoadError(f"{where}: d2t maps {target_ids.size} draft tokens, lm_head scores {head_rows}")
    if target_ids.min() < 0 or (spec.vocab_size is not None and target_ids.max() >= spec.vocab_size):
        raise ModelLoadError(f"{where}: d2t maps draft tokens outside the target vocabulary "
                             f"(target ids {int(target_ids.min())}..{int(target_ids.max())}, vocabulary {spec.vocab_size})")
    if np.unique(target_ids).size != target_ids.size:
        raise ModelLoadError(f"{where}: d2t maps two draft tokens to one target token")


def _check_fusion(spec: Eagle3Spec, fc_input: int, where: str) -> None:
    width = spec.target_hidden_size or spec.hidden_size
    if fc_input % width:
        raise ModelLoadError(f"{where}: fc reads {fc_input} features, not a whole number of {width}-wide target layers")
    if spec.fc_input is not None and spec.fc_input != fc_input:
        raise ModelLoadError(f"{where}: fc reads {fc_input} features, but the config names "
                             f"{len(spec.aux_layer_ids)} target layers of width {width}")
    if spec.aux_layer_ids is None and fc_input != 3 * width:
        raise ModelLoadError(f"{where}: fc reads {fc_input // width} target layers but the config does not say which "
                             "(eagle_aux_hidden_state_layer_ids); only the default three can be assumed")


def build(spec: Eagle3Spec, tensors: dict[str, mx.array], target_ids: np.ndarray | None, where: str, *,
          dtype: mx.Dtype | None = mx.float32) -> Eagle3Checkpoint:
    """The network for ``spec`` with ``tensors`` (our names) loaded, every shape and map checked."""
    if "fc.weight" not in tensors:
        raise ModelLoadError(f"{where}: the EAGLE-3 drafter has no fc.weight (the fusion of the target's layers)")
    fc_input = int(tensors["fc.weight"].shape[1])
    head = tensors.get("lm_head.weight")
    embed = tensors.get("embed_tokens.weight")
    head_rows = None if head is None else int(head.shape[0])
    _check_fusion(spec, fc_input, where)
    _check_vocabulary(spec, head_rows, target_ids, where)
    network = Eagle3Network(spec, fc_input=fc_input, head_rows=head_rows,
                            embed_rows=None if embed is None else int(embed.shape[0]))
    expected = {k for k, _ in tree_flatten(network.parameters())}
    missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing or extra:
        detail = "; ".join(p for p in (f"missing {missing[:4]}" if missing else "",
                                      f"unexpected {extra[:4]}" if extra else "") if p)
        raise ModelLoadError(f"{where}: the EAGLE-3 drafter's tensors do not match its config ({detail})")
    if dtype is not None:
        tensors = {k: v.astype(dtype) for k, v in tensors.items()}
    try:
        network.load_weights(list(tensors.items()), strict=True)
    except ValueError as exc:
        raise ModelLoadError(f"{where}: {exc}") from exc
    mx.eval(network.parameters())
    network.eval()
    return Eagle3Checkpoint(network, spec, target_ids, where)
