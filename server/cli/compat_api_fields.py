"""The request fields of the two APIs translated into chat requests (the OpenAI Responses API on
``/v1/responses``, the Anthropic Messages API on ``/v1/messages``): what mlxcel does with each,
against upstream's conversion (``server-chat.cpp``) and the official API. Written to
``api_fields.json`` by ``compat_record``; states as there."""

from __future__ import annotations

CHAT_FIELDS = "every /v1/chat/completions field"

# (api, field, state, note)
API_FIELDS: list[tuple[str, str, str, str]] = [
    ("responses", "input", "supported", "a string, or items: messages (string content, input_text / output_text / "
     "refusal parts), function_call, function_call_output, reasoning; consecutive assistant items are one turn; "
     "input_image parts (image_url: a data: URL, as on chat, with a vision tower); input_file parts and other "
     "item types are refused with 400"),
    ("responses", "instructions", "supported", "a system message first; not carried over by previous_response_id, "
     "as the official API"),
    ("responses", "previous_response_id", "divergent", "continues the stored response's conversation (upstream "
     "refuses it with 400); an unknown or unstored id is 404"),
    ("responses", "store", "divergent", "default true: the response is kept in memory (the last 1024) for "
     "previous_response_id and GET /v1/responses/{id}; upstream stores nothing"),
    ("responses", "background", "divergent", "the response runs detached and the answer is the queued response; "
     "poll GET, stop it with POST .../cancel; with stream, 400 (not replayed); upstream ignores it"),
    ("responses", "tools", "divergent", "function tools; other tool types (web_search, file_search, mcp...) are "
     "left out with a log line, as upstream"),
    ("responses", "tool_choice", "supported", "auto, none, required, {type: function, name}, allowed_tools (narrows "
     "the tools); built-in tool choices are 400"),
    ("responses", "parallel_tool_calls", "supported", "false keeps the first call"),
    ("responses", "max_output_tokens", "supported", "max_tokens; a response it cuts short is status incomplete, "
     "incomplete_details.reason max_output_tokens, its stream ending in response.incomplete (upstream: completed)"),
    ("responses", "max_tool_calls", "supported", "function calls past it are left out"),
    ("responses", "temperature", "supported", ""),
    ("responses", "top_p", "supported", ""),
    ("responses", "reasoning", "divergent", "effort becomes reasoning_effort (the template reads it; none turns "
     "thinking off), as upstream; summary is ignored: reasoning comes as reasoning_text content, summary []"),
    ("responses", "include", "supported", "reasoning.encrypted_content: the reasoning, base64, in the item's "
     "encrypted_content (not encrypted), accepted back in input; other values are 400"),
    ("responses", "text", "supported", "format text / json_object / json_schema becomes response_format (as on "
     "chat); verbosity is ignored"),
    ("responses", "metadata", "supported", "echoed"),
    ("responses", "stream", "supported", "response.* events with sequence_number; timings on the final event and "
     "with timings_per_token, prompt_progress on response.in_progress with return_progress, as upstream"),
    ("responses", "truncation", "refused", "400 unless disabled (a prompt over the context is refused)"),
    ("responses", "top_logprobs", "refused", "400 unless 0: no log probabilities on this route yet"),
    ("responses", "conversation", "refused", "400: no Conversations API (previous_response_id works)"),
    ("responses", "prompt", "refused", "400: no stored prompt templates"),
    ("responses", "model", "ignored", "the loaded model answers, as upstream"),
    ("responses", "user", "ignored", "echoed, no effect"),
    ("responses", "safety_identifier", "ignored", "no effect"),
    ("responses", "prompt_cache_key", "ignored", "no effect: the prompt prefix is reused automatically"),
    ("responses", "prompt_cache_retention", "ignored", "no effect"),
    ("responses", "service_tier", "ignored", "echoed as default"),
    ("responses", "stream_options", "ignored", "include_obfuscation has no meaning here"),
    ("responses", "n", "refused", "400 unless 1: a response has one output"),
    ("responses", CHAT_FIELDS, "supported", "goes through to the chat request (top_k, seed, logit_bias, "
     "timings_per_token...), as upstream"),
    ("messages", "messages", "divergent", "text, thinking, tool_use and tool_result blocks, in order (upstream puts "
     "a message's text before its tool results); at least one message (upstream accepts none); image blocks "
     "(base64 or url source) become image_url parts, as upstream (images with a vision tower); document blocks "
     "are 400 (upstream 500), redacted_thinking is left out"),
    ("messages", "system", "supported", "a string or text blocks, joined with a blank line (upstream joins them "
     "with nothing); the cch= stamp of a billing-header prompt is masked, as upstream"),
    ("messages", "max_tokens", "divergent", "required, as Anthropic's API (upstream defaults it to 4096)"),
    ("messages", "stop_sequences", "divergent", "stop strings; the one that matched gives stop_reason "
     "stop_sequence and stop_sequence (upstream: end_turn)"),
    ("messages", "stream", "supported", "message_start, ping, content_block_start / _delta / _stop per block (each "
     "closed before the next opens), message_delta with the usage, message_stop; errors as an error event"),
    ("messages", "temperature", "supported", ""),
    ("messages", "top_p", "supported", ""),
    ("messages", "top_k", "supported", ""),
    ("messages", "tools", "supported", "name, description, input_schema become a function tool"),
    ("messages", "tool_choice", "divergent", "auto; any is required; tool names the function (upstream: "
     "required); none and disable_parallel_tool_use are honoured (upstream ignores them)"),
    ("messages", "thinking", "divergent", "enabled sets the thinking budget (budget_tokens, default 10000, as "
     "upstream) and the template's enable_thinking; disabled clears enable_thinking (upstream ignores it)"),
    ("messages", "output_format", "supported", "json_schema becomes response_format (as on chat)"),
    ("messages", "metadata", "ignored", "user_id has no effect, as upstream"),
    ("messages", "service_tier", "ignored", "no effect"),
    ("messages", "model", "ignored", "the loaded model answers, as upstream"),
    ("messages", "mcp_servers", "refused", "400: no server-side tools"),
    ("messages", "container", "refused", "400: no server-side tools"),
    ("messages", "context_management", "ignored", "no server-side context editing: the conversation is rendered "
     "as sent"),
    ("messages", "chat_template_kwargs", "supported", "as upstream"),
    ("messages", CHAT_FIELDS, "divergent", "goes through to the chat request (seed, logit_bias...); upstream keeps "
     "only temperature, top_p, top_k, stream and chat_template_kwargs"),
]
