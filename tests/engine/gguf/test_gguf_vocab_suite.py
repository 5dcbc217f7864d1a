"""The rebuilt tokenizer against llama.cpp's own tokenizer test suite: each
``ggml-vocab-*.gguf`` (a vocabulary-only GGUF of a real model family) comes with texts
(``.inp``: whitespace runs, unicode, digits, code, emoji) and the ids the original Hugging Face
tokenizer gives them (``.out``), which llama.cpp's ``test-tokenizer-0`` checks it reproduces.
Skipped, saying so, when no copy of the llama.cpp sources is at hand (``llama_cpp_sources``); slow (~35 s:
the vocabularies are large)."""

from __future__ import annotations

from pathlib import Path

import llama_cpp_sources
import pytest

from mlxcel.engine.gguf.file import read_gguf
from mlxcel.engine.gguf.tokenizer import build_tokenizers_object

MODELS = llama_cpp_sources.models_dir()
# families whose vocabulary kind mlxcel does not read (Gemma 4's BPE): out of scope
NOT_READ = {"ggml-vocab-gemma-4.gguf"}
SEP = "\n__ggml_vocab_test__\n"


def _vocabularies() -> list[str]:
    if MODELS is None:
        return []
    return sorted(p.name[: -len(".inp")] for p in MODELS.glob("ggml-vocab-*.gguf.inp") if p.name[:-4] not in NOT_READ)


@pytest.mark.slow
@pytest.mark.skipif(MODELS is None, reason="llama.cpp's sources are not here (set MLXCEL_LLAMA_CPP_SRC, or run "
                                           "scripts/build_llama_server.sh or the conformance run once)")
@pytest.mark.parametrize("vocab", _vocabularies() or ["none"])
def test_llama_cpp_tokenizer_cases(vocab: str):
    path = Path(MODELS) / vocab
    meta = read_gguf(path).metadata
    tok, _ = build_tokenizers_object(meta, vocab)
    texts = (path.parent / f"{vocab}.inp").read_text(encoding="utf-8").split(SEP)
    expected = [line.strip() for line in (path.parent / f"{vocab}.out").read_text(encoding="utf-8").split("\n")]
    assert len(texts) <= len(expected)
    wrong = []
    for text, out in zip(texts, expected):
        want = [int(x) for x in out.split()]
        got = tok.encode(text, add_special_tokens=False).ids
        if got != want:
            wrong.append((text, got, want))
    assert not wrong, f"{vocab} ({meta.get('tokenizer.ggml.pre')}): {len(wrong)} of {len(texts)} differ, e.g. {wrong[:2]}"
