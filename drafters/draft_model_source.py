"""The draft model's loader (``registry.DRAFT_MODEL.load``): the small model ``-md`` names, loaded as
a target is (a drafter-only checkpoint refused), and checked to tokenize as the target does, since
its ids are verified as the target's."""

from __future__ import annotations

import time

from mlxcel.drafters.draft_model import check_same_vocabulary
from mlxcel.drafters.loading import load_target
from mlxcel.drafters.source import DrafterSource, SourceRequest
from mlxcel.engine.speculative.drafter import Drafter


def load_source(request: SourceRequest) -> DrafterSource:
    start = time.perf_counter()
    target = request.target
    if target is None:
        raise ValueError("a draft model is loaded against its target")
    hub = request.draft_hf  # -hfd: -md then names the repository's file, as upstream reads the pair
    draft = load_target(None if hub else request.draft_model, hf_repo=hub, hf_file=request.draft_model if hub else None)
    check_same_vocabulary(target, draft)
    cls, prefill_step = request.drafter, request.prefill_step

    def make(n_min: int, ngram_max: int | None) -> Drafter:
        return cls(draft, target_vocab_size=target.vocab_size, prefill_step=prefill_step)
    return DrafterSource(make, request.default_block,
                         f"draft-model {draft.name} in {time.perf_counter() - start:.2f} s")
