"""Read a GGUF file's header: its metadata and where each tensor's raw bytes lie.

Written by hand (about a hundred lines) rather than taken from a library because neither
ready-made reader fits a model server:

- ``gguf.GGUFReader`` builds a numpy view per array item, which takes seconds for a
  50k-token vocabulary (and grows with 150k-token ones) before a single weight is read;
- ``mx.load`` is fast, but hides each tensor's stored type, converts K-quants and BF16 to
  float16 on the way (a lossy step we cannot undo), and refuses Q5_0/Q5_1 outright.

Here the header is walked once with ``struct`` over a memory map; tensor data stays in the map
as numpy views (zero copy) until ``gguf_tensors`` converts it. The type enums and block sizes
come from the ``gguf`` package.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from mlxcel.engine.errors import ModelLoadError, UnsupportedQuantError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.FLOAT64: "<d",
    GGUFValueType.BOOL: "<?",
}
_NUMPY_DTYPES = {
    GGUFValueType.UINT8: np.uint8, GGUFValueType.INT8: np.int8,
    GGUFValueType.UINT16: np.uint16, GGUFValueType.INT16: np.int16,
    GGUFValueType.UINT32: np.uint32, GGUFValueType.INT32: np.int32,
    GGUFValueType.UINT64: np.uint64, GGUFValueType.INT64: np.int64,
    GGUFValueType.FLOAT32: np.float32, GGUFValueType.FLOAT64: np.float64,
    GGUFValueType.BOOL: np.bool_,
}


@dataclass
class TensorInfo:
    """One tensor as stored: ``shape`` in numpy order (rows first), ``data`` the raw bytes
    viewed as ``(rows, bytes_per_row)`` uint8 for block types, or the float array itself."""

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray

    @property
    def type_name(self) -> str:
        return self.qtype.name


@dataclass
class GGUFFile:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo] = field(default_factory=dict)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))


class _Cursor:
    """Bounds-checked little-endian reads over the mapped file."""

    def __init__(self, buf, path: Path):
        self.buf = buf
        self.pos = 0
        self.path = path

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise ModelLoadError(f"{self.path} is truncated or corrupt (header runs past the end of the file)")

    def scalar(self, fmt: str):
        size = struct.calcsize(fmt)
        self.need(size)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        self.need(n)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int):
        try:
            vtype = GGUFValueType(vtype)
        except ValueError:
            raise ModelLoadError(f"{self.path} is corrupt: unknown metadata value type {vtype}") from None
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            item_type = self.scalar("<I")
            count = self.scalar("<Q")
            if item_type in _NUMPY_DTYPES:
                dtype = np.dtype(_NUMPY_DTYPES[GGUFValueType(item_type)]).newbyteorder("<")
                self.need(count * dtype.itemsize)
                arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
                self.pos += count * dtype.itemsize
                return arr
            return [self.value(item_type) for _ in range(count)]
        return self.scalar(_SCALAR_FORMATS[vtype])


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse the header of ``path`` and map its tensors. Raises ``ModelLoadError`` for a file
    that is not GGUF, is truncated, or uses a tensor type numpy cannot address."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:  # ValueError: mmap of an empty file
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    cur = _Cursor(buf, path)
    if len(buf) < 24 or buf[:4] != MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file (bad magic or too short)")
    cur.pos = 4
    version = cur.scalar("<I")
    if version not in (2, 3):
        raise ModelLoadError(f"{path}: unsupported GGUF version {version} (only 2 and 3, little-endian)")
    n_tensors = cur.scalar("<Q")
    n_kv = cur.scalar("<Q")
    if n_tensors > len(buf) or n_kv > len(buf):
        raise ModelLoadError(f"{path} is corrupt (implausible tensor/metadata counts)")

    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar("<I"))

    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.scalar("<I")
        if n_dims > 8:
            raise ModelLoadError(f"{path} is corrupt: tensor {name!r} claims {n_dims} dimensions")
        dims = [cur.scalar("<Q") for _ in range(n_dims)]
        type_id = cur.scalar("<I")
        offset = cur.scalar("<Q")
        infos.append((name, dims, type_id, offset))

    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT)) or DEFAULT_ALIGNMENT
    data_start = -(-cur.pos // alignment) * alignment
    gguf_file = GGUFFile(path=path, version=version, metadata=metadata)
    for name, dims, type_id, offset in infos:
        gguf_file.tensors[name] = _map_tensor(buf, path, data_start, name, dims, type_id, offset)
    return gguf_file


def _map_tensor(buf, path: Path, data_start: int, name: str, dims: list[int], type_id: int, offset: int) -> TensorInfo:
    try:
        qtype = GGMLQuantizationType(type_id)
    except ValueError:
        raise UnsupportedQuantError(f"tensor {name!r} in {path} has unknown ggml type id {type_id}") from None
    shape = tuple(int(d) for d in reversed(dims))  # GGUF lists the innermost dimension first
    block, type_size = GGML_QUANT_SIZES[qtype]
    cols = shape[-1] if shape else 1
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    if cols % block:
        raise ModelLoadError(f"{path} is corrupt: tensor {name!r} ({qtype.name}) has {cols} columns, "
                             f"not a multiple of its block size {block}")
    row_bytes = cols // block * type_size
    nbytes = rows * row_bytes
    start = data_start + offset
    if start + nbytes > len(buf):
        raise ModelLoadError(f"{path} is truncated: tensor {name!r} ends past the end of the file")
    plain = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
             GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
             GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
             GGMLQuantizationType.I64: np.int64}
    if qtype in plain:
        data = np.frombuffer(buf, dtype=plain[qtype], count=rows * cols, offset=start).reshape(shape or (1,))
    else:
        data = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=start).reshape(*shape[:-1], row_bytes)
    return TensorInfo(name=name, qtype=qtype, shape=shape, data=data)
