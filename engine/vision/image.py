"""An image as a request sends it (the bytes of a PNG, JPEG, WebP, GIF or BMP file), decoded.

Decoding is where a bad image is caught: bytes that are no image, a file cut short, an image so
large that decoding it would take the server's memory. Each is an :class:`ImageError` whose message
is upstream's ("Failed to load image or audio file") with the reason after it, for the HTTP layer's
400. The size is checked from the header before any pixel is decoded, so a small file claiming
a huge canvas (a decompression bomb) costs nothing. Pure Pillow; no MLX, safe on any thread.
"""

from __future__ import annotations

import io
import warnings

from PIL import Image, UnidentifiedImageError

LOAD_FAILED = "Failed to load image or audio file"
# The largest canvas decoded (width x height): 64 megapixels (8192 x 8192), far past what any vision
# tower looks at (Qwen2.5-VL's default cap is ~12.8 megapixels) and small enough to decode safely.
MAX_PIXELS = 8192 * 8192


class ImageError(ValueError):
    """An image that cannot be used, with the reason."""


def decode_image(data: bytes, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """``data`` decoded to an RGB image (an alpha channel composited over white, as a viewer shows
    it); :class:`ImageError` for anything else."""
    if not data:
        raise ImageError(f"{LOAD_FAILED}: the image is empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width <= 0 or height <= 0 or width * height > max_pixels:
                raise ImageError(f"{LOAD_FAILED}: the image is {width}x{height} pixels, more than the "
                                 f"{max_pixels} this server decodes")
            image.load()
    except ImageError:
        raise
    except UnidentifiedImageError:
        raise ImageError(f"{LOAD_FAILED}: the data is not an image in a format this server reads "
                         "(PNG, JPEG, WebP, GIF, BMP)") from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"{LOAD_FAILED}: {exc}") from None
    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")
