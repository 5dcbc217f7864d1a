"""llama-server's tokenizer and template routes: ``/tokenize``, ``/detokenize`` and
``/apply-template``.

Each route's tokenizer / template work runs in a worker thread (``asyncio.to_thread``): a long text
takes the tokenizer a while, and the event loop serves every other client meanwhile."""

from __future__ import annotations

import asyncio

from starlette.requests import Request

from mlxcel.server.http.pipeline import read_body
from mlxcel.server.http.plan import chat_body_prompt
from mlxcel.server.http.prompts import bos_prefix, tokenize_text
from mlxcel.server.http.schema import DetokenizeRequest, TokenizeRequest, validate
from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.http.state import ServerState
from mlxcel.server.runtime.errors import invalid, json_type_name


async def tokenize(request: Request) -> JsonResponse:
    state: ServerState = request.app.state.server
    req = validate(TokenizeRequest, await read_body(request))
    return JsonResponse(await asyncio.to_thread(_tokens, state, req))


def _tokens(state: ServerState, req: TokenizeRequest) -> dict:
    if req.content is None:
        return {"tokens": []}
    ids = tokenize_text(state.loaded.tokenizer, req.content, add_special=False, parse_special=req.parse_special)
    if req.add_special:
        ids = bos_prefix(state.loaded) + ids
    if req.with_pieces:
        return {"tokens": [{"id": t, "piece": state.token_text.piece(t)} for t in ids]}
    return {"tokens": ids}


async def detokenize(request: Request) -> JsonResponse:
    state: ServerState = request.app.state.server
    body = await read_body(request)
    if "tokens" in body and not isinstance(body["tokens"], list):
        raise invalid(f"type must be array, but is {json_type_name(body['tokens'])}")
    req = validate(DetokenizeRequest, body)
    tokens = req.tokens or []
    if any(t < 0 or t >= state.loaded.vocab_size for t in tokens):
        raise invalid("tokens contain invalid ids")
    return JsonResponse({"content": await asyncio.to_thread(state.loaded.tokenizer.decode, tokens)})


async def apply_template(request: Request) -> JsonResponse:
    state: ServerState = request.app.state.server
    body = await read_body(request)
    return JsonResponse({"prompt": await asyncio.to_thread(chat_body_prompt, state, body)})
