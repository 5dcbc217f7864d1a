"""Recognising a separate NextN MTP assistant checkpoint from its config.json alone (no MLX, no
weights), so the command line can be checked before anything heavy loads."""

from __future__ import annotations

NEXTN_ARCHITECTURE_SUFFIX = "ForCausalLMNextN"


def is_assistant_checkpoint(config: dict) -> bool:
    """A NextN export: an MTP-only checkpoint bound to a separate target."""
    return any(str(a).endswith(NEXTN_ARCHITECTURE_SUFFIX) for a in config.get("architectures") or [])
