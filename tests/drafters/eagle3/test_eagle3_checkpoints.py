"""EAGLE-3 checkpoints: recognised by structure in each published form (the authors' config.json,
the speculators config.json, llama.cpp's GGUF conversion), chosen and refused by the registry with
messages that say what to do, read by the real loaders (both JSON layouts and the GGUF give the
network the same weights), and refused clearly when malformed or trained for another target."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
import tiny_drafters
import tiny_gguf

from mlxcel.drafters import registry
from mlxcel.drafters.eagle3.checkpoint import load_directory
from mlxcel.drafters.eagle3.drafter import Eagle3Drafter
from mlxcel.drafters.eagle3.structure import GGUF, ORIGINAL, SPECULATORS, eagle3_layout
from mlxcel.drafters.gguf_header import gguf_architecture
from mlxcel.drafters.loading import load_model_drafter, load_target
from mlxcel.drafters.registry import DrafterChoiceError, checkpoint_kind, choose, read_drafter_config
from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.target_features import prefill_with_features

# -- by structure -----------------------------------------------------------------------------------

EAGLE3_CONFIGS = {
    "authors": ({"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
                 "draft_vocab_size": 32000}, ORIGINAL),
    "angelslim": ({"architectures": ["Eagle3LlamaForCausalLM"], "model_type": "llama"}, ORIGINAL),
    "unnamed": ({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "draft_vocab_size": 32000}, ORIGINAL),
    "speculators": ({"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                     "transformer_layer_config": {"model_type": "llama"}}, SPECULATORS),
    "speculators-config": ({"speculators_config": {"algorithm": "eagle3"}}, SPECULATORS),
    "gguf": ({"general.architecture": "eagle3"}, GGUF),
}
NOT_EAGLE3 = [{"model_type": "llama", "num_hidden_layers": 16}, {"draft_vocab_size": 32000, "num_hidden_layers": 2},
              {"speculators_config": {"algorithm": "dflash"}}, {"general.architecture": "llama"},
              {"architectures": ["DFlashDraftModel"], "dflash_config": {}}]


@pytest.mark.parametrize("name", sorted(EAGLE3_CONFIGS))
def test_each_form_is_recognised_by_structure(name):
    config, layout = EAGLE3_CONFIGS[name]
    assert eagle3_layout(config) == layout
    assert checkpoint_kind(config) is registry.EAGLE3


@pytest.mark.parametrize("config", NOT_EAGLE3)
def test_other_configs_are_not_eagle3(config):
    assert eagle3_layout(config) is None
    assert checkpoint_kind(config) is not registry.EAGLE3


def test_the_flags_choose_eagle3(e3_dirs):
    for form in ("eagle3", "speculators", "gguf"):
        path = str(e3_dirs[form])
        for flags in ({"spec_types": ["draft-eagle3"]}, {"draft_kind": "eagle3"}, {}):
            choice = choose(draft_model=path, **flags)
            assert choice.kind is registry.EAGLE3, (form, flags)
        assert "EAGLE-3 round loop" in choose(draft_model=path).notes[0]  # -md alone: by structure
    assert registry.upstream_type(registry.EAGLE3) == "draft-eagle3"
    assert "draft-eagle3" in registry.SPEC_TYPES and "draft-eagle3" not in registry.SPEC_TYPE_REFUSED


def test_impossible_choices_say_why(e3_dirs, e3_root, tiny_llama_dir):
    dflash = e3_root / "a-dflash"
    dflash.mkdir(exist_ok=True)
    (dflash / "config.json").write_text(json.dumps({"architectures": ["DFlashDraftModel"], "dflash_config": {}}))
    eagle = str(e3_dirs["eagle3"])
    for kwargs, needle in (
            ({"spec_types": ["draft-eagle3"]}, "needs its drafter: pass -md DIR"),
            ({"spec_types": ["draft-eagle3"], "draft_hf": "org/repo"}, "-hfd is not read for it"),
            ({"spec_types": ["draft-eagle3"], "draft_model": str(dflash)}, "is a dflash drafter checkpoint"),
            ({"draft_kind": "eagle3", "draft_model": str(tiny_llama_dir)}, "is not an EAGLE-3 drafter"),
            ({"spec_types": ["draft-simple"], "draft_model": eagle}, "run it with --spec-type draft-eagle3"),
            ({"spec_types": ["draft-dflash"], "draft_model": eagle}, "not a DFlash"),
            ({"spec_types": ["draft-eagle3", "draft-mtp"], "draft_model": eagle}, "one drafter at a time")):
        with pytest.raises(DrafterChoiceError, match=needle):
            choose(**kwargs)


def test_an_eagle3_checkpoint_is_not_a_target_model(e3_dirs):
    with pytest.raises(ModelLoadError, match="not a standalone model.*EAGLE-3 round loop"):
        load_target(e3_dirs["eagle3"])


def test_a_gguf_drafter_is_known_by_its_architecture_alone(e3_dirs, e3_root, tiny_llama_dir):
    assert gguf_architecture(e3_dirs["gguf"]) == "eagle3"
    assert read_drafter_config(e3_dirs["gguf"]) == {"general.architecture": "eagle3"}
    llama = tiny_gguf.write_gguf(tiny_llama_dir, e3_root / "llama.gguf")
    assert gguf_architecture(llama) == "llama" and choose(draft_model=str(llama)).kind is registry.DRAFT_MODEL
    not_gguf = e3_root / "notes.gguf"
    not_gguf.write_bytes(b"GGUF\x03\x00")  # truncated
    assert gguf_architecture(not_gguf) is None and read_drafter_config(not_gguf) == {}


# -- loading ------------------------------------------------------------------------------------------


def test_both_layouts_load_with_what_their_configs_say(e3_dirs):
    original = load_directory(e3_dirs["eagle3"])
    assert original.spec.layout == ORIGINAL and original.spec.aux_layer_ids == (1, 2, 4)
    assert not original.spec.norm_before_residual and original.spec.block == 3
    assert original.target_ids.size == 256 and original.network.has_head and not original.network.has_embeddings
    speculators = load_directory(e3_dirs["speculators"])
    assert speculators.spec.layout == SPECULATORS and speculators.spec.aux_layer_ids is None
    assert speculators.spec.norm_before_residual and speculators.spec.block == 4  # speculators' own defaults
    assert speculators.network.has_embeddings
    assert type(load_model_drafter(e3_dirs["speculators"], target_vocab_size=384)) is Eagle3Drafter


def test_layer_ids_name_the_state_entering_a_layer(e3_dirs, e3_target):
    """EAGLE-3's id ``a`` is the residual stream entering target layer ``a`` (vLLM and llama.cpp record
    it there), i.e. layer ``a - 1``'s output: ids (1, 2, 4) of a 4-layer target read layers 0, 1 and 3
    (3 being the last layer's output before the final norm); the default trio (2, N // 2, N - 3) is
    (2, 2, 1) here, layers 1, 1 and 0."""
    named = load_model_drafter(e3_dirs["eagle3"], target_vocab_size=384)
    named.bind(e3_target.model)
    assert named.feature_layers == (0, 1, 3)
    default = load_model_drafter(e3_dirs["speculators"], target_vocab_size=384)
    default.bind(e3_target.model)
    assert default.feature_layers == (1, 1, 0)


def test_the_gguf_conversion_drafts_exactly_as_its_directory(e3_dirs, e3_target):
    """Same network after undoing the conversion (names, q/k row order, absolute d2t): the same
    proposal and the same q, bit for bit, on the target's real features."""
    prompt = list(e3_target.tokenizer.encode("The quick brown fox"))
    proposals = []
    for form in ("eagle3", "gguf"):
        drafter = load_model_drafter(e3_dirs[form], target_vocab_size=e3_target.vocab_size)
        drafter.bind(e3_target.model)
        features = prefill_with_features(e3_target.model, prompt, e3_target.make_cache(), drafter.feature_layers)
        sequence = prompt + [5]
        drafter.start(sequence, SamplerParams(temperature=0.9, seed=3), 3)
        drafter.observe_target(features)
        proposals.append(drafter.propose(sequence, 4))
    assert proposals[0].tokens == proposals[1].tokens and len(proposals[0].tokens) == 4
    assert mx.array_equal(proposals[0].q, proposals[1].q).item()


def _broken(src, tmp_path, edit_config=None, edit_tensors=None):
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    if edit_config is not None:
        config = json.loads((bad / "config.json").read_text())
        edit_config(config)
        (bad / "config.json").write_text(json.dumps(config))
    if edit_tensors is not None:
        tensors = dict(mx.load(str(bad / "model.safetensors")))
        edit_tensors(tensors)
        mx.save_safetensors(str(bad / "model.safetensors"), tensors)
    return bad


def _d2t_duplicate(t):
    d2t = np.asarray(t["d2t"]).copy()
    d2t[1] = d2t[0] - 1  # draft tokens 0 and 1 both map to target id d2t[0]
    t["d2t"] = mx.array(d2t)


BROKEN = {
    "no hidden size": (lambda c: c.pop("hidden_size"), None, "lacks 'hidden_size'"),
    "two layers": (lambda c: c.update(num_hidden_layers=2, draft_vocab_size=256), None, "2 decoder layers"),
    "not llama": (lambda c: c.update(model_type="qwen3"), None, "a 'qwen3' layer"),
    "eagle 1/2": (lambda c: c.update(eagle_config={"use_aux_hidden_state": False}), None, "not EAGLE-3"),
    "layer count vs fc": (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2]), None, "names 2 target layers"),
    "head vs draft vocab": (lambda c: c.update(draft_vocab_size=300), None, "draft_vocab_size is 300"),
    "no d2t": (None, lambda t: t.pop("d2t"), "no d2t map"),
    "d2t out of range": (None, lambda t: t.update(d2t=t["d2t"] + 200), "outside the target vocabulary"),
    "d2t duplicates": (None, _d2t_duplicate, "two draft tokens to one target token"),
    "missing tensor": (None, lambda t: t.pop("midlayer.hidden_norm.weight"), "missing.*hidden_norm"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_malformed_checkpoint_is_refused_clearly(e3_dirs, tmp_path, case):
    edit_config, edit_tensors, needle = BROKEN[case]
    bad = _broken(e3_dirs["eagle3"], tmp_path, edit_config, edit_tensors)
    with pytest.raises(ModelLoadError, match=needle):
        load_model_drafter(bad, target_vocab_size=384)


def test_a_drafter_for_another_target_is_refused_at_bind(e3_dirs, e3_root, e3_target, tiny_llama, tmp_path):
    drafter = load_model_drafter(e3_dirs["eagle3"], target_vocab_size=tiny_llama.vocab_size)
    with pytest.raises(ModelLoadError, match=r"entering layers \[1, 2, 4\], but this target has 2 layers"):
        drafter.bind(tiny_llama.model)  # two layers; the drafter reads the state entering layer 4
    zero = _broken(e3_dirs["eagle3"], tmp_path, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 1, 2]))
    with pytest.raises(ModelLoadError, match="0, the embeddings, cannot"):
        load_model_drafter(zero, target_vocab_size=384).bind(e3_target.model)
    narrow = load_target(tiny_drafters.build_target(e3_root / "narrow", "qwen3", seed=4, hidden=32))
    with pytest.raises(ModelLoadError, match="hidden size is 32"):
        load_model_drafter(e3_dirs["eagle3"], target_vocab_size=384).bind(narrow.model)
    with pytest.raises(ModelLoadError, match="trained for a 384-token vocabulary; this target's has 300"):
        load_model_drafter(e3_dirs["eagle3"], target_vocab_size=300).bind(e3_target.model)
