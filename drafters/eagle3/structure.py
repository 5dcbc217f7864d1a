"""Recognising an EAGLE-3 drafter checkpoint by structure alone (no MLX, no weights), so the command
line can be checked before anything heavy loads.

Three forms are published or produced:

* the EAGLE-3 authors' layout (SpecForge, AngelSlim, Tengyunw...): a Llama config.json with
  ``architectures`` ``["LlamaForCausalLMEagle3"]`` (or ``Eagle3LlamaForCausalLM`` /
  ``Eagle3DraftModel``), one hidden layer and ``draft_vocab_size``; a checkpoint that names no
  such architecture is still recognised, as llama.cpp's converter recognises it, by
  ``draft_vocab_size`` with exactly one hidden layer;
* the ``speculators`` layout (RedHatAI's ``*.speculator.eagle3``): ``architectures``
  ``["Eagle3Speculator"]`` / ``speculators_model_type: eagle3`` / a ``speculators_config`` whose
  ``algorithm`` is ``eagle3``, the decoder layer's own config nested in ``transformer_layer_config``;
* a GGUF file as llama.cpp's converter writes it (architecture ``eagle3``), whose "config" here
  is just its architecture name (``registry.read_drafter_config``).
"""

from __future__ import annotations

from mlxcel.drafters.gguf_header import ARCHITECTURE_KEY

ORIGINAL = "eagle3"  # the EAGLE-3 authors' config.json
SPECULATORS = "speculators"  # vLLM's speculators config.json
GGUF = "gguf"  # llama.cpp's conversion

ORIGINAL_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3DraftModel")
SPECULATORS_ARCHITECTURE = "Eagle3Speculator"
GGUF_ARCHITECTURE = "eagle3"


def eagle3_layout(config: dict) -> str | None:
    """Which EAGLE-3 form ``config`` describes (``ORIGINAL``, ``SPECULATORS`` or ``GGUF``), or None."""
    if config.get(ARCHITECTURE_KEY) == GGUF_ARCHITECTURE:
        return GGUF
    architectures = config.get("architectures") or []
    speculators = config.get("speculators_config")
    if (SPECULATORS_ARCHITECTURE in architectures or config.get("speculators_model_type") == "eagle3"
            or (isinstance(speculators, dict) and speculators.get("algorithm") == "eagle3")):
        return SPECULATORS
    if any(a in architectures for a in ORIGINAL_ARCHITECTURES):
        return ORIGINAL
    if "draft_vocab_size" in config and config.get("num_hidden_layers") == 1:
        return ORIGINAL
    return None


def is_eagle3(config: dict) -> bool:
    """The registry's structural detector for the EAGLE-3 kind."""
    return eagle3_layout(config) is not None
