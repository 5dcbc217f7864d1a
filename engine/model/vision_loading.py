"""The vision tower a loaded text model gets, if any: which projector, from where, and when none.

Three sources, the first that applies:

1. ``--mmproj FILE``: that projector GGUF, whatever the model; a kind mlxcel does not run, or mlx-vlm
   missing, is an error (the user asked for images);
2. an MLX / Hugging Face vision checkpoint given with ``-m DIR`` (its ``config.json`` has a
   ``vision_config``): its own tower;
3. ``-hf``'s repository projector (recorded by ``hub``), fetched into the Hugging Face cache.

(2) and (3) are automatic, and ``--no-mmproj`` turns them off, as upstream's flag does for (3); when
they cannot be served (mlx-vlm not installed, a projector kind mlxcel does not run) the model is
served as a text model with a warning saying why, as it was before vision existed. mlx-vlm is the
``vision`` extra (``pip install 'mlxcel[vision]'``) and is imported only here and below.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model.hub import cached_snapshot, download
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.platform import device

log = logging.getLogger(__name__)

EXTRA = "pip install 'mlxcel[vision]'"


def vision_available() -> bool:
    """Whether the ``vision`` extra is installed: mlx-vlm and Pillow."""
    return all(importlib.util.find_spec(name) is not None for name in ("mlx_vlm", "PIL"))


def attach_vision(loaded: LoadedModel, *, mmproj: str | Path | None = None, auto: bool = True,
                  hub: tuple[str, str] | None = None, sharded: bool = False) -> None:
    """Load and attach ``loaded``'s vision tower as the module docstring says (``hub``: the ``-hf``
    repository and its projector's file name)."""
    source = _source(loaded, mmproj, auto, hub)
    if source is None:
        return
    explicit = mmproj is not None
    if sharded:
        if explicit:
            raise ModelLoadError("images are not served across ranks (mlx.launch); start without --mmproj")
        log.warning("%s has a vision tower; images are not served across ranks: serving it as a text model",
                    loaded.path)
        return
    if not vision_available():
        if explicit:
            raise ModelLoadError(f"--mmproj needs mlx-vlm and Pillow, which are not installed; {EXTRA}")
        log.warning("%s has a vision tower, but mlx-vlm / Pillow are not installed (%s): serving it as a text model",
                    loaded.path, EXTRA)
        return
    from mlxcel.engine.vision.loading import attach, load_from_dir, load_from_mmproj  # noqa: PLC0415 - defers mlx-vlm

    try:
        if source == "dir":
            tower = load_from_dir(loaded.path, loaded.config, device.compute_dtype())
        else:
            tower = load_from_mmproj(_local(source, hub), device.compute_dtype())
        attach(tower, loaded.model, loaded.tokenizer, loaded.config)
    except ModelLoadError as exc:
        if explicit:
            raise
        log.warning("%s; serving %s as a text model", exc, loaded.path.name)
        return
    loaded.vision = tower


def _source(loaded: LoadedModel, mmproj, auto: bool, hub) -> str | Path | None:
    if mmproj is not None:
        path = Path(mmproj).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"multimodal projector not found: {path}")
        return path
    if not auto:
        return None
    if loaded.source == "mlx" and isinstance(loaded.config.get("vision_config"), dict) and loaded.config["vision_config"]:
        return "dir"
    if hub is not None:
        return "hub"
    return None


def _local(source, hub: tuple[str, str] | None) -> Path:
    """The projector file: the path given, or ``-hf``'s fetched into the cache (a cached copy is used as it is)."""
    if source != "hub":
        return source
    repo, name = hub
    snapshot = cached_snapshot(repo)
    if snapshot is not None and (snapshot.root / name).is_file():
        return snapshot.root / name
    return download(repo, name)
