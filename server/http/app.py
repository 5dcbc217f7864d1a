"""The FastAPI application: llama-server's route table, authentication, error mapping, and the
request handlers that turn HTTP bodies into scheduler tasks and events into responses.

The model loads in a background thread after the server starts listening; until it is ready every
route answers 503 ``unavailable_error`` ("Loading model"), as upstream does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import PlainTextResponse, Response

from mlxcel.server.http import model_info
from mlxcel.server.http import responses as R
from mlxcel.server.cli.args import ServerConfig
from mlxcel.server.http.chat_template import apply_template, normalize_messages, resolve_template
from mlxcel.server.http.auth import ApiKeys, invalid_key
from mlxcel.server.http.cors import Cors
from mlxcel.server.runtime.errors import (ApiError, context_exceeded, context_exceeded_at_least, invalid, not_found_body, not_supported,
                     unavailable)
from mlxcel.server.http.limits import BodyLimit, BodyRefused, Limits
from mlxcel.server.runtime.metrics import Metrics
from mlxcel.server.http.prompts import check_tokens, least_tokens, longest_piece, split_prompts, tokenize_prompt, tokenize_text
from mlxcel.server.http.request_params import ServerDefaults, build_defaults, generation_options
from mlxcel.server.http.schema import ChatRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest, check_range, parse_body, validate
from mlxcel.server.runtime.scheduler import Scheduler, TaskHandle
from mlxcel.server.http.sse import DONE, JsonResponse, event, event_stream
from mlxcel.server.runtime.task import Final, GenerationOptions, Partial, Progress
from mlxcel.server.http.token_text import TokenText

log = logging.getLogger(__name__)

@dataclass
class ServerState:
    config: ServerConfig
    loaded: Any = None
    scheduler: Scheduler | None = None
    defaults: ServerDefaults = field(default_factory=ServerDefaults)
    model_name: str = ""
    template: str | None = None
    template_kwargs: dict = field(default_factory=dict)
    token_text: TokenText | None = None
    metrics: Metrics = field(default_factory=Metrics)
    load_error: str | None = None
    api_keys: list[str] = field(default_factory=list)
    limits: Limits = field(default_factory=Limits)
    n_params: int = 0  # counted at load time, so no MLX call happens on the event loop
    piece_chars: int = 0  # longest vocabulary piece, for prompts.least_tokens

    @property
    def ready(self) -> bool:
        return self.scheduler is not None

    def default_options(self) -> GenerationOptions:
        d = self.defaults
        return GenerationOptions(sampler=d.sampler, seed=d.seed, n_predict=d.n_predict, samplers=list(d.samplers))


# -- middleware ---------------------------------------------------------------------------------


class GateMiddleware:
    """The checks every request passes before a route sees it, in upstream's order: CORS headers
    (and the ``OPTIONS`` preflight), 503 while the model loads, 401 without a valid API key, 413
    for a body over ``--max-body-size`` and 408 for one that stalls past ``--timeout``. Pure ASGI,
    so streaming and disconnect detection are untouched; the cost is a header scan and a couple of
    closures per request (``scripts/bench_gate.py``)."""

    def __init__(self, app, state: ServerState):
        self.app = app
        self.state = state
        self.cors = Cors.from_config(state.config)
        self.keys = ApiKeys(state.api_keys)
        self.body_limit = BodyLimit(state.config.max_body_size, read_timeout=float(state.config.timeout))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = self.state
        origin = b""
        for name, value in scope.get("headers", ()):
            if name == b"origin":
                origin = value
                break
        send = self.cors.wrap_send(origin, send)
        if scope.get("method") == "OPTIONS":
            return await self.cors.preflight(send)
        if not state.ready:
            message = "Loading model" if state.load_error is None else f"Model failed to load: {state.load_error}"
            return await JsonResponse(unavailable(message).body(), status_code=503)(scope, receive, send)
        path = scope.get("path", "")
        prefix = state.config.api_prefix
        if prefix and path.startswith(prefix):
            path = path[len(prefix):] or "/"
        if self.keys.needed(path) and not self.keys.valid(scope.get("headers", ())):
            log.warning("unauthorized request to %s: invalid API key", path)
            return await JsonResponse(invalid_key().body(), status_code=401)(scope, receive, send)
        size = self.body_limit.declared_too_large(scope)
        if size is not None:
            return await self.body_limit.refuse(size, scope, receive, send)
        return await self.app(scope, self.body_limit.wrap(receive), send)


# -- helpers ------------------------------------------------------------------------------------


async def _body(request: Request) -> dict:
    return parse_body(await request.body())


async def _until_disconnect(request: Request, coro):
    """Await ``coro``; if the client goes away first, cancel it (freeing its slots)."""
    work = asyncio.ensure_future(coro)
    try:
        while True:
            done, _ = await asyncio.wait({work}, timeout=0.25)
            if done:
                return work.result()
            if await request.is_disconnected():
                work.cancel()
                raise asyncio.CancelledError("client disconnected")
    finally:
        if not work.done():
            work.cancel()


async def _gather_results(handles: list[TaskHandle]):
    try:
        return await asyncio.gather(*(h.result() for h in handles))
    finally:
        for h in handles:
            h.cancel()


async def _merged_events(handles: list[TaskHandle]) -> AsyncIterator[tuple[int, Any]]:
    """Events of several tasks as they come: ``(position in handles, event)``."""
    if len(handles) == 1:
        async for ev in handles[0].events():
            yield 0, ev
        return
    queue: asyncio.Queue = asyncio.Queue()
    sentinel = object()

    async def pump(i: int, handle: TaskHandle):
        try:
            async for ev in handle.events():
                await queue.put((i, ev))
        except BaseException as exc:
            await queue.put((i, exc))
        finally:
            await queue.put((i, sentinel))

    pumps = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(handles)]
    remaining = len(handles)
    try:
        while remaining:
            i, ev = await queue.get()
            if ev is sentinel:
                remaining -= 1
                continue
            if isinstance(ev, BaseException):
                raise ev
            yield i, ev
    finally:
        for p in pumps:
            p.cancel()
        for h in handles:
            h.cancel()


def _stream_error(exc: Exception) -> bytes:
    err = exc if isinstance(exc, ApiError) else ApiError(str(exc), "server_error")
    return event(err.body())


# -- the application ----------------------------------------------------------------------------


def create_app(config: ServerConfig, loader: Callable[[], Any] | None = None) -> FastAPI:
    """Build the app. ``loader()`` returns a ``LoadedModel``; it runs in a background thread at
    startup (default: ``load_model`` with the config's model options)."""
    state = ServerState(config=config)
    state.api_keys = config.api_keys()
    state.limits = Limits.from_config(config)

    def load():
        try:
            if loader is not None:
                loaded = loader()
            else:
                from mlxcel.engine.model.loading import load_model

                loaded = load_model(config.model, hf_repo=config.hf_repo, hf_file=config.hf_file)
            template_src = config.chat_template
            if config.chat_template_file:
                with open(config.chat_template_file, encoding="utf-8") as f:
                    template_src = f.read()
            state.template = resolve_template(loaded.chat_template, template_src)
            if config.chat_template_kwargs:
                state.template_kwargs = json.loads(config.chat_template_kwargs)
            state.defaults = build_defaults(config)
            # as upstream: the alias, else the model argument as given (the file name for the default)
            state.model_name = config.alias.split(",")[0] if config.alias else (
                config.model or config.hf_repo or loaded.path.name)
            state.token_text = TokenText(loaded.tokenizer)
            state.piece_chars = longest_piece(loaded.tokenizer)
            from mlx.utils import tree_flatten

            state.n_params = int(sum(v.size for _, v in tree_flatten(loaded.model.parameters())))
            state.loaded = loaded
            from mlxcel.server.runtime.speculation import Speculation, resolve

            settings = resolve(config)
            speculation = Speculation.load(settings, loaded) if settings is not None else None
            if settings is not None:
                state.defaults.speculative_types = f"none,{settings.spec_type}"
            scheduler = Scheduler(loaded, n_slots=config.n_slots, n_ctx=config.ctx_size, n_batch=config.batch_size,
                                  n_ubatch=config.ubatch_size, metrics=state.metrics, max_queue=state.limits.max_queue,
                                  slot_prompt_similarity=config.slot_prompt_similarity, speculation=speculation,
                                  timeout=float(config.timeout))
            scheduler.start()
            state.scheduler = scheduler
            log.info("model %s loaded; %d slots, n_ctx %d", state.model_name, len(scheduler.slots), scheduler.n_ctx)
        except Exception as exc:
            log.error("model loading failed: %s", exc)
            state.load_error = str(exc)
            if app.state.on_load_error is not None:
                app.state.on_load_error(exc)

    @asynccontextmanager
    async def lifespan(_app):
        threading.Thread(target=load, name="mlxcel-load", daemon=True).start()
        yield
        if state.scheduler is not None:
            state.scheduler.stop()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    app.state.on_load_error = None
    app.add_middleware(GateMiddleware, state=state)

    @app.exception_handler(ApiError)
    async def api_error(_req, exc: ApiError):
        return JsonResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_req, exc: StarletteHTTPException):
        if exc.status_code in (404, 405):
            return JsonResponse(not_found_body(), status_code=404)
        err = ApiError(str(exc.detail), "invalid_request_error" if exc.status_code < 500 else "server_error")
        return JsonResponse(err.body(), status_code=err.status)

    @app.exception_handler(BodyRefused)
    async def body_refused(_req, exc: BodyRefused):
        return JsonResponse(exc.error.body(), status_code=exc.error.status, headers={"Connection": "close"})

    @app.exception_handler(RequestValidationError)
    async def validation_error(_req, exc):
        return JsonResponse(invalid(str(exc)).body(), status_code=400)

    @app.exception_handler(Exception)
    async def unexpected(_req, exc: Exception):
        log.exception("unhandled error")
        return JsonResponse(ApiError(f"{type(exc).__name__}: {exc}", "server_error").body(), status_code=500)

    router = APIRouter(prefix=config.api_prefix)
    _add_routes(router, state)
    app.router.routes.extend(router.routes)  # flat, so app.routes lists every route
    return app


