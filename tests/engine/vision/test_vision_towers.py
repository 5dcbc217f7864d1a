"""Vision towers loaded both ways users hold them, against mlx-vlm's own models.

For each family (Gemma 3, Qwen2.5-VL), a tiny checkpoint as mlx-vlm saves it, and the same checkpoint
as llama.cpp's converter writes it (text GGUF + mmproj GGUF, ``tests/helpers/tiny_vision.py``):

- the projector file's tensors land on exactly the directory's parameters (the converter's changes
  undone: split q/k/v, the 2-D patch kernels, Gemma's ``1 + w`` norm);
- a prompt with an image gives the logits mlx-vlm's model gives (``vision_reference``), and the greedy
  tokens after it, from either source: embeddings, M-RoPE positions (moved so decoding sits at cache
  indices), Gemma's bidirectional image attention;
- images are prepared as transformers' processors prepare them.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

pytest.importorskip("mlx_vlm", reason="the vision tests need mlx-vlm (pip install 'mlxcel[vision]')")
from vision_reference import hf_pixels, png, reference

from mlxcel.engine.errors import ModelLoadError

FAMILIES = ("gemma3", "qwen2_5_vl")
N_GREEDY = 6


@pytest.fixture(scope="module")
def loaded(vision_files):
    from mlxcel.engine.model.loading import load_model

    out = {}
    for family, files in vision_files.items():
        out[family, "dir"] = load_model(files["dir"])
        out[family, "gguf"] = load_model(files["gguf"], mmproj=files["mmproj"])
    return out


def prompt(lm, data: bytes):
    from mlxcel.engine.vision.prompt import marked_prompt

    text = "<|im_start|>user\nLook at this: MARK\nWhat is it?<|im_end|>\n<|im_start|>assistant\n"
    image = lm.vision.prepare(data)
    return marked_prompt(text, "MARK", [image], lm.vision, lambda s: lm.tokenizer.encode(s, add_special_tokens=False))


def greedy(lm, tokens, media, n: int):
    """The engine's own path: the prompt's chunk with images on its cache, then plain one-token steps."""
    from mlxcel.engine.vision.forward import media_logits

    cache = lm.make_cache()
    first = media_logits(lm.model, mx.array(tokens), media.chunk(0, len(tokens)), cache, True)
    out, logits = [], first
    for _ in range(n):
        out.append(int(mx.argmax(logits)))
        logits = lm.model(mx.array([[out[-1]]]), cache=cache)[0, -1]
    return first, out


@pytest.mark.parametrize("family", FAMILIES)
def test_the_mmproj_tensors_are_the_directory_tower(loaded, family):
    a = dict(tree_flatten(loaded[family, "dir"].vision.modules.parameters()))
    b = dict(tree_flatten(loaded[family, "gguf"].vision.modules.parameters()))
    assert a.keys() == b.keys()
    for name in a:
        atol = 1e-3 if "input_projection" in name else 0.0  # the converter stores Gemma's projection as F16
        assert np.allclose(np.array(a[name]), np.array(b[name]), atol=atol, rtol=0), name


@pytest.mark.parametrize("family", FAMILIES)
def test_images_are_prepared_as_transformers_prepares_them(loaded, vision_files, family):
    data = png(3, size=(37, 61))
    mine = loaded[family, "dir"].vision.prepare(data).pixels
    theirs, grid = hf_pixels(vision_files[family]["dir"], data)
    if grid is None:  # SigLIP: one [H, W, C] image (theirs channels-first)
        theirs = theirs.transpose(0, 2, 3, 1)
    assert mine.shape == theirs.shape
    assert np.abs(mine - theirs).max() < 1e-5


@pytest.mark.parametrize("source", ["dir", "gguf"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_prompt_with_an_image_gives_mlx_vlms_logits_and_tokens(loaded, vision_files, family, source):
    lm = loaded[family, source]
    data = png(7)
    tokens, media = prompt(lm, data)
    logits, tokens_out = greedy(lm, tokens, media, N_GREEDY)
    ref_logits, ref_tokens = reference(vision_files[family]["dir"], tokens, data, N_GREEDY)
    assert float(mx.abs(logits - ref_logits).max()) < 5e-3 * max(1.0, float(mx.abs(ref_logits).max()))
    assert tokens_out == ref_tokens


@pytest.mark.parametrize("family", FAMILIES)
def test_the_image_changes_the_answer(loaded, family):
    """Not a text model that ignores its image rows: another image gives other logits."""
    lm = loaded[family, "dir"]
    a = greedy(lm, *prompt(lm, png(1)), 0)[0]
    b = greedy(lm, *prompt(lm, png(2)), 0)[0]
    assert float(mx.abs(a - b).max()) > 1e-3


def test_qwen_positions_match_mlx_vlms_rope_index(loaded, vision_files):
    """The prompt's M-RoPE positions are mlx-vlm's (``get_rope_index``), moved by one constant so that
    the prompt ends at its index."""
    lm = loaded["qwen2_5_vl", "dir"]
    data = png(4, size=(64, 32))
    tokens, media = prompt(lm, data)
    _, grid = hf_pixels(vision_files["qwen2_5_vl"]["dir"], data)
    from vision_reference import vlm_model

    theirs, _ = vlm_model(vision_files["qwen2_5_vl"]["dir"]).language_model.get_rope_index(
        mx.array([tokens]), mx.array([grid]))
    theirs = np.array(theirs)[:, 0, :]
    assert (media.positions - theirs == media.shift).all()
    assert media.positions[:, -1].tolist() == [len(tokens) - 1] * 3 and media.shift > 0


def test_other_projectors_are_refused_by_name(tmp_path, vision_files):
    from gguf import GGUFWriter

    from mlxcel.engine.model.loading import load_model

    path = tmp_path / "mmproj-idefics3.gguf"
    w = GGUFWriter(str(path), "clip")
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type("idefics3")
    w.add_tensor("v.patch_embd.weight", np.zeros((4, 3, 2, 2), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="unsupported multimodal projector type 'idefics3'"):
        load_model(vision_files["gemma3"]["gguf"], mmproj=path)
    with pytest.raises(ModelLoadError, match="not a multimodal projector"):
        load_model(vision_files["gemma3"]["gguf"], mmproj=vision_files["gemma3"]["gguf"])


def test_a_projector_for_another_vocabulary_is_refused(vision_files):
    """Qwen's projector on Gemma's text model: its image tokens are not in the vocabulary."""
    from mlxcel.engine.model.loading import load_model

    with pytest.raises(ModelLoadError, match="lacks the Qwen2.5-VL image tokens"):
        load_model(vision_files["gemma3"]["gguf"], mmproj=vision_files["qwen2_5_vl"]["mmproj"])


def test_no_mmproj_serves_the_directory_as_text(vision_files):
    from mlxcel.engine.model.loading import load_model

    assert load_model(vision_files["gemma3"]["dir"], mmproj_auto=False).vision is None


def test_hf_loads_the_repositorys_projector(vision_files, tmp_path, monkeypatch):
    """``-hf``: the projector the repository holds beside the model is loaded with it (from the cache
    here), unless ``--no-mmproj``."""
    from hub_cache import gguf_repo

    from mlxcel.engine.model.loading import load_model

    files = vision_files["qwen2_5_vl"]
    gguf_repo(tmp_path / "hub", "acme/tiny-VL-GGUF", {"tiny-VL-Q8_0.gguf": files["gguf"],
                                                     "mmproj-tiny-VL-F16.gguf": files["mmproj"]})
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = load_model(hf_repo="acme/tiny-VL-GGUF:Q8_0", mmproj_auto=True)
    assert loaded.vision is not None and loaded.vision.family.name == "qwen2_5_vl"
    assert load_model(hf_repo="acme/tiny-VL-GGUF:Q8_0", mmproj_auto=False).vision is None


@pytest.mark.parametrize("family", FAMILIES)
def test_a_prompt_fed_in_small_chunks_gives_the_same_answer(loaded, vision_files, family):
    """As the server feeds a long prompt: chunks of a few tokens, an image never cut (``chunk_end``), the
    chunks before it at their planned positions, the ones after the last image plain."""
    from mlxcel.engine.vision.forward import media_logits

    lm = loaded[family, "gguf"]
    data = png(9)
    tokens, media = prompt(lm, data)
    cache, start, logits = lm.make_cache(), 0, None
    while start < len(tokens):
        end = media.chunk_end(start, start + 5)
        x = mx.array(tokens[start:end])
        if start < media.plain_from:
            logits = media_logits(lm.model, x, media.chunk(start, end), cache, True)
        else:
            logits = lm.model(x[None], cache=cache)[0, -1]
        start = end
    ref_logits, _ = reference(vision_files[family]["dir"], tokens, data, 0)
    assert float(mx.abs(logits - ref_logits).max()) < 5e-3 * max(1.0, float(mx.abs(ref_logits).max()))


@pytest.mark.parametrize("family", FAMILIES)
def test_two_images_in_one_prompt(loaded, vision_files, family):
    """Each image in its place, with its own size (Qwen), attending within itself (Gemma), the text
    between them at its positions."""
    from mlxcel.engine.vision.prompt import marked_prompt

    lm = loaded[family, "gguf"]
    datas = [png(11, size=(40, 56)), png(12, size=(64, 32))]
    text = "<|im_start|>user\nFirst MARK then MARK: compare.<|im_end|>\n<|im_start|>assistant\n"
    tokens, media = marked_prompt(text, "MARK", [lm.vision.prepare(d) for d in datas], lm.vision,
                                  lambda s: lm.tokenizer.encode(s, add_special_tokens=False))
    assert len(media.images) == 2
    logits, tokens_out = greedy(lm, tokens, media, N_GREEDY)
    ref_logits, ref_tokens = reference(vision_files[family]["dir"], tokens, datas, N_GREEDY)
    assert float(mx.abs(logits - ref_logits).max()) < 5e-3 * max(1.0, float(mx.abs(ref_logits).max()))
    assert tokens_out == ref_tokens
