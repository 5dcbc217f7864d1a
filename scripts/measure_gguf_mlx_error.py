"""How far each GGUF type's MLX layout (``engine/gguf/mlx_quant.py``) is from gguf-py's float
decoding: the table of docs/gguf-architectures.md, "Quantized weights on the MLX-native path".

    .venv/bin/python scripts/measure_gguf_mlx_error.py [-m FILE.gguf]

Without ``-m``: every type of ``LAYOUTS`` on the blocks the tests use (``tiny_gguf``: a 64 x 1024
matrix, seed 0; gguf-py quantizes normal values for the types it can encode, the others get random
well-formed blocks). With ``-m``: also every quantized matrix type of that file, on up to 512 rows of
each of its tensors. Scales and biases are float16, as on the MLX-native path. Errors: the largest
absolute one, and the RMS of the error over the RMS of the reference values.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as Q

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "helpers"))

import tiny_gguf  # noqa: E402

from mlxcel.engine.gguf.file import TensorInfo, read_gguf  # noqa: E402
from mlxcel.engine.gguf.mlx_quant import LAYOUTS, to_quantized  # noqa: E402


def errors(infos: list[TensorInfo]) -> tuple[float, float]:
    """(max |error|, RMS error / RMS value) over ``infos``' MLX layouts in float16."""
    worst, err2, ref2 = 0.0, 0.0, 0.0
    for info in infos:
        ref = quants.dequantize(info.data, info.qtype).astype(np.float32)
        err = np.array(to_quantized(info, mx.float16).dequantize(mx.float32)) - ref
        worst = max(worst, float(np.abs(err).max()))
        err2 += float((err.astype(np.float64) ** 2).sum())
        ref2 += float((ref.astype(np.float64) ** 2).sum())
    return worst, (err2 / ref2) ** 0.5


def synthetic(qtype: Q) -> TensorInfo:
    rng = np.random.default_rng(0)
    if qtype in tiny_gguf.ENCODABLE:
        raw = quants.quantize((0.02 * rng.standard_normal((64, 1024))).astype(np.float32), qtype)
    else:
        raw = tiny_gguf.random_blocks(64, 1024, qtype, rng)
    return TensorInfo(name="x", qtype=qtype, shape=(64, 1024), data=raw)


def from_file(path: str) -> dict[Q, list[TensorInfo]]:
    """Up to 512 rows of every matrix of ``path`` whose type has an MLX layout, by type."""
    out: dict[Q, list[TensorInfo]] = {}
    for info in read_gguf(path).tensors.values():
        if info.qtype in LAYOUTS and len(info.shape) == 2:
            rows = min(512, info.shape[0])
            out.setdefault(info.qtype, []).append(
                TensorInfo(name=info.name, qtype=info.qtype, shape=(rows, info.shape[1]), data=info.data[:rows]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", help="also measure the matrices of this GGUF")
    args = parser.parse_args()
    real = from_file(args.model) if args.model else {}
    print("| type | bits/weight in the file | MLX layout | bits/weight in MLX | max abs error | relative RMS error |"
          + (f" on {Path(args.model).name}: max abs / relative RMS |" if real else ""))
    print("|---|---:|---|---:|---:|---:|" + ("---:|" if real else ""))
    for qtype, layout in LAYOUTS.items():
        block, size = GGML_QUANT_SIZES[qtype]
        shape = f"{layout.mode} {layout.bits}-bit, group 32" if layout.mode == "affine" else f"{layout.mode}, group 32"
        shape += "" if layout.exact else ", re-quantized"
        worst, rel = errors([synthetic(qtype)])
        row = (f"| {qtype.name} | {8 * size / block:.4g} | {shape} | {layout.bits_per_weight:.4g} "
               f"| {worst:.3g} | {rel:.3g} |")
        if real:
            row += " {:.3g} / {:.3g} |".format(*errors(real[qtype])) if qtype in real else " |"
        print(row, flush=True)


if __name__ == "__main__":
    main()
