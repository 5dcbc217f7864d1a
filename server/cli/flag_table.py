"""Every flag of upstream llama-server's ``--help`` (the build recorded under
``compat/llama-server/``), and what mlxcel-server does with it.

States:
- ``supported``: accepted with upstream's meaning;
- ``divergent``: accepted, meaning differs in a documented way;
- ``ignored``: accepted and ignored with a logged note (tuning knobs of llama.cpp's own backends,
  UI and router features that have no MLX counterpart);
- ``refused``: accepted by the parser, then refused with a clear message (unless given its
  disabled value, listed in ``allowed``), because honouring it silently would change results;
- ``planned``: accepted and ignored with a note until the feature lands (none left today).

This table is the single source: ``args.build_parser`` is generated from it, and
``compat_record`` writes ``flags.json`` from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxcel.drafters.lookup.prompt_lookup import BLOCK_START
from mlxcel.drafters.registry import DRAFT_MODEL, KINDS, PROMPT_LOOKUP, SPEC_TYPE_REFUSED


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    state: str
    metavar: str | None = None  # None: a switch
    dest: str | None = None  # the config attribute it sets (supported/divergent flags)
    type: str = "str"  # "str" | "int" | "float"
    negatives: tuple[str, ...] = ()  # switch names that set it to False
    optional_value: bool = False
    nargs: int = 1
    allowed: tuple[str, ...] = ()  # values a refused flag may take (its "off" value)
    note: str = ""
    append: bool = False


def F(names: str, state: str, metavar: str | None = None, **kw) -> Flag:
    return Flag(names=tuple(names.split()), state=state, metavar=metavar, **kw)


BACKEND = "a llama.cpp/ggml backend setting with no MLX counterpart; MLX chooses threads, memory and kernels"
GPU = "GPU offload/placement of llama.cpp; MLX runs the whole model on its default device"
UI = "mlxcel-server has no web UI"
ROUTER = "router mode (several models) is not implemented; mlxcel-server serves one model"
SPEC_BACKEND = "a llama.cpp backend setting for the draft model with no MLX counterpart"
SPEC_GPU = "GPU placement of the draft model; MLX runs it on its default device"
LOOKUP = ("the n-gram types are all served by prompt lookup (see --spec-type); its sizes are "
          "--spec-ngram-simple-size-n/-m")
MEDIA = "multimodal input is not supported; mlxcel-server is text-only"
ROPE = "mlxcel uses the RoPE settings of the model's own config; overriding them would change the model"
PRESET = "a preset that downloads another model; mlxcel-server cannot download models"
LOG = "logging format knob; mlxcel logs through Python logging"
REMOVED = "removed upstream too; use --spec-draft-n-max / --spec-draft-n-min"

# mlxcel's own flags (not upstream's); recorded apart from upstream's in the compat record.
EXTENSIONS: list[Flag] = [
    F("--draft-kind", "supported", "KIND", dest="draft_kind",
      note="; ".join(f"{k.name}: {k.summary} ({k.flags}, the {k.loop} round loop)" for k in KINDS)),
    F("--max-body-size", "supported", "N", dest="max_body_size", type="int",
      note="largest request body accepted, in bytes (default 8388608 = 8 MiB); larger ones get 413"),
    F("--max-prompt-tokens", "supported", "N", dest="max_prompt_tokens", type="int",
      note="most prompt tokens one request may send (default 0: only the context size bounds it)"),
    F("--max-queue", "supported", "N", dest="max_queue", type="int",
      note="requests that may wait for a free slot (default 256, or MLXCEL_MAX_QUEUE); past it new ones get 503"),
    F("--draft-adaptive", "supported", "on|off", dest="draft_adaptive",
      note="whether the prompt-lookup governor may pause rows whose drafts do not pay for their verify "
           "forward (default on; off: every lookup match is verified)"),
]

FLAGS: list[Flag] = [
    # -- common ------------------------------------------------------------------------------------
    F("-h --help --usage", "supported", note="prints mlxcel-server's usage and exits"),
    F("--version", "supported", note="prints mlxcel's version and exits"),
    F("-cl --cache-list", "refused", note="mlxcel has no model cache listing; models are paths or HF repos"),
    F("--completion-bash", "refused", note="no bash completion script is provided"),
    F("-t --threads", "divergent", "N", dest="threads", type="int",
      note="on a Linux CPU, the OpenBLAS threads that run the matmuls (default: every usable core, as "
           "upstream, or OPENBLAS_NUM_THREADS); MLX's other CPU ops and any GPU are unaffected"),
    F("-tb --threads-batch", "ignored", "N", note=BACKEND),
    F("-C --cpu-mask", "ignored", "M", note=BACKEND),
    F("-Cr --cpu-range", "ignored", "lo-hi", note=BACKEND),
    F("--cpu-strict", "ignored", "<0|1>", note=BACKEND),
    F("--prio", "ignored", "N", note=BACKEND),
    F("--poll", "ignored", "<0...100>", note=BACKEND),
    F("-Cb --cpu-mask-batch", "ignored", "M", note=BACKEND),
    F("-Crb --cpu-range-batch", "ignored", "lo-hi", note=BACKEND),
    F("--cpu-strict-batch", "ignored", "<0|1>", note=BACKEND),
    F("--prio-batch", "ignored", "N", note=BACKEND),
    F("--poll-batch", "ignored", "<0|1>", note=BACKEND),
    F("-c --ctx-size", "supported", "N", dest="ctx_size", type="int",
      note="per-slot context; 0 = the model's max_position_embeddings"),
    F("-n --predict --n-predict", "supported", "N", dest="n_predict", type="int",
      note="the default n_predict, and (when positive) the most any request may ask for"),
    F("-b --batch-size", "supported", "N", dest="batch_size", type="int",
      note="most prompt tokens prefilled per scheduler step, over all slots"),
    F("-ub --ubatch-size", "supported", "N", dest="ubatch_size", type="int",
      note="prefill chunk size of one forward pass"),
    F("--keep", "ignored", "N", note="only matters for context shift, which mlxcel does not do"),
    F("--swa-full", "ignored", note=BACKEND),
    F("-fa --flash-attn", "ignored", "[on|off|auto]", optional_value=True,
      note="MLX uses its fused attention kernel where it has one"),
    F("--perf", "ignored", negatives=("--no-perf",), note=BACKEND),
    F("-e --escape", "ignored", negatives=("--no-escape",), note="applies to command-line prompts, which the server has none of"),
    F("--rope-scaling", "refused", "{none,linear,yarn}", note=ROPE),
    F("--rope-scale", "refused", "N", note=ROPE),
    F("--rope-freq-base", "refused", "N", note=ROPE),
    F("--rope-freq-scale", "refused", "N", note=ROPE),
    F("--yarn-orig-ctx", "refused", "N", note=ROPE),
    F("--yarn-ext-factor", "refused", "N", note=ROPE),
    F("--yarn-attn-factor", "refused", "N", note=ROPE),
    F("--yarn-beta-slow", "refused", "N", note=ROPE),
    F("--yarn-beta-fast", "refused", "N", note=ROPE),
    F("-kvo --kv-offload", "ignored", negatives=("-nkvo", "--no-kv-offload"), note=GPU),
    F("--repack", "ignored", negatives=("-nr", "--no-repack"), note=BACKEND),
    F("--no-host", "ignored", note=BACKEND),
    F("-ctk --cache-type-k", "ignored", "TYPE", note="the KV cache uses the model's compute dtype"),
    F("-ctv --cache-type-v", "ignored", "TYPE", note="the KV cache uses the model's compute dtype"),
    F("-dt --defrag-thold", "ignored", "N", note="deprecated upstream; MLX caches need no defragmentation"),
    F("--rpc", "refused", "SERVERS", note="distributed inference over RPC is not supported"),
    F("-lm --load-mode", "ignored", "MODE", note=BACKEND),
    F("-lzm --lazy-mode", "ignored", "MODE", note=BACKEND),
    F("--numa", "ignored", "TYPE", note=BACKEND),
    F("-dev --device", "ignored", "<dev1,dev2,..>", note=GPU),
    F("--list-devices", "supported", note="prints MLX's default device and exits"),
    F("-ot --override-tensor", "ignored", "<tensor name pattern>=<buffer type>,...", note=GPU),
    F("-cmoe --cpu-moe", "ignored", note=GPU),
    F("-ncmoe --n-cpu-moe", "ignored", "N", note=GPU),
    F("-ncffn --n-cpu-ffn", "ignored", "N", note=GPU),
    F("-ngl --gpu-layers --n-gpu-layers", "ignored", "N", note=GPU),
    F("-sm --split-mode", "ignored", "{none,layer,row,tensor}", note=GPU),
    F("-ts --tensor-split", "ignored", "N0,N1,N2,...", note=GPU),
    F("-mg --main-gpu", "ignored", "INDEX", note=GPU),
    F("-fit --fit", "ignored", "[on|off]", optional_value=True, note=GPU),
    F("-fitt --fit-target", "ignored", "MiB0,MiB1,MiB2,...", note=GPU),
    F("-fitc --fit-ctx", "ignored", "N", note=GPU),
    F("--check-tensors", "ignored", note="the loaders validate tensor shapes and types while loading"),
    F("--override-kv", "refused", "KEY=TYPE:VALUE,...", note="overriding GGUF metadata is not supported"),
    F("--op-offload", "ignored", negatives=("--no-op-offload",), note=GPU),
    F("--lora", "refused", "FNAME", note="LoRA adapters are not supported"),
    F("--lora-scaled", "refused", "FNAME:SCALE,...", note="LoRA adapters are not supported"),
    F("--control-vector", "refused", "FNAME", note="control vectors are not supported"),
    F("--control-vector-scaled", "refused", "FNAME:SCALE,...", note="control vectors are not supported"),
    F("--control-vector-layer-range", "refused", "START END", nargs=2, note="control vectors are not supported"),
    F("-m --model", "supported", "FNAME", dest="model",
      note="a GGUF file or an MLX/Hugging Face model directory; none = the built-in default model"),
    F("-mu --model-url", "refused", "MODEL_URL", note="downloading from a URL is not supported; use -m or -hf"),
    F("-dr --docker-repo", "refused", "[<repo>/]<model>[:quant]", note="Docker Hub models are not supported"),
    F("-hf -hfr --hf-repo", "divergent", "<user>/<model>[:quant]", dest="hf_repo",
      note="an MLX/safetensors repo is loaded whole; with a GGUF repo give the file with -hff (the :quant "
           "suffix selection is not implemented)"),
    F("-hff --hf-file", "supported", "FILE", dest="hf_file"),
    F("-hft --hf-token", "supported", "TOKEN", dest="hf_token"),
    F("--log-disable", "supported", dest="log_disable"),
    F("--log-file", "supported", "FNAME", dest="log_file"),
    F("--log-jsonl", "ignored", negatives=("--no-log-jsonl",), note=LOG),
    F("--log-colors", "ignored", "[on|off|auto]", optional_value=True, note=LOG),
    F("-v --verbose --log-verbose", "supported", dest="verbose"),
    F("--offline", "supported", dest="offline", note="sets HF_HUB_OFFLINE=1"),
    F("-lv --verbosity --log-verbosity", "supported", "N", dest="verbosity", type="int"),
    F("--log-prefix", "ignored", negatives=("--no-log-prefix",), note=LOG),
    F("--log-timestamps", "ignored", negatives=("--no-log-timestamps",), note=LOG),
    F("--spec-draft-type-k -ctkd --cache-type-k-draft", "ignored", "TYPE",
      note="the draft model's KV cache keeps the model's own dtype"),
    F("--spec-draft-type-v -ctvd --cache-type-v-draft", "ignored", "TYPE",
      note="the draft model's KV cache keeps the model's own dtype"),
    # -- sampling ----------------------------------------------------------------------------------
    F("--samplers", "divergent", "SAMPLERS", dest="samplers",
      note="stages may be left out; the chain's order is fixed, so a reordering is refused"),
    F("-s --seed", "supported", "SEED", dest="seed", type="int"),
    F("--sampler-seq --sampling-seq", "divergent", "SEQUENCE", dest="sampler_seq",
      note="as --samplers, in single letters"),
    F("--ignore-eos", "supported", dest="ignore_eos"),
    F("--temp --temperature", "supported", "N", dest="temperature", type="float"),
    F("--top-k", "supported", "N", dest="top_k", type="int"),
    F("--top-p", "supported", "N", dest="top_p", type="float"),
    F("--min-p", "supported", "N", dest="min_p", type="float"),
    F("--top-nsigma --top-n-sigma", "refused", "N", allowed=("-1", "-1.0", "-1.00"),
      note="the top-n-sigma stage is not implemented"),
    F("--xtc-probability", "supported", "N", dest="xtc_probability", type="float"),
    F("--xtc-threshold", "supported", "N", dest="xtc_threshold", type="float"),
    F("--typical --typical-p", "supported", "N", dest="typical_p", type="float"),
    F("--repeat-last-n", "supported", "N", dest="repeat_last_n", type="int"),
    F("--repeat-penalty", "supported", "N", dest="repeat_penalty", type="float"),
    F("--presence-penalty", "supported", "N", dest="presence_penalty", type="float"),
    F("--frequency-penalty", "supported", "N", dest="frequency_penalty", type="float"),
    F("--dry-multiplier", "supported", "N", dest="dry_multiplier", type="float"),
    F("--dry-base", "supported", "N", dest="dry_base", type="float"),
    F("--dry-allowed-length", "supported", "N", dest="dry_allowed_length", type="int"),
    F("--dry-penalty-last-n", "supported", "N", dest="dry_penalty_last_n", type="int"),
    F("--dry-sequence-breaker", "supported", "STRING", dest="dry_sequence_breaker", append=True),
    F("--adaptive-target", "refused", "N", allowed=("-1", "-1.0", "-1.00"), note="the adaptive-p stage is not implemented"),
    F("--adaptive-decay", "ignored", "N", note="only used by the adaptive-p stage, which is refused"),
    F("--dynatemp-range", "refused", "N", allowed=("0", "0.0", "0.00"), note="dynamic temperature is not implemented"),
    F("--dynatemp-exp", "ignored", "N", note="only used by dynamic temperature, which is refused"),
    F("--mirostat", "refused", "N", allowed=("0",), note="mirostat sampling is not implemented"),
    F("--mirostat-lr", "ignored", "N", note="only used by mirostat, which is refused"),
    F("--mirostat-ent", "ignored", "N", note="only used by mirostat, which is refused"),
    F("-l --logit-bias", "supported", "TOKEN_ID(+/-)BIAS", dest="logit_bias", append=True),
    F("--grammar", "refused", "GRAMMAR", note="there is no grammar engine"),
    F("--grammar-file", "refused", "FNAME", note="there is no grammar engine"),
    F("-j --json-schema", "refused", "SCHEMA", note="there is no grammar engine"),
    F("-jf --json-schema-file", "refused", "FILE", note="there is no grammar engine"),
    F("-bs --backend-sampling", "ignored", note="sampling always runs in MLX on the model's device"),
    # -- speculative -------------------------------------------------------------------------------
    F("--spec-draft-hf -hfd -hfrd --hf-repo-draft", "supported", "<user>/<model>[:quant]", dest="draft_hf",
      note="the draft model from the Hugging Face cache (nothing is downloaded)"),
    F("--spec-draft-threads -td --threads-draft", "ignored", "N", note=SPEC_BACKEND),
    F("--spec-draft-threads-batch -tbd --threads-batch-draft", "ignored", "N", note=SPEC_BACKEND),
    F("--spec-draft-cpu-mask -Cd --cpu-mask-draft", "ignored", "M", note=SPEC_BACKEND),
    F("--spec-draft-cpu-range -Crd --cpu-range-draft", "ignored", "lo-hi", note=SPEC_BACKEND),
    F("--spec-draft-cpu-strict --cpu-strict-draft", "ignored", "<0|1>", note=SPEC_BACKEND),
    F("--spec-draft-prio --prio-draft", "ignored", "N", note=SPEC_BACKEND),
    F("--spec-draft-poll --poll-draft", "ignored", "<0|1>", note=SPEC_BACKEND),
    F("--spec-draft-cpu-mask-batch -Cbd --cpu-mask-batch-draft", "ignored", "M", note=SPEC_BACKEND),
    F("--spec-draft-cpu-strict-batch --cpu-strict-batch-draft", "ignored", "<0|1>", note=SPEC_BACKEND),
    F("--spec-draft-prio-batch --prio-batch-draft", "ignored", "N", note=SPEC_BACKEND),
    F("--spec-draft-poll-batch --poll-batch-draft", "ignored", "<0|1>", note=SPEC_BACKEND),
    F("--spec-draft-override-tensor -otd --override-tensor-draft", "ignored",
      "<tensor name pattern>=<buffer type>,...", note=SPEC_GPU),
    F("--spec-draft-cpu-moe -cmoed --cpu-moe-draft", "ignored", note=SPEC_GPU),
    F("--spec-draft-n-cpu-moe --spec-draft-ncmoe -ncmoed --n-cpu-moe-draft", "ignored", "N", note=SPEC_GPU),
    F("--spec-draft-n-max", "supported", "N", dest="spec_draft_n_max", type="int",
      note=f"draft-model tokens per verify round (default {DRAFT_MODEL.default_block}); a model-based drafter's "
           "default is its checkpoint's block; prompt lookup's cap is --spec-ngram-simple-size-m"),
    F("--spec-draft-n-min", "supported", "N", dest="spec_draft_n_min", type="int",
      note="a block shorter than N is not verified; the row decodes plainly that step (default 0)"),
    F("--spec-synth-len", "refused", "L", note="synthetic acceptance (benchmarking only) is not implemented"),
    F("--spec-synth-rates", "refused", "P0,P1,...", note="synthetic acceptance (benchmarking only) is not implemented"),
    F("--spec-draft-p-split --draft-p-split", "ignored", "P", note="no draft-tree splitting: blocks are one chain"),
    F("--spec-draft-p-min --draft-p-min", "ignored", "P",
      note="a draft-model block is always --spec-draft-n-max long; the acceptance rule decides what survives"),
    F("--spec-draft-backend-sampling", "ignored", negatives=("--no-spec-draft-backend-sampling",),
      note=SPEC_BACKEND),
    F("--spec-draft-sampling", "divergent", "{greedy,probabilistic}", dest="spec_draft_sampling", note=(
        "ignored: the draft model draws with the request's own sampler (argmax at temperature 0); acceptance is "
        "sampler-match, or rejection sampling with MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT=1; output is lossless either way")),
    F("--spec-draft-device -devd --device-draft", "ignored", "<dev1,dev2,..>", note=SPEC_GPU),
    F("--spec-draft-ngl -ngld --gpu-layers-draft --n-gpu-layers-draft", "ignored", "N", note=SPEC_GPU),
    F("--spec-draft-model -md --model-draft", "divergent", "FNAME", dest="draft_model", note=(
        "a draft model sharing the target's vocabulary (GGUF file or model directory). Without --spec-type it "
        "drafts (draft-simple); upstream loads it and never drafts, which only confuses. A DFlash, DSpark or "
        "Muse Glimmer assistant checkpoint directory (recognised by structure) drafts on the DFlash round loop, "
        "a NextN MTP assistant on the MTP round loop")),
    F("--spec-type", "divergent", "TYPES", dest="spec_type", note=(
        "none, or one drafter per server: " + "; ".join(f"{'/'.join(k.spec_types)}: {k.name}" for k in KINDS
                                                         if k.spec_types)
        + "; the n-gram types upstream implements apart are all served "
        "by prompt lookup (lossless either way: only speed can differ); the model-based kinds verify "
        "argmax-against-argmax above temperature 0 unless stochastic acceptance is on, and DSpark decodes "
        "sampling requests plainly; " + "; ".join(f"{t} is refused ({why})" for t, why in SPEC_TYPE_REFUSED.items()))),
    F("--spec-ngram-mod-n-min", "ignored", "N", note=LOOKUP),
    F("--spec-ngram-mod-n-max", "ignored", "N", note=LOOKUP),
    F("--spec-ngram-mod-n-match", "ignored", "N", note=LOOKUP),
    F("--spec-ngram-simple-size-n", "divergent", "N", dest="spec_ngram_simple_size_n", type="int",
      note="longest n-gram prompt lookup matches, shorter ones tried after it down to 1 (default 3, upstream 12)"),
    F("--spec-ngram-simple-size-m", "divergent", "N", dest="spec_ngram_simple_size_m", type="int",
      note=f"prompt lookup's block cap (default {PROMPT_LOOKUP.default_block}, upstream 48: a wide verify forward "
           f"costs more here; blocks start at {BLOCK_START} tokens and double while fully accepted)"),
    F("--spec-ngram-simple-min-hits", "ignored", "N", note="every lookup match is proposed (min hits 1)"),
    F("--spec-ngram-map-k-size-n", "ignored", "N", note=LOOKUP),
    F("--spec-ngram-map-k-size-m", "ignored", "N", note=LOOKUP),
    F("--spec-ngram-map-k-min-hits", "ignored", "N", note=LOOKUP),
    F("--spec-ngram-map-k4v-size-n", "ignored", "N", note=LOOKUP),
    F("--spec-ngram-map-k4v-size-m", "ignored", "N", note=LOOKUP),
    F("--spec-ngram-map-k4v-min-hits", "ignored", "N", note=LOOKUP),
    F("--draft --draft-n --draft-max", "refused", "N", note=REMOVED),
    F("--draft-min --draft-n-min", "refused", "N", note=REMOVED),
    F("--spec-ngram-size-n", "refused", "N", note="removed upstream too; use --spec-ngram-*-size-n"),
    F("--spec-ngram-size-m", "refused", "N", note="removed upstream too; use --spec-ngram-*-size-m"),
    F("--spec-ngram-min-hits", "refused", "N", note="removed upstream too; use --spec-ngram-*-min-hits"),
    # -- example-specific (server) ------------------------------------------------------------------
    F("-lcs --lookup-cache-static", "ignored", "FNAME",
      note="prompt lookup searches the request's own prompt and output; no lookup cache files"),
    F("-lcd --lookup-cache-dynamic", "ignored", "FNAME",
      note="prompt lookup searches the request's own prompt and output; no lookup cache files"),
    F("--kv-unified-per-slot", "ignored", "N", note="every slot has its own -c sized cache"),
    F("-ctxcp --ctx-checkpoints --swa-checkpoints", "ignored", "N", note=BACKEND),
    F("-cms --checkpoint-min-step", "ignored", "N", note=BACKEND),
    F("-cram --cache-ram", "ignored", "N", note="prompt caching is per slot, in the slot's own KV cache"),
    F("-kvu --kv-unified", "ignored", negatives=("-no-kvu", "--no-kv-unified"), note="every slot has its own cache"),
    F("--cache-idle-slots", "ignored", negatives=("--no-cache-idle-slots",), note="idle slots always keep their cache"),
    F("--context-shift", "refused", negatives=("--no-context-shift",), allowed=("false",),
      note="context shift is not implemented: generation stops when the context is full"),
    F("-r --reverse-prompt", "ignored", "PROMPT", note="interactive-mode option; use the request's stop field"),
    F("-sp --special", "ignored", note="special tokens are rendered as the tokenizer decodes them"),
    F("--warmup", "ignored", negatives=("--no-warmup",), note="no warm-up run is needed"),
    F("--spm-infill", "ignored", note="/infill is not supported"),
    F("--pooling", "ignored", "{none,mean,cls,last,rank}", note="embeddings are not supported"),
    F("-np --parallel", "supported", "N", dest="parallel", type="int", note="-1 (auto) = 4 slots"),
    F("-cb --cont-batching", "ignored", negatives=("-nocb", "--no-cont-batching"),
      note="continuous batching is always on"),
    F("-mm --mmproj", "refused", "FILE", note=MEDIA),
    F("-mmu --mmproj-url", "refused", "URL", note=MEDIA),
    F("--mmproj-auto", "ignored", negatives=("--no-mmproj", "--no-mmproj-auto"), note=MEDIA),
    F("--mmproj-offload", "ignored", negatives=("--no-mmproj-offload",), note=MEDIA),
    F("-mmdev --mmproj-device", "ignored", "DEVICE", note=MEDIA),
    F("--image-min-tokens", "ignored", "N", note=MEDIA),
    F("--image-max-tokens", "ignored", "N", note=MEDIA),
    F("--mtmd-batch-max-tokens", "ignored", "N", note=MEDIA),
    F("--video-fps", "ignored", "N", note=MEDIA),
    F("--video-timestamp-interval", "ignored", "N", note=MEDIA),
    F("--video-ffmpeg-dir", "ignored", "DIR", note=MEDIA),
    F("-a --alias", "supported", "STRING", dest="alias"),
    F("--tags", "supported", "STRING", dest="tags"),
    F("--embd-normalize", "ignored", "N", note="embeddings are not supported"),
    F("--host", "supported", "HOST", dest="host", note="one address (UNIX sockets: a path ending in .sock)"),
    F("--port", "supported", "PORT", dest="port", type="int"),
    F("--reuse-port", "ignored", note="uvicorn binds one socket"),
    F("--path", "ignored", "PATH", note="no static files are served"),
    F("--cors-origins", "supported", "ORIGINS", dest="cors_origins",
      note="default *; with --cors-credentials (default) * echoes the request's Origin, as upstream"),
    F("--cors-methods", "supported", "METHODS", dest="cors_methods"),
    F("--cors-headers", "supported", "HEADERS", dest="cors_headers"),
    F("--cors-credentials", "supported", negatives=("--no-cors-credentials",), dest="cors_credentials"),
    F("--api-prefix", "supported", "PREFIX", dest="api_prefix"),
    F("--ui-config --webui-config", "ignored", "JSON", note=UI),
    F("--ui-config-file --webui-config-file", "ignored", "PATH", note=UI),
    F("--ui-mcp-proxy --webui-mcp-proxy", "ignored", negatives=("--no-ui-mcp-proxy", "--no-webui-mcp-proxy"), note=UI),
    F("--tools", "ignored", "TOOL1,TOOL2,...", note=UI),
    F("--tools-runtime", "ignored", "OPTION", note=UI),
    F("--mcp-servers-config", "ignored", "PATH", note=UI),
    F("--mcp-servers-json", "ignored", "JSON", note=UI),
    F("-ag --agent", "ignored", negatives=("-no-ag", "--no-agent"), note=UI),
    F("--ui --webui", "ignored", negatives=("--no-ui", "--no-webui"), note=UI),
    F("--embedding --embeddings", "refused", note="embeddings are not supported"),
    F("--rerank --reranking", "refused", note="reranking is not supported"),
    F("--api-key", "supported", "KEY", dest="api_key"),
    F("--api-key-file", "supported", "FNAME", dest="api_key_file"),
    F("--ssl-key-file", "supported", "FNAME", dest="ssl_key_file"),
    F("--ssl-cert-file", "supported", "FNAME", dest="ssl_cert_file"),
    F("--chat-template-kwargs", "supported", "STRING", dest="chat_template_kwargs"),
    F("-to --timeout", "divergent", "N", dest="timeout", type="int",
      note="the most seconds one request may run (queue wait, prefill and generation); past it the request "
           "ends with a 503 error (body or stream event) and its slot is freed; also the read timeout of "
           "request bodies (408)"),
    F("--sse-ping-interval", "ignored", "N", note="no SSE keep-alive comments are sent"),
    F("--threads-http", "ignored", "N", note="requests are served by one asyncio event loop"),
    F("--cache-prompt", "supported", negatives=("--no-cache-prompt",), dest="cache_prompt"),
    F("--cache-reuse", "ignored", "N", note="only the common prefix is reused (no KV shifting)"),
    F("--metrics", "supported", dest="metrics"),
    F("--props", "supported", dest="props", note="POST /props is accepted; it changes nothing"),
    F("--slots", "supported", negatives=("--no-slots",), dest="slots"),
    F("--slot-save-path", "ignored", "PATH", note="saving/restoring slots is not supported"),
    F("--media-path", "ignored", "PATH", note=MEDIA),
    F("--models-dir", "refused", "PATH", note=ROUTER),
    F("--models-preset", "refused", "PATH", note=ROUTER),
    F("--models-max", "ignored", "N", note=ROUTER),
    F("--models-autoload", "ignored", negatives=("--no-models-autoload",), note=ROUTER),
    F("--jinja", "divergent", negatives=("--no-jinja",), dest="jinja",
      note="templates are always rendered with Jinja; --no-jinja is accepted and changes nothing"),
    F("--reasoning-format", "ignored", "FORMAT", note="no reasoning extraction: replies are content-only"),
    F("-rea --reasoning", "ignored", "[on|off|auto]", optional_value=True, note="no reasoning extraction"),
    F("--reasoning-effort", "ignored", "LEVEL", note="no reasoning extraction"),
    F("--reasoning-budget", "ignored", "N", note="no reasoning extraction"),
    F("--reasoning-budget-message", "ignored", "MESSAGE", note="no reasoning extraction"),
    F("--reasoning-preserve", "ignored", negatives=("--no-reasoning-preserve",), note="no reasoning extraction"),
    F("--chat-template", "divergent", "JINJA_TEMPLATE", dest="chat_template",
      note="Jinja source, or the built-in name 'chatml' (other built-in names are refused)"),
    F("--chat-template-file", "supported", "JINJA_TEMPLATE_FILE", dest="chat_template_file"),
    F("--skip-chat-parsing", "ignored", negatives=("--no-skip-chat-parsing",), note="replies are content-only already"),
    F("--prefill-assistant", "ignored", negatives=("--no-prefill-assistant",), note="the template decides"),
    F("-sps --slot-prompt-similarity", "supported", "SIMILARITY", dest="slot_prompt_similarity", type="float"),
    F("--lora-init-without-apply", "ignored", note="LoRA adapters are not supported"),
    F("--sleep-idle-seconds", "ignored", "SECONDS", note="the model stays loaded"),
    F("--log-prompts-dir", "ignored", "PATH", note="prompts are not logged to files"),
    F("--embd-gemma-default", "refused", note=PRESET),
    F("--fim-qwen-1.5b-default", "refused", note=PRESET),
    F("--fim-qwen-3b-default", "refused", note=PRESET),
    F("--fim-qwen-7b-default", "refused", note=PRESET),
    F("--fim-qwen-7b-spec", "refused", note=PRESET),
    F("--fim-qwen-14b-spec", "refused", note=PRESET),
    F("--fim-qwen-30b-default", "refused", note=PRESET),
    F("--gpt-oss-20b-default", "refused", note=PRESET),
    F("--gpt-oss-120b-default", "refused", note=PRESET),
    F("--vision-gemma-4b-default", "refused", note=PRESET),
    F("--vision-gemma-12b-default", "refused", note=PRESET),
    F("--spec-default", "divergent", dest="spec_default",
      note="enables prompt lookup (mlxcel's default speculative setup needs no second model)"),
]
