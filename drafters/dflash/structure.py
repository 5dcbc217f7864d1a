"""Recognising a DFlash-family drafter checkpoint from its config.json alone (no MLX, no weights),
so the command line can be checked before anything heavy loads."""

from __future__ import annotations

DFLASH_ARCHITECTURES = {"DFlashDraftModel": "dflash", "Lfm2DSparkDraftModel": "dspark"}
MUSE_MODEL_TYPE = "muse_glimmer_assistant"
MUSE_ARCHITECTURE = "MuseGlimmerAssistantModel"


def dflash_family(config: dict) -> str | None:
    """Which DFlash-family drafter a config.json describes, by structure: "dflash" (a
    ``dflash_config`` block or ``DFlashDraftModel``), "dspark" (``Lfm2DSparkDraftModel``),
    "muse-glimmer" (model type ``muse_glimmer_assistant`` or ``MuseGlimmerAssistantModel``), or
    None. Never by a resolved kind name: an ordinary small model carries none of these."""
    architectures = config.get("architectures") or []
    if config.get("model_type") == MUSE_MODEL_TYPE or MUSE_ARCHITECTURE in architectures:
        return "muse-glimmer"
    for arch, family in DFLASH_ARCHITECTURES.items():
        if arch in architectures:
            return family
    if "dflash_config" in config:
        return "dflash"
    return None
