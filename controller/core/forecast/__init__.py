"""Load forecasting: one interface for the planner, a prior and a learned forecaster behind it.

- interface.py: `Forecaster` (the Protocol a planner calls) and `LoadForecast` (what it returns);
- prior.py: `PriorForecaster`, level + damped trend + empirical spread, no fitting (the MPC
  policy's forecaster);
- learned.py: the fitted forecaster (`ForecastConfig`, `fit_forecaster`, `ForecasterModel`,
  `Forecast`) and `LearnedForecaster`, which puts a fitted model behind `Forecaster`;
- backtest.py: the seasonal-naive reference, walk-forward backtests; state.py: plain state for
  storage.

The names below are the package's public interface; its modules' other names are internal.

Must not: do I/O, read the clock (time is the `now_s` argument) or keep state between calls.
"""

from controller.core.forecast.backtest import holdout_mae, rolling_backtest, seasonal_naive
from controller.core.forecast.interface import Forecaster, LoadForecast
from controller.core.forecast.learned import (
    DAY_S,
    WEEK_S,
    Forecast,
    ForecastConfig,
    ForecasterModel,
    LearnedForecaster,
    SeriesModel,
    bin_series,
    fit_forecaster,
    fit_series,
)
from controller.core.forecast.prior import PriorForecaster
from controller.core.forecast.state import STATE_FORMAT, forecaster_from_state, forecaster_to_state

__all__ = [
    "DAY_S",
    "STATE_FORMAT",
    "WEEK_S",
    "Forecast",
    "ForecastConfig",
    "Forecaster",
    "ForecasterModel",
    "LearnedForecaster",
    "LoadForecast",
    "PriorForecaster",
    "SeriesModel",
    "bin_series",
    "fit_forecaster",
    "fit_series",
    "forecaster_from_state",
    "forecaster_to_state",
    "holdout_mae",
    "rolling_backtest",
    "seasonal_naive",
]
