"""The models a router serves, from upstream's sources:

- ``--models-dir DIR``: each ``*.gguf`` file in it (named by the file without ``.gguf``) and each
  subdirectory holding a model (named by the directory): a GGUF file (the first shard of a split
  one), with its ``*mmproj*`` projector and a ``mtp-`` / ``dspark-`` / ``dflash-`` drafter beside
  it, or an MLX / Hugging Face checkpoint (``config.json`` with ``*.safetensors``), which mlxcel
  also loads;
- ``--models-preset FILE``: an INI file, one ``[name]`` section per model whose keys are any of
  the server's flag names (``model``, ``hf-repo``, ``c``, ``LLAMA_ARG_CTX_SIZE``...), a ``[*]``
  section applied under every model, and the preset-only keys ``load-on-startup``,
  ``stop-timeout`` and ``dedup-cache-models``; a section named like a ``--models-dir`` model
  adds to it;

Every model's server then also gets the router's own command line (``--temp 0`` on the router
applies to every model), except the router's own settings and the model's source.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from mlxcel.server.router.options import LOAD_ON_STARTUP, MODEL_SOURCE, ROUTER_ONLY, STOP_TIMEOUT, normalize_key

DEFAULT_STOP_TIMEOUT_S = 10
DRAFT_PREFIXES = ("mtp-", "dspark-", "dflash-")


class CatalogError(Exception):
    """A model source cannot be read (the router does not start, or a reload fails)."""


@dataclass
class ModelEntry:
    name: str
    source: str  # preset | models_dir
    options: dict[str, str] = field(default_factory=dict)  # canonical flag name -> value
    aliases: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    hidden: bool = False

    @property
    def load_on_startup(self) -> bool:
        return self.options.get(LOAD_ON_STARTUP, "").strip().lower() in ("1", "true", "on", "enabled")

    @property
    def stop_timeout(self) -> float:
        try:
            return float(self.options.get(STOP_TIMEOUT, DEFAULT_STOP_TIMEOUT_S))
        except ValueError:
            return DEFAULT_STOP_TIMEOUT_S

    def child_options(self, router_options: dict[str, str]) -> dict[str, str]:
        """What this model's server runs with: its own options under the router's command line."""
        out = {k: v for k, v in self.options.items()}
        for key, value in router_options.items():
            if key not in ROUTER_ONLY and key not in MODEL_SOURCE:
                out[key] = value
        for key in ROUTER_ONLY:
            out.pop(key, None)
        return out


_SECTION = re.compile(r"^\s*\[\s*([^\]]+?)\s*\]\s*(?:[;#].*)?$")
_KV = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*=\s*(.*?)(?:\s+[;#].*|\s*)$")
_BLANK = re.compile(r"^\s*(?:[;#].*)?$")


def parse_ini(text: str, path: str) -> dict[str, dict[str, str]]:
    """Upstream's preset INI: ``[section]`` lines, ``key = value`` lines (a value ends at
    whitespace before ``;`` or ``#``), comment and blank lines; anything else is an error."""
    sections: dict[str, dict[str, str]] = {}
    current = ""
    for n, line in enumerate(text.splitlines(), start=1):
        if _BLANK.match(line):
            continue
        m = _SECTION.match(line)
        if m:
            current = m.group(1)
            sections.setdefault(current, {})
            continue
        m = _KV.match(line)
        if m:
            sections.setdefault(current, {})[m.group(1)] = m.group(2)
            continue
        raise CatalogError(f"failed to parse server preset file {path}: line {n}: {line.strip()[:80]!r}")
    return sections


def _preset_options(section: str, items: dict[str, str], path: str) -> dict[str, str]:
    out = {}
    for key, value in items.items():
        if key == "version":
            continue
        try:
            name, value = normalize_key(key, value)
        except KeyError:
            raise CatalogError(f"option '{key}' not recognized in preset '{section}' ({path})") from None
        out[name] = value
    return out


def load_presets(path: str) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """(the ``[*]`` options, {model name: options})."""
    if not os.path.exists(path):
        raise CatalogError(f"preset file does not exist: {path}")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"failed to open server preset file: {path}: {exc}") from None
    global_options: dict[str, str] = {}
    models: dict[str, dict[str, str]] = {}
    for section, items in parse_ini(text, path).items():
        name = section or "default"
        options = _preset_options(name, items, path)
        if name == "*":
            global_options = options
        elif name != "default" or options:
            models[name] = options
    return global_options, models


def _is_mlx_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def scan_models_dir(models_dir: str) -> dict[str, dict[str, str]]:
    root = Path(models_dir)
    if not root.is_dir():
        raise CatalogError(f"'{models_dir}' does not exist or is not a directory")
    out: dict[str, dict[str, str]] = {}
    for entry in sorted(root.iterdir()):
        if entry.is_dir():
            if _is_mlx_dir(entry):
                out[entry.name] = {"model": str(entry)}
                continue
            model = shard = mmproj = draft = None
            for f in sorted(entry.iterdir()):
                if not f.is_file() or not f.name.endswith(".gguf"):
                    continue
                if "mmproj" in f.name:
                    mmproj = f
                elif f.name.startswith(DRAFT_PREFIXES):
                    draft = draft or f
                elif "-00001-of-" in f.name:
                    shard = f
                else:
                    model = f
            path = shard or model
            if path is not None:
                options = {"model": str(path)}
                if mmproj is not None:
                    options["mmproj"] = str(mmproj)
                if draft is not None:
                    options["model-draft"] = str(draft)
                out[entry.name] = options
        elif entry.is_file() and entry.name.endswith(".gguf") and "mmproj" not in entry.name \
                and not entry.name.startswith(DRAFT_PREFIXES):
            out[entry.name.replace(".gguf", "")] = {"model": str(entry)}
    return out


def _csv(value: str | None) -> list[str]:
    return sorted({v.strip() for v in (value or "").split(",") if v.strip()})


def load_catalog(models_dir: str | None, models_preset: str | None) -> dict[str, ModelEntry]:
    """Every model, by name (a models-dir model that a preset names too is merged, the preset winning)."""
    global_options: dict[str, str] = {}
    presets: dict[str, dict[str, str]] = {}
    local = scan_models_dir(models_dir) if models_dir else {}
    if models_preset:
        global_options, presets = load_presets(models_preset)
    entries: dict[str, ModelEntry] = {}
    for name, options in local.items():
        entries[name] = ModelEntry(name, "models_dir", {**global_options, **options})
    for name, options in presets.items():
        if name in entries:
            entries[name].options.update(options)
            entries[name].source = "preset"
        else:
            entries[name] = ModelEntry(name, "preset", {**global_options, **options})
    # dedup-cache-models hides cache models a preset resolves to; no cache models are listed here
    _check_names(entries)
    return entries


def _check_names(entries: dict[str, ModelEntry]) -> None:
    """Aliases and tags from each model's ``alias`` / ``tags``; no alias may shadow another model."""
    seen: dict[str, str] = {}
    for entry in entries.values():
        entry.aliases = _csv(entry.options.get("alias"))
        entry.tags = _csv(entry.options.get("tags"))
        for alias in entry.aliases:
            if alias in entries and alias != entry.name:
                raise CatalogError(f"alias '{alias}' for model '{entry.name}' conflicts with existing model name")
            if alias in seen and seen[alias] != entry.name:
                raise CatalogError(f"alias '{alias}' for model '{entry.name}' conflicts with alias of model "
                                   f"'{seen[alias]}'")
            seen[alias] = entry.name
