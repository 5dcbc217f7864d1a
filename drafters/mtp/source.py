"""The MTP round loop's loader (``registry.MTP.load`` and ``registry.INTERNAL_MTP.load``): the
target's own MTP layers, or those of a NextN assistant, through the kind's declared class; a Gemma 4
assistant (recognised by structure) drafts with its own class. The network comes back unbound;
``drafters.loading`` binds it to the target as it does every model-based kind's."""

from __future__ import annotations

from mlxcel.drafters.mtp.gemma4_assistant import Gemma4AssistantDrafter
from mlxcel.drafters.mtp.structure import is_gemma4_assistant
from mlxcel.drafters.source import SourceRequest
from mlxcel.engine.speculative.drafter import ModelDrafter


def load_network(request: SourceRequest) -> ModelDrafter:
    if request.draft_model and is_gemma4_assistant(request.config):
        return Gemma4AssistantDrafter.load(request.draft_model)
    if request.target is None:
        raise ValueError("an MTP drafter is read against its target")
    return request.drafter.load(request.target.path, request.draft_model, prefill_step=request.prefill_step)
