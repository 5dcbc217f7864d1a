"""Loading the model into a :class:`ServerState`: the model, its chat template and the request
defaults, the drafter, and the scheduler that serves them. Runs on a background thread after the
server starts listening (every route answers 503 until it is done)."""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Callable

from mlx.utils import tree_flatten

from mlxcel.drafters.loading import load_target
from mlxcel.engine.distributed.world import world
from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model import kv_types
from mlxcel.engine.model.fim_tokens import model_fim_tokens
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.model.lora import attach_adapters
from mlxcel.engine.platform import device
from mlxcel.engine.sampling.grammar import special_token_ids
from mlxcel.server.http.chat.reasoning import think_markers
from mlxcel.server.http.chat.template import legacy_format, resolve_template
from mlxcel.server.http.chat.template_caps import probe_template
from mlxcel.server.http.chat.tool_calls import call_syntax
from mlxcel.server.http.prompts import longest_piece
from mlxcel.server.http.request_params import build_defaults
from mlxcel.server.http.state import ServerState
from mlxcel.server.http.token_text import TokenText
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.distributed_setup import load_shard
from mlxcel.server.runtime.embedder import Embedder, check_encoder_flags
from mlxcel.server.runtime.lockstep import Leader
from mlxcel.server.runtime.scheduler import Scheduler
from mlxcel.server.runtime.speculation import Speculation
from mlxcel.server.runtime.speculation_settings import resolve

log = logging.getLogger(__name__)


def comma_set(value: str | None) -> list[str]:
    """A comma-separated flag value as upstream keeps it: stripped, no empties, sorted, unique."""
    return sorted({part.strip() for part in (value or "").split(",") if part.strip()})


