"""N-gram cache files (``-lcs`` / ``-lcd``) in llama.cpp's format, so a file its ``llama-lookup-create``
or ``llama-lookup`` wrote serves here as it serves upstream.

The file is a run of records, all numbers 32-bit little-endian signed integers: an n-gram as four token
ids (a shorter n-gram padded with -1), how many distinct tokens followed it, then that many
(token, count) pairs. Nothing else: no header, no version.
"""

from __future__ import annotations

import struct
from pathlib import Path

from mlxcel.drafters.lookup.ngram_counts import NgramCounts
from mlxcel.engine.errors import MlxcelError

NGRAM_SLOTS = 4  # token ids an n-gram is written as
PAD = -1
_HEAD = struct.Struct(f"<{NGRAM_SLOTS}ii")
_PAIR = struct.Struct("<ii")


class CacheFileError(MlxcelError):
    """A lookup cache file that cannot be read (missing, truncated, or not in llama.cpp's format)."""


def load(path: str | Path) -> NgramCounts:
    """The statistics ``path`` holds (:class:`CacheFileError` when it cannot be read)."""
    try:
        data = Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise CacheFileError(f"cannot read lookup cache {path}: {exc.strerror or exc}") from None
    table: dict[tuple[int, ...], dict[int, int]] = {}
    at = 0
    while at < len(data):
        if at + _HEAD.size > len(data):
            raise CacheFileError(f"lookup cache {path} is truncated (a record head at byte {at})")
        *ngram, n_tokens = _HEAD.unpack_from(data, at)
        at += _HEAD.size
        end = at + n_tokens * _PAIR.size
        if n_tokens <= 0 or end > len(data):
            raise CacheFileError(f"lookup cache {path} is not in llama.cpp's format (a record at byte "
                                 f"{at - _HEAD.size} claims {n_tokens} tokens)")
        key = _ngram(ngram, path)
        part = table.setdefault(key, {})
        for token, count in _PAIR.iter_unpack(data[at:end]):
            if count <= 0:
                raise CacheFileError(f"lookup cache {path} holds a count of {count} (they are positive)")
            part[token] = part.get(token, 0) + count
        at = end
    return NgramCounts(table)


def save(counts: NgramCounts, path: str | Path) -> None:
    """Write ``counts`` to ``path`` in the same format."""
    out = bytearray()
    for ngram, part in counts.table.items():
        if not part or not 1 <= len(ngram) <= NGRAM_SLOTS:
            continue
        out += _HEAD.pack(*ngram, *[PAD] * (NGRAM_SLOTS - len(ngram)), len(part))
        for token, count in part.items():
            out += _PAIR.pack(token, count)
    Path(path).expanduser().write_bytes(bytes(out))


def _ngram(slots: list[int], path: str | Path) -> tuple[int, ...]:
    """The n-gram four padded token ids spell (padding only at the end)."""
    n = next((i for i, t in enumerate(slots) if t == PAD), NGRAM_SLOTS)
    if n == 0 or any(t != PAD for t in slots[n:]):
        raise CacheFileError(f"lookup cache {path} is not in llama.cpp's format (an n-gram {slots})")
    return tuple(slots[:n])
