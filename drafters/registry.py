"""Drafter kinds: what a ``--draft-model`` checkpoint is, and what ``mlxcel generate`` does with it.

Two questions with different answers:

* *Structure* (``drafters.checkpoints.drafter_structure``): is the checkpoint a
  drafter-only network (DFlash, DSpark, Muse Glimmer assistant) that borrows the target's
  embeddings and head? Such a checkpoint is not a model by itself; the offline CLI refuses it
  before loading anything, whatever flags were given, and points at ``mlxcel-server``.
* *Kind* (``detect_drafter_kind``): the label a drafter's config.json resolves to. An ordinary
  small full model carries no kind of its own and resolves to the default, ``dflash``. The
  offline CLI prints that label and then says plainly that it runs the classic draft-model loop
  regardless; choosing a kind-specific round loop with ``--draft-kind`` is a server feature
  (``mlxcel-server`` runs every model-based kind: ``server.runtime.speculation``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mlxcel.drafters.checkpoints import drafter_structure
from mlxcel.engine.errors import MlxcelError

DRAFTER_KINDS = ("dflash", "dspark", "muse-glimmer", "mtp", "internal-mtp", "prompt-lookup")
DEFAULT_DRAFTER_KIND = "dflash"
DEFAULT_BLOCK_SIZE = 16
SERVER_COMMAND = "mlxcel-server"
# How mlxcel-server is asked for each kind's round loop.
SERVER_FLAGS = {"dflash": "--spec-type draft-dflash -md DIR", "dspark": "--spec-type draft-dspark -md DIR",
                "muse-glimmer": "--draft-kind muse-glimmer -md DIR", "mtp": "--spec-type draft-mtp",
                "internal-mtp": "--draft-kind internal-mtp", "prompt-lookup": "--spec-type ngram-simple",
                "draft-model": "--spec-type draft-simple -md FILE"}


@dataclass(frozen=True)
class ResolvedKind:
    kind: str
    detail: str  # e.g. "block_size = 16, default"


def read_drafter_config(path: str | Path) -> dict:
    """config.json of a drafter directory; ``{}`` for a single-file (GGUF) drafter or a path
    without one (loading then reports what is wrong)."""
    config_file = Path(path).expanduser() / "config.json"
    if not config_file.is_file():
        return {}
    try:
        return json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def refuse_drafter_only_checkpoint(path: str | Path, config: dict | None = None) -> None:
    """Raise a clear error when ``path`` is a drafter-only checkpoint the classic path cannot run."""
    config = read_drafter_config(path) if config is None else config
    family = drafter_structure(config)
    if family is not None:
        raise MlxcelError(
            f"{path} is a {family} drafter checkpoint: it has no embeddings or LM head of its own and "
            f"borrows the target's, so mlxcel generate cannot run it as a draft model. "
            f"A {family} drafter runs in {SERVER_COMMAND}'s {_round_loop(family)} instead "
            f"({SERVER_COMMAND} -m TARGET {SERVER_FLAGS[family].replace('DIR', str(path))})."
        )


def _round_loop(family: str) -> str:
    """The server round loop a drafter-only checkpoint of ``family`` runs on."""
    return "MTP round loop" if family == "mtp" else "DFlash round loop"


def detect_drafter_kind(config: dict) -> ResolvedKind:
    """The drafter kind a config.json resolves to when no ``--draft-kind`` is given."""
    family = drafter_structure(config)
    block_size = (config.get("dflash_config") or {}).get("block_size") or config.get("block_size")
    if family is not None:
        detail = f"block_size = {block_size}" if block_size else "from config.json"
        return ResolvedKind(family, detail)
    text_config = config.get("text_config") or {}
    for source in (config, text_config):  # multimodal wrappers (Qwen3.5) nest the language model's keys
        for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
            if int(source.get(key) or 0) > 0:
                return ResolvedKind("mtp", f"{key} = {source[key]}")
    return ResolvedKind(DEFAULT_DRAFTER_KIND, f"block_size = {block_size or DEFAULT_BLOCK_SIZE}, default")


def auto_detected_kind_lines(resolved: ResolvedKind) -> list[str]:
    """What ``mlxcel generate`` prints when the kind was only auto-detected."""
    return [
        f"Resolved drafter kind: {resolved.kind} ({resolved.detail})",
        "Drafter kind was auto-detected only; mlxcel generate runs the classic draft-model path "
        f"(kind-specific round loops run in {SERVER_COMMAND}, selected there with --draft-kind).",
    ]


def explicit_kind_error(kind: str) -> MlxcelError:
    """``--draft-kind`` given to ``mlxcel generate``: refused, with the reason."""
    hint = " (for prompt lookup use --prompt-lookup)" if kind == "prompt-lookup" else ""
    flags = SERVER_FLAGS.get(kind, f"--draft-kind {kind}")
    server = f"{SERVER_COMMAND} {flags}"
    return MlxcelError(
        f"--draft-kind {kind}: mlxcel generate does not construct kind-specific round loops; it runs only "
        f"the classic draft-model path (--draft-model){hint}. Kind-specific round loops run in "
        f"{server}; or drop --draft-kind."
    )


def load_model_drafter(path: str | Path, *, target_vocab_size: int | None = None, eos_token_ids=(), tokenizer=None):
    """The model-based drafter a drafter-only checkpoint describes (DFlash, DSpark or Muse Glimmer
    assistant, by structure), loaded and ready to bind to its target."""
    from mlxcel.drafters.dflash.drafter import DFlashDrafter
    from mlxcel.drafters.dflash.dspark import DSparkDrafter
    from mlxcel.drafters.dflash.muse_glimmer import MuseGlimmerDrafter

    family = drafter_structure(read_drafter_config(path))
    classes = {"dflash": DFlashDrafter, "dspark": DSparkDrafter, "muse-glimmer": MuseGlimmerDrafter}
    if family not in classes:
        raise MlxcelError(f"{path} is not a DFlash, DSpark or Muse Glimmer assistant drafter checkpoint "
                          "(its config.json names none of their structures)")
    return classes[family].load(path, target_vocab_size=target_vocab_size, eos_token_ids=eos_token_ids,
                                tokenizer=tokenizer)

