"""``GET`` / ``POST /lora-adapters``: the loaded LoRA adapters and their global scales.

As upstream: ``GET`` lists every adapter loaded with ``--lora`` / ``--lora-scaled`` (``id``, ``path``,
``scale``, ``task_name``, ``prompt_prefix``; ``[]`` without any); ``POST`` takes an array of
``{"id", "scale"}`` and sets those adapters' global scales, every adapter it leaves out to 0, and
answers ``{"success": true}``. The global scales are what a request that lists no adapters runs at,
taken when it starts (a running request keeps its own). The body is read by ``lora_list`` (a bad
entry or an unknown id is a 400, where upstream ignores it).
"""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request

from mlxcel.server.http.disconnects import ClientGone
from mlxcel.server.http.json_body import decode_json
from mlxcel.server.http.lora_list import parse_lora_list
from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.http.state import ServerState
from mlxcel.server.runtime.errors import invalid


async def get_lora_adapters(request: Request) -> JsonResponse:
    state: ServerState = request.app.state.server
    adapters = state.loaded.adapters if state.loaded is not None else None
    return JsonResponse(adapters.describe() if adapters is not None else [])


async def post_lora_adapters(request: Request) -> JsonResponse:
    state: ServerState = request.app.state.server
    try:
        raw = await request.body()  # small: a few adapters' ids and scales (--max-body-size bounds it)
    except ClientDisconnect:
        raise ClientGone("the client disconnected while sending the body") from None
    body = decode_json(raw)
    if not isinstance(body, list):
        raise invalid("Request body must be an array")
    adapters = state.loaded.adapters if state.loaded is not None else None
    scales = parse_lora_list(body, len(adapters) if adapters is not None else 0)
    if adapters is not None:
        adapters.set_scales(scales)
    return JsonResponse({"success": True})
