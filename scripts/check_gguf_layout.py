"""Check the test suite's GGUF writer (``tests/helpers/gguf_convert.py``) against llama.cpp's own
``convert_hf_to_gguf.py`` on the same tiny checkpoints: same tensor names, shapes and values, and
the same ``{arch}.*`` metadata. The architecture tests are only as good as that writer's account
of the converter; this is where the account is checked.

    .venv/bin/python scripts/check_gguf_layout.py --llama-cpp-src DIR [CASE ...]

A case may be ``NAME:fuse-qkv``: the converter's ``--fuse-qkv`` against the writer's ``fuse_qkv``
(the default run adds llama, qwen2 and gemma3 that way).

Needs the ``reference`` extra (torch) and the llama.cpp sources. The converter picks a
pre-tokenizer by hashing the tokenizer's output and refuses one it does not know, as the tiny
tokenizer is; the run tells it "gpt-2", as the writer does. Everything else is the converter's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "helpers")]

DRIVER = """
import sys
sys.path[:0] = [{src!r}, {gguf_py!r}]
sys.argv = ["convert_hf_to_gguf.py", {hf!r}, "--outfile", {out!r}, "--outtype", "f32", *{flags!r}]
import convert_hf_to_gguf as converter
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
converter.main()
"""
# keys the two writers may word differently without changing what the loader reads
IGNORED_KEYS = ("general.", "tokenizer.", "GGUF.")
# converter flags a case needs (the hybrids carry no MTP layers, which the converter otherwise expects)
FLAGS = {"qwen3next": ["--no-mtp"], "qwen35": ["--no-mtp"], "qwen35moe": ["--no-mtp"]}
# families whose converter reads a SentencePiece tokenizer.model (a tiny one is trained for them)
SENTENCEPIECE = {"gemma", "gemma2", "phi3", "phi4mini", "ernie4_5"}
# cases the converter cannot take as mlx-lm needs them written
SKIP = {"exaone4": "transformers' Exaone4Config reads sliding_window_pattern as a number, mlx-lm's exaone4 as 'LLLG'"}


def sentencepiece_model(out: Path) -> None:
    """A tiny SentencePiece model beside the checkpoint, for converters that read one."""
    import sentencepiece as spm
    import tiny_checkpoints

    text = out / "corpus.txt"
    text.write_text("\n".join(tiny_checkpoints.CORPUS * 4))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(out / "tokenizer"), vocab_size=380,
                                   model_type="bpe", byte_fallback=True, minloglevel=2)


def run_converter(src: Path, hf: Path, out: Path, flags: list[str]) -> None:
    code = DRIVER.format(src=str(src), gguf_py=str(src / "gguf-py"), hf=str(hf), out=str(out), flags=flags)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-3000:])


def compare(ours: Path, theirs: Path) -> list[str]:
    from mlxcel.engine.gguf.file import read_gguf
    from mlxcel.engine.gguf.tensors import dequantize_numpy

    a, b = read_gguf(ours), read_gguf(theirs)
    problems = []
    names_a, names_b = set(a.tensors), set(b.tensors)
    if names_a - names_b:
        problems.append(f"tensors only in ours: {sorted(names_a - names_b)}")
    if names_b - names_a:
        problems.append(f"tensors only in the converter's: {sorted(names_b - names_a)}")
    for name in sorted(names_a & names_b):
        x, y = dequantize_numpy(a.tensors[name]), dequantize_numpy(b.tensors[name])
        if x.shape != y.shape:
            problems.append(f"{name}: shape {x.shape} vs {y.shape}")
        elif not np.allclose(x, y, atol=1e-6, rtol=0):
            problems.append(f"{name}: values differ (max {np.abs(x - y).max():.3g})")
    keys_a = {k for k in a.metadata if not k.startswith(IGNORED_KEYS)}
    keys_b = {k for k in b.metadata if not k.startswith(IGNORED_KEYS)}
    for key in sorted(keys_a | keys_b):
        va, vb = a.metadata.get(key), b.metadata.get(key)
        same = (va is not None and vb is not None and np.allclose(np.asarray(va, dtype=float), np.asarray(vb, dtype=float))
                if not isinstance(va, str) and not isinstance(vb, str) else va == vb)
        if not same:
            problems.append(f"metadata {key}: ours {va!r} vs converter {vb!r}")
    return problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*")
    ap.add_argument("--llama-cpp-src", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "data" / "gguf-layout-check.json",
                    help="where to record each case's result (read by scripts/gguf_arch_table.py)")
    args = ap.parse_args()
    import json

    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    import gguf_convert
    import tiny_archs

    failed = 0
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for spec in args.cases or [*tiny_archs.CASES, "llama:fuse-qkv", "qwen2:fuse-qkv", "gemma3:fuse-qkv"]:
            case_id, _, variant = spec.partition(":")
            case = tiny_archs.CASES[case_id]
            fused = variant == "fuse-qkv"
            if case_id in SKIP:
                print(f"{case_id}: skipped ({SKIP[case_id]})")
                results[case_id] = f"not checked: {SKIP[case_id]}"
                continue
            hf = root / case_id
            if not (hf / "config.json").exists():
                tiny_archs.build(case, hf, seed=5)
            if case_id in SENTENCEPIECE:
                sentencepiece_model(hf)
            ours = gguf_convert.convert(hf, root / f"{spec}-ours.gguf", case.gguf_arch, fuse_qkv=fused)
            try:
                flags = FLAGS.get(case_id, []) + (["--fuse-qkv"] if fused else [])
                run_converter(args.llama_cpp_src, hf, root / f"{spec}-converter.gguf", flags)
                problems = compare(ours, root / f"{spec}-converter.gguf")
            except Exception as exc:
                problems = [f"the converter failed: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc}"]
            failed += bool(problems)
            results[spec] = "same" if not problems else "; ".join(problems[:3])
            print(f"{spec}: {'same layout' if not problems else f'{len(problems)} difference(s)'}")
            for p in problems[:12]:
                print(f"    {p}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
