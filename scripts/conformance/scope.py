"""Which of upstream's server test files cover features mlxcel-server does not have, and why.

``plugin.py`` skips their tests with that reason (so a run spends no time on them and the results
file says why each was not run); ``report.py`` keeps them out of the in-scope figure. Every other
file is in scope: each of its tests that passes against llama-server on the same model should pass
against mlxcel-server. Planned features name the issue that brings them.
"""

from __future__ import annotations

OUT_OF_SCOPE = {
    "unit/test_compat_anthropic.py": "planned (issue 14): the Anthropic Messages API answers 501",
    "unit/test_compat_oai_responses.py": "planned (issue 14): the OpenAI Responses API answers 501",
    "unit/test_embedding.py": "planned (issue 14): embeddings answer 501",
    "unit/test_rerank.py": "planned (issue 14): reranking answers 501",
    "unit/test_infill.py": "planned (issue 14): fill-in-the-middle answers 501",
    "unit/test_slot_save.py": "planned (issue 14): slot save/restore answers 501",
    "unit/test_lora.py": "not applicable: LoRA adapters are refused (--lora)",
    "unit/test_systemone.py": "not applicable: upstream's SystemOne task API answers 501",
}


GRAMMAR = "planned (issue 13): grammar-constrained generation (grammar / json_schema) is refused with 400"

# Single tests of in-scope files, by the start of their id.
OUT_OF_SCOPE_TESTS = {
    'unit/test_chat_completion.py::test_completion_with_grammar[': GRAMMAR,
    'unit/test_chat_completion.py::test_completion_with_json_schema[': GRAMMAR,
    **{f"unit/test_chat_completion.py::test_completion_with_response_format[response_format{i}-": GRAMMAR
       for i in range(4)},  # the valid schemas; the invalid ones (4-7) are refused as upstream refuses them
    "unit/test_kv_keep_only_active.py::test_clear_and_restore": (
        "not applicable: reads upstream's internal debug log tags (__TEST_TAG_*) of its host-memory prompt "
        "cache (--cache-ram)"),
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
    "unit/test_sleep.py::test_server_sleep_token_counting_wake": (
        "planned (issue 14): also counts tokens through /v1/responses/input_tokens and /v1/messages/count_tokens, "
        "which answer 501 until the Responses and Anthropic APIs land"),
})


def reason(test_id: str) -> str | None:
    """Why ``unit/test_x.py::test_y[...]`` is out of scope, or None."""
    if test_id.split("::")[0] in OUT_OF_SCOPE:
        return OUT_OF_SCOPE[test_id.split("::")[0]]
    return next((why for start, why in OUT_OF_SCOPE_TESTS.items() if test_id.startswith(start)), None)
