"""Scheduled refits: the validation gate, storage of swapped models, and ticks never waiting on a refit."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

from controller.clock import VirtualClock
from controller.core.coupling import CouplingModels, LatencyInputs
from controller.learning.fit import CorrectionConfig, fit_coupling
from controller.learning.history import HistoryBuffer
from controller.learning.refit import ModelSet, ModelSlot, RefitConfig, RefitJob, RefitOutcome
from controller.learning.store import ModelStore
from controller.learning.training_data import build_training_data
from tests.fixtures.prometheus import wait_until
from tests.learning.helpers import physics_by_pool, synthetic_records, toy_physics


def history_of(records) -> HistoryBuffer:
    h = HistoryBuffer(capacity=10_000)
    for r in records:
        h.append(r)
    return h


def test_a_better_candidate_is_swapped_in_and_stored(tmp_path):
    records = synthetic_records(400, seed=2)
    slot = ModelSlot(ModelSet(coupling=CouplingModels.prior_only([toy_physics()])))
    outcomes: list[RefitOutcome] = []
    job = RefitJob(history_of(records), slot, physics_by_pool(), clock=VirtualClock(records[-1].at_s),
                   store=ModelStore(tmp_path), on_outcome=outcomes.append)
    out = job.run_once()
    assert out.coupling_swapped, out.reason
    assert out.coupling_candidate_score < out.coupling_current_score
    assert slot.get().version == 1 and slot.get().source == "refit"
    assert slot.get().coupling.holdout_errors["ttft_p95_s_mape"] < 0.2
    assert ModelStore(tmp_path).load_coupling()[0].calibration == slot.get().coupling.calibration
    # marked as passing the gate: what a restart loads (tests/runtime/test_refit_restart.py)
    assert ModelStore(tmp_path).read_manifest("coupling").data["training"]["gate"]["passed"] is True
    assert outcomes == [out]


def test_a_worse_candidate_is_not_swapped(caplog):
    records = synthetic_records(400, seed=3)
    data, phys = build_training_data(records, physics_by_pool())
    good = fit_coupling(data, phys, np.random.default_rng(0))
    slot = ModelSlot(ModelSet(coupling=good, source="shipped"))
    # the candidate is handicapped: no calibration, no correction — the prior alone
    cfg = RefitConfig(correction=CorrectionConfig(kind="none", calibrate=False))
    job = RefitJob(history_of(records), slot, physics_by_pool(), clock=VirtualClock(records[-1].at_s), config=cfg,
                   logger=logging.getLogger("test.refit"))
    with caplog.at_level(logging.INFO, logger="test.refit"):
        out = job.run_once()
    assert not out.coupling_swapped
    assert out.coupling_candidate_score > out.coupling_current_score
    assert slot.get().coupling is good and slot.get().version in (0, 1)  # the forecaster may have been swapped
    assert any("coupling kept" in r.getMessage() for r in caplog.records)


def test_too_little_history_keeps_the_current_models():
    records = synthetic_records(20, seed=4)
    slot = ModelSlot(ModelSet(coupling=CouplingModels.prior_only([toy_physics()])))
    out = RefitJob(history_of(records), slot, physics_by_pool(), clock=VirtualClock(0.0)).run_once()
    assert not out.coupling_swapped and "steady training rows" in out.reason


class GatedHistory(HistoryBuffer):
    """A history whose snapshot (the first thing a refit does) waits until the test opens the gate."""

    def __init__(self, records) -> None:
        super().__init__(capacity=10_000)
        for r in records:
            self.append(r)
        self.entered = threading.Event()
        self.gate = threading.Event()

    def snapshot(self):
        self.entered.set()
        assert self.gate.wait(30.0), "the test never opened the gate"
        return super().snapshot()


def test_a_refit_never_blocks_a_tick():
    """The job runs on its own scheduler thread; while it is stuck mid-refit, ticks (read the
    current models, predict, append to the history) go on and finish on the test thread."""
    records = synthetic_records(300, seed=5)
    history = GatedHistory(records[:200])
    slot = ModelSlot(ModelSet(coupling=CouplingModels.prior_only([toy_physics()])))
    done: list[RefitOutcome] = []
    job = RefitJob(history, slot, physics_by_pool(), clock=VirtualClock(records[199].at_s),
                   config=RefitConfig(interval_s=3600.0), on_outcome=done.append)
    job.start(first_run_after_s=0.0)
    try:
        assert history.entered.wait(30.0), "the refit job did not start"
        x = LatencyInputs.build(2, physics_index=0, arrival_rps_per_replica=1.0, prompt_tokens=1000, output_tokens=200)
        for rec in records[200:260]:  # 60 ticks while the refit is held mid-flight
            models = slot.get()
            pred, _, _ = models.coupling.predict_latency(x)
            assert np.all(np.isfinite(pred["ttft_p95_s"]))
            history.append(rec)
        assert not done, "the refit finished before the gate opened"
        assert len(HistoryBuffer.snapshot(history)) == 260
        history.gate.set()
        wait_until(lambda: done, 60.0, what="the refit to finish")
    finally:
        history.gate.set()
        job.stop()
    assert done[0].rows_train > 0
    assert slot.get().version == 1 if done[0].coupling_swapped or done[0].forecast_swapped else slot.get().version == 0


@pytest.mark.parametrize("kw, message", [
    ({"holdout_frac": 0.9}, "holdout_frac"),
    ({"interval_s": 0.0}, "interval_s"),
])
def test_refit_config_is_checked(kw, message):
    with pytest.raises(ValueError, match=message):
        RefitConfig(**kw)
