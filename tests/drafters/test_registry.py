"""The drafter registry: kinds recognised by structure, the one resolution of the speculative
flags that ``mlxcel generate`` and ``mlxcel-server`` share, and the refusals that name where a
drafter-only checkpoint runs."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from dataclasses import replace

import pytest
import tiny_checkpoints

from mlxcel.drafters import registry
from mlxcel.drafters.draft_model import check_same_vocabulary
from mlxcel.drafters.loading import load_target
from mlxcel.drafters.registry import DrafterChoiceError, checkpoint_kind, choose
from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.speculative.drafter import Drafter, ModelDrafter
from mlxcel.server.cli.generate_speculative import add_speculative_args, check_speculative_args

DRAFTER_ONLY = {
    "dflash": {"model_type": "qwen3", "architectures": ["DFlashDraftModel"], "dflash_config": {"block_size": 16}},
    "dflash-config-only": {"model_type": "qwen3", "dflash_config": {"block_size": 8}},
    "dspark": {"model_type": "lfm2", "architectures": ["Lfm2DSparkDraftModel"]},
    "muse": {"model_type": "muse_glimmer_assistant"},
    "muse-arch": {"model_type": "x", "architectures": ["MuseGlimmerAssistantModel"]},
    "mtp-assistant": {"model_type": "glm4_moe", "architectures": ["Glm4MoeForCausalLMNextN"]},
}
EXPECTED_KIND = {"dflash": "dflash", "dflash-config-only": "dflash", "dspark": "dspark", "muse": "muse-glimmer",
                 "muse-arch": "muse-glimmer", "mtp-assistant": "mtp"}


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


def test_drafter_only_checkpoints_are_recognised_by_structure(drafter_only_dir):
    config = json.loads((drafter_only_dir / "config.json").read_text())
    assert checkpoint_kind(config).name == EXPECTED_KIND[drafter_only_dir.name]
    assert checkpoint_kind({"model_type": "llama"}) is None
    assert checkpoint_kind({"model_type": "deepseek_v3", "num_nextn_predict_layers": 1}) is None  # a target


def test_a_drafter_only_checkpoint_is_not_a_target_model(drafter_only_dir):
    with pytest.raises(ModelLoadError, match="not a standalone model") as exc:
        load_target(drafter_only_dir)
    assert ("MTP" if drafter_only_dir.name.startswith("mtp") else "DFlash") in str(exc.value)


def test_md_alone_runs_a_drafter_only_checkpoint_on_its_round_loop(drafter_only_dir):
    choice = choose(draft_model=str(drafter_only_dir))
    assert choice.kind.name == EXPECTED_KIND[drafter_only_dir.name]
    assert any("round loop" in note for note in choice.notes)


def test_md_an_ordinary_model_is_a_draft_model(tiny_llama_dir):
    choice = choose(draft_model=str(tiny_llama_dir))
    assert choice.kind is registry.DRAFT_MODEL and "draft-simple" in choice.notes[0]


@pytest.mark.parametrize("kwargs, expected", [
    ({"spec_types": ["ngram-simple"]}, "prompt-lookup"),
    ({"spec_types": ["ngram-mod"]}, "ngram-mod"),
    ({"spec_types": ["ngram-cache"]}, "ngram-cache"),
    ({"spec_default": True}, "prompt-lookup"),
    ({"draft_kind": "internal-mtp"}, "internal-mtp"),
    ({"spec_types": ["draft-mtp"]}, "internal-mtp"),
    ({"spec_types": ["draft-mtp"], "draft_kind": "internal-mtp"}, "internal-mtp"),
    ({"spec_types": ["none"]}, None),
    ({}, None),
])
def test_flags_resolve_to_one_kind(kwargs, expected):
    choice = choose(**kwargs)
    assert (choice.kind.name if choice else None) == expected


def test_impossible_choices_say_why(tmp_path):
    dflash = tmp_path / "dflash"
    dflash.mkdir()
    (dflash / "config.json").write_text(json.dumps(DRAFTER_ONLY["dflash"]))
    for kwargs, needle in (({"spec_types": ["draft-simple"], "draft_model": str(dflash)}, "dflash drafter checkpoint"),
                           ({"spec_types": ["draft-eagle3"]}, "draft-eagle3 needs its drafter"),
                           ({"spec_types": ["draft-banana"]}, "unknown type"),
                           ({"draft_kind": "banana"}, "prompt-lookup, draft-model, dflash"),
                           ({"draft_kind": "dspark"}, "pass -md DIR"),
                           ({"draft_kind": "dspark", "draft_model": str(dflash)}, "dspark was asked for"),
                           ({"spec_types": ["draft-simple"]}, "needs a draft model"),
                           ({"draft_kind": "internal-mtp", "draft_model": str(dflash)}, "drop -md"),
                           ({"spec_types": ["draft-mtp"], "draft_model": str(dflash)}, "pass an MTP assistant"),
                           ({"spec_types": ["ngram-simple", "draft-simple"], "draft_model": "x.gguf"}, "one drafter"),
                           ({"spec_types": ["ngram-simple"], "draft_model": "x.gguf"}, "needs no draft model")):
        with pytest.raises(DrafterChoiceError, match=needle):
            choose(**kwargs)


def test_every_kind_is_declared_once_with_its_traits():
    names = [k.name for k in registry.KINDS]
    assert len(names) == len(set(names))
    assert registry.BY_NAME["dspark"].greedy_only and not registry.BY_NAME["dflash"].greedy_only
    for kind in registry.KINDS:
        assert issubclass(kind.drafter_class(), Drafter)
        assert callable(kind.loader())
        assert kind.model_based == issubclass(kind.drafter_class(), ModelDrafter)  # the declared trait is the class's
        assert kind.model_based == (kind.default_block is None)  # model-based blocks come from the checkpoint
        assert registry.upstream_type(kind) in registry.SPEC_TYPES
    assert {k.loop for k in registry.KINDS} == {"prompt-lookup", "draft-model", "dflash", "mtp", "eagle3", "ngram-map-k",
                                               "ngram-map-k4v", "ngram-mod", "ngram-cache"}


def test_a_name_or_spec_type_is_registered_once():
    before = list(registry.KINDS)
    for clash in (registry.DFLASH, replace(registry.PROMPT_LOOKUP, name="lookup-2"),
                  replace(registry.PROMPT_LOOKUP, name="eagle", spec_types=("draft-eagle3",))):
        with pytest.raises(ValueError, match="already"):
            registry.register(clash)
    assert registry.KINDS == before


# -- mlxcel generate's flags --------------------------------------------------------------------


def test_generate_accepts_every_kind_the_server_does(drafter_only_dir):
    parser, args = parse("--draft-model", str(drafter_only_dir))
    err = io.StringIO()
    check_speculative_args(parser, args, err=err)
    assert args.drafter.kind.name == EXPECTED_KIND[drafter_only_dir.name]
    assert "round loop" in err.getvalue()


def test_generate_prompt_lookup_fills_defaults_and_prints_nothing():
    parser, args = parse("--prompt-lookup")
    err = io.StringIO()
    check_speculative_args(parser, args, err=err)
    assert err.getvalue() == ""
    assert args.drafter.kind is registry.PROMPT_LOOKUP
    assert (args.prompt_lookup_min, args.prompt_lookup_max) == (registry.LOOKUP_NGRAM_MIN, registry.LOOKUP_NGRAM_MAX)
    parser, args = parse("--draft-kind", "prompt-lookup")
    check_speculative_args(parser, args, err=err)
    assert args.drafter.kind is registry.PROMPT_LOOKUP


@pytest.mark.parametrize("argv, fragment", [
    (["--draft-model", "x", "--prompt-lookup"], "alternatives"),
    (["--prompt-lookup", "--draft-kind", "dflash"], "alternatives"),
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


def test_a_drafter_with_another_vocabulary_is_refused(tiny_llama, tmp_path):
    other = tiny_checkpoints.build_hf_checkpoint(tmp_path / "other", "llama", seed=3)
    tiny_checkpoints.build_tokenizer(other, vocab_size=300)  # retrained: different merges and ids
    with pytest.raises(ModelLoadError, match="vocabulary"):
        check_same_vocabulary(tiny_llama, load_target(other))
    check_same_vocabulary(tiny_llama, tiny_llama)


def test_the_command_line_is_checked_without_loading_model_code():
    """The kinds table and the flag table import no mlx-lm (nor, through it, transformers), so a bad
    command line is refused, and --help answers, before anything heavy loads."""
    code = ("import sys; import mlxcel.server.cli.serve, mlxcel.drafters.registry; "
            "print(sorted(m for m in ('mlx_lm', 'transformers', 'torch', 'fastapi') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
