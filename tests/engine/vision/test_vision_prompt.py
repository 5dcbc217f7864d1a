"""A prompt with images as tokens (``engine.vision.prompt``), what of a cached prefix it may reuse, how it
is cut into chunks, and the decoding of the bytes a request sends (``engine.vision.image``)."""

from __future__ import annotations

import io

import numpy as np
import pytest

pytest.importorskip("PIL", reason="the image tests need Pillow (pip install 'mlxcel[vision]')")
from PIL import Image
from vision_reference import png

from mlxcel.engine.vision.image import ImageError, decode_image
from mlxcel.engine.vision.prepared import PlacedImage, PreparedImage
from mlxcel.engine.vision.prompt import NO_MEDIA, MarkerMismatch, PromptMedia, marked_prompt, reusable_through


class _Family:
    def __init__(self, mrope: bool):
        from mlxcel.engine.vision.families.base import Markers

        self.mrope = mrope
        self.markers = Markers("<b>", "<e>", "<p>")


class _Tower:
    placeholder_id = 99

    def __init__(self, mrope: bool = False):
        self.family = _Family(mrope)


def image(digest: str, grid=(1, 2, 3)) -> PreparedImage:
    return PreparedImage(pixels=np.zeros(1), grid=grid, digest=digest)


def tokenize(text: str) -> list[int]:
    return [{"<b>": 10, "<e>": 11}.get(text, 1)] if text in ("<b>", "<e>") else [ord(c) for c in text]


def test_markers_become_begin_placeholders_end():
    tokens, media = marked_prompt("ab@c", "@", [image("x")], _Tower(), tokenize, prefix=[7])
    assert tokens == [7, ord("a"), ord("b"), 10] + [99] * 6 + [11, ord("c")]
    assert [(p.start, p.end) for p in media.images] == [(4, 10)]
    assert media.plain_from == 10 and media.shift == 0 and media.positions is None


def test_markers_and_images_must_pair_up():
    with pytest.raises(MarkerMismatch, match=r"number of media markers in text \(2\) does not match number of "
                                             r"bitmaps \(1\)"):
        marked_prompt("@ and @", "@", [image("x")], _Tower(), tokenize)


def test_mrope_prompt_ends_at_its_index():
    tokens, media = marked_prompt("ab@cd@e", "@", [image("x", (1, 2, 3)), image("y", (1, 4, 1))], _Tower(True), tokenize)
    n = len(tokens)
    assert media.positions.shape == (3, n)
    assert media.positions[:, -1].tolist() == [n - 1] * 3
    # each image takes max(rows, cols) positions: 6 tokens in 3, 4 tokens in 4
    assert media.shift == (6 - 3) + (4 - 4)
    # text between images sits at a constant offset from its index
    first = media.images[0]
    after = media.positions[0, first.end:media.images[1].start] - np.arange(first.end, media.images[1].start)
    assert len(set(after.tolist())) == 1


def test_a_chunk_never_cuts_an_image():
    _, media = marked_prompt("ab@c", "@", [image("x")], _Tower(), tokenize)
    assert media.chunk_end(0, 6) == 9  # 6 falls inside the image (3..9): the chunk takes it whole
    assert media.chunk_end(0, 3) == 3 and media.chunk_end(0, 12) == 12
    chunk = media.chunk(0, 9)
    assert [offset for offset, _ in chunk.spans] == [3] and chunk.plan is None


def test_mrope_chunks_carry_positions_or_a_shift():
    _, media = marked_prompt("abcd@e", "@", [image("x", (1, 1, 4))], _Tower(True), tokenize)
    before = media.chunk(0, 2)
    assert before.spans == [] and before.plan.positions is None and before.plan.shift == media.shift
    with_image = media.chunk(0, media.plain_from)
    assert with_image.plan.positions.shape == (3, media.plain_from)


def key(*images: tuple[int, int, str], shift: int = 0):
    return tuple(images), shift


def test_a_cached_prefix_is_reused_only_through_the_same_images():
    a, b = (4, 6, "aaa"), (4, 6, "bbb")
    assert reusable_through(key(a), key(a), 20) == 20  # same bytes, same place
    assert reusable_through(key(a), key(b), 20) == 4  # another image there: up to its start
    assert reusable_through(key(a), NO_MEDIA, 20) == 4  # the cache has an image the prompt does not
    assert reusable_through(NO_MEDIA, key(a), 20) == 4  # and the other way round
    assert reusable_through(key(a), key(a), 7) == 4  # the prefix ends inside the image
    assert reusable_through(key(a), key(a, (30, 2, "c")), 20) == 20  # an image past the prefix does not count
    assert reusable_through(key(a, shift=2), key(a, shift=3), 20) == 0  # other positions throughout


def test_prompt_media_key_names_every_image():
    media = PromptMedia(_Tower(), [PlacedImage(5, image("d", (1, 1, 2)))])
    assert media.key == (((5, 2, "d"),), 0)


def encoded(image: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def test_decoding_takes_common_formats_and_flattens_alpha():
    rgba = Image.new("RGBA", (4, 3), (0, 0, 0, 0))
    out = decode_image(encoded(rgba))
    assert out.mode == "RGB" and out.size == (4, 3) and out.getpixel((0, 0)) == (255, 255, 255)
    assert decode_image(encoded(Image.new("RGB", (5, 5), (1, 2, 3)), "JPEG")).size == (5, 5)
    assert decode_image(png(1)).size == (56, 40)


@pytest.mark.parametrize("data, why", [
    (b"", "the image is empty"),
    (b"GIF89a not really", "Failed to load image or audio file"),
    (b"<html>hello</html>", "not an image in a format this server reads"),
    (png(1)[:200], "Failed to load image or audio file"),  # cut short
])
def test_bad_images_are_image_errors(data, why):
    with pytest.raises(ImageError, match=why):
        decode_image(data)


def test_a_huge_canvas_is_refused_before_decoding():
    big = encoded(Image.new("L", (4000, 3000)))  # small file, 12 megapixels
    with pytest.raises(ImageError, match="4000x3000 pixels, more than the 1000000"):
        decode_image(big, max_pixels=1_000_000)
