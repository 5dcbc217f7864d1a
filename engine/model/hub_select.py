"""Which files of a Hugging Face repository ``-hf <user>/<model>[:quant]`` means, decided from the
repository's file names alone, by the rules llama.cpp's downloader applies (so a command line picks
the same file here as there):

- the quant is matched case-insensitively against each file's path, followed by ``.`` or ``-``
  (``:q8_0`` picks ``model-Q8_0.gguf``); with no quant, ``Q4_K_M``, then ``Q8_0``, then the first
  model GGUF of the listing;
- sidecar files (``mmproj``, ``imatrix``, ``mtp-``, ``eagle3-``, ``dflash-``, ``dspark-``) are never
  the model;
- a split GGUF (``name-00001-of-00003.gguf``) is chosen by its first part and fetched with all its
  parts;
- the multimodal projector that goes with the model is picked too (the ``mmproj`` file in the
  model's directory or above it, nearest in bits per weight), to be recorded: mlxcel serves text;
- ``-hff`` names the file outright and overrides the quant;
- a repository with no model GGUF at all is a model directory (MLX / safetensors), fetched whole.

No I/O here: ``hub.py`` lists the cache or the hub and hands the names in. Light (no
huggingface_hub), so the command line can check a ``-hf`` value before anything loads.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from mlxcel.engine.errors import ModelLoadError

DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")  # upstream's preference when -hf names no quant
SIDECAR_MARKERS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
DIRECTORY_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken")
REPO_FORMAT = "expected <user>/<model>[:quant]"
_SPLIT = re.compile(r"^(.+)-(\d{5})-of-(\d{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_LISTED = 24  # file names an error message lists at most


@dataclass(frozen=True)
class SplitName:
    """A GGUF path's parts: ``prefix`` (the name without ``.gguf`` and the split suffix, the quant
    included), ``tag`` (the quant, upper case; "" when the name has none), and the split position."""

    prefix: str
    tag: str
    index: int = 1
    count: int = 1


@dataclass(frozen=True)
class RepoChoice:
    """What to fetch from ``repo``: ``files`` (repository paths); ``primary`` is the GGUF to load (the
    first part of a split one), or None when the repository is a model directory; ``mmproj`` is the
    projector that goes with the model (recorded, not fetched)."""

    repo: str
    tag: str
    files: tuple[str, ...]
    primary: str | None
    mmproj: str | None = None


def split_repo_tag(text: str) -> tuple[str, str]:
    """``"<user>/<model>[:quant]"`` -> (repo, quant); a malformed repository is a ModelLoadError."""
    parts = text.strip().split(":")
    repo, tag = parts[0], parts[-1] if len(parts) > 1 else ""
    halves = repo.split("/")
    if len(halves) != 2 or not all(h.strip() for h in halves):
        raise ModelLoadError(f"invalid Hugging Face repo {text!r}: {REPO_FORMAT}")
    return repo, tag.strip()


def split_name(path: str) -> SplitName | None:
    """The parts of a ``.gguf`` path (None for any other file)."""
    if not path.lower().endswith(".gguf"):
        return None
    prefix, index, count = path[: -len(".gguf")], 1, 1
    m = _SPLIT.match(prefix)
    if m:
        prefix, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    t = _TAG.search(prefix)
    return SplitName(prefix, t.group(1).upper() if t else "", index, count)


def is_model_gguf(path: str) -> bool:
    """A GGUF that holds a model, not a sidecar (judged by its file name, as upstream judges it)."""
    name = path.rsplit("/", 1)[-1]
    return name.lower().endswith(".gguf") and not any(marker in name for marker in SIDECAR_MARKERS)


def _first_part(path: str) -> bool:
    split = split_name(path)
    return split is not None and (split.count <= 1 or split.index == 1)


def quant_bits(tag: str) -> int:
    """The leading number of a quant tag: Q4_K_M -> 4, F16 -> 16, BF16 -> 16; 0 without one."""
    m = re.search(r"\d+", tag)
    return int(m.group(0)) if m else 0


def pick_gguf(files: list[str], tag: str) -> str | None:
    """The model GGUF a quant (or, for "", the default preference) selects; None when none does."""
    for quant in (tag,) if tag else DEFAULT_QUANTS:
        pattern = re.compile(re.escape(quant) + r"[.-]", re.IGNORECASE)
        for f in files:
            if is_model_gguf(f) and pattern.search(f) and _first_part(f):
                return f
    if not tag:
        return next((f for f in files if is_model_gguf(f) and _first_part(f)), None)
    return None


def split_parts(files: list[str], primary: str) -> tuple[str, ...]:
    """Every part of ``primary``'s split GGUF, in order (just ``primary`` when it is not split); a
    listing that lacks a part is a ModelLoadError naming it."""
    split = split_name(primary)
    if split is None or split.count <= 1:
        return (primary,)
    by_index = {}
    for f in files:
        s = split_name(f)
        if s is not None and s.prefix == split.prefix and s.count == split.count:
            by_index[s.index] = f
    missing = [i for i in range(1, split.count + 1) if i not in by_index]
    if missing:
        raise ModelLoadError(f"{primary} is split in {split.count} parts, and part(s) "
                             f"{', '.join(str(i) for i in missing)} are missing from the listing")
    return tuple(by_index[i] for i in range(1, split.count + 1))


def pick_sibling(files: list[str], model: str, keyword: str, tag: str = "") -> str | None:
    """The GGUF whose name holds ``keyword`` (``mmproj``) that goes with ``model``: it must sit in the
    model's directory or one above it; the deepest wins, then one named for ``tag``, then the one
    nearest the model (or the tag) in bits per weight."""
    model_dirs = model.split("/")[:-1]
    target_bits = quant_bits(tag.upper()) if tag else quant_bits((split_name(model) or SplitName("", "")).tag)
    best, best_key = None, None
    for f in files:
        if not f.endswith(".gguf") or keyword not in f:
            continue
        dirs = f.split("/")[:-1]
        if dirs != model_dirs[: len(dirs)]:
            continue
        exact = bool(tag) and f"-{tag.upper()}." in f.upper()
        bits = quant_bits((split_name(f) or SplitName("", "")).tag)
        key = (len(dirs), exact, -abs(bits - target_bits))
        if best_key is None or key > best_key:
            best, best_key = f, key
    return best


def available(files: list[str]) -> str:
    """The model GGUFs of a listing, for an error message: their quants, then their names."""
    models = [f for f in files if is_model_gguf(f) and _first_part(f)]
    if not models:
        return "no GGUF files"
    quants = sorted({s.tag for s in map(split_name, models) if s is not None and s.tag})
    names = ", ".join(models[:_LISTED]) + (f", ... ({len(models) - _LISTED} more)" if len(models) > _LISTED else "")
    return (f"quants {', '.join(quants)}; " if quants else "") + f"GGUF files {names}"


def choose_files(spec: str, files: list[str], hf_file: str | None = None) -> RepoChoice:
    """What ``spec`` (``-hf``'s value) and ``hf_file`` (``-hff``'s) select from a repository whose
    files are ``files``; a ModelLoadError that lists what the repository has when nothing fits."""
    repo, tag = split_repo_tag(spec)
    files = sorted(files)
    if hf_file:
        if hf_file not in files:
            raise ModelLoadError(f"{repo} has no file {hf_file!r} (-hff); it has {available(files)}")
        parts = split_parts(files, hf_file) if hf_file.endswith(".gguf") else (hf_file,)
        return RepoChoice(repo, tag, parts, hf_file, _mmproj(files, hf_file))
    primary = pick_gguf(files, tag)
    if primary is not None:
        return RepoChoice(repo, tag, split_parts(files, primary), primary, _mmproj(files, primary))
    if any(is_model_gguf(f) for f in files):
        raise ModelLoadError(f"{repo} has no GGUF file for quant {tag!r} (matched case-insensitively "
                             f"against the file names); it has {available(files)}")
    if tag:
        raise ModelLoadError(f"{repo} has no GGUF files, so :{tag} selects nothing; it is a model directory "
                             "(drop the :quant)" if "config.json" in files else
                             f"{repo} has no GGUF files, so :{tag} selects nothing")
    if "config.json" not in files:
        shown = ", ".join(files[:_LISTED]) or "none"
        raise ModelLoadError(f"{repo} has neither a GGUF file nor a config.json, so it is not a model "
                             f"repository (files: {shown})")
    wanted = tuple(f for f in files if any(fnmatch.fnmatch(f, p) for p in DIRECTORY_PATTERNS))
    return RepoChoice(repo, tag, wanted, None)


def _mmproj(files: list[str], model: str) -> str | None:
    return pick_sibling(files, model, "mmproj") if model.endswith(".gguf") else None
