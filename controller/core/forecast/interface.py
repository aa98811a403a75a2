"""What a planner asks of a load forecaster: one arrival-rate series forecast over its horizon.

`Forecaster.forecast(t_s, y, now_s, lead_s)` takes the history of one series (the fleet's
arrivals, or a class's or a pool's: times and values, req/s) and returns a `LoadForecast` at
the lead times asked for (seconds from now_s): the p50, the p90, and the level and trend it
read. The MPC policy forecasts the fleet's arrivals and splits them by class share; the
planner plans for a quantile between the p50 and the p90 (ObjectiveWeights.plan_quantile).

Implementations: `PriorForecaster` (prior.py, no fitting: level, damped trend and empirical
spread from the series itself) and `LearnedForecaster` (learned.py, a fitted ForecasterModel).

Must not: do I/O, read the clock (time is the `now_s` argument) or keep state between calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class LoadForecast:
    """Arrival-rate forecast at lead times (seconds from now): p50 and p90 arrays (req/s)."""

    lead_s: np.ndarray
    p50: np.ndarray
    p90: np.ndarray
    level: float  # req/s the forecast starts from
    trend_per_s: float  # req/s per second the forecast moves by at first
    method: str = "prior"


@runtime_checkable
class Forecaster(Protocol):
    """A forecaster of one arrival-rate series (see the module docstring)."""

    def forecast(self, t_s: np.ndarray, y: np.ndarray, now_s: float, lead_s: np.ndarray) -> LoadForecast:
        """p50 and p90 of the series at now_s + each lead, from its history (t_s, y)."""
        ...