def set_kv_types(loaded: LoadedModel, config) -> None:
    """``-ctk`` / ``-ctv`` onto the loaded model's caches (``engine.model.kv_types``; a type this
    process cannot hold stops the start with its reason)."""
    dtype = str(device.compute_dtype()).removeprefix("mlx.core.")
    c = loaded.config
    heads = c.get("num_attention_heads")
    head_dim = c.get("head_dim") or (c["hidden_size"] // heads if heads and c.get("hidden_size") else None)
    loaded.kv_quant = kv_types.resolve(config.cache_type_k, config.cache_type_v, compute_dtype=dtype,
                                       mlx_native=device.mlx_native(), head_dim=head_dim)
    log.info("%s", kv_types.describe(loaded.kv_quant, dtype, (config.cache_type_k, config.cache_type_v)))


def load_into(state: ServerState, loader: Callable[[], LoadedModel] | None = None) -> None:
    """Load everything ``state.config`` asks for and start the scheduler (``state.ready`` after).
    ``loader()`` replaces loading the configured model (tests)."""
    config = state.config
    group = world()  # several ranks under mlx.launch: this is rank 0 (runtime/lockstep.py)
    if loader is not None:
        loaded = loader()
    elif group is not None:
        if config.mmproj:
            raise ModelLoadError("images are not served across ranks (mlx.launch); start without --mmproj")
        loaded = load_shard(config, group)
    else:
        loaded = load_target(config.model, hf_repo=config.hf_repo, hf_file=config.hf_file, mmproj=config.mmproj,
                             mmproj_auto=config.mmproj_auto)
    if loaded.vision is not None:
        loaded.vision.limit_tokens(config.image_min_tokens, config.image_max_tokens)
    set_kv_types(loaded, config)  # before anything makes a cache
    if config.lora_adapters:  # before the drafter's probe and cost model, which run the adapted model
        attach_adapters(loaded, config.lora_adapters, apply=not config.lora_init_without_apply)
    encoder = bool(loaded.metadata.get("encoder"))  # a BERT-family model: served for embeddings/rerank only
    if encoder:
        check_encoder_flags(config, loaded)
    template_src = config.chat_template
    if config.chat_template_file:
        with open(config.chat_template_file, encoding="utf-8") as f:
            template_src = f.read()
    state.template = resolve_template(loaded.chat_template, template_src)
    state.jinja = config.jinja is not False
    if not state.jinja:
        state.legacy_format = legacy_format(state.template, from_override=bool(template_src))
        if state.legacy_format is None:
            log.warning("--no-jinja: the model's chat template matches no built-in format; chat requests "
                        "will be refused (start with --jinja, or name a format with --chat-template)")
    state.template_kwargs = template_kwargs(config)
    if state.jinja:
        state.template_info = probe_template(loaded.tokenizer, state.template)
        state.call_syntax = call_syntax(state.template, loaded.tokenizer, state.template_info)
    state.think = think_markers(state.template_info, loaded.tokenizer)
    state.special_tokens = special_token_ids(loaded.tokenizer)
    if state.call_syntax is not None or state.think is not None:
        log.info("chat output: tool calls read with %s; thinking tags %s",
                 state.call_syntax.source if state.call_syntax else "nothing (no parser for this template)",
                 f"{state.think.start} ... {state.think.end}" if state.think else "none")
    state.defaults = build_defaults(config)
    # as upstream: the aliases (a set, so the name is the first in order), else the model as given
    state.aliases = comma_set(config.alias) or [config.model or config.hf_repo or loaded.path.name]
    state.model_name = state.aliases[0]
    state.tags = comma_set(config.tags)
    state.token_text = TokenText(loaded.tokenizer)
    # WordPiece drops whitespace and control characters, so no per-character lower bound holds
    state.piece_chars = 0 if loaded.metadata.get("tokenizer_model") == "bert" else longest_piece(loaded.tokenizer)
    state.fim = model_fim_tokens(loaded.tokenizer, loaded.vocab_size, loaded.metadata.get("token_ids"))
    state.embedder = Embedder.load(config, loaded)
    state.n_params = int(sum(v.size for _, v in tree_flatten(loaded.model.parameters())))
    state.loaded = loaded
    settings = resolve(config)
    if settings is not None and encoder:
        log.warning("speculative decoding is not supported by this context (an encoder generates nothing): "
                    "the speculative flags are ignored")
        settings = None
    speculation = (Speculation.load(settings, loaded, config.ubatch_size, measure_cost=group is None)
                   if settings is not None else None)
    if settings is not None:
        state.defaults.speculative_types = f"none,{settings.spec_type}"
    scheduler = build_scheduler(config, loaded, speculation, metrics=state.metrics, max_queue=state.limits.max_queue)
    if group is not None:
        scheduler.lockstep = Leader(group, on_lost=lambda: os.kill(os.getpid(), signal.SIGTERM))
        scheduler.lockstep.watch(scheduler)
    scheduler.start()
    state.scheduler = scheduler
    log.info("model %s loaded; %d slots, n_ctx %d", state.model_name, len(scheduler.slots), scheduler.n_ctx)


def build_scheduler(config: ServerConfig, loaded: LoadedModel, speculation: Speculation | None, *,
                    metrics=None, max_queue: int = 256) -> Scheduler:
    """The scheduler the flags ask for (every rank of a distributed server builds the same one)."""
    return Scheduler(loaded, n_slots=config.n_slots, n_ctx=config.ctx_size, unified_kv=config.unified_kv,
                     n_batch=config.batch_size, n_ubatch=config.ubatch_size, metrics=metrics, max_queue=max_queue,
                     slot_prompt_similarity=config.slot_prompt_similarity, speculation=speculation,
                     context_shift=config.context_shift, timeout=float(config.timeout))


def template_kwargs(config: ServerConfig) -> dict:
    """The template variables every chat request starts from, as upstream builds them from the
    command line: ``enable_thinking`` is true unless ``--reasoning off`` (upstream passes it to
    every template; templates that test ``not enable_thinking`` need it defined), then
    ``--chat-template-kwargs`` over it, then ``--reasoning-effort`` (``reasoning_effort``;
    ``default`` leaves the template's own)."""
    kwargs = {"enable_thinking": config.reasoning != "off"}  # the CLI normalizes --reasoning
    kwargs.update(json.loads(config.chat_template_kwargs) if config.chat_template_kwargs else {})
    if config.reasoning in ("on", "off"):  # an explicit --reasoning wins, as upstream's sets the kwarg
        kwargs["enable_thinking"] = config.reasoning == "on"
    if config.reasoning_effort and config.reasoning_effort != "default":
        kwargs["reasoning_effort"] = config.reasoning_effort
    return kwargs
