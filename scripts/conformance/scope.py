"""Which of upstream's server test files cover features mlxcel-server does not have, and why.

``plugin.py`` skips their tests with that reason (so a run spends no time on them and the results
file says why each was not run); ``report.py`` keeps them out of the in-scope figure. Every other
file is in scope: each of its tests that passes against llama-server on the same model should pass
against mlxcel-server. Planned features name the issue that brings them.
"""

from __future__ import annotations

OUT_OF_SCOPE = {
    "unit/test_infill.py": (
        "not applicable on the conformance model: SmolLM2 has no FIM tokens, so llama-server answers 501 as mlxcel "
        "does; /infill is tested on a tiny checkpoint with FIM tokens (tests/server/http/test_infill.py)"),
    "unit/test_lora.py": (
        "not applicable: the adapter is for stories15M-MoE (expert tensors), not the conformance model; LoRA is "
        "tested on tiny checkpoints (tests/server/http/test_lora_server.py)"),
    "unit/test_systemone.py": "not applicable: upstream's SystemOne task API answers 501",
}


# Single tests of in-scope files, by the start of their id.
OUT_OF_SCOPE_TESTS = {
    "unit/test_kv_keep_only_active.py::test_clear_and_restore": (
        "not applicable: reads upstream's internal debug log tags (__TEST_TAG_*) of its host-memory prompt "
        "cache (--cache-ram)"),
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


VISION = ("not applicable: needs a vision model with its projector (the test's tinygemma3 reads the image); "
          "mlxcel-server serves text models and refuses image input, which the test's error cases check")
_V = "unit/test_vision_api.py::"
OUT_OF_SCOPE_TESTS.update({
    f"{_V}test_models_supports_multimodal_capability": VISION,
    f"{_V}test_v1_models_supports_multimodal_capability": VISION,
    f"{_V}test_vision_chat_completion_token_count": VISION,
    f"{_V}test_vision_embeddings_oai_content": VISION,
    **{f"{_V}test_vision_chat_completion[{prompt}\\n-{image}-True-": VISION
       for prompt, image in (("What is this:", "IMG_URL_0"), ("What is this:", "IMG_BASE64_URI_0"),
                             ("What is this:", "IMG_URL_1"), ("Test test", "IMG_URL_1"))},
    **{f"{_V}test_vision_completion[What is this: <__media__>\\n-{image}-True-": VISION
       for image in ("IMG_BASE64_0", "IMG_BASE64_1")},
    **{f"{_V}test_vision_embeddings[What is this: <__media__>\\n-{image}-True]": VISION
       for image in ("IMG_BASE64_0", "IMG_BASE64_1")},
    "unit/test_router.py::test_router_delete_model": (
        "not applicable: mlxcel-server does not download models (POST /models answers 501); upstream passes this "
        "test offline only because its download of a model it cannot reach reports download_finished"),
})


def reason(test_id: str) -> str | None:
    """Why ``unit/test_x.py::test_y[...]`` is out of scope, or None."""
    if test_id.split("::")[0] in OUT_OF_SCOPE:
        return OUT_OF_SCOPE[test_id.split("::")[0]]
    return next((why for start, why in OUT_OF_SCOPE_TESTS.items() if test_id.startswith(start)), None)
