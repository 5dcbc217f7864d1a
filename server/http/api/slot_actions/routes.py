"""``POST /slots/{id_slot}?action=save|restore|erase`` (with ``--slot-save-path``), as upstream
answers it: 501 without the flag, 400 for a bad slot id, action or file name, and the result
bodies of ``runtime.slot_files``."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from starlette.requests import Request

from mlxcel.server.http.pipeline import read_body
from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.http.state import ServerState
from mlxcel.server.runtime import slot_files
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.errors import invalid, not_supported


def _file(state: ServerState, body: dict) -> tuple[str, Path]:
    """The request's ``filename`` and its path inside ``--slot-save-path`` (refused when it is not a
    plain file name there)."""
    name = body.get("filename")
    if not isinstance(name, str):
        raise invalid('"filename" must be a string')
    if not slot_files.valid_filename(name):
        raise invalid("Invalid filename")
    root = Path(state.config.slot_save_path).resolve()
    path = (root / name).resolve()
    if path.parent != root:  # cannot happen for a valid name; a second lock on the same door
        raise invalid("Invalid filename")
    return name, path


async def slot_action(request: Request, id_slot: str) -> JsonResponse:
    state: ServerState = request.app.state.server
    if not state.config.slot_save_path:
        raise not_supported("This server does not support slots action. Start it with `--slot-save-path`")
    try:
        slot = int(id_slot.strip())
    except ValueError:
        raise invalid("Invalid slot ID") from None
    action = request.query_params.get("action", "")
    scheduler = state.scheduler
    if action in ("save", "restore"):
        name, path = _file(state, await read_body(request))
        run = slot_files.save if action == "save" else slot_files.restore
        return JsonResponse(await scheduler.call(lambda: run(scheduler, slot, name, path)))
    if action == "erase":
        return JsonResponse(await scheduler.call(lambda: slot_files.erase(scheduler, slot)))
    raise invalid("Invalid action")


def add_routes(router: APIRouter, config: ServerConfig) -> None:
    router.add_api_route("/slots/{id_slot}", slot_action, methods=["POST"])
