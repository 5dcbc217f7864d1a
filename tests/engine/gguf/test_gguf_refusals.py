"""A GGUF file mlxcel cannot serve right is refused with one message that names the architecture
(or the tensor, key or pre-tokenizer) and what is missing; never loaded as a wrong model."""

from __future__ import annotations

from pathlib import Path

import gguf_convert
import pytest
import tiny_archs

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model.gguf_loader import load_gguf


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("refusals")


def _checkpoint(root: Path, case_id: str) -> Path:
    out = root / case_id
    if not (out / "config.json").exists():
        tiny_archs.build(tiny_archs.CASES[case_id], out, seed=3)
    return out


def _refused(root: Path, case_id: str, match: str, **kw) -> None:
    case = tiny_archs.CASES[case_id]
    path = gguf_convert.convert(_checkpoint(root, case_id), root / f"{case_id}-{len(list(root.iterdir()))}.gguf",
                                case.gguf_arch, **kw)
    with pytest.raises(ModelLoadError, match=match):
        load_gguf(path)


def test_an_architecture_mlx_lm_has_but_mlxcel_does_not_map_says_so(root):
    _refused(root, "llama", r"unsupported GGUF architecture 'command-r' .*mlx-lm has a cohere model", write_as="command-r")


def test_an_unknown_architecture_lists_the_ones_read(root):
    _refused(root, "llama", r"unsupported GGUF architecture 'no-such-arch'.*mlxcel reads .*gemma3.*qwen35", write_as="no-such-arch")


def test_a_missing_tensor_is_named(root):
    _refused(root, "qwen3", r"'qwen3' needs 2 tensor\(s\) the file lacks .*k_norm", drop=("attn_k_norm",))


def test_an_unexpected_tensor_is_named(root):
    # a llama file whose q/k norms no llama has
    _refused(root, "qwen3", r"unexpected tensor\(s\) for architecture 'llama'.*attn_q_norm", write_as="llama")


def test_features_mlx_lm_lacks_are_refused_with_what_is_missing(root):
    _refused(root, "gemma3", r"cannot serve GGUF architecture 'gemma3'.*final logit soft-capping",
             extra_kv={"final_logit_softcapping": 30.0})
    _refused(root, "lfm2", r"cannot serve GGUF architecture 'lfm2'.*sliding-window attention",
             extra_kv={"attention.sliding_window": 512})
    _refused(root, "granite", r"RoPE switched off", extra_kv={"rope.scaling.finetuned": False})
    _refused(root, "olmo3", r"separate RoPE base", extra_kv={"rope.freq_base_swa": 500.0})


def test_an_explicit_head_size_the_class_cannot_express(root):
    _refused(root, "qwen2", r"heads are 32 wide .* mlx-lm's qwen2 model cannot express",
             extra_kv={"attention.key_length": 32})


def test_an_unknown_pre_tokenizer_is_refused_as_llama_cpp_refuses_it(root):
    _refused(root, "llama", r"unknown pre-tokenizer 'no-such-split'", pre="no-such-split")
