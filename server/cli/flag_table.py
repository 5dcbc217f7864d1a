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

This table is the single source: ``args.build_parser`` is generated from it, ``help_text`` writes
``--help`` from it (``SECTIONS``: upstream's sections, in upstream's order; ``help`` says what an
honoured flag does, ``note`` how mlxcel does it or why it is ignored or refused), and
``compat_record`` writes ``flags.json`` from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxcel.drafters.lookup.options import NgramMapOptions, NgramModOptions
from mlxcel.drafters.lookup.prompt_lookup import BLOCK_START
from mlxcel.drafters.registry import DRAFT_MODEL, KINDS, PROMPT_LOOKUP, SPEC_TYPE_REFUSED, combinable_types


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
    env: str | None = None  # upstream's environment variable for it (LLAMA_ARG_*); the command line wins
    help: str = ""  # what the flag does, for --help (the note follows it there)
    default: str | None = None  # the default --help shows; None: the ServerConfig field's own, "" none


def F(names: str, state: str, metavar: str | None = None, **kw) -> Flag:
    return Flag(names=tuple(names.split()), state=state, metavar=metavar, **kw)


BACKEND = "a llama.cpp/ggml backend setting with no MLX counterpart; MLX chooses threads, memory and kernels"
GPU = "GPU offload/placement of llama.cpp; MLX runs the whole model on its default device"
UI = "a feature of llama-server's bundled web app; mlxcel's own chat page at / has no such setting"
SPEC_BACKEND = "a llama.cpp backend setting for the draft model with no MLX counterpart"
SPEC_GPU = "GPU placement of the draft model; MLX runs it on its default device"
MAP = NgramMapOptions()  # upstream's defaults, shown by --help
MOD = NgramModOptions()
MEDIA = "video and audio input are not supported; mlxcel-server's vision towers take images"
PROJECTORS = ("images through mlx-vlm's vision towers: Gemma 3 (gemma3) and Qwen2.5-VL (qwen2.5vl_merger) "
              "projectors, mapped from llama.cpp's v.*/mm.* tensors")
ROPE = "mlxcel uses the RoPE settings of the model's own config; overriding them would change the model"
PRESET = ("upstream's preset: a model it fetches from Hugging Face with settings for it; mlxcel has no presets, "
          "give the model with -m or -hf and the settings as flags")
LOG = "logging format knob; mlxcel logs through Python logging"
REMOVED = "removed upstream too; use --spec-draft-n-max / --spec-draft-n-min"

