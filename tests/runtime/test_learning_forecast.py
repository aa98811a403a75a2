"""The daemon's learning edge scores the slot's forecaster on the fleet's arrivals (forecast_ae)."""

from __future__ import annotations

import logging
import math

from controller.clock import VirtualClock
from controller.runtime.learning import Learning
from controller.types import FleetObservation, FleetSpec, PoolObservation, PoolSpec, Reading, SloSpec

FLEET = FleetSpec(pools=(PoolSpec("p", "llama-3-8b", "a100-80gb", gpus_per_replica=1),),
                  slos={c: SloSpec(2.5, 0.1) for c in ("critical", "standard", "sheddable")})


def _obs(t: float, rps: float | None) -> FleetObservation:
    pool = PoolObservation(pool="p", replicas_ready=Reading(2.0),
                           arrival_rps=Reading(rps) if rps is not None else Reading.of(None))
    return FleetObservation(at_s=t, pools={"p": pool})


def test_forecast_error_is_scored_once_its_horizon_has_passed(tmp_path):
    learning = Learning(FLEET, tmp_path, clock=VirtualClock(1.0e9), logger=logging.getLogger("test"))
    assert learning.slot.get().forecaster is not None  # the shipped forecaster
    horizon = learning.tracker.forecast_horizon_s
    t0 = 1.0e9
    errors = []
    for k in range(40):  # 10 minutes at 15 s: a steady 10 req/s with a step to 14 at 5 minutes
        t = t0 + 15.0 * k
        learning.on_tick(t, _obs(t, 10.0 if k < 20 else 14.0), None)
        errors.append(learning.tracker.snapshot().errors["forecast_ae"])
    first_scored = next(i for i, e in enumerate(errors) if math.isfinite(e))
    assert 15.0 * first_scored >= horizon  # nothing is scored before its horizon comes
    snap = learning.tracker.snapshot()
    assert snap.samples["forecast"] >= 30
    # a steady level is forecast within a fraction of a req/s; the step adds its error for a horizon
    assert 0.0 <= snap.errors["forecast_ae"] < 4.0
    assert math.isfinite(snap.errors["naive_ae"])


def test_no_arrivals_no_forecast_score(tmp_path):
    learning = Learning(FLEET, tmp_path, clock=VirtualClock(1.0e9), logger=logging.getLogger("test"))
    for k in range(10):
        learning.on_tick(1.0e9 + 15.0 * k, _obs(1.0e9 + 15.0 * k, None), None)
    assert math.isnan(learning.tracker.snapshot().errors["forecast_ae"])
