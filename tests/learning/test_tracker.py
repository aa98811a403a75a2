"""The live error tracker: model predictions against what then happened."""

from __future__ import annotations

import math

import numpy as np

from controller.core.coupling import Calibration, CouplingModels
from controller.core.forecast import fit_forecaster
from controller.core.observations import forecast_series
from controller.learning.tracker import ModelTracker
from tests.learning.helpers import physics_by_pool, synthetic_records, toy_physics


def run(models: CouplingModels, records, forecaster=None) -> dict:
    tracker = ModelTracker(physics_by_pool(), window=500, forecast_horizon_s=60.0)
    for r in records:
        fc = None
        if forecaster is not None:
            hist = forecast_series(records[: records.index(r) + 1])
            fc = forecaster.predict(hist, r.at_s, [60.0])
        tracker.update(r, models, fc)
    return tracker.snapshot().to_dict()


def test_the_true_model_has_small_errors_and_a_wrong_one_large():
    records = synthetic_records(80, seed=6, time_scale=1.3, wait_scale=0.6)
    key = toy_physics().key
    truth = CouplingModels(physics=(toy_physics(),), corrections={}, calibration={key: Calibration(1.3, 0.6)})
    wrong = CouplingModels(physics=(toy_physics(),), corrections={}, calibration={key: Calibration(3.0, 3.0)})
    good, bad = run(truth, records), run(wrong, records)
    assert good["ticks"] == 80 and good["samples"]["tpot_p95_ape"] > 50
    assert good["errors"]["tpot_p95_ape"] < 0.1  # TPOT is not distorted in the synthetic fleet
    assert bad["errors"]["tpot_p95_ape"] > 3 * good["errors"]["tpot_p95_ape"]
    assert set(good["per_pool"]) == {"p0", "p1"}
    assert good["confidence"] == 0.0  # no correction fitted: the model says it runs on its prior


def test_forecast_errors_are_settled_when_their_time_comes():
    records = synthetic_records(60, seed=7)
    forecaster = fit_forecaster(forecast_series(records[:40]))
    snap = run(CouplingModels.prior_only([toy_physics()]), records, forecaster)
    assert snap["samples"]["forecast"] >= 50
    assert math.isfinite(snap["errors"]["forecast_ae"]) and math.isfinite(snap["errors"]["naive_ae"])


def test_snapshot_of_an_empty_tracker_is_json_ready():
    snap = ModelTracker(physics_by_pool()).snapshot().to_dict()
    assert snap["ticks"] == 0 and snap["errors"]["ttft_p95_ape"] is None
    import json

    json.dumps(snap)
    assert np.isnan(ModelTracker(physics_by_pool()).snapshot().errors["forecast_ae"])
