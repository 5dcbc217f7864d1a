"""Which of upstream's server test files cover features mlxcel-server does not have, and why.

``plugin.py`` skips their tests with that reason (so a run spends no time on them and the results
file says why each was not run); ``report.py`` keeps them out of the in-scope figure. Every other
file is in scope: each of its tests that passes against llama-server on the same model should pass
against mlxcel-server. Planned features name the issue that brings them.
"""

from __future__ import annotations

OUT_OF_SCOPE = {
    "unit/test_rerank.py": (
        "not applicable on the conformance model: SmolLM2 has no rank head, and mlxcel refuses --reranking for a "
        "model without one (llama-server scores the first component of its hidden state); rerank is tested on a "
        "tiny GGUF with a known head (tests/server/http/test_embeddings.py)"),
    "unit/test_infill.py": (
        "not applicable on the conformance model: SmolLM2 has no FIM tokens, so llama-server answers 501 as mlxcel "
        "does; /infill is tested on a tiny checkpoint with FIM tokens (tests/server/http/test_infill.py)"),
    "unit/test_lora.py": "not applicable: LoRA adapters are refused (--lora)",
    "unit/test_vision_api.py": "not applicable: text models only (multimodal input is refused)",
    "unit/test_mcp_servers.py": "not applicable: the web UI's MCP servers (--mcp-servers-* ignored)",
    "unit/test_tools_builtin.py": "not applicable: the web UI's built-in tools (/tools answers 403)",
    "unit/test_proxy.py": "not applicable: the web UI's CORS proxy (/cors-proxy answers 403)",
    "unit/test_router.py": "not applicable: router mode (one server, several models)",
    "unit/test_sleep.py": "not applicable: unloading the model when idle (--sleep-idle-seconds ignored)",
    "unit/test_systemone.py": "not applicable: upstream's SystemOne task API answers 501",
}


# Single tests of in-scope files, by the start of their id.
OUT_OF_SCOPE_TESTS = {
    "unit/test_kv_keep_only_active.py::test_clear_and_restore": (
        "not applicable: reads upstream's internal debug log tags (__TEST_TAG_*) of its host-memory prompt "
        "cache (--cache-ram)"),
    "unit/test_security.py::test_cors_proxy_": "not applicable: the web UI's CORS proxy (/cors-proxy answers 403)",
    "unit/test_compat_anthropic.py::test_anthropic_empty_messages": (
        "deliberate: an empty messages array is a 400, as Anthropic's API and the chat route refuse it "
        "(upstream answers 200)"),
    **{f"unit/test_compat_anthropic.py::{name}": "not applicable: text models only (an image block is a 400; "
       "upstream answers 500)" for name in ("test_anthropic_tool_result_with_image",
                                          "test_anthropic_vision_format_accepted",
                                          "test_anthropic_vision_base64_with_multimodal_model")},
    "unit/test_compat_oai_responses.py::test_responses_stream_with_llama_telemetry": (
        "deliberate: a response cut by max_output_tokens ends with response.incomplete, as the official API "
        "(upstream sends response.completed); the telemetry it checks is there"),
}


def reason(test_id: str) -> str | None:
    """Why ``unit/test_x.py::test_y[...]`` is out of scope, or None."""
    if test_id.split("::")[0] in OUT_OF_SCOPE:
        return OUT_OF_SCOPE[test_id.split("::")[0]]
    return next((why for start, why in OUT_OF_SCOPE_TESTS.items() if test_id.startswith(start)), None)