def _add_routes(router: APIRouter, state: ServerState) -> None:  # noqa: C901 - the route table
    def ctx_check(tokens: list[int]) -> None:
        n_ctx = state.scheduler.n_ctx
        if len(tokens) >= n_ctx:
            raise context_exceeded(len(tokens), n_ctx)

    def prompt_tokens(prompt: Any) -> list[int]:
        least = least_tokens(prompt, state.piece_chars)
        if least >= state.scheduler.n_ctx:
            raise context_exceeded_at_least(least, state.scheduler.n_ctx)
        tokens = tokenize_prompt(state.loaded, prompt)
        if not tokens:
            raise invalid("the prompt is empty: it must contain at least one token")
        check_tokens(tokens, state.loaded.vocab_size)
        ctx_check(tokens)
        state.limits.check_prompt(len(tokens))
        return tokens

    def n_choices(value: int | None, field_name: str) -> int:
        n = 1 if value is None else value
        check_range(field_name, n, 1, len(state.scheduler.slots))
        return n

    def most_at_once() -> int:
        """Completions this server can hold at once (slots plus --max-queue); a request asking for
        more could never be queued, so it is refused 400, not 503."""
        return state.limits.max_queue + len(state.scheduler.slots)

    def open_tasks(prompts: list[list[int]], opts: GenerationOptions, n: int, t0: float) -> list[TaskHandle]:
        most = most_at_once()
        if len(prompts) * n > most:
            raise invalid(f"the request asks for {len(prompts) * n} completions; this server runs at most {most} "
                          "at once (slots plus --max-queue)")
        handles = []
        try:
            for p, tokens in enumerate(prompts):
                for k in range(n):
                    handles.append(state.scheduler.open(tokens, opts, index=p * n + k, t_arrival=t0))
        except BaseException:
            for h in handles:
                h.cancel()
            raise
        return handles

    def prompt_text(tokens: list[int]) -> str:
        return state.loaded.tokenizer.decode(tokens)

    # -- health, props, models ------------------------------------------------------------------

    @router.get("/health")
    @router.get("/v1/health")
    async def health():
        return JsonResponse({"status": "ok"})

    @router.get("/props")
    async def get_props():
        return JsonResponse(model_info.props(state))

    @router.post("/props")
    async def post_props(request: Request):
        if not state.config.props:
            raise not_supported("This server does not support changing global properties. Start it with `--props`")
        await _body(request)
        return JsonResponse({"success": True})

    @router.get("/models")
    @router.get("/v1/models")
    async def get_models():
        return JsonResponse(model_info.models(state))

    @router.get("/slots")
    async def get_slots():
        if not state.config.slots:
            raise not_supported("This server does not support slots endpoint. Start it with `--slots`")
        default = state.default_options()
        return JsonResponse([model_info.slot_json(s, default, state.scheduler.speculation is not None)
                             for s in state.scheduler.slots])

    @router.post("/slots/{id_slot}")
    async def slot_action(id_slot: str):
        raise not_supported("This server does not support slots action. Start it with `--slot-save-path`")

    @router.get("/metrics")
    async def metrics():
        if not state.config.metrics:
            raise not_supported("This server does not support metrics endpoint. Start it with `--metrics`")
        text = state.metrics.render(state.scheduler.processing, state.scheduler.deferred)
        return PlainTextResponse(text, headers={"Content-Type": "text/plain; version=0.0.4"})

    @router.get("/lora-adapters")
    async def lora_adapters():
        return JsonResponse([])

    @router.post("/lora-adapters")
    async def set_lora_adapters(request: Request):
        if (await request.body()).strip():
            await _body(request)  # a malformed body is refused as on every other route
        raise invalid("no LoRA adapters are loaded")

    for path, what, flag in (("/embedding", "embeddings", "--embeddings"), ("/embeddings", "embeddings", "--embeddings"),
                             ("/v1/embeddings", "embeddings", "--embeddings"), ("/rerank", "reranking", "--reranking"),
                             ("/reranking", "reranking", "--reranking"), ("/v1/rerank", "reranking", "--reranking"),
                             ("/v1/reranking", "reranking", "--reranking")):
        def make(what=what, flag=flag):
            async def disabled():
                raise not_supported(f"This server does not support {what}. Start it with `{flag}`")
            return disabled
        router.add_api_route(path, make(), methods=["POST"])

    @router.post("/infill")
    async def infill():
        raise not_supported("Infill is not supported by mlxcel-server")

    # -- tokenizer routes -----------------------------------------------------------------------

    @router.post("/tokenize")
    async def tokenize(request: Request):
        req = validate(TokenizeRequest, await _body(request))
        if req.content is None:
            return JsonResponse({"tokens": []})
        ids = tokenize_text(state.loaded.tokenizer, req.content, add_special=False, parse_special=req.parse_special)
        if req.add_special:
            from mlxcel.server.http.prompts import bos_prefix

            ids = bos_prefix(state.loaded) + ids
        if req.with_pieces:
            return JsonResponse({"tokens": [{"id": t, "piece": state.token_text.piece(t)} for t in ids]})
        return JsonResponse({"tokens": ids})

    @router.post("/detokenize")
    async def detokenize(request: Request):
        body = await _body(request)
        if "tokens" in body and not isinstance(body["tokens"], list):
            from mlxcel.server.runtime.errors import json_type_name

            raise invalid(f"type must be array, but is {json_type_name(body['tokens'])}")
        req = validate(DetokenizeRequest, body)
        tokens = req.tokens or []
        if any(t < 0 or t >= state.loaded.vocab_size for t in tokens):
            raise invalid("tokens contain invalid ids")
        return JsonResponse({"content": state.loaded.tokenizer.decode(tokens)})

    def chat_prompt(req: ChatRequest, body: dict) -> str:
        if "messages" not in body:
            raise invalid("'messages' is required")
        messages = normalize_messages(req.messages)
        kwargs = {**state.template_kwargs, **(req.chat_template_kwargs or {})}
        add_gen = True if req.add_generation_prompt is None else req.add_generation_prompt
        return apply_template(state.loaded.tokenizer, state.template, messages, add_gen, kwargs)

    @router.post("/apply-template")
    async def apply_template_route(request: Request):
        body = await _body(request)
        req = validate(ChatRequest, body)
        return JsonResponse({"prompt": chat_prompt(req, body)})

    @router.post("/v1/chat/completions/input_tokens")
    async def chat_input_tokens(request: Request):
        body = await _body(request)
        req = validate(ChatRequest, body)
        tokens = tokenize_prompt(state.loaded, chat_prompt(req, body))
        return JsonResponse({"input_tokens": len(tokens), "object": "response.input_tokens"})

    # -- native completion ----------------------------------------------------------------------

    async def completion_request(request: Request) -> tuple[CompletionRequest, list[list[int]]]:
        """A completion body, validated, and its prompt(s) as token lists."""
        body = await _body(request)
        req = validate(CompletionRequest, body)
        if "prompt" not in body:
            raise invalid("key 'prompt' not found")
        parts = split_prompts(req.prompt)
        most = most_at_once()
        if len(parts) > most:
            raise invalid(f"the request has {len(parts)} prompts; this server runs at most {most} at once "
                          "(slots plus --max-queue)")
        return req, [prompt_tokens(p) for p in parts]

    async def native_completion(request: Request):
        t0 = time.perf_counter()
        req, prompts = await completion_request(request)
        n = n_choices(req.n_cmpl, "n_cmpl")
        n_predict = req.n_predict if req.n_predict is not None else req.max_tokens
        opts = generation_options(req, state.defaults, state.loaded, n_predict=n_predict, n_probs=req.n_probs or 0)
        handles = open_tasks(prompts, opts, n, t0)
        prompt_of = {h.index: prompts[h.index // n] for h in handles}
        model = state.model_name
        text = state.token_text

        def final_body(result, index, streamed: bool) -> dict:
            return R.native_final(result, opts, index=index, model=model, prompt_text=prompt_text(prompt_of[index]),
                                  text=text, content="" if streamed else None)

        if opts.stream:
            async def chunks():
                try:
                    async for i, ev in _merged_events(handles):
                        idx = handles[i].index
                        n_prompt = len(prompt_of[idx])
                        if isinstance(ev, Partial):
                            yield event(R.native_partial(ev, idx, n_prompt, opts, text))
                        elif isinstance(ev, Progress):
                            yield event(R.native_progress(idx, n_prompt, ev))
                        elif isinstance(ev, Final):
                            yield event(final_body(ev.result, idx, streamed=True))
                except ApiError as exc:
                    yield _stream_error(exc)
            return event_stream(chunks())

        results = await _until_disconnect(request, _gather_results(handles))
        bodies = [final_body(r, h.index, streamed=False) for r, h in zip(results, handles)]
        if req.response_fields:
            bodies = [R.select_fields(b, req.response_fields) for b in bodies]
        return JsonResponse(bodies[0] if len(bodies) == 1 else bodies)

    router.add_api_route("/completion", native_completion, methods=["POST"])
    router.add_api_route("/completions", native_completion, methods=["POST"])

    # -- OpenAI completions ---------------------------------------------------------------------

    @router.post("/v1/completions")
    async def oai_completions(request: Request):
        t0 = time.perf_counter()
        req, prompts = await completion_request(request)
        n = n_choices(req.n, "n")
        n_predict = req.max_tokens if req.max_tokens is not None else req.n_predict
        logprobs = req.logprobs
        n_probs = 0 if logprobs in (None, False) else (1 if logprobs is True else int(logprobs))
        check_range("logprobs", n_probs, 0, 1024)
        opts = generation_options(req, state.defaults, state.loaded, n_predict=n_predict, n_probs=n_probs)
        handles = open_tasks(prompts, opts, n, t0)
        cid = R.completion_id()
        model = state.model_name
        text = state.token_text

        if opts.stream:
            async def chunks():
                try:
                    async for i, ev in _merged_events(handles):
                        idx = handles[i].index
                        if isinstance(ev, Partial):
                            lp = {"content": R.probs_json(ev.probs, text, False)} if n_probs else None
                            yield event(R.oai_completion_chunk(index=idx, content=ev.text, finish=None, model=model,
                                                               id=cid, logprobs=lp))
                        elif isinstance(ev, Final):
                            yield event(R.oai_completion_chunk(index=idx, content="",
                                                               finish=R.finish_reason(ev.result.stop_type),
                                                               model=model, id=cid, result=ev.result))
                    yield DONE
                except ApiError as exc:
                    yield _stream_error(exc)
            return event_stream(chunks())

        results = await _until_disconnect(request, _gather_results(handles))
        return JsonResponse(R.oai_completion(list(results), model=model, id=cid, text=text, logprobs=bool(n_probs)))

    # -- OpenAI chat ----------------------------------------------------------------------------

    async def chat_completions(request: Request):
        t0 = time.perf_counter()
        body = await _body(request)
        req = validate(ChatRequest, body)
        prompt = chat_prompt(req, body)
        tokens = prompt_tokens(prompt)
        n = n_choices(req.n, "n")
        n_predict = next((v for v in (req.max_completion_tokens, req.max_tokens, req.n_predict) if v is not None), None)
        check_range("max_tokens", n_predict, -1, 2147483647)
        top_n = req.top_logprobs if req.logprobs else None
        if top_n is not None:
            check_range("top_logprobs", top_n, 0, 20)
        n_probs = max(top_n or 0, 1) if req.logprobs else 0
        opts = generation_options(req, state.defaults, state.loaded, n_predict=n_predict, n_probs=n_probs)
        handles = open_tasks([tokens], opts, n, t0)
        cid = R.completion_id()
        model = state.model_name
        text = state.token_text
        include_usage = bool((req.stream_options or {}).get("include_usage"))

        if opts.stream:
            created = int(time.time())

            async def chunks():
                role_sent: set[int] = set()

                def role(idx, progress=None):
                    chunk = R.chat_chunk(model=model, id=cid, created=created, index=idx,
                                         delta={"role": "assistant", "content": None})
                    if progress is not None:
                        chunk["prompt_progress"] = R.prompt_progress(progress)
                    return event(chunk)

                try:
                    if not opts.return_progress:
                        for h in handles:
                            role_sent.add(h.index)
                            yield role(h.index)
                    async for i, ev in _merged_events(handles):
                        idx = handles[i].index
                        if isinstance(ev, Progress):
                            yield role(idx, ev)
                            continue
                        if idx not in role_sent:
                            role_sent.add(idx)
                            yield role(idx)
                        if isinstance(ev, Partial):
                            if not ev.text:
                                continue
                            lp = {"content": R.probs_json(ev.probs, text, False, top_n)} if req.logprobs else None
                            yield event(R.chat_chunk(model=model, id=cid, created=created, index=idx,
                                                     delta={"content": ev.text}, logprobs=lp, timings=ev.timings))
                        elif isinstance(ev, Final):
                            r = ev.result
                            yield event(R.chat_chunk(model=model, id=cid, created=created, index=idx,
                                                     finish=R.finish_reason(r.stop_type),
                                                     timings=None if include_usage else r.timings))
                            if include_usage:
                                yield event(R.chat_chunk(model=model, id=cid, created=created, empty_choices=True,
                                                         usage_of=r, timings=r.timings))
                    yield DONE
                except ApiError as exc:
                    yield _stream_error(exc)
            return event_stream(chunks())

        results = await _until_disconnect(request, _gather_results(handles))
        out = R.chat_completion(list(results), model=model, id=cid, text=text, logprobs=bool(req.logprobs),
                                top_n=top_n)
        if req.verbose:
            verbose = R.native_final(results[0], opts, index=0, model=model, prompt_text=prompt, text=text)
            timings = out.pop("timings")
            out["__verbose"] = verbose
            out["timings"] = timings
        return JsonResponse(out)

    router.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    router.add_api_route("/chat/completions", chat_completions, methods=["POST"])

    @router.get("/openapi.json")
    async def openapi_document():
        from mlxcel.server.http.openapi import document

        return JsonResponse(document())

    @router.get("/")
    async def root():
        return Response("mlxcel-server: llama-server compatible API (no web UI)\n", media_type="text/plain")
