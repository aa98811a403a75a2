"""Live error of the models in use: each tick, what the models said against what then happened.

Two figures per pool and fleet-wide, over the last `window` ticks:

- coupling: the models' prediction for the window just observed — given the load that actually
  arrived and the settings in force — against the observed p95 TTFT/TPOT (absolute percentage
  error) and hit rate (absolute error). This isolates the coupling models from forecast error.
- forecast: at each tick the forecaster's p50 for `forecast_horizon_s` ahead is remembered; when
  that time comes it is compared with the observed arrival rate (absolute error, and the same
  error of the last value — the naive forecast — for scale).

`TrackerSnapshot.to_dict()` is what `governor status` shows and what the daemon exports as a
gauge (suggested: governor_model_error{model, metric, pool}).

Must not: fit models or block the tick (one small predict per pool per tick).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from controller.core.coupling import CouplingModels, with_physics
from controller.core.forecast import Forecast
from controller.core.observations import DISPERSION_TICKS, ObservationRecord
from controller.learning.training_data import build_training_data


@dataclass(frozen=True)
class TrackerSnapshot:
    ticks: int
    errors: Mapping[str, float]  # fleet-wide: ttft_p95_ape, tpot_p95_ape, hit_rate_ae, forecast_ae, naive_ae
    per_pool: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    samples: Mapping[str, int] = field(default_factory=dict)
    confidence: float = math.nan  # mean model confidence over the window

    def to_dict(self) -> dict:
        def clean(v: float) -> float | None:
            return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else round(float(v), 6)

        return {"ticks": self.ticks, "errors": {k: clean(v) for k, v in self.errors.items()},
                "per_pool": {p: {k: clean(v) for k, v in d.items()} for p, d in self.per_pool.items()},
                "samples": dict(self.samples), "confidence": clean(self.confidence)}


class ModelTracker:
    METRICS = ("ttft_p95_ape", "tpot_p95_ape", "hit_rate_ae")

    def __init__(self, physics_by_pool: Mapping, *, window: int = 240, window_s: float = 60.0,
                 forecast_horizon_s: float = 60.0, forecast_series: str = "arrival_rps") -> None:
        self.physics_by_pool = dict(physics_by_pool)
        self.window = int(window)
        self.window_s = float(window_s)
        self.forecast_horizon_s = float(forecast_horizon_s)
        self.forecast_series = forecast_series
        self._lock = threading.Lock()
        self._recent: deque[ObservationRecord] = deque(maxlen=DISPERSION_TICKS + 1)
        self._err: dict[tuple[str, str], deque[float]] = {}
        self._conf: deque[float] = deque(maxlen=self.window)
        self._pending: deque[tuple[float, float, float]] = deque()  # (due_s, p50, naive)
        self._fc_err: deque[float] = deque(maxlen=self.window)
        self._naive_err: deque[float] = deque(maxlen=self.window)
        self.ticks = 0

    def _push(self, pool: str, metric: str, v: float) -> None:
        if math.isfinite(v):
            self._err.setdefault((pool, metric), deque(maxlen=self.window)).append(v)

    def update(self, record: ObservationRecord, coupling: CouplingModels, forecast: Forecast | None = None) -> None:
        """Call once per tick after the observation is read (and the forecast made)."""
        with self._lock:
            self.ticks += 1
            self._recent.append(record)
            data, phys = build_training_data(list(self._recent), self.physics_by_pool, window_s=self.window_s,
                                             settle_s=0.0)
            now = data.t_s == record.at_s
            if now.any():
                d = data.subset(now)
                models = with_physics(coupling, phys)
                pred, _, conf = models.predict_latency(d.latency)
                hit, _ = models.predict_hit_rate(d.cache)
                for i, pool in enumerate(d.aux["pool"]):
                    for t, m in (("ttft_p95_s", "ttft_p95_ape"), ("tpot_p95_s", "tpot_p95_ape")):
                        y = d.targets[t][i]
                        if math.isfinite(y) and y > 0:
                            self._push(str(pool), m, abs(pred[t][i] - y) / y)
                    y = d.targets["hit_rate"][i]
                    if math.isfinite(y):
                        self._push(str(pool), "hit_rate_ae", abs(hit[i] - y))
                self._conf.extend(float(c) for c in conf)
            # forecast: settle what is due, then remember this tick's forecast
            actual = _total_arrivals(record)
            while self._pending and self._pending[0][0] <= record.at_s:
                _, p50, naive = self._pending.popleft()
                if math.isfinite(actual):
                    self._fc_err.append(abs(p50 - actual))
                    self._naive_err.append(abs(naive - actual))
            if forecast is not None and self.forecast_series in forecast.p50 and math.isfinite(actual):
                h = np.asarray(forecast.horizons_s)
                j = int(np.argmin(np.abs(h - self.forecast_horizon_s))) if len(h) else -1
                if j >= 0 and abs(h[j] - self.forecast_horizon_s) <= 0.5 * self.forecast_horizon_s:
                    self._pending.append((record.at_s + float(h[j]), float(forecast.p50[self.forecast_series][j]),
                                          actual))

    def snapshot(self) -> TrackerSnapshot:
        with self._lock:
            per_pool: dict[str, dict[str, float]] = {}
            fleet: dict[str, list[float]] = {m: [] for m in self.METRICS}
            samples: dict[str, int] = {}
            for (pool, metric), vals in self._err.items():
                per_pool.setdefault(pool, {})[metric] = float(np.mean(vals)) if vals else math.nan
                fleet[metric].extend(vals)
            errors = {m: (float(np.mean(v)) if v else math.nan) for m, v in fleet.items()}
            for m, v in fleet.items():
                samples[m] = len(v)
            errors["forecast_ae"] = float(np.mean(self._fc_err)) if self._fc_err else math.nan
            errors["naive_ae"] = float(np.mean(self._naive_err)) if self._naive_err else math.nan
            samples["forecast"] = len(self._fc_err)
            conf = float(np.mean(self._conf)) if self._conf else math.nan
            return TrackerSnapshot(ticks=self.ticks, errors=errors, per_pool=per_pool, samples=samples,
                                   confidence=conf)


def _total_arrivals(record: ObservationRecord) -> float:
    vals = [p.arrival_rps.value for p in record.observation.pools.values() if p.arrival_rps.ok]
    return float(sum(vals)) if vals else math.nan
