"""The DFlash round loop's loader (``registry.DFLASH.load``, and DSpark's and the Muse Glimmer
assistant's): the kind's declared class reads its checkpoint. The network comes back unbound;
``drafters.loading`` binds it to the target as it does every model-based kind's."""

from __future__ import annotations

from mlxcel.drafters.source import SourceRequest
from mlxcel.engine.errors import MlxcelError
from mlxcel.engine.speculative.drafter import ModelDrafter


def load_network(request: SourceRequest) -> ModelDrafter:
    if not request.draft_model:
        raise MlxcelError("the DFlash round loop reads its drafter from a checkpoint directory: pass -md DIR")
    target = request.target
    extra = {} if target is None else {"eos_token_ids": target.eos_token_ids, "tokenizer": target.tokenizer}
    return request.drafter.load(request.draft_model, target_vocab_size=request.vocab_size, **extra)
