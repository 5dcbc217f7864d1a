"""Independent references for the vision tests: the image processors of Hugging Face transformers
(its Pillow versions, so no torchvision is needed) and mlx-vlm's own full models, run on a prompt the
way their authors run them.

- Qwen2.5-VL: mlx-vlm's ``Model`` with its own M-RoPE (``get_rope_index``: the image's tokens on a
  time/row/column grid, the text after it at unshifted positions) and its own decode loop, which
  carries the position delta of the prompt into every generated token.
- Gemma 3: mlx-vlm's embeddings of the prompt (its projector's features put in at the image token
  positions), through mlx-vlm's language model with an explicit mask: causal, and an image's tokens
  seeing each other both ways, as llama.cpp decodes Gemma 3's images (``mtmd_decode_use_non_causal``)
  and Hugging Face's model masks them.
"""

from __future__ import annotations

import io
import json
from functools import lru_cache
from pathlib import Path

import mlx.core as mx
import numpy as np
from PIL import Image


def png(seed: int, size: tuple[int, int] = (40, 56)) -> bytes:
    """A random RGB image (height, width) as PNG bytes."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def hf_pixels(vlm_dir: Path, data: bytes) -> tuple[np.ndarray, list[int] | None]:
    """Transformers' preprocessing of ``data`` for the checkpoint: (pixel_values, grid_thw or None)."""
    config = json.loads((vlm_dir / "config.json").read_text())
    pre = json.loads((vlm_dir / "preprocessor_config.json").read_text())
    image = Image.open(io.BytesIO(data)).convert("RGB")
    if config["model_type"] == "qwen2_5_vl":
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        proc = Qwen2VLImageProcessorPil(min_pixels=pre["min_pixels"], max_pixels=pre["max_pixels"],
                                        patch_size=pre["patch_size"], merge_size=pre["merge_size"],
                                        temporal_patch_size=pre["temporal_patch_size"], image_mean=pre["image_mean"],
                                        image_std=pre["image_std"])
        out = proc(images=[image], return_tensors="np")
        return out["pixel_values"], [int(x) for x in out["image_grid_thw"][0]]
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    proc = Gemma3ImageProcessorPil(size=pre["size"], image_mean=pre["image_mean"], image_std=pre["image_std"])
    return proc(images=[image], return_tensors="np")["pixel_values"], None


@lru_cache(maxsize=4)
def vlm_model(vlm_dir: Path):
    from mlx_vlm.utils import load_model

    return load_model(vlm_dir)


def reference(vlm_dir: Path, tokens: list[int], data: bytes | list[bytes], n: int) -> tuple[mx.array, list[int]]:
    """The last prompt position's logits and ``n`` greedy tokens after the prompt (EOS ignored), as
    mlx-vlm's model computes them for ``tokens`` (with the images' placeholder positions) and the images
    ``data`` (one, or several in prompt order)."""
    model = vlm_model(vlm_dir)
    prepared = [hf_pixels(vlm_dir, d) for d in ([data] if isinstance(data, bytes) else data)]
    pixels = np.concatenate([p for p, _ in prepared])
    grid = [g for _, g in prepared] if prepared[0][1] is not None else None
    ids = mx.array([tokens])
    lm = model.language_model
    if grid is not None:
        from mlx_lm.models.cache import make_prompt_cache

        cache = make_prompt_cache(lm)
        first = model(ids, pixel_values=mx.array(pixels), image_grid_thw=mx.array(grid), cache=cache).logits[0, -1]
        step = lambda t: lm(mx.array([[t]]), cache=cache).logits[0, -1]  # noqa: E731
    else:
        from mlx_vlm.models.cache import KVCache

        image = int(json.loads((vlm_dir / "config.json").read_text())["image_token_index"])
        embeds = model.get_input_embeddings(ids, mx.array(pixels), mask=mx.ones_like(ids)).inputs_embeds
        mask = np.tril(np.ones((len(tokens), len(tokens)), dtype=bool))
        positions = np.flatnonzero(np.array(tokens) == image)
        per_image = len(positions) // len(prepared)
        for k in range(len(prepared)):  # each image's tokens see each other (and not another image's ahead)
            block = positions[k * per_image:(k + 1) * per_image]
            mask[np.ix_(block, block)] = True
        cache = [KVCache() for _ in lm.model.layers]
        first = lm(ids, inputs_embeds=embeds, cache=cache, mask=mx.array(mask)).logits[0, -1]
        step = lambda t: lm(mx.array([[t]]), cache=cache).logits[0, -1]  # noqa: E731
    out, logits = [], first
    for _ in range(n):
        out.append(int(mx.argmax(logits)))
        logits = step(out[-1])
    return first, out
