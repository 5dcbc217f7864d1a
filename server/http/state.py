"""What the HTTP layer holds for the life of the server: the configuration, the loaded model and
everything derived from it at load time (template, defaults, scheduler), and the counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlxcel.engine.model.fim_tokens import FimTokens
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.server.http.chat.template_caps import TemplateInfo, ThinkMarkers
from mlxcel.server.http.chat.tool_calls import CallSyntax
from mlxcel.server.http.limits import Limits
from mlxcel.server.http.request_params import ServerDefaults
from mlxcel.server.http.response_store import ResponseStore
from mlxcel.server.http.token_text import TokenText
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.embedder import Embedder
from mlxcel.server.runtime.metrics import Metrics
from mlxcel.server.runtime.scheduler import Scheduler
from mlxcel.server.runtime.task import GenerationOptions


@dataclass
class ServerState:
    config: ServerConfig
    loaded: LoadedModel | None = None
    scheduler: Scheduler | None = None
    defaults: ServerDefaults = field(default_factory=ServerDefaults)
    model_name: str = ""  # what bodies call the model: the first alias
    aliases: list[str] = field(default_factory=list)  # -a, sorted (upstream keeps a set)
    tags: list[str] = field(default_factory=list)  # --tags, sorted
    template: str | None = None
    jinja: bool = True  # --no-jinja: render with upstream's built-in format legacy_format
    legacy_format: str | None = None
    template_kwargs: dict = field(default_factory=dict)
    template_info: TemplateInfo = field(default_factory=TemplateInfo)  # what the template can do (probed)
    think: ThinkMarkers | None = None  # the thinking tags (template's, else the vocabulary's)
    call_syntax: CallSyntax | None = None  # how tool calls are read back (None: not at all)
    special_tokens: dict[str, int] = field(default_factory=dict)  # the vocabulary's special tokens, for grammars
    token_text: TokenText | None = None
    metrics: Metrics = field(default_factory=Metrics)
    load_error: str | None = None
    api_keys: list[str] = field(default_factory=list)
    limits: Limits = field(default_factory=Limits)
    n_params: int = 0  # counted at load time, so no MLX call happens on the event loop
    piece_chars: int = 0  # longest vocabulary piece, for prompts.least_tokens
    fim: FimTokens | None = None  # the model's fill-in-the-middle tokens (/infill)
    embedder: Embedder | None = None  # --embeddings / --reranking
    responses: ResponseStore = field(default_factory=ResponseStore)  # the Responses API's stored responses
    sleep: Any = None  # sleep.IdleSleep with --sleep-idle-seconds (it imports this module)

    @property
    def ready(self) -> bool:
        return self.scheduler is not None

    def default_options(self) -> GenerationOptions:
        d = self.defaults
        return GenerationOptions(sampler=d.sampler, seed=d.seed, n_predict=d.n_predict, samplers=list(d.samplers),
                                 n_keep=d.n_keep)
