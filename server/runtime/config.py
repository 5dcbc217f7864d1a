"""The server's configuration: every setting the command line (``cli.args``) can give, with
llama-server's defaults. The HTTP layer and the runtime read it; only the CLI builds it from flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlxcel.engine.sampling.params import SamplerParams


class ArgumentError(Exception):
    """A bad command line: the message is shown as ``error: ...`` without a traceback."""


# The sampler flags' defaults are the engine's (llama-server's) defaults, stated once.
_SAMPLER = SamplerParams()


@dataclass
class ServerConfig:
    model: str | None = None
    alias: str | None = None
    tags: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    threads: int = -1  # -t: OpenBLAS threads on a Linux CPU (-1: the device default)
    ctx_size: int = 0
    parallel: int = -1
    kv_unified: bool | None = None  # -kvu / -no-kvu; None: on when the slot count is auto (-np -1)
    n_predict: int = -1
    n_keep: int = 0  # --keep: the default n_keep of requests (prompt tokens a context shift keeps)
    context_shift: bool = False
    batch_size: int = 2048
    ubatch_size: int = 512
    cache_type_k: str | None = None  # -ctk (engine/model/kv_types.py); None: the compute dtype
    cache_type_v: str | None = None  # -ctv
    hf_repo: str | None = None
    hf_file: str | None = None
    mmproj: str | None = None  # -mm: the multimodal projector GGUF (images)
    mmproj_auto: bool = True  # --no-mmproj: no vision tower unless --mmproj names one
    media_path: str | None = None  # --media-path: where file:// images are read from
    image_min_tokens: int | None = None  # a dynamic-resolution tower's tokens per image, at least / at most
    image_max_tokens: int | None = None
    hf_token: str | None = None
    offline: bool = False
    seed: int = -1
    temperature: float = _SAMPLER.temperature
    top_k: int = _SAMPLER.top_k
    top_p: float = _SAMPLER.top_p
    min_p: float = _SAMPLER.min_p
    typical_p: float = _SAMPLER.typical_p
    xtc_probability: float = _SAMPLER.xtc_probability
    xtc_threshold: float = _SAMPLER.xtc_threshold
    repeat_last_n: int = _SAMPLER.repeat_last_n
    repeat_penalty: float = _SAMPLER.repeat_penalty
    presence_penalty: float = _SAMPLER.presence_penalty
    frequency_penalty: float = _SAMPLER.frequency_penalty
    dry_multiplier: float = _SAMPLER.dry_multiplier
    dry_base: float = _SAMPLER.dry_base
    dry_allowed_length: int = _SAMPLER.dry_allowed_length
    dry_penalty_last_n: int = _SAMPLER.dry_penalty_last_n
    dry_sequence_breaker: list[str] | None = None
    ignore_eos: bool = False
    logit_bias: list[str] | None = None
    grammar: str | None = None  # --grammar (or the text of --grammar-file): GBNF, or llguidance Lark
    grammar_file: str | None = None
    json_schema: str | None = None  # -j (or the text of -jf): a JSON schema
    json_schema_file: str | None = None
    samplers: str | None = None
    sampler_seq: str | None = None
    api_key: str | None = None
    api_key_file: str | None = None
    ssl_key_file: str | None = None
    ssl_cert_file: str | None = None
    api_prefix: str = ""
    metrics: bool = False
    props: bool = False
    slots: bool = True
    jinja: bool = True
    chat_template: str | None = None
    chat_template_file: str | None = None
    chat_template_kwargs: str | None = None
    gcp_predict_route: str | None = None  # Vertex AI prediction route (AIP_MODE=PREDICTION); None: off
    gcp_health_route: str | None = None  # AIP_HEALTH_ROUTE: /health served there too
    reasoning: str | None = None  # on | off | auto (normalized by the CLI): enable_thinking for the template
    reasoning_effort: str | None = None  # the template's reasoning_effort ("default": unset)
    reasoning_format: str = "auto"  # none | auto | deepseek | deepseek-legacy: whether thinking is split out
    reasoning_budget: int = -1  # thinking tokens before the end tag is forced (-1: no limit)
    reasoning_budget_message: str | None = None  # forced before the end tag when the budget is spent
    timeout: int = 3600
    sleep_idle_seconds: int = -1  # unload the model after this many idle seconds (-1: never)
    cors_origins: str | None = None  # unset: "*", or "localhost" when --tools is given (as upstream)
    tools: str | None = None  # --tools: the web UI's built-in tools (comma-separated, or all)
    tools_runtime: str | None = None
    mcp_servers_config: str | None = None
    mcp_servers_json: str | None = None
    ui_mcp_proxy: bool = False  # the web UI's /cors-proxy
    agent: bool | None = None  # -ag: tools=all and the proxy; --no-agent: neither
    cors_methods: str = "GET, POST, DELETE, OPTIONS"
    cors_headers: str = "*"
    cors_credentials: bool = True
    max_body_size: int = 8 * 1024 * 1024
    max_prompt_tokens: int = 0
    max_queue: int | None = None  # None: MLXCEL_MAX_QUEUE, else 256
    cache_prompt: bool = True
    spm_infill: bool = False  # /infill: suffix before prefix
    slot_save_path: str | None = None  # --slot-save-path: where POST /slots/:id saves and restores
    static_path: str | None = None  # --path: serve this directory's files at / instead of the web page
    ui: bool = True  # --ui / --no-ui: the web page at /
    split_mode: str | None = None  # -sm: across mlx.launch's ranks, row (tensor parallel) or layer (pipeline)
    tensor_split: str | None = None  # -ts: proportions per rank
    embeddings: bool = False  # --embeddings: the embedding routes
    reranking: bool = False  # --reranking: the rerank routes (rank pooling)
    pooling: str | None = None  # --pooling; None: the model's own
    embd_normalize: int = 2  # --embd-normalize: the default of a request's embd_normalize
    slot_prompt_similarity: float = 0.1
    # --lora FILE (scale 1) and --lora-scaled FILE:SCALE, in command-line order: (path, global scale)
    lora_adapters: list[tuple[str, float]] = field(default_factory=list)
    lora_init_without_apply: bool = False  # every adapter's global scale starts at 0
    log_disable: bool = False
    log_file: str | None = None
    verbose: bool = False
    verbosity: int = 3
    help: bool = False
    version: bool = False
    list_devices: bool = False
    # speculative decoding (resolved by runtime.speculation.resolve)
    draft_model: str | None = None
    draft_hf: str | None = None
    spec_type: str | None = None
    spec_draft_n_max: int | None = None
    spec_draft_n_min: int | None = None
    spec_ngram_simple_size_n: int | None = None
    spec_ngram_simple_size_m: int | None = None
    spec_ngram_map_k_size_n: int | None = None  # the n-gram types' own sizes (None: upstream's defaults)
    spec_ngram_map_k_size_m: int | None = None
    spec_ngram_map_k_min_hits: int | None = None
    spec_ngram_map_k4v_size_n: int | None = None
    spec_ngram_map_k4v_size_m: int | None = None
    spec_ngram_map_k4v_min_hits: int | None = None
    spec_ngram_mod_n_match: int | None = None
    spec_ngram_mod_n_min: int | None = None
    spec_ngram_mod_n_max: int | None = None
    lookup_cache_static: str | None = None  # -lcs: ngram-cache's static cache file
    lookup_cache_dynamic: str | None = None  # -lcd: ngram-cache's dynamic cache file
    spec_draft_sampling: str | None = None
    spec_synth_len: float | None = None  # benchmarking only (synthetic acceptance)
    spec_synth_rates: str | None = None
    spec_default: bool = False
    draft_kind: str | None = None
    draft_adaptive: str | None = None
    models_dir: str | None = None  # router mode (no model given): where the models are
    models_preset: str | None = None
    models_max: int = 4
    models_autoload: bool = True
    argv: list[str] = field(default_factory=list)  # the command line as given (the router passes it on)
    notes: list[str] = field(default_factory=list)  # what was ignored, for the startup log

    @property
    def router(self) -> bool:
        """Upstream's router mode (models in child servers): no model, and models to route to. With
        neither (a bare start) mlxcel serves its built-in default model, where upstream routes to its
        download cache, which mlxcel does not keep."""
        return not self.model and not self.hf_repo and bool(self.models_dir or self.models_preset)

    @property
    def n_slots(self) -> int:
        return self.parallel if self.parallel > 0 else 4

    @property
    def unified_kv(self) -> bool:
        """Whether every slot may use the whole context (upstream's unified KV pool): on with an
        automatic slot count, off when ``-np`` is given, unless ``-kvu`` / ``-no-kvu`` says."""
        return self.kv_unified if self.kv_unified is not None else self.parallel <= 0

    def api_keys(self) -> list[str]:
        keys = [k.strip() for k in (self.api_key or "").split(",") if k.strip()]
        if self.api_key_file:
            try:
                with open(self.api_key_file, encoding="utf-8") as f:
                    for line in f:
                        line = line.strip()
                        if line and not line.startswith("#"):
                            keys.append(line)
            except OSError as exc:
                raise ArgumentError(f"cannot read --api-key-file {self.api_key_file}: {exc}") from None
        return keys
