"""Slot files (``--slot-save-path`` with ``POST /slots/:id?action=save|restore|erase``): a slot's KV
cache and the tokens it holds written to, and read back from, a file in that directory, with
upstream's result bodies.

Each action runs on the engine thread (``Scheduler.call``) and waits while its slot is busy, as
upstream defers it. A restored slot is exactly a slot that had just run those tokens: the next
request with that prefix reuses it (``cache_n``). File names follow upstream's rules
(``valid_filename``): no separators, no ``..``, no control or reserved characters, at most 255
bytes, so a name can only ever point inside the directory. A file is written under a short temporary
name of fixed length beside it and renamed, so even a 255-byte name (the file system's limit) saves.

Error bodies never show where the directory is: the client knows its file name, the server's paths
are the operator's business (the log has the details).

A slot whose cache holds images keeps them in its file as their digests, places and position shift
(``Slot.media_key``), after the model's fingerprint: a restored slot's prefix is then reused only by a
prompt with the same images, as the slot that saved it would have been.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from pathlib import Path

from safetensors import safe_open

from mlxcel.engine.cache.cache_file import CacheFileError, load_cache_file, save_cache_file
from mlxcel.engine.cache.kv_cache import cache_length
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.vision.prompt import NO_MEDIA, MediaKey
from mlxcel.server.runtime.errors import ApiError, invalid
from mlxcel.server.runtime.scheduler import Scheduler
from mlxcel.server.runtime.slots import Slot
from mlxcel.server.runtime.task import Deferred

log = logging.getLogger(__name__)

# code points a file name may not hold (besides C0/C1 controls, DEL and the path separators)
_FORBIDDEN = set(':*?"<>|') | {0xFF0E, 0x2215, 0x2216, 0xFFFD, 0xFEFF}


def valid_filename(name: object) -> bool:
    """Upstream's ``fs_validate_filename``: 1-255 bytes of UTF-8, no control characters, no
    ``/ \\ : * ? " < > |`` (nor their full-width look-alikes), no surrogates, BOM or replacement
    character, no leading or trailing space, no trailing dot, no ``..`` anywhere, not ``.``."""
    if not isinstance(name, str) or not name:
        return False
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate
        return False
    if size > 255:
        return False
    for ch in name:
        c = ord(ch)
        if c <= 0x1F or c == 0x7F or 0x80 <= c <= 0x9F or 0xD800 <= c <= 0xDFFF or ch in "/\\" \
                or ch in _FORBIDDEN or c in _FORBIDDEN:
            return False
    return not (name[0] == " " or name[-1] in " ." or ".." in name or name == ".")


def model_fingerprint(lm: LoadedModel) -> str:
    """What a slot file must have been saved from to be restored here: the model's shape."""
    c = lm.config
    keys = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim")
    return json.dumps({k: c.get(k) for k in keys} | {"vocab": lm.vocab_size}, sort_keys=True)


def _slot(scheduler: Scheduler, id_slot: int) -> Slot:
    if not 0 <= id_slot < len(scheduler.slots):
        raise invalid("Invalid slot ID")
    slot = scheduler.slots[id_slot]
    if slot.busy:
        raise Deferred()
    return slot


def _without_paths(text: str, path: Path) -> str:
    """``text`` (an I/O error's) with the directory of ``path`` taken out of every path it names."""
    directory = str(path.parent)
    return text.replace(directory + os.sep, "").replace(directory, "")


_MEDIA = "|images="  # between the model's fingerprint and the slot's images in a file's "model" field


def _stored_fingerprint(lm: LoadedModel, media: MediaKey) -> str:
    """The fingerprint a slot file is written with: the model's, and the images its cache holds."""
    base = model_fingerprint(lm)
    return base if media == NO_MEDIA else base + _MEDIA + json.dumps([list(map(list, media[0])), media[1]])


