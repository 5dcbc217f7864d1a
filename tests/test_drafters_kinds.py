"""Drafter kinds on ``mlxcel generate``: drafter-only checkpoints are refused by structure
(with or without --draft-kind, naming mlxcel-server), an explicit --draft-kind is an error that
says why, and an ordinary drafter prints its auto-detected kind plus the path that really runs."""

from __future__ import annotations

import argparse
import io
import json

import pytest
import tiny_checkpoints

from mlxcel.drafters.registry import ResolvedKind, detect_drafter_kind, refuse_drafter_only_checkpoint
from mlxcel.engine.errors import MlxcelError, ModelLoadError
from mlxcel.engine.model.loading import load_model
from mlxcel.server.cli.generate_speculative import add_speculative_args, check_same_vocabulary, check_speculative_args

DRAFTER_ONLY = {
    "dflash": {"model_type": "qwen3", "architectures": ["DFlashDraftModel"], "dflash_config": {"block_size": 16}},
    "dflash-config-only": {"model_type": "qwen3", "dflash_config": {"block_size": 8}},
    "dspark": {"model_type": "lfm2", "architectures": ["Lfm2DSparkDraftModel"]},
    "muse": {"model_type": "muse_glimmer_assistant"},
    "muse-arch": {"model_type": "x", "architectures": ["MuseGlimmerAssistantModel"]},
    "mtp-assistant": {"model_type": "glm4_moe", "architectures": ["Glm4MoeForCausalLMNextN"]},
}


class ParserExit(Exception):
    pass


class RaisingParser(argparse.ArgumentParser):
    def error(self, message):
        raise ParserExit(message)


def parse(*argv):
    parser = add_speculative_args(RaisingParser())
    parser.add_argument("--max-kv-size", type=int, default=None)
    return parser, parser.parse_args(list(argv))


@pytest.fixture(params=sorted(DRAFTER_ONLY))
def drafter_only_dir(request, tmp_path):
    d = tmp_path / request.param
    d.mkdir()
    (d / "config.json").write_text(json.dumps(DRAFTER_ONLY[request.param]))
    return d


@pytest.mark.parametrize("with_kind", [False, True])
def test_drafter_only_checkpoints_are_refused_naming_the_server(drafter_only_dir, with_kind):
    argv = ["--draft-model", str(drafter_only_dir)] + (["--draft-kind", "dflash"] if with_kind else [])
    parser, args = parse(*argv)
    err = io.StringIO()
    with pytest.raises(MlxcelError) as exc:
        check_speculative_args(parser, args, err=err)
    message = str(exc.value)
    assert "mlxcel-server" in message and "drafter checkpoint" in message
    loop = "MTP round loop" if drafter_only_dir.name.startswith("mtp") else "DFlash round loop"
    assert loop in message
    assert err.getvalue() == ""  # refused before any kind line


def test_loading_a_drafter_only_checkpoint_as_a_model_is_refused_too(drafter_only_dir):
    with pytest.raises(ModelLoadError, match="not a standalone model") as exc:
        load_model(drafter_only_dir)
    assert ("MTP" if drafter_only_dir.name.startswith("mtp") else "DFlash") in str(exc.value)


def test_explicit_draft_kind_is_an_error_that_says_why(tiny_llama_dir):
    parser, args = parse("--draft-model", str(tiny_llama_dir), "--draft-kind", "dflash")
    with pytest.raises(MlxcelError) as exc:
        check_speculative_args(parser, args, err=io.StringIO())
    assert "does not construct" in str(exc.value) and "mlxcel-server" in str(exc.value)
    parser, args = parse("--prompt-lookup", "--draft-kind", "prompt-lookup")
    with pytest.raises(MlxcelError, match="--prompt-lookup"):
        check_speculative_args(parser, args, err=io.StringIO())


def test_auto_detected_kind_is_printed_with_the_path_that_runs(tiny_llama_dir):
    parser, args = parse("--draft-model", str(tiny_llama_dir))
    err = io.StringIO()
    check_speculative_args(parser, args, err=err)
    lines = err.getvalue().splitlines()
    assert lines[0] == "Resolved drafter kind: dflash (block_size = 16, default)"
    assert lines[1].startswith("Drafter kind was auto-detected only; mlxcel generate runs the classic draft-model path")


def test_prompt_lookup_prints_no_kind_lines_and_fills_defaults():
    parser, args = parse("--prompt-lookup")
    err = io.StringIO()
    check_speculative_args(parser, args, err=err)
    assert err.getvalue() == ""
    assert (args.prompt_lookup_min, args.prompt_lookup_max) == (1, 3)


@pytest.mark.parametrize("argv, fragment", [
    (["--draft-model", "x", "--prompt-lookup"], "alternatives"),
    (["--prompt-lookup", "--num-draft-tokens", "0"], "--num-draft-tokens"),
    (["--prompt-lookup-min", "2"], "only apply with --prompt-lookup"),
    (["--prompt-lookup", "--prompt-lookup-min", "4", "--prompt-lookup-max", "2"], "prompt-lookup-min"),
    (["--prompt-lookup", "--prompt-lookup-min", "0"], "prompt-lookup-min"),
    (["--prompt-lookup", "--max-kv-size", "64"], "--max-kv-size"),
])
def test_usage_errors(argv, fragment):
    parser, args = parse(*argv)
    with pytest.raises(ParserExit, match=fragment):
        check_speculative_args(parser, args, err=io.StringIO())


def test_detect_kind_on_structures():
    assert detect_drafter_kind({"model_type": "llama"}).kind == "dflash"
    assert detect_drafter_kind(DRAFTER_ONLY["dflash"]).detail == "block_size = 16"
    assert detect_drafter_kind(DRAFTER_ONLY["dspark"]).kind == "dspark"
    assert detect_drafter_kind({"model_type": "deepseek_v3", "num_nextn_predict_layers": 1}).kind == "mtp"
    qwen35 = {"model_type": "qwen3_5", "text_config": {"mtp_num_hidden_layers": 1}}
    assert detect_drafter_kind(qwen35) == ResolvedKind("mtp", "mtp_num_hidden_layers = 1")
    refuse_drafter_only_checkpoint("plain", {"model_type": "llama"})  # an ordinary model passes


def test_a_drafter_with_another_vocabulary_is_refused(tiny_llama, tmp_path):
    other = tiny_checkpoints.build_hf_checkpoint(tmp_path / "other", "llama", seed=3)
    tiny_checkpoints.build_tokenizer(other, vocab_size=300)  # retrained: different merges and ids
    with pytest.raises(ModelLoadError, match="vocabulary"):
        check_same_vocabulary(tiny_llama, load_model(other))
    check_same_vocabulary(tiny_llama, tiny_llama)
