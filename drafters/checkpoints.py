"""Recognise drafter-only checkpoints (DFlash, DSpark, Muse Glimmer assistant) by structure.

Such a checkpoint has no embeddings or LM head of its own (it borrows the target's), so it is
never a standalone model. The test is structural, on config.json, never on a resolved kind name.
"""

from __future__ import annotations

from mlxcel.drafters.mtp.checkpoint import is_assistant_checkpoint

DFLASH_ARCHITECTURES = {"DFlashDraftModel": "dflash", "Lfm2DSparkDraftModel": "dspark"}
MUSE_MODEL_TYPE = "muse_glimmer_assistant"
MUSE_ARCHITECTURE = "MuseGlimmerAssistantModel"


def drafter_structure(config: dict) -> str | None:
    """The drafter family a config.json describes ("dflash", "dspark", "muse-glimmer", "mtp" for
    an MTP assistant), or None for an ordinary model."""
    architectures = config.get("architectures") or []
    if config.get("model_type") == MUSE_MODEL_TYPE or MUSE_ARCHITECTURE in architectures:
        return "muse-glimmer"
    for arch, kind in DFLASH_ARCHITECTURES.items():
        if arch in architectures:
            return kind
    if "dflash_config" in config:
        return "dflash"
    if is_assistant_checkpoint(config):  # a NextN MTP export (drafters/mtp/checkpoint.py)
        return "mtp"
    return None