# mlxcel's own flags (not upstream's); recorded apart from upstream's in the compat record.
EXTENSIONS: list[Flag] = [
    F("--draft-kind", "supported", "KIND", dest="draft_kind", help="the drafter, by mlxcel's name for it",
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

COMMON: list[Flag] = [
    F("-h --help --usage", "supported", note="prints mlxcel-server's usage and exits"),
    F("--version", "supported", note="prints mlxcel's version and exits"),
    F("-cl --cache-list", "refused", note="mlxcel has no model cache listing; models are paths or HF repos"),
    F("--completion-bash", "refused", note="no bash completion script is provided"),
    F("-t --threads", "divergent", "N", dest="threads", type="int",
      note="on a CPU, the threads of the quantized-matmul kernels and of OpenBLAS (default: every usable "
           "core, as upstream, or OPENBLAS_NUM_THREADS); MLX's other CPU ops and any GPU are unaffected", env="LLAMA_ARG_THREADS"),
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
    F("-c --ctx-size", "supported", "N",
      help="context size in tokens", dest="ctx_size", type="int",
      note="0: the model's own (max_position_embeddings); shared by the slots with -kvu (the default when -np is "
           "auto), else each slot gets -c / -np", env="LLAMA_ARG_CTX_SIZE"),
    F("-n --predict --n-predict", "supported", "N",
      help="tokens to generate per request (-1: until the end of the sequence or a full context)",
      dest="n_predict", type="int",
      note="the default n_predict: a request's own n_predict (other than -1) wins, as upstream", env="LLAMA_ARG_N_PREDICT"),
    F("-b --batch-size", "supported", "N", dest="batch_size", type="int",
      note="most prompt tokens prefilled per scheduler step, over all slots", env="LLAMA_ARG_BATCH"),
    F("-ub --ubatch-size", "supported", "N", dest="ubatch_size", type="int",
      note="prefill chunk size of one forward pass", env="LLAMA_ARG_UBATCH"),
    F("--keep", "supported", "N", dest="n_keep", type="int",
      note="the default n_keep of requests: prompt tokens a context shift keeps (-1: all)"),
    F("--swa-full", "ignored", note=BACKEND, env="LLAMA_ARG_SWA_FULL"),
    F("-fa --flash-attn", "ignored", "[on|off|auto]", optional_value=True,
      note="MLX uses its fused attention kernel where it has one", env="LLAMA_ARG_FLASH_ATTN"),
    F("--perf", "ignored", negatives=("--no-perf",), note=BACKEND, env="LLAMA_ARG_PERF"),
    F("-e --escape", "ignored", negatives=("--no-escape",),
      note="escapes in command-line prompts, which the server has none of; upstream also unescapes "
           "--dry-sequence-breaker, whose value is taken as written here"),
    F("--rope-scaling", "refused", "{none,linear,yarn}", note=ROPE, env="LLAMA_ARG_ROPE_SCALING_TYPE"),
    F("--rope-scale", "refused", "N", note=ROPE, env="LLAMA_ARG_ROPE_SCALE"),
    F("--rope-freq-base", "refused", "N", note=ROPE, env="LLAMA_ARG_ROPE_FREQ_BASE"),
    F("--rope-freq-scale", "refused", "N", note=ROPE, env="LLAMA_ARG_ROPE_FREQ_SCALE"),
    F("--yarn-orig-ctx", "refused", "N", note=ROPE, env="LLAMA_ARG_YARN_ORIG_CTX"),
    F("--yarn-ext-factor", "refused", "N", note=ROPE, env="LLAMA_ARG_YARN_EXT_FACTOR"),
    F("--yarn-attn-factor", "refused", "N", note=ROPE, env="LLAMA_ARG_YARN_ATTN_FACTOR"),
    F("--yarn-beta-slow", "refused", "N", note=ROPE, env="LLAMA_ARG_YARN_BETA_SLOW"),
    F("--yarn-beta-fast", "refused", "N", note=ROPE, env="LLAMA_ARG_YARN_BETA_FAST"),
    F("-kvo --kv-offload", "ignored", negatives=("-nkvo", "--no-kv-offload"), note=GPU, env="LLAMA_ARG_KV_OFFLOAD"),
    F("--repack", "ignored", negatives=("-nr", "--no-repack"), note=BACKEND, env="LLAMA_ARG_REPACK"),
    F("--no-host", "ignored", note=BACKEND, env="LLAMA_ARG_NO_HOST"),
    F("-ctk --cache-type-k", "divergent", "TYPE", dest="cache_type_k",
      help="the KV cache's type for keys (f32, f16, bf16, q8_0, q5_0, q5_1, q4_0, q4_1)",
      note="q8_0/q5_x/q4_x: mlx-lm's quantized cache (MLX affine, groups of 32; the _0 types held with a bias too), "
           "on the MLX-native profile only, the same type for -ctv; f32/f16/bf16: the compute dtype (float32 on the "
           "CPU kernels, where f16/bf16 stay float32); iq4_nl refused (engine/model/kv_types.py)",
      env="LLAMA_ARG_CACHE_TYPE_K"),
    F("-ctv --cache-type-v", "divergent", "TYPE", dest="cache_type_v",
      help="the KV cache's type for values (as -ctk)", note="as -ctk: quantized keys and values use the same type",
      env="LLAMA_ARG_CACHE_TYPE_V"),
    F("-dt --defrag-thold", "ignored", "N", note="deprecated upstream; MLX caches need no defragmentation", env="LLAMA_ARG_DEFRAG_THOLD"),
    F("--rpc", "refused", "SERVERS", note="llama.cpp's RPC backend is not supported; to split a model across machines "
      "run mlxcel-server under mlx.launch (docs/distributed.md)", env="LLAMA_ARG_RPC"),
    F("-lm --load-mode", "ignored", "MODE", note=BACKEND, env="LLAMA_ARG_LOAD_MODE"),
    F("-lzm --lazy-mode", "ignored", "MODE", note=BACKEND, env="LLAMA_ARG_LAZY_MODE"),
    F("--numa", "ignored", "TYPE", note=BACKEND, env="LLAMA_ARG_NUMA"),
    F("-dev --device", "ignored", "<dev1,dev2,..>", note=GPU, env="LLAMA_ARG_DEVICE"),
    F("--list-devices", "supported", note="prints MLX's default device and exits"),
    F("-ot --override-tensor", "ignored", "<tensor name pattern>=<buffer type>,...", note=GPU, env="LLAMA_ARG_OVERRIDE_TENSOR"),
    F("-cmoe --cpu-moe", "ignored", note=GPU, env="LLAMA_ARG_CPU_MOE"),
    F("-ncmoe --n-cpu-moe", "ignored", "N", note=GPU, env="LLAMA_ARG_N_CPU_MOE"),
    F("-ncffn --n-cpu-ffn", "ignored", "N", note=GPU, env="LLAMA_ARG_N_CPU_FFN"),
    F("-ngl --gpu-layers --n-gpu-layers", "ignored", "N", note=GPU, env="LLAMA_ARG_N_GPU_LAYERS"),
    F("-sm --split-mode", "divergent", "{none,layer,row,tensor}", dest="split_mode", env="LLAMA_ARG_SPLIT_MODE",
      note="splits the model across the ranks of mlx.launch, not across GPUs: row/tensor (the default there) is "
           "mlx-lm's tensor parallelism, layer its pipeline parallelism; ignored in a single process "
           "(docs/distributed.md)"),
    F("-ts --tensor-split", "divergent", "N0,N1,N2,...", dest="tensor_split", env="LLAMA_ARG_TENSOR_SPLIT",
      note="proportions per rank of mlx.launch, not per GPU: layers per rank with --split-mode layer; "
           "row splits evenly, so only equal proportions; ignored in a single process"),
    F("-mg --main-gpu", "ignored", "INDEX", note=GPU, env="LLAMA_ARG_MAIN_GPU"),
    F("-fit --fit", "ignored", "[on|off]", optional_value=True, note=GPU, env="LLAMA_ARG_FIT"),
    F("-fitt --fit-target", "ignored", "MiB0,MiB1,MiB2,...", note=GPU, env="LLAMA_ARG_FIT_TARGET"),
    F("-fitc --fit-ctx", "ignored", "N", note=GPU, env="LLAMA_ARG_FIT_CTX"),
    F("--check-tensors", "ignored", note="tensor data is not scanned for NaN/inf values; the loaders check every "
      "tensor's shape and type"),
    F("--override-kv", "refused", "KEY=TYPE:VALUE,...", note="overriding GGUF metadata is not supported"),
    F("--op-offload", "ignored", negatives=("--no-op-offload",), note=GPU),
    F("--lora", "supported", "FNAME", dest="lora_adapters", type="lora", append=True,
      help="path to LoRA adapter (use comma-separated values to load multiple adapters)",
      note="a GGUF adapter (convert_lora_to_gguf.py) or an mlx-lm adapter directory (adapter_config.json + "
           "adapters.safetensors); applied per request, so requests with different adapters or scales share "
           "a batch; adapters are numbered in command-line order with --lora-scaled"),
    F("--lora-scaled", "supported", "FNAME:SCALE,...", dest="lora_adapters", type="lora_scaled", append=True,
      help="path to LoRA adapter with user defined scaling (format: FNAME:SCALE,...)",
      note="the scale is the global one GET /lora-adapters shows; a GGUF adapter's delta is scale * alpha / rank, "
           "an mlx-lm adapter's scale * its lora_parameters scale"),
    F("--control-vector", "refused", "FNAME", note="control vectors are not supported"),
    F("--control-vector-scaled", "refused", "FNAME:SCALE,...", note="control vectors are not supported"),
    F("--control-vector-layer-range", "refused", "START END", nargs=2, note="control vectors are not supported"),
    F("-m --model", "supported", "FNAME", dest="model",
      note="a GGUF file or an MLX/Hugging Face model directory; none = the built-in default model", env="LLAMA_ARG_MODEL"),
    F("-mu --model-url", "refused", "MODEL_URL", note="downloading from a URL is not supported; use -m or -hf", env="LLAMA_ARG_MODEL_URL"),
    F("-dr --docker-repo", "refused", "[<repo>/]<model>[:quant]", note="Docker Hub models are not supported", env="LLAMA_ARG_DOCKER_REPO"),
    F("-hf -hfr --hf-repo", "divergent", "<user>/<model>[:quant]",
      help="load the model from this Hugging Face repository: the quant's GGUF (case-insensitive; default Q4_K_M, "
           "then Q8_0, then the first GGUF) or an MLX/safetensors repository whole, from the Hugging Face cache when "
           "it holds the file (no network), else downloaded into it (--offline: the cache only)",
      dest="hf_repo",
      note="the repository's mmproj file is fetched and loaded for images (unless --no-mmproj; a projector type "
           "mlxcel does not run leaves a text model, with a warning); a split GGUF is "
           "fetched whole, then refused (mlxcel reads single-file GGUFs); with no quant the cache answers without "
           "network only when it holds Q4_K_M; a repository's preset.ini and its mtp-/dflash-/eagle3-/dspark- "
           "sidecars are not looked for", env="LLAMA_ARG_HF_REPO"),
    F("-hff --hf-file", "supported", "FILE",
      help="the file of --hf-repo to load; overrides the :quant", dest="hf_file", env="LLAMA_ARG_HF_FILE"),
    F("-hft --hf-token", "supported", "TOKEN",
      help="Hugging Face access token", dest="hf_token", env="HF_TOKEN"),
    F("--log-disable", "supported",
      help="log nothing", dest="log_disable"),
    F("--log-file", "supported", "FNAME",
      help="write the log to this file instead of stderr", dest="log_file", env="LLAMA_ARG_LOG_FILE"),
    F("--log-jsonl", "ignored", negatives=("--no-log-jsonl",), note=LOG, env="LLAMA_ARG_LOG_JSONL"),
    F("--log-colors", "ignored", "[on|off|auto]", optional_value=True, note=LOG, env="LLAMA_ARG_LOG_COLORS"),
    F("-v --verbose --log-verbose", "supported",
      help="log everything (debug level)", dest="verbose"),
    F("--offline", "supported",
      help="never reach the network: models come from the local Hugging Face cache",
      dest="offline", note="sets HF_HUB_OFFLINE=1", env="LLAMA_ARG_OFFLINE"),
    F("-lv --verbosity --log-verbosity", "supported", "N",
      help="how much is logged: 0-1 errors, 2 warnings too, 3-4 information too, 5 or more everything",
      dest="verbosity", type="int", env="LLAMA_ARG_LOG_VERBOSITY"),
    F("--log-prefix", "ignored", negatives=("--no-log-prefix",), note=LOG, env="LLAMA_ARG_LOG_PREFIX"),
    F("--log-timestamps", "ignored", negatives=("--no-log-timestamps",), note=LOG, env="LLAMA_ARG_LOG_TIMESTAMPS"),
    F("--spec-draft-type-k -ctkd --cache-type-k-draft", "ignored", "TYPE",
      note="the draft model's KV cache keeps the model's own dtype", env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K"),
    F("--spec-draft-type-v -ctvd --cache-type-v-draft", "ignored", "TYPE",
      note="the draft model's KV cache keeps the model's own dtype", env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V"),
]

SAMPLING: list[Flag] = [
    F("--samplers", "divergent", "SAMPLERS",
      help="the sampler stages, separated by ';'", dest="samplers",
      note="stages may be left out; the chain's order is fixed, so a reordering is refused"),
    F("-s --seed", "supported", "SEED",
      help="random seed (-1: a fresh one per request)", dest="seed", type="int"),
    F("--sampler-seq --sampling-seq", "divergent", "SEQUENCE", dest="sampler_seq",
      note="as --samplers, in single letters"),
    F("--ignore-eos", "supported",
      help="keep generating past end-of-sequence tokens", dest="ignore_eos"),
    F("--temp --temperature", "supported", "N",
      help="sampling temperature (0: greedy)", dest="temperature", type="float", env="LLAMA_ARG_TEMPERATURE"),
    F("--top-k", "supported", "N",
      help="keep only the K most likely tokens (0: off)", dest="top_k", type="int", env="LLAMA_ARG_TOP_K"),
    F("--top-p", "supported", "N",
      help="keep the most likely tokens until their probabilities add up to P (1.0: off)",
      dest="top_p", type="float", env="LLAMA_ARG_TOP_P"),
    F("--min-p", "supported", "N",
      help="drop tokens less likely than P times the most likely one (0.0: off)",
      dest="min_p", type="float", env="LLAMA_ARG_MIN_P"),
    F("--top-nsigma --top-n-sigma", "refused", "N", allowed=("-1", "-1.0", "-1.00"),
      note="the top-n-sigma stage is not implemented"),
    F("--xtc-probability", "supported", "N",
      help="chance that XTC removes the top choices at a step (0.0: off)", dest="xtc_probability", type="float"),
    F("--xtc-threshold", "supported", "N",
      help="tokens at least this likely are what XTC may remove", dest="xtc_threshold", type="float"),
    F("--typical --typical-p", "supported", "N",
      help="locally typical sampling (1.0: off)", dest="typical_p", type="float"),
    F("--repeat-last-n", "supported", "N",
      help="how many recent tokens the repetition penalties look at (0: off, -1: the whole context)",
      dest="repeat_last_n", type="int"),
    F("--repeat-penalty", "supported", "N",
      help="penalise recently seen tokens by this factor (1.0: off)",
      dest="repeat_penalty", type="float", env="LLAMA_ARG_REPEAT_PENALTY"),
    F("--presence-penalty", "supported", "N",
      help="lower the logit of every token seen in the last --repeat-last-n by this (0.0: off)",
      dest="presence_penalty", type="float", env="LLAMA_ARG_PRESENCE_PENALTY"),
    F("--frequency-penalty", "supported", "N",
      help="lower a recently seen token's logit by this times its count (0.0: off)",
      dest="frequency_penalty", type="float", env="LLAMA_ARG_FREQUENCY_PENALTY"),
    F("--dry-multiplier", "supported", "N",
      help="strength of the DRY penalty on repeated sequences (0.0: off)", dest="dry_multiplier", type="float"),
    F("--dry-base", "supported", "N",
      help="DRY's penalty grows as this to the power of the repeat's length past the allowed length",
      dest="dry_base", type="float"),
    F("--dry-allowed-length", "supported", "N",
      help="repeats up to this many tokens long are not penalised by DRY", dest="dry_allowed_length", type="int"),
    F("--dry-penalty-last-n", "supported", "N",
      help="how many recent tokens DRY scans (-1: the whole context, 0: off)", dest="dry_penalty_last_n", type="int"),
    F("--dry-sequence-breaker", "supported", "STRING",
      help="a string that breaks DRY's repeat matching; give it several times for several; replaces the defaults "
           "('\\n', ':', '\"', '*'); 'none' for no breakers",
      dest="dry_sequence_breaker", append=True),
    F("--adaptive-target", "refused", "N", allowed=("-1", "-1.0", "-1.00"), note="the adaptive-p stage is not implemented"),
    F("--adaptive-decay", "ignored", "N", note="only used by the adaptive-p stage, which is refused"),
    F("--dynatemp-range", "refused", "N", allowed=("0", "0.0", "0.00"), note="dynamic temperature is not implemented"),
    F("--dynatemp-exp", "ignored", "N", note="only used by dynamic temperature, which is refused"),
    F("--mirostat", "refused", "N", allowed=("0",), note="mirostat sampling is not implemented"),
    F("--mirostat-lr", "ignored", "N", note="only used by mirostat, which is refused"),
    F("--mirostat-ent", "ignored", "N", note="only used by mirostat, which is refused"),
    F("-l --logit-bias", "supported", "TOKEN_ID(+/-)BIAS",
      help="add BIAS to the logit of TOKEN_ID (e.g. 15043+1, 15043-inf); give it several times for several "
           "tokens",
      dest="logit_bias", append=True),
    F("--grammar", "supported", "GRAMMAR", dest="grammar",
      note="GBNF (or llguidance's Lark) for every request that names no grammar of its own"),
    F("--grammar-file", "supported", "FNAME",
      help="--grammar, read from a file", dest="grammar_file"),
    F("-j --json-schema", "supported", "SCHEMA",
      help="a JSON schema for the output of every request that names no grammar or schema of its own",
      dest="json_schema"),
    F("-jf --json-schema-file", "supported", "FILE",
      help="-j, read from a file", dest="json_schema_file"),
    F("-bs --backend-sampling", "ignored", note="sampling always runs in MLX on the model's device", env="LLAMA_ARG_BACKEND_SAMPLING"),
]

SPECULATIVE: list[Flag] = [
    F("--spec-draft-hf -hfd -hfrd --hf-repo-draft", "divergent", "<user>/<model>[:quant]",
      help="load the draft model from this Hugging Face repository, its file chosen as -hf chooses (-md then "
           "names the file, as -hff does for -hf)", dest="draft_hf",
      note="always a draft model (draft-simple): the repository's mtp-/dflash-/eagle3-/dspark- sidecars are not "
           "looked for, so the drafter kind is not inferred from them",
      env="LLAMA_ARG_SPEC_DRAFT_HF_REPO"),
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
    F("--spec-draft-cpu-moe -cmoed --cpu-moe-draft", "ignored", note=SPEC_GPU, env="LLAMA_ARG_SPEC_DRAFT_CPU_MOE"),
    F("--spec-draft-n-cpu-moe --spec-draft-ncmoe -ncmoed --n-cpu-moe-draft", "ignored", "N", note=SPEC_GPU, env="LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE"),
    F("--spec-draft-n-max", "supported", "N", dest="spec_draft_n_max", type="int",
      note=f"draft-model tokens per verify round (default {DRAFT_MODEL.default_block}); a model-based drafter's "
           "default is its checkpoint's block; prompt lookup's cap is --spec-ngram-simple-size-m", env="LLAMA_ARG_SPEC_DRAFT_N_MAX"),
    F("--spec-draft-n-min", "supported", "N", dest="spec_draft_n_min", type="int",
      note="a block shorter than N is not verified; the row decodes plainly that step (default 0)", env="LLAMA_ARG_SPEC_DRAFT_N_MIN"),
    F("--spec-synth-len", "divergent", "L", dest="spec_synth_len", type="float",
      note="benchmarking only: drafts accepted at random for a target mean acceptance length (target token "
           "included), whatever the target says; the output is not the target's. draft-simple and prompt lookup", env="LLAMA_ARG_SPEC_SYNTH_LEN"),
    F("--spec-synth-rates", "divergent", "P0,P1,...", dest="spec_synth_rates",
      note="benchmarking only: per-position acceptance probabilities (non-increasing, one per draft), whatever the "
           "target says; the output is not the target's. draft-simple and prompt lookup", env="LLAMA_ARG_SPEC_SYNTH_RATES"),
    F("--spec-draft-p-split --draft-p-split", "ignored", "P", note="no draft-tree splitting: blocks are one chain", env="LLAMA_ARG_SPEC_DRAFT_P_SPLIT"),
    F("--spec-draft-p-min --draft-p-min", "ignored", "P",
      note="draft blocks are not cut by the draft model's confidence (their length is --spec-draft-n-max, or the "
           "verify-cost cap); the acceptance rule decides what survives", env="LLAMA_ARG_SPEC_DRAFT_P_MIN"),
    F("--spec-draft-backend-sampling", "ignored", negatives=("--no-spec-draft-backend-sampling",),
      note=SPEC_BACKEND, env="LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING"),
    F("--spec-draft-sampling", "ignored", "{greedy,probabilistic}", note=(
        "the draft model draws with the request's own sampler (argmax at temperature 0); acceptance is "
        "sampler-match, or rejection sampling with MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT=1; output is lossless either way"), env="LLAMA_ARG_SPEC_DRAFT_SAMPLING"),
    F("--spec-draft-device -devd --device-draft", "ignored", "<dev1,dev2,..>", note=SPEC_GPU),
    F("--spec-draft-ngl -ngld --gpu-layers-draft --n-gpu-layers-draft", "ignored", "N", note=SPEC_GPU, env="LLAMA_ARG_N_GPU_LAYERS_DRAFT"),
    F("--spec-draft-model -md --model-draft", "divergent", "FNAME",
      help="the draft model for speculative decoding", dest="draft_model", note=(
        "a draft model sharing the target's vocabulary (GGUF file or model directory). Without --spec-type it "
        "drafts (draft-simple); upstream loads it and never drafts, which only confuses. A DFlash, DSpark or "
        "Muse Glimmer assistant checkpoint directory (recognised by structure) drafts on the DFlash round loop, "
        "a NextN MTP assistant on the MTP round loop, an EAGLE-3 checkpoint directory (either config layout) or "
        "the GGUF llama.cpp converts one to on the EAGLE-3 round loop; with -hfd, the file of that repository "
        "to load"),
      env="LLAMA_ARG_SPEC_DRAFT_MODEL"),
    F("--spec-type", "divergent", "TYPES",
      help="the speculative decoding method", dest="spec_type", note=(
        "none, one drafter, or several n-gram types together (comma-separated: each round asks them in "
        "upstream's order, " + ", ".join(combinable_types()) + ", and the first that drafts serves it): "
        + "; ".join(f"{'/'.join(k.spec_types)}: {k.name}" for k in KINDS if k.spec_types)
        + "; ngram-simple is mlxcel's prompt lookup (suffixes from --spec-ngram-simple-size-n down to 1 token, "
        "a governor pausing rows whose drafts do not pay), the other n-gram types are upstream's; the model-based kinds verify "
        "argmax-against-argmax above temperature 0 unless stochastic acceptance is on, except draft-eagle3, which "
        "verifies with sampler-match (plain sampling's tokens; stochastic acceptance opts into rejection sampling), "
        "and DSpark decodes sampling requests plainly"
        + "".join(f"; {t} is refused ({why})" for t, why in SPEC_TYPE_REFUSED.items())), env="LLAMA_ARG_SPEC_TYPE"),
    F("--spec-ngram-mod-n-min", "supported", "N", dest="spec_ngram_mod_n_min", type="int", default=str(MOD.n_min),
      help="ngram-mod drafts nothing when its chain of lookups breaks before this many tokens"),
    F("--spec-ngram-mod-n-max", "supported", "N", dest="spec_ngram_mod_n_max", type="int", default=str(MOD.n_max),
      help="the most tokens ngram-mod drafts a round (its block)"),
    F("--spec-ngram-mod-n-match", "supported", "N", dest="spec_ngram_mod_n_match", type="int",
      default=str(MOD.n_match), help="the n-gram length ngram-mod's shared table is keyed on"),
    F("--spec-ngram-simple-size-n", "divergent", "N", dest="spec_ngram_simple_size_n", type="int",
      note="longest n-gram prompt lookup matches, shorter ones tried after it down to 1 (default 3, upstream 12)"),
    F("--spec-ngram-simple-size-m", "divergent", "N", dest="spec_ngram_simple_size_m", type="int",
      note=f"prompt lookup's block cap (default {PROMPT_LOOKUP.default_block}, upstream 48: a wide verify forward "
           f"costs more here; blocks start at {BLOCK_START} tokens and double while fully accepted)"),
    F("--spec-ngram-simple-min-hits", "ignored", "N",
      note="every lookup match is proposed (min hits 1); upstream's ngram-simple does not read it either"),
    F("--spec-ngram-map-k-size-n", "supported", "N", dest="spec_ngram_map_k_size_n", type="int",
      default=str(MAP.size_n), help="the key length ngram-map-k looks up"),
    F("--spec-ngram-map-k-size-m", "supported", "N", dest="spec_ngram_map_k_size_m", type="int",
      default=str(MAP.size_m), help="the most tokens ngram-map-k drafts a round (its block)"),
    F("--spec-ngram-map-k-min-hits", "supported", "N", dest="spec_ngram_map_k_min_hits", type="int",
      default=str(MAP.min_hits), help="accepted and checked (>= 1); ngram-map-k does not read it, as upstream's "
                                      "does not (ngram-map-k4v's is --spec-ngram-map-k4v-min-hits)"),
    F("--spec-ngram-map-k4v-size-n", "supported", "N", dest="spec_ngram_map_k4v_size_n", type="int",
      default=str(MAP.size_n), help="the key length ngram-map-k4v looks up"),
    F("--spec-ngram-map-k4v-size-m", "supported", "N", dest="spec_ngram_map_k4v_size_m", type="int",
      default=str(MAP.size_m), help="the length of the values ngram-map-k4v counts, and the most it drafts a round"),
    F("--spec-ngram-map-k4v-min-hits", "supported", "N", dest="spec_ngram_map_k4v_min_hits", type="int",
      default=str(MAP.min_hits), help="ngram-map-k4v drafts from a key once it was looked up this many times"),
    F("--draft --draft-n --draft-max", "refused", "N", note=REMOVED, env="LLAMA_ARG_DRAFT_MAX"),
    F("--draft-min --draft-n-min", "refused", "N", note=REMOVED, env="LLAMA_ARG_DRAFT_MIN"),
    F("--spec-ngram-size-n", "refused", "N", note="removed upstream too; use --spec-ngram-*-size-n"),
    F("--spec-ngram-size-m", "refused", "N", note="removed upstream too; use --spec-ngram-*-size-m"),
    F("--spec-ngram-min-hits", "refused", "N", note="removed upstream too; use --spec-ngram-*-min-hits"),
]

SERVER: list[Flag] = [
    F("-lcs --lookup-cache-static", "supported", "FNAME", dest="lookup_cache_static",
      help="ngram-cache's static cache (llama.cpp's lookup-cache file format), read at startup, never written; "
           "validates and weighs its drafts and drafts alone when the others do not"),
    F("-lcd --lookup-cache-dynamic", "supported", "FNAME", dest="lookup_cache_dynamic",
      help="ngram-cache's dynamic cache (llama.cpp's lookup-cache file format), read at startup and shared by the "
           "slots; as in upstream's server it is not written back (each slot's own cache, which outlives its "
           "requests, holds what the server generates)"),
    F("--kv-unified-per-slot", "ignored", "N", note="no per-slot limit: -c is the budget (shared by the slots with "
      "-kvu, split among them by -np without it)", env="LLAMA_ARG_KV_UNIFIED_PER_SLOT"),
    F("-ctxcp --ctx-checkpoints --swa-checkpoints", "ignored", "N", note=BACKEND, env="LLAMA_ARG_CTX_CHECKPOINTS"),
    F("-cms --checkpoint-min-step", "ignored", "N", note=BACKEND, env="LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT"),
    F("-cram --cache-ram", "ignored", "N", note="prompt caching is per slot, in the slot's own KV cache", env="LLAMA_ARG_CACHE_RAM"),
    F("-kvu --kv-unified", "supported", negatives=("-no-kvu", "--no-kv-unified"), dest="kv_unified",
      note="every slot may use the whole -c (default: on when -np is auto); off: each slot gets -c / -np",
      env="LLAMA_ARG_KV_UNIFIED"),
    F("--cache-idle-slots", "ignored", negatives=("--no-cache-idle-slots",), note="idle slots keep their cached prompts until the -kvu budget needs the room (then dropped, as upstream "
      "clears them); there is no separate prompt cache (-cram) to save them to", env="LLAMA_ARG_CACHE_IDLE_SLOTS"),
    F("--context-shift", "divergent", negatives=("--no-context-shift",), dest="context_shift",
      note="a full context drops n_discard tokens after n_keep and goes on, as upstream; the rest is re-evaluated "
           "rather than its keys re-rotated", env="LLAMA_ARG_CONTEXT_SHIFT"),
    F("-r --reverse-prompt", "ignored", "PROMPT", note="interactive-mode option; use the request's stop field"),
    F("-sp --special", "ignored", note="special tokens are rendered as the tokenizer decodes them"),
    F("--warmup", "ignored", negatives=("--no-warmup",), note="no warm-up run is needed"),
    F("--spm-infill", "supported", dest="spm_infill",
      note="/infill lays the suffix part before the prefix part (Suffix/Prefix/Middle)"),
    F("--pooling", "supported", "{none,mean,cls,last,rank}",
      help="how an embedding is pooled from the tokens' hidden states", dest="pooling",
      note="over the final-norm hidden states; default the model's own (GGUF pooling_type, sentence-transformers "
           "config), else none", env="LLAMA_ARG_POOLING"),
    F("-np --parallel", "supported", "N",
      help="slots: how many requests are decoded together",
      dest="parallel", type="int", note="-1 (auto) = 4 slots", env="LLAMA_ARG_N_PARALLEL"),
    F("-cb --cont-batching", "ignored", negatives=("-nocb", "--no-cont-batching"),
      note="continuous batching is always on", env="LLAMA_ARG_CONT_BATCHING"),
    F("-mm --mmproj", "supported", "FILE", dest="mmproj",
      help="path to a multimodal projector file (images in requests); with -hf it can be omitted",
      note=f"{PROJECTORS}; any other projector type is refused by name; needs the vision extra "
           "(pip install 'mlxcel[vision]')", env="LLAMA_ARG_MMPROJ"),
    F("-mmu --mmproj-url", "refused", "URL", note="downloading a projector from a URL is not supported; use -mm with a "
      "local file, or -hf (which fetches the repository's projector)", env="LLAMA_ARG_MMPROJ_URL"),
    F("--mmproj-auto", "supported", negatives=("--no-mmproj", "--no-mmproj-auto"), dest="mmproj_auto",
      help="use the model's multimodal projector when there is one: -hf's mmproj file, or an MLX vision "
           "checkpoint's own tower", note="without it the model is served as a text model unless -mm names a projector",
      env="LLAMA_ARG_MMPROJ_AUTO"),
    F("--mmproj-offload", "ignored", negatives=("--no-mmproj-offload",), note=GPU, env="LLAMA_ARG_MMPROJ_OFFLOAD"),
    F("-mmdev --mmproj-device", "ignored", "DEVICE", note=GPU, env="MTMD_BACKEND_DEVICE"),
    F("--image-min-tokens", "supported", "N", dest="image_min_tokens", type="int",
      help="minimum number of tokens each image can take (dynamic-resolution towers; default: the model's)",
      note="Qwen2.5-VL; Gemma 3's images are a fixed 256 tokens", env="LLAMA_ARG_IMAGE_MIN_TOKENS"),
    F("--image-max-tokens", "supported", "N", dest="image_max_tokens", type="int",
      help="maximum number of tokens each image can take (dynamic-resolution towers; default: the model's)",
      note="Qwen2.5-VL; Gemma 3's images are a fixed 256 tokens", env="LLAMA_ARG_IMAGE_MAX_TOKENS"),
    F("--mtmd-batch-max-tokens", "ignored", "N", note="an image is encoded whole, in one tower forward",
      env="LLAMA_ARG_MTMD_BATCH_MAX_TOKENS"),
    F("--video-fps", "ignored", "N", note=MEDIA, env="LLAMA_ARG_VIDEO_FPS"),
    F("--video-timestamp-interval", "ignored", "N", note=MEDIA, env="LLAMA_ARG_VIDEO_TIMESTAMP_INTERVAL"),
    F("--video-ffmpeg-dir", "ignored", "DIR", note=MEDIA, env="LLAMA_ARG_VIDEO_FFMPEG_DIR"),
    F("-a --alias", "supported", "STRING",
      help="the model's names in the API, comma-separated", dest="alias", env="LLAMA_ARG_ALIAS"),
    F("--tags", "supported", "STRING",
      help="tags the model list shows, comma-separated (informational)", dest="tags", env="LLAMA_ARG_TAGS"),
    F("--embd-normalize", "supported", "N",
      help="how embeddings are normalised", dest="embd_normalize", type="int",
      note="-1 none, 0 max-absolute (int16 range), 1 taxicab, 2 euclidean (default), p > 2 p-norm"),
    F("--host", "supported", "HOST",
      help="where to listen",
      dest="host", note="addresses, comma-separated (IPv4 and IPv6; :: binds IPv6 only), or a UNIX socket path ending in .sock",
      env="LLAMA_ARG_HOST"),
    F("--port", "supported", "PORT",
      help="TCP port to listen on", dest="port", type="int", env="LLAMA_ARG_PORT"),
    F("--reuse-port", "ignored", note="uvicorn binds one socket", env="LLAMA_ARG_REUSE_PORT"),
    F("--path", "supported", "PATH", dest="static_path",
      note="serve this directory's files at / (GET) instead of the built-in page; API routes come first",
      env="LLAMA_ARG_STATIC_PATH"),
    F("--cors-origins", "supported", "ORIGINS",
      help="origins that browsers may call the server from, comma-separated", dest="cors_origins",
      note="default * (localhost with --tools); with --cors-credentials (default) * echoes the request's Origin, as upstream", env="LLAMA_ARG_CORS_ORIGINS"),
    F("--cors-methods", "supported", "METHODS",
      help="the methods CORS allows", dest="cors_methods", env="LLAMA_ARG_CORS_METHODS"),
    F("--cors-headers", "supported", "HEADERS",
      help="the request headers CORS allows", dest="cors_headers", env="LLAMA_ARG_CORS_HEADERS"),
    F("--cors-credentials", "supported",
      help="whether CORS lets browsers send credentials (cookies, Authorization)",
      negatives=("--no-cors-credentials",), dest="cors_credentials", env="LLAMA_ARG_CORS_CREDENTIALS"),
    F("--api-prefix", "supported", "PREFIX",
      help="a path prefix for every route (e.g. /llm makes /llm/v1/chat/completions)",
      dest="api_prefix", env="LLAMA_ARG_API_PREFIX"),
    F("--ui-config --webui-config", "ignored", "JSON", note=UI, env="LLAMA_ARG_UI_CONFIG"),
    F("--ui-config-file --webui-config-file", "ignored", "PATH", note=UI, env="LLAMA_ARG_UI_CONFIG_FILE"),
    F("--ui-mcp-proxy --webui-mcp-proxy", "supported", negatives=("--no-ui-mcp-proxy", "--no-webui-mcp-proxy"),
      dest="ui_mcp_proxy", note="the web UI's CORS proxy for MCP servers on /cors-proxy (experimental, off by default: "
                                "403 feature_disabled)", env="LLAMA_ARG_UI_MCP_PROXY"),
    F("--tools", "supported", "TOOL1,TOOL2,...", dest="tools",
      note="the web UI's built-in tools on /tools (read_file, file_glob_search, grep_search, exec_shell_command, "
           "write_file, edit_file, get_info, or all; experimental, off by default: 403 feature_disabled); as upstream, "
           "giving them makes the default --cors-origins localhost", env="LLAMA_ARG_TOOLS"),
    F("--tools-runtime", "supported", "OPTION", dest="tools_runtime",
      note="where tools run: docker:<image> / podman:<image> (a container spawned and owned by the server), "
           "docker-container:<id> / podman-container:<id>, ssh:<target>; default the host", env="LLAMA_ARG_TOOLS_RUNTIME"),
    F("--mcp-servers-config", "supported", "PATH", dest="mcp_servers_config",
      note="a JSON file of MCP servers (Cursor's mcpServers format) whose tools /tools serves", env="LLAMA_ARG_MCP_SERVERS_CONFIG"),
    F("--mcp-servers-json", "supported", "JSON", dest="mcp_servers_json",
      note="MCP servers inline (Cursor's mcpServers format)", env="LLAMA_ARG_MCP_SERVERS_JSON"),
    F("-ag --agent", "supported", negatives=("-no-ag", "--no-agent"), dest="agent",
      note="all built-in tools and the CORS proxy on (--no-agent: both off)", env="LLAMA_ARG_AGENT"),
    F("--ui --webui", "supported", negatives=("--no-ui", "--no-webui"), dest="ui",
      note="the built-in chat page at / (default on; --no-ui: / is 404)", env="LLAMA_ARG_UI"),
    F("--embedding --embeddings", "supported",
      help="serve the embedding routes", dest="embeddings",
      note="/embedding, /embeddings, /v1/embeddings over the loaded decoder's hidden states (completions keep "
           "working) or a BERT-family GGUF encoder's (bert, nomic-bert, jina-bert-v2: needs this flag or --reranking, "
           "completions are 501); other encoder architectures are refused", env="LLAMA_ARG_EMBEDDINGS"),
    F("--rerank --reranking", "supported",
      help="serve the rerank routes", dest="reranking",
      note="/rerank and aliases; scored by the model's rank head (GGUF cls.* tensors, or a Qwen3-Reranker "
           "directory), or without one by the first component of the last token's hidden state (an encoder's: the "
           "first token's), as upstream (with a warning)",
      env="LLAMA_ARG_RERANKING"),
    F("--api-key", "supported", "KEY",
      help="API keys clients must send (Authorization: Bearer KEY or X-Api-Key), comma-separated",
      dest="api_key", env="LLAMA_API_KEY"),
    F("--api-key-file", "supported", "FNAME",
      help="a file of API keys, one per line ('#' starts a comment line)",
      dest="api_key_file", env="LLAMA_ARG_API_KEY_FILE"),
    F("--ssl-key-file", "supported", "FNAME",
      help="PEM private key: serve HTTPS", dest="ssl_key_file", env="LLAMA_ARG_SSL_KEY_FILE"),
    F("--ssl-cert-file", "supported", "FNAME",
      help="PEM certificate: serve HTTPS", dest="ssl_cert_file", env="LLAMA_ARG_SSL_CERT_FILE"),
    F("--chat-template-kwargs", "supported", "STRING",
      help="extra variables for the chat template, as a JSON object",
      dest="chat_template_kwargs", env="LLAMA_ARG_CHAT_TEMPLATE_KWARGS"),
    F("-to --timeout", "divergent", "N", dest="timeout", type="int",
      note="the most seconds one request may run (queue wait, prefill and generation); past it the request "
           "ends with a 503 error (body or stream event) and its slot is freed; also the read timeout of "
           "request bodies (408)", env="LLAMA_ARG_TIMEOUT"),
    F("--sse-ping-interval", "ignored", "N", note="no server-wide default: a stream gets SSE comment pings only when "
      "its request sets sse_ping_interval (upstream pings every 30 s by default)", env="LLAMA_ARG_SSE_PING_INTERVAL"),
    F("--threads-http", "ignored", "N", note="requests are served by one asyncio event loop", env="LLAMA_ARG_THREADS_HTTP"),
    F("--cache-prompt", "supported",
      help="reuse the part of a slot's cache that the next prompt shares",
      negatives=("--no-cache-prompt",), dest="cache_prompt", env="LLAMA_ARG_CACHE_PROMPT"),
    F("--cache-reuse", "ignored", "N", note="only the common prefix is reused (no KV shifting)", env="LLAMA_ARG_CACHE_REUSE"),
    F("--metrics", "supported",
      help="serve Prometheus metrics at /metrics", dest="metrics", env="LLAMA_ARG_ENDPOINT_METRICS"),
    F("--props", "supported",
      help="allow POST /props",
      dest="props", note="it is accepted and changes nothing", env="LLAMA_ARG_ENDPOINT_PROPS"),
    F("--slots", "supported",
      help="serve the slots' state at /slots", negatives=("--no-slots",), dest="slots", env="LLAMA_ARG_ENDPOINT_SLOTS"),
    F("--slot-save-path", "supported", "PATH",
      help="the directory slots are saved to and restored from", dest="slot_save_path",
      note="POST /slots/:id?action=save|restore|erase; the KV cache and tokens in a safetensors file (MLX's own "
           "I/O), not upstream's binary state format"),
    F("--media-path", "supported", "PATH", dest="media_path",
      help="directory for loading local media files; files can be accessed via file:// URLs using relative paths",
      note="file:// image URLs are read under it (relative paths only); remote http(s) image URLs are refused, "
           "where upstream fetches them"),
    F("--models-dir", "supported", "PATH", dest="models_dir", note="router mode: a directory of models (GGUF files, "
      "directories of GGUF files, MLX checkpoints)", env="LLAMA_ARG_MODELS_DIR"),
    F("--models-preset", "supported", "PATH", dest="models_preset", note="router mode: an INI file of models and their "
      "settings", env="LLAMA_ARG_MODELS_PRESET"),
    F("--models-max", "supported", "N", dest="models_max", type="int", note="router mode: most models loaded at once "
      "(default 4, 0 = unlimited); the least recently used idle one makes room", env="LLAMA_ARG_MODELS_MAX"),
    F("--models-autoload", "supported", negatives=("--no-models-autoload",), dest="models_autoload",
      note="router mode: load a model when a request names it (default on)", env="LLAMA_ARG_MODELS_AUTOLOAD"),
    F("--jinja", "supported",
      help="render chat templates with Jinja", negatives=("--no-jinja",), dest="jinja",
      note="--no-jinja renders upstream's built-in formats (named, or detected from the template), as upstream",
      env="LLAMA_ARG_JINJA"),
    F("--reasoning-format", "supported", "FORMAT",
      help="where a reply's thinking goes", dest="reasoning_format",
      note="none keeps thinking in the content; auto/deepseek (and deepseek-legacy, as this build treats it) "
           "put it in reasoning_content, with the template's own think tags", env="LLAMA_ARG_THINK"),
    F("-rea --reasoning", "supported", "[on|off|auto]",
      help="whether the model thinks", dest="reasoning", optional_value=True,
      note="on/off set the template variable enable_thinking to true/false, as upstream; auto leaves the template's "
           "default", env="LLAMA_ARG_REASONING"),
    F("--reasoning-effort", "supported", "LEVEL", dest="reasoning_effort",
      note="the template variable reasoning_effort ('default' leaves it unset), as upstream", env="LLAMA_ARG_REASONING_EFFORT"),
    F("--reasoning-budget", "supported", "N", dest="reasoning_budget", type="int",
      note="the end-of-thinking tag is forced after N thinking tokens (-1: no limit), exactly under speculation",
      env="LLAMA_ARG_THINK_BUDGET"),
    F("--reasoning-budget-message", "supported", "MESSAGE",
      help="text inserted before the forced end-of-thinking tag when the budget runs out",
      dest="reasoning_budget_message",
      env="LLAMA_ARG_THINK_BUDGET_MESSAGE"),
    F("--reasoning-preserve", "ignored", negatives=("--no-reasoning-preserve",), env="LLAMA_ARG_REASONING_PRESERVE",
      note="the template variables upstream sets from it (preserve_thinking, clear_thinking, "
           "truncate_history_thinking, drop_thinking; preserving by default) are not set: each template keeps or "
           "drops earlier turns' reasoning_content by its own default"),
    F("--chat-template", "supported", "JINJA_TEMPLATE",
      help="the chat template to use instead of the model's", dest="chat_template",
      note="as upstream: Jinja source (or 'chatml'); with --no-jinja a built-in format's name", env="LLAMA_ARG_CHAT_TEMPLATE"),
    F("--chat-template-file", "supported", "JINJA_TEMPLATE_FILE",
      help="--chat-template, read from a file", dest="chat_template_file", env="LLAMA_ARG_CHAT_TEMPLATE_FILE"),
    F("--skip-chat-parsing", "refused", negatives=("--no-skip-chat-parsing",), env="LLAMA_ARG_SKIP_CHAT_PARSING",
      note="replies are always parsed: tool calls into tool_calls and thinking into reasoning_content (--reasoning-format "
           "none keeps the thinking in the content); there is no content-only parser"),
    F("--prefill-assistant", "ignored", negatives=("--no-prefill-assistant",), env="LLAMA_ARG_PREFILL_ASSISTANT",
      note="a final assistant message is always continued, as upstream's default; --no-prefill-assistant is not "
           "honoured (a request sends continue_final_message: false for that)"),
    F("-sps --slot-prompt-similarity", "supported", "SIMILARITY",
      help="how much of a slot's cached prompt a new prompt must share to be given that slot (0.0: off)",
      dest="slot_prompt_similarity", type="float"),
    F("--lora-init-without-apply", "divergent", dest="lora_init_without_apply",
      help="load LoRA adapters without applying them (apply later via POST /lora-adapters)",
      note="as upstream documents it: every adapter's global scale starts at 0 (GET /lora-adapters shows 0); "
           "upstream's server of this build still applies them at their --lora scales"),
    F("--sleep-idle-seconds", "supported", "SECONDS", dest="sleep_idle_seconds", type="int",
      note="unload the model after SECONDS without a request that uses it, reload it on the next one (-1: never)"),
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

# upstream's --help sections, in its order
SECTIONS: tuple[tuple[str, list[Flag]], ...] = (("common params", COMMON), ("sampling params", SAMPLING),
                                              ("speculative params", SPECULATIVE),
                                              ("example-specific params", SERVER))
FLAGS: list[Flag] = [flag for _, flags in SECTIONS for flag in flags]
