"""``/embedding``, ``/embeddings``, ``/v1/embeddings`` (``--embeddings``) and ``/rerank``,
``/reranking``, ``/v1/rerank``, ``/v1/reranking`` (``--reranking``).

A request's inputs are tokenized in a worker thread (the event loop keeps serving everyone else),
then computed on the engine thread as one ``runtime.embedder.EmbeddingRun``: a slice at a time
between the steps of running completions, ended by ``--timeout`` (503, as a completion) and
dropped when the client hangs up. The answer is serialized in a worker thread too.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter
from starlette.requests import Request

from mlxcel.server.http.api.embeddings import bodies
from mlxcel.server.http.pipeline import read_body
from mlxcel.server.http.sse import JsonResponse
from mlxcel.server.http.state import ServerState
from mlxcel.server.http.tasks import until_disconnect
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.embedder import EmbeddingRun
from mlxcel.server.runtime.errors import invalid, not_supported

EMBEDDINGS_OFF = "This server does not support embeddings. Start it with `--embeddings`"
RERANKING_OFF = "This server does not support reranking. Start it with `--reranking`"


async def _on_engine(request: Request, state: ServerState, run: EmbeddingRun) -> list:
    """``run``'s results; a client that hangs up (or any other way out) drops its remaining inputs."""
    try:
        return await until_disconnect(request, state.scheduler.call(run))
    finally:
        run.cancel()


async def _embed(request: Request, oai: bool) -> JsonResponse:
    t_arrival = time.perf_counter()
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
    use_base64 = bodies.check_encoding(body)
    norm = bodies.check_normalize(body, embedder.normalization)
    inputs = await asyncio.to_thread(bodies.embedding_inputs, state, value)  # tokenizing: off the loop
    vectors = await _on_engine(request, state, embedder.embedding_run(inputs, norm, state.scheduler.timeout,
                                                                      t_arrival))
    if oai:
        lengths = [len(t) for t in inputs]
        return await asyncio.to_thread(lambda: JsonResponse(
            bodies.oai_body(body, state.model_name, vectors, lengths, use_base64)))
    return await asyncio.to_thread(lambda: JsonResponse(bodies.native_body(vectors)))


async def embeddings_native(request: Request) -> JsonResponse:
    return await _embed(request, oai=False)


async def embeddings_oai(request: Request) -> JsonResponse:
    return await _embed(request, oai=True)


async def rerank(request: Request) -> JsonResponse:
    t_arrival = time.perf_counter()
    state: ServerState = request.app.state.server
    embedder = state.embedder
    if embedder is None or not embedder.reranking:
        raise not_supported(RERANKING_OFF)
    body = await read_body(request)
    query, docs, top_n, tei = bodies.rerank_request(body)
    prompts = await asyncio.to_thread(bodies.rerank_inputs, state, embedder.rerank_template, query, docs)
    scores = await _on_engine(request, state, embedder.rerank_run(prompts, state.scheduler.timeout, t_arrival))
    lengths = [len(p) for p in prompts]
    return await asyncio.to_thread(lambda: JsonResponse(
        bodies.rerank_body(body, state.model_name, docs, list(scores), lengths, top_n, tei)))


def add_routes(router: APIRouter, config: ServerConfig) -> None:
    for path in ("/embedding", "/embeddings"):
        router.add_api_route(path, embeddings_native, methods=["POST"])
    router.add_api_route("/v1/embeddings", embeddings_oai, methods=["POST"])
    for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"):
        router.add_api_route(path, rerank, methods=["POST"])