def _file_media(path: Path, lm: LoadedModel) -> tuple[str, MediaKey]:
    """The fingerprint ``path`` was written with, when it is this model's, and the images it holds
    (the safetensors header only; the cache loader checks everything else)."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            stored = (f.metadata() or {}).get("model", "")
    except Exception:
        return model_fingerprint(lm), NO_MEDIA  # not a safetensors file: the loader says what it is
    base, sep, images = stored.partition(_MEDIA)
    if not sep or base != model_fingerprint(lm):
        return model_fingerprint(lm), NO_MEDIA
    try:
        spans, shift = json.loads(images)
        return stored, (tuple((int(a), int(b), str(c)) for a, b, c in spans), int(shift))
    except (ValueError, TypeError):
        raise CacheFileError(f"{path.name} has malformed image metadata") from None


def _write(path: Path, cache, tokens: list[int], fingerprint: str) -> int:
    """Write the file under a fixed-length temporary name beside ``path`` (whatever the length of
    ``path``'s name, which may already be the file system's limit), then rename it into place."""
    tmp = path.with_name(f".slot-{secrets.token_hex(8)}.tmp")
    try:
        n_bytes = save_cache_file(tmp, cache, tokens, fingerprint)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return n_bytes


def save(scheduler: Scheduler, id_slot: int, filename: str, path: Path) -> dict:
    """Write slot ``id_slot``'s cache and tokens to ``path`` (engine thread)."""
    slot = _slot(scheduler, id_slot)
    t0 = time.perf_counter()
    tokens = list(slot.tokens) if slot.cache is not None else []
    if slot.cache is not None and tokens and cache_length(slot.cache) != len(tokens):
        raise ApiError("Unable to save slot: its cache does not match its tokens", "server_error")
    try:
        media = slot.media_key if tokens else NO_MEDIA
        n_bytes = _write(path, slot.cache if tokens else None, tokens, _stored_fingerprint(scheduler.lm, media))
    except CacheFileError as exc:
        raise ApiError(str(exc), "not_supported_error") from None
    except (OSError, RuntimeError) as exc:  # RuntimeError: MLX's writer, whose text names the full path
        log.error("slot %d: cannot write %s: %s", id_slot, path, exc)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"cannot write {filename}"
        raise ApiError(f"Unable to save slot: {reason}", "server_error") from None
    return {"id_slot": id_slot, "filename": filename, "n_saved": len(tokens), "n_written": n_bytes,
            "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}


def restore(scheduler: Scheduler, id_slot: int, filename: str, path: Path) -> dict:
    """Load ``path`` into slot ``id_slot`` (engine thread). On any failure the slot is left empty
    and usable, and the error is upstream's 400 ``Unable to restore slot: ...``."""
    slot = _slot(scheduler, id_slot)
    t0 = time.perf_counter()
    lm = scheduler.lm
    slot.cache, slot.tokens = None, []
    try:
        if not path.is_file():
            raise CacheFileError(f"no slot file named {filename}")
        fingerprint, media = _file_media(path, lm)
        cache, tokens, n_bytes = load_cache_file(path, fingerprint, lm.make_cache())
        if len(tokens) > slot.n_ctx:
            raise CacheFileError("Restored prompt does not fit in the slot context")
        if any(not 0 <= t < lm.vocab_size for t in tokens):
            raise CacheFileError("Invalid tokens in slot save file")
        if tokens and cache_length(cache) != len(tokens):
            raise CacheFileError("the cache in the file does not hold its tokens")
        if scheduler.pool is not None and not scheduler.pool.make_room(scheduler.slots, len(tokens)):
            raise CacheFileError("No available space in KV cache")
    except (CacheFileError, OSError, RuntimeError, TypeError, ValueError, KeyError, IndexError) as exc:
        log.warning("slot %d: cannot restore %s: %s", id_slot, path, exc)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else _without_paths(str(exc), path)
        raise invalid(f"Unable to restore slot: {reason}") from None
    if tokens:
        slot.cache, slot.tokens, slot.media_key = cache, tokens, media
    slot.last_used = time.perf_counter()
    return {"id_slot": id_slot, "filename": filename, "n_restored": len(tokens), "n_read": n_bytes,
            "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}


def erase(scheduler: Scheduler, id_slot: int) -> dict:
    """Drop slot ``id_slot``'s cached tokens (engine thread)."""
    slot = _slot(scheduler, id_slot)
    n = len(slot.tokens) if slot.cache is not None else 0
    slot.cache, slot.tokens = None, []
    return {"id_slot": id_slot, "n_erased": n}
