"""``/embedding``, ``/embeddings``, ``/v1/embeddings`` (``--embeddings``) and ``/rerank``,
``/reranking``, ``/v1/rerank``, ``/v1/reranking`` (``--reranking``): each input is one job on the
engine thread (``Scheduler.call``), so embeddings interleave with running completions."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from starlette.requests import Request

from mlxcel.server.http import embeddings
from mlxcel.server.http.pipeline import read_body
from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.http.state import ServerState
from mlxcel.server.http.tasks import until_disconnect
from mlxcel.server.runtime.errors import invalid, not_supported

EMBEDDINGS_OFF = "This server does not support embeddings. Start it with `--embeddings`"
RERANKING_OFF = "This server does not support reranking. Start it with `--reranking`"


async def _embed(request: Request, oai: bool) -> JsonResponse:
    state: ServerState = request.app.state.server
    embedder = state.embedder
    if embedder is None:
        raise not_supported(EMBEDDINGS_OFF)
    if oai and embedder.pooling == "none":
        raise invalid("Pooling type 'none' is not OAI compatible. Please use a different pooling type")
    body = await read_body(request)
    if "input" in body:
        value = body["input"]
    elif "content" in body:
        value, oai = body["content"], False  # "content" is the native shape, on any of the routes
    else:
        raise invalid('"input" or "content" must be provided')
    use_base64 = embeddings.check_encoding(body)
    inputs = await asyncio.to_thread(embeddings.embedding_inputs, state, value)  # tokenizing: off the loop
    norm = embeddings.check_normalize(body, embedder.normalization)
    vectors = await until_disconnect(request, asyncio.gather(
        *(state.scheduler.call(lambda t=tokens: embedder.embed(t, norm)) for tokens in inputs)))
    if oai:
        return JsonResponse(embeddings.oai_body(body, state.model_name, vectors, [len(t) for t in inputs], use_base64))
    return JsonResponse(embeddings.native_body(vectors))


async def embeddings_native(request: Request) -> JsonResponse:
    return await _embed(request, oai=False)


async def embeddings_oai(request: Request) -> JsonResponse:
    return await _embed(request, oai=True)


async def rerank(request: Request) -> JsonResponse:
    state: ServerState = request.app.state.server
    embedder = state.embedder
    if embedder is None or not embedder.reranking:
        raise not_supported(RERANKING_OFF)
    body = await read_body(request)
    query, docs, top_n, tei = embeddings.rerank_request(body)
    prompts = [embeddings.rerank_tokens(state, embedder.rerank_template, query, d) for d in docs]
    scores = await until_disconnect(request, asyncio.gather(
        *(state.scheduler.call(lambda t=tokens: embedder.score(t)) for tokens in prompts)))
    return JsonResponse(embeddings.rerank_body(body, state.model_name, docs, list(scores), [len(p) for p in prompts],
                                               top_n, tei))


def add_routes(router: APIRouter) -> None:
    for path in ("/embedding", "/embeddings"):
        router.add_api_route(path, embeddings_native, methods=["POST"])
    router.add_api_route("/v1/embeddings", embeddings_oai, methods=["POST"])
    for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"):
        router.add_api_route(path, rerank, methods=["POST"])
