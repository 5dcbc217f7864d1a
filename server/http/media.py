"""Media in a request, refused as upstream refuses it on a model without a multimodal projector.

mlxcel-server serves text models (``--mmproj`` is refused), so it is always in the position of a
llama-server started without ``--mmproj``: an ``image_url``, ``input_audio`` or ``input_video`` /
``video_url`` content part, and a ``/completion`` prompt object carrying ``multimodal_data`` (even
an empty list, as upstream tests for the key), are refused before anything is downloaded or
decoded. The messages are upstream's; the status is 400 ``invalid_request_error`` rather than
upstream's 500 (the request cannot be served by this server, the server is not failing), and the
hint names what is missing here instead of advising ``--mmproj``.
"""

from __future__ import annotations

from mlxcel.server.runtime.errors import ApiError, invalid

HINT = "mlxcel-server serves text models only"

# content part type -> the kind upstream names in its refusal
MEDIA_PARTS = {"image_url": "image", "input_audio": "audio", "input_video": "video", "video_url": "video"}


def refuse_content_part(part: object) -> None:
    """Raise for a content part this server cannot take: media (upstream's "<kind> input is not
    supported") or an unknown type (upstream's "unsupported content[].type"). Text parts pass."""
    kind = part.get("type") if isinstance(part, dict) else None
    if not isinstance(kind, str):
        raise invalid("unsupported content[].type: a content part's type must be a string")
    if kind in MEDIA_PARTS:
        raise invalid(f"{MEDIA_PARTS[kind]} input is not supported - {HINT}")
    if kind != "text":
        raise invalid("unsupported content[].type")


def multimodal_prompt_refused() -> ApiError:
    """A prompt object with ``multimodal_data``: upstream's message for a model without a projector."""
    return invalid(f"Multimodal data provided, but model does not support multimodal requests (multimodal_data: "
                   f"{HINT}).")
