"""The EAGLE-3 round loop's loader (``registry.EAGLE3.load``): the kind's declared class reads the
checkpoint directory or GGUF file. The network comes back unbound; ``drafters.loading`` binds it to
the target as it does every model-based kind's."""

from __future__ import annotations

from mlxcel.drafters.source import SourceRequest
from mlxcel.engine.errors import MlxcelError
from mlxcel.engine.speculative.drafter import ModelDrafter


def load_network(request: SourceRequest) -> ModelDrafter:
    if not request.draft_model:
        raise MlxcelError("an EAGLE-3 drafter is read from its checkpoint: pass -md DIR (or the GGUF llama.cpp "
                          "converts it to)")
    target = request.target
    extra = {} if target is None else {"eos_token_ids": target.eos_token_ids, "tokenizer": target.tokenizer}
    return request.drafter.load(request.draft_model, target_vocab_size=request.vocab_size,
                                prefill_step=request.prefill_step, **extra)
