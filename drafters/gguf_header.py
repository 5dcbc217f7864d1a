"""A GGUF drafter's architecture name, read from the first keys of its header, nothing else.

The registry recognises a drafter-only checkpoint by structure before anything heavy loads; for a
directory that structure is its config.json, for a GGUF file (llama.cpp converts EAGLE-3 drafters
to one) it is ``general.architecture``. ``engine.gguf.file.read_gguf`` would read it too, but it
walks the whole header, a converted drafter's copy of the target's vocabulary included, and pulls
in numpy and the ``gguf`` package: too much for a command-line check. llama.cpp's writer puts the
architecture first, so reading stops there (or after a few keys, giving up quietly).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

ARCHITECTURE_KEY = "general.architecture"
_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9  # GGUF value type ids
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_KEYS_SCANNED = 16
_LONGEST_STRING = 1 << 20


class _Unreadable(Exception):
    pass


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise _Unreadable
    return data


def _u32(f: BinaryIO) -> int:
    return struct.unpack("<I", _read(f, 4))[0]


def _u64(f: BinaryIO) -> int:
    return struct.unpack("<Q", _read(f, 8))[0]


def _string(f: BinaryIO) -> str:
    n = _u64(f)
    if n > _LONGEST_STRING:
        raise _Unreadable
    return _read(f, n).decode("utf-8", errors="replace")


def _skip(f: BinaryIO, vtype: int) -> None:
    """Step over one value of type ``vtype``."""
    if vtype == _STRING:
        f.seek(_u64(f), 1)
    elif vtype == _ARRAY:
        item, count = _u32(f), _u64(f)
        if item in _SCALAR_SIZES:
            f.seek(count * _SCALAR_SIZES[item], 1)
        elif count <= _KEYS_SCANNED:
            for _ in range(count):
                _skip(f, item)
        else:  # a vocabulary, say: the architecture is not coming soon
            raise _Unreadable
    elif vtype in _SCALAR_SIZES:
        f.seek(_SCALAR_SIZES[vtype], 1)
    else:
        raise _Unreadable


def gguf_architecture(path: str | Path) -> str | None:
    """``general.architecture`` of the GGUF file ``path``, or None (not a GGUF file, unreadable, or
    the key is not among the first few)."""
    try:
        with open(Path(path).expanduser(), "rb") as f:
            if f.read(4) != _MAGIC:
                return None
            _u32(f)  # version
            _u64(f)  # tensor count
            for _ in range(min(_u64(f), _KEYS_SCANNED)):
                key, vtype = _string(f), _u32(f)
                if key == ARCHITECTURE_KEY and vtype == _STRING:
                    return _string(f)
                _skip(f, vtype)
    except (OSError, _Unreadable, struct.error):
        return None
    return None
