"""What the KV cache holds: ``-ctk`` / ``-ctv`` (``--cache-type-k`` / ``--cache-type-v``), upstream's
names, resolved to what this process runs.

* ``q8_0``, ``q5_0``, ``q5_1``, ``q4_0``, ``q4_1``: mlx-lm's quantized cache (``QuantizedKVCache``:
  MLX's affine quantization, a scale and a bias per group of 32, at 8, 5 or 4 bits), on the
  MLX-native profile (Metal, CUDA, ``MLXCEL_KERNELS=mlx``), where MLX's attention reads it directly.
  The ``_0`` types (a scale only) are held the ``_1`` way (a scale and a bias), which is never less
  exact. MLX's cache quantizes keys and values alike, so both flags must name the same quantized
  type. Layers with a sliding window keep full precision (mlx-lm has no quantized rotating cache).
  mlxcel's CPU kernels attend over float32 keys and values only: there a quantized type is refused.
* ``f32``, ``f16``, ``bf16``: full precision, which here means the model's compute dtype (float32 on
  the CPU kernels, float16 on the MLX-native profile unless ``MLXCEL_DTYPE`` says otherwise). A type
  the compute dtype holds at least as exactly runs (``f16`` or ``bf16`` where the model computes in
  float32: the cache keeps float32, and the start-up log says so); one it cannot hold is refused
  (``f32`` on a float16 model, ``bf16`` on a float16 one). Not given (None), the cache holds the
  compute dtype: upstream's default ``f16`` never refuses a start.
* ``iq4_nl`` (a non-linear 4-bit code MLX has no layout for): refused.

A quantized cache cannot join the ragged batch nor mlx-lm's batch cache: its rows forward alone, each
on its own cache (``server/runtime/stepper.py``), which rewinds exactly (``kv_cache``), so prompt
reuse, slot files and every speculative rule work on it as on a full-precision cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxcel.engine.errors import MlxcelError

QUANTIZED_BITS = {"q8_0": 8, "q5_0": 5, "q5_1": 5, "q4_0": 4, "q4_1": 4}
FULL = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
FULL_NAME = {dtype: name for name, dtype in FULL.items()}
GROUP = 32  # llama.cpp's block for these types, and an MLX group size
UPSTREAM_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


class KvTypeError(MlxcelError):
    """A cache type this process cannot hold (one line, naming the flag)."""


@dataclass(frozen=True)
class KvQuant:
    """A quantized KV cache: ``bits`` per element in groups of ``group``."""

    bits: int
    group: int = GROUP


def resolve(k: str | None, v: str | None, *, compute_dtype: str, mlx_native: bool,
            head_dim: int | None = None) -> KvQuant | None:
    """The cache ``-ctk k -ctv v`` ask for here: a :class:`KvQuant`, or None for full precision (the
    compute dtype, ``compute_dtype`` being its name: ``float32``...); :class:`KvTypeError` when it
    cannot be held (module docstring; ``head_dim``: the model's, which groups of 32 must divide)."""
    k, v = (name.lower() if name else FULL_NAME[compute_dtype] for name in (k, v))
    for flag, name in (("-ctk", k), ("-ctv", v)):
        if name not in UPSTREAM_TYPES:
            raise KvTypeError(f"{flag} {name}: unsupported cache type (one of {', '.join(UPSTREAM_TYPES)})")
        if name == "iq4_nl":
            raise KvTypeError(f"{flag} iq4_nl: MLX has no layout for this non-linear 4-bit code; use q4_0 or q4_1")
    if k in QUANTIZED_BITS or v in QUANTIZED_BITS:
        if QUANTIZED_BITS.get(k) != QUANTIZED_BITS.get(v):
            raise KvTypeError(f"-ctk {k} -ctv {v}: MLX's quantized cache quantizes keys and values alike; give both "
                              "the same quantized type")
        if not mlx_native:
            raise KvTypeError(f"-ctk {k}: a quantized KV cache runs on the MLX-native profile (Metal, CUDA, "
                              "MLXCEL_KERNELS=mlx); mlxcel's CPU kernels attend over float32 keys and values")
        if head_dim is not None and head_dim % GROUP:
            raise KvTypeError(f"-ctk {k}: the model's attention heads have {head_dim} dimensions, which groups of "
                              f"{GROUP} do not divide")
        return KvQuant(QUANTIZED_BITS[k])
    for flag, name in (("-ctk", k), ("-ctv", v)):
        wanted = FULL[name]
        if wanted != compute_dtype and compute_dtype != "float32":
            raise KvTypeError(f"{flag} {name}: the KV cache holds the model's compute dtype, {compute_dtype}, here "
                              f"(MLXCEL_DTYPE={wanted} computes in {wanted}, or use a quantized type)")
    return None


def describe(quant: KvQuant | None, compute_dtype: str, asked: tuple[str | None, str | None] = (None, None)) -> str:
    if quant is None:
        wider = sorted({a.lower() for a in asked if a and FULL.get(a.lower()) != compute_dtype})
        kept = f" (asked {', '.join(wider)}: held as {compute_dtype}, at least as exact)" if wider else ""
        return f"KV cache: {compute_dtype}{kept}"
    return (f"KV cache: {quant.bits}-bit affine, groups of {quant.group} (mlx-lm's quantized cache); rows forward "
            "alone on their own caches")
