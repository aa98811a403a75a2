"""How well a CouplingModels predicts observed windows: the acceptance metrics (MAPE of the
latency quantiles, MAE of the hit rate and of the GPU busy fraction) and the spread the upper
bands use. Used by `governor fit` (holdout errors), the daemon's refit gate and the bench.

Must not: fit anything or do I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from controller.core.coupling import LATENCY_TARGETS, CouplingModels, LatencyInputs, PhysicsTable, latency_prior
from controller.learning.training_data import (
    TrainingData,
    engine_not_saturated,
    valid_cache_rows,
    valid_latency_rows,
)


@dataclass(frozen=True)
class ModelErrors:
    """Errors of a CouplingModels on observed rows (steady rows only, below saturation for latency)."""

    mape: Mapping[str, float]  # latency targets: mean |ŷ − y| / y
    hit_rate_mae: float
    rows: Mapping[str, int]
    log_q90: Mapping[str, float]  # 0.9 quantile of log(y / ŷ): the spread for the upper band
    gpu_busy_frac_mae: float = math.nan

    def score(self) -> float:
        """One number to compare two models (lower is better): mean of the p95 MAPEs and 2× the hit MAE."""
        parts = [v for k, v in self.mape.items() if k in ("ttft_p95_s", "tpot_p95_s") and math.isfinite(v)]
        if math.isfinite(self.hit_rate_mae):
            parts.append(2.0 * self.hit_rate_mae)
        return float(np.mean(parts)) if parts else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {"mape": dict(self.mape), "hit_rate_mae": self.hit_rate_mae, "gpu_busy_frac_mae": self.gpu_busy_frac_mae,
                "rows": dict(self.rows), "log_q90": dict(self.log_q90), "score": self.score()}


def evaluate(models: CouplingModels, data: TrainingData, *, max_rho: float = 0.9,
             use_observed_hit: bool = True) -> ModelErrors:
    """MAPE per latency target, MAE of the hit rate and of the GPU busy fraction, on the steady
    rows of `data` (a busy fraction near 0 would make a percentage error meaningless).

    Latency rows count only below saturation: the uncalibrated prior's engine utilisation below
    max_rho and no standing engine queue (engine_not_saturated). With use_observed_hit the
    latency model gets the observed hit rate (isolates its error); otherwise the cache model's
    prediction (the planner's chain).
    """
    mape: dict[str, float] = {}
    rows: dict[str, int] = {}
    logq: dict[str, float] = {}
    lat_in = data.latency
    if not use_observed_hit:
        hit, _ = models.predict_hit_rate(data.cache)
        obs_hit = data.latency.hit_rate
        lat_in = LatencyInputs(**{**{f.name: getattr(lat_in, f.name) for f in fields(lat_in)},
                                  "hit_rate": np.where(np.isfinite(hit), hit, obs_hit)})
    pred, _, _ = models.predict_latency(lat_in)
    # the operating range is judged by the uncalibrated prior: the same rows for every model compared
    below = (latency_prior(PhysicsTable(models.physics), lat_in).rho_engine < max_rho) & engine_not_saturated(data)
    for t in LATENCY_TARGETS:
        m = valid_latency_rows(data, t) & below
        rows[t] = int(m.sum())
        if m.any():
            y, yh = data.targets[t][m], pred[t][m]
            mape[t] = float(np.mean(np.abs(yh - y) / y))
            logq[t] = float(np.quantile(np.log(y / yh), 0.9))
        else:
            mape[t] = math.nan
            logq[t] = math.nan
    m = valid_latency_rows(data, "gpu_busy_frac") & below
    rows["gpu_busy_frac"] = int(m.sum())
    busy_mae = (float(np.mean(np.abs(pred["gpu_busy_frac"][m] - data.targets["gpu_busy_frac"][m])))
                if m.any() else math.nan)
    m = valid_cache_rows(data)
    rows["hit_rate"] = int(m.sum())
    if m.any():
        hit, _ = models.predict_hit_rate(data.subset(m).cache)
        mae = float(np.mean(np.abs(hit - data.targets["hit_rate"][m])))
    else:
        mae = math.nan
    return ModelErrors(mape, mae, rows, logq, busy_mae)
