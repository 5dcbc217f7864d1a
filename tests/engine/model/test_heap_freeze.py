"""After a load the model's objects are out of the cyclic collector's scans (``gc.freeze``), and a
dropped model still frees its weights by reference counting alone: what ``--sleep-idle-seconds``
relies on to unload a frozen model."""

from __future__ import annotations

import gc
import weakref

import mlx.core as mx

from mlxcel.engine.model.loading import load_model


def test_a_loaded_model_is_frozen_and_frees_without_the_collector(tiny_llama_dir):
    gc.unfreeze()  # what an earlier load froze does not count
    lm = load_model(tiny_llama_dir)
    assert gc.get_freeze_count() > 0
    mx.eval(lm.model.parameters())
    ref = weakref.ref(lm.model)
    gc.disable()  # no collection may run in between: only reference counts free the model
    try:
        del lm
        assert ref() is None
    finally:
        gc.enable()

