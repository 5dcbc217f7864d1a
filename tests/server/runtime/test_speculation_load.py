"""What the server's ``Speculation`` decides when it loads, in process on tiny real checkpoints:

* a target whose recurrent state a verify round cannot restore (Falcon-H1) declines speculation
  with one warning, loads no drafter, and each request it declines is a ``target-state`` count in
  /metrics' text; a hybrid target it can restore speculates;
* ``--draft-adaptive off`` reaches the prompt-lookup governor of every request's drafter (on: the
  governor pauses low-yield rows);
* a model-based drafter's exactness probe runs at load for every verify width it can use, and a
  request's rounds then find every verdict memoized.
"""

from __future__ import annotations

import logging

import tiny_checkpoints

from mlxcel.engine.model.loading import load_model
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative import exactness_probe
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.metrics import Metrics
from mlxcel.server.runtime.speculation import DECLINED_TARGET, Speculation
from mlxcel.server.runtime.speculation_settings import resolve
from mlxcel.server.runtime.task import GenerationOptions

GREEDY = GenerationOptions(sampler=SamplerParams(temperature=0.0))


def test_a_target_whose_state_cannot_be_restored_declines_once_and_is_counted(checkpoints_root, caplog):
    falcon = load_model(tiny_checkpoints.build_hf_checkpoint(checkpoints_root / "tiny-falcon-h1", "falcon_h1"))
    settings = resolve(ServerConfig(spec_type="ngram-simple"))
    with caplog.at_level(logging.WARNING):
        spec = Speculation.load(settings, falcon)
    assert spec.source is None and "CacheList" in spec.declined
    assert sum("Speculation declined for this target" in r.message for r in caplog.records) == 1
    metrics = Metrics()
    for _ in range(2):
        reason = spec.declines(GREEDY)
        assert reason == DECLINED_TARGET and not spec.eligible(GREEDY)
        metrics.record_declined(reason)
    assert 'mlxcel:spec_decode_declined_total{reason="target-state"} 2' in metrics.render(0, 0)
    # a request that opts out is not a decline
    assert spec.declines(GenerationOptions(sampler=SamplerParams(temperature=0.0), spec_n_max=0)) is None


def test_a_hybrid_target_speculates(hybrid):
    spec = Speculation.load(resolve(ServerConfig(spec_type="ngram-simple")), hybrid["lfm2"])
    assert spec.declined is None and spec.eligible(GREEDY)


def test_draft_adaptive_reaches_every_requests_governor(hybrid):
    lm = hybrid["lfm2"]
    for flag, adaptive in (("off", False), ("on", True), (None, True)):
        spec = Speculation.load(resolve(ServerConfig(spec_type="ngram-simple", draft_adaptive=flag)), lm)
        session = spec.start(GREEDY, [5, 6, 7, 5, 6], seed=0)
        assert session.drafter.governor.adaptive is adaptive
        governor = session.drafter.governor
        for _ in range(4):
            governor.record_round(0)  # rounds that accepted nothing
        assert governor.paused is adaptive  # off: the floor is ignored, it never pauses


def test_the_probe_runs_at_load_for_every_width(hybrid_dirs, hybrid, monkeypatch, caplog):
    monkeypatch.delenv("MLXCEL_EXACTNESS_PROBE", raising=False)
    lm = hybrid["qwen3_5"]
    exactness_probe.forget(lm.model)
    with caplog.at_level(logging.WARNING):
        Speculation.load(resolve(ServerConfig(draft_kind="mtp", spec_draft_n_max=3)), lm)
    line = next(r.message for r in caplog.records if r.message.startswith("Exactness probe at load"))
    assert "verify widths 2-4" in line
    assert {w for (_, w) in exactness_probe._verdicts if exactness_probe._verdicts[(_, w)][0] is lm.model} == {2, 3, 4}
