"""Media in a request: images read into a prompt, as llama-server reads them with a projector loaded.

A chat ``image_url`` content part (and what other APIs translate into one: a Responses
``input_image``, an Anthropic ``image`` block) gives its image as upstream's ``handle_media`` takes
it: a ``data:image/...;base64,`` URL, bare base64, or ``file://`` under ``--media-path``; the part
becomes the media marker (:data:`MEDIA_MARKER`, which ``/props`` shows) in the message's text, joined
to the text parts around it without a newline, as upstream joins them. A ``/completion`` prompt object
carries base64 images in ``multimodal_data``, one per marker in its ``prompt_string``.

Each image is decoded and laid out for the model's vision tower at once (:class:`MediaCollector`; the
plan runs in a worker thread, so decoding never holds the event loop), and a bad one is a 400 with
upstream's message: not base64, not an image, cut short, too large. Where upstream answers these
with a 500 (its ``runtime_error``s), mlxcel answers 400 ``invalid_request_error``: the request is
at fault, not the server. Remote ``http(s)://`` images are refused: upstream fetches them unasked
(no flag turns that off), a server-side fetch of any URL a client names, which mlxcel does not do;
the client sends the bytes instead.

Without a vision tower (a text model, ``--no-mmproj``), media parts and ``multimodal_data`` are
refused before anything is read, with upstream's messages and hint. Audio and video are refused
always: mlxcel's towers are vision towers.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
import string
from pathlib import Path
from typing import Any

from mlxcel.server.runtime.errors import ApiError, invalid

HINT = "hint: if this is unexpected, you may need to provide the mmproj"
# upstream's marker: random per process unless LLAMA_MEDIA_MARKER pins it
MEDIA_MARKER = os.environ.get("LLAMA_MEDIA_MARKER") or (
    "<__media_" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(32)) + "__>")

# content part type -> the kind upstream names in its refusal
MEDIA_PARTS = {"image_url": "image", "input_audio": "audio", "input_video": "video", "video_url": "video"}


def load_url(url: Any, media_path: str | None) -> bytes:
    """An image's bytes from the forms upstream's ``handle_media`` takes (module docstring)."""
    if not isinstance(url, str) or not url:
        raise invalid("image_url: 'url' must be a non-empty string")
    if url.startswith("http"):
        raise invalid("remote image URLs are not fetched by mlxcel-server; send the image itself as a "
                      "data:image/...;base64 URL")
    if url.startswith("file://"):
        return _local_file(url[len("file://"):], media_path)
    if url.startswith("data:"):
        head, sep, payload = url.partition(",")
        if not sep or "," in payload:
            raise invalid("Invalid uri-encoded base64 value")
        if not head.startswith(("data:image/", "data:video/", "data:audio/")):
            raise invalid(f"Invalid uri format: {head[:64]}")
        if not head.endswith("base64"):
            raise invalid("uri must be base64 encoded")
        return _base64(payload)
    return _base64(url)


def _base64(text: str) -> bytes:
    try:
        data = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise invalid("Invalid base64 value") from None
    if not data:
        raise invalid("Invalid base64 value")
    return data


def _local_file(name: str, media_path: str | None) -> bytes:
    """A ``file://`` image: a relative path under ``--media-path`` only, as upstream allows it."""
    if not media_path:
        raise invalid("file:// URLs are not allowed unless --media-path is specified")
    parts = Path(name).parts
    if not name or Path(name).is_absolute() or ".." in parts or "\\" in name or "\0" in name:
        raise invalid(f"file path is not allowed: {name[:256]}")
    root = Path(media_path).resolve()
    path = (root / name).resolve()
    if root not in path.parents or not path.is_file():
        raise invalid(f"file does not exist or cannot be opened: {name[:256]}")
    return path.read_bytes()


class MediaCollector:
    """The images of one request, in the order their markers appear in its prompt, each decoded and
    prepared for ``tower`` as it is found."""

    def __init__(self, tower, media_path: str | None = None):
        self.tower = tower
        self.media_path = media_path
        self.images: list = []

    def add(self, data: bytes) -> str:
        """Prepare one image; the marker that stands for it in the prompt text."""
        from mlxcel.engine.vision.image import ImageError  # noqa: PLC0415 - defers Pillow (vision servers only)

        try:
            self.images.append(self.tower.prepare(data))
        except ImageError as exc:
            raise invalid(str(exc)) from None
        return MEDIA_MARKER

    def add_part(self, part: dict) -> str:
        """An ``image_url`` content part's image; its marker."""
        image_url = part.get("image_url")
        url = image_url.get("url") if isinstance(image_url, dict) else image_url
        return self.add(load_url(url, self.media_path))


class MarkersOnly:
    """Stands in for a collector where the same parts are rendered a second time: the markers, no reading."""

    def add_part(self, part: dict) -> str:
        return MEDIA_MARKER


def content_part_text(part: object, media: MediaCollector | MarkersOnly | None) -> tuple[str, bool]:
    """A chat content part as (its text, whether it is a media marker). Media parts go to ``media``
    (refused without one, as upstream refuses them without a projector); audio and video are refused,
    and so is an unknown type (upstream's "unsupported content[].type")."""
    kind = part.get("type") if isinstance(part, dict) else None
    if not isinstance(kind, str):
        raise invalid("unsupported content[].type: a content part's type must be a string")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise invalid("Failed to parse messages: a text content part needs a string 'text'")
        return part["text"], False
    if kind == "image_url" and media is not None:
        return media.add_part(part), True
    if kind in MEDIA_PARTS:
        raise invalid(f"{MEDIA_PARTS[kind]} input is not supported - {HINT}")
    raise invalid("unsupported content[].type")


def joined(parts: list[tuple[str, bool]], join: str) -> str:
    """Content parts' texts joined as upstream joins them: ``join`` between text parts, nothing next to
    a media marker."""
    out, last_media = "", False
    for text, is_media in parts:
        if out and not is_media and not last_media:
            out += join
        out += text
        last_media = is_media
    return out


def refuse_content_part(part: object) -> None:
    """Raise for a content part a server without a vision tower cannot take (text parts pass)."""
    content_part_text(part, None)


def multimodal_prompt_refused() -> ApiError:
    """A prompt object with ``multimodal_data`` on a server without a vision tower: upstream's message."""
    return invalid("Multimodal data provided, but model does not support multimodal requests.")


def multimodal_images(prompt: dict, media: MediaCollector) -> None:
    """A prompt object's ``multimodal_data`` (base64 images, or data URLs) into ``media``."""
    items = prompt.get("multimodal_data")
    if not isinstance(items, list) or any(not isinstance(x, str) for x in items):
        raise invalid("'multimodal_data' must be an array of base64 strings")
    for item in items:
        media.add(load_url(item, None) if item.startswith("data:") else _base64(item))
