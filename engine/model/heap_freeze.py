"""A loaded model's Python objects moved out of the cyclic garbage collector's scans.

A loaded model (its modules, tokenizer tables, chat template) leaves ~220,000 GC-tracked objects
in the process (SmolLM2-135M); every full collection walks them all, ~160 ms on the CPUs of
``docs/benchmarks.md``, a stall in whichever decode step it lands. They live as long as the
model, so after loading they go into the permanent generation (``gc.freeze``), where a collection
costs ~0 ms. Objects frozen are still freed by reference counting: a model dropped by
``--sleep-idle-seconds`` (``server/http/sleep.py``) frees its arrays when its last reference
goes, because the model holds no reference cycles (``tests/engine/model/test_heap_freeze.py``
checks it). Any cyclic garbage frozen with a model is collected at the next load, which first
unfreezes and collects.
"""

from __future__ import annotations

import gc


def freeze_loaded_heap() -> None:
    """Collect, then freeze everything alive (after a model load)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
