"""Recognising a separate MTP assistant checkpoint from its config.json alone (no MLX, no weights),
so the command line can be checked before anything heavy loads: SGLang's NextN export of a
DeepSeek-style MTP layer, and Google's Gemma 4 MTP assistant (``gemma4_assistant``)."""

from __future__ import annotations

NEXTN_ARCHITECTURE_SUFFIX = "ForCausalLMNextN"
GEMMA4_ASSISTANT_MODEL_TYPE = "gemma4_assistant"
GEMMA4_ASSISTANT_ARCHITECTURE = "Gemma4AssistantForCausalLM"


def is_gemma4_assistant(config: dict) -> bool:
    """Gemma 4's MTP assistant: a small Gemma 4 text stack with no K/V projections of its own (it
    attends to the target's cache), fed the target's last hidden state."""
    return (config.get("model_type") == GEMMA4_ASSISTANT_MODEL_TYPE
            or GEMMA4_ASSISTANT_ARCHITECTURE in (config.get("architectures") or []))


def is_assistant_checkpoint(config: dict) -> bool:
    """An MTP-only checkpoint bound to a separate target: a NextN export or a Gemma 4 assistant."""
    return is_gemma4_assistant(config) or any(
        str(a).endswith(NEXTN_ARCHITECTURE_SUFFIX) for a in config.get("architectures") or [])
