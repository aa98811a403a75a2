"""Scoring the learned forecaster: the seasonal-naive reference, a walk-forward backtest, a holdout MAE.

`seasonal_naive` is the reference forecast the bench compares against: the value one period
before the target (period = one day, or one week when asked), or the last value when the history
is shorter than a period. `rolling_backtest` refits as it walks (the bench's figure);
`holdout_mae` scores a fixed model (the validation gate of a refit).

Must not: do I/O or read the clock; pure and deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from controller.core.forecast.learned import DAY_S, ForecastConfig, ForecasterModel, SeriesModel, bin_series, fit_series


def seasonal_naive(t_s: np.ndarray, y: np.ndarray, step_s: float, horizon_s: float,
                   period_s: float = DAY_S) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The reference forecast on a binned series: ŷ(t + H) = y(t + H − period) when the series is at
    least one period long, else the last value y(t).

    Returns (target bin times, actual, forecast) for every target bin with both defined.
    """
    t0, yb = bin_series(t_s, y, step_s)
    h = max(1, int(round(horizon_s / step_s)))
    p = int(round(period_s / step_s))
    span = len(t0)
    if span > p + h:
        fc = np.full(span, np.nan)
        fc[p:] = yb[:-p]
    else:
        fc = np.full(span, np.nan)
        fc[h:] = yb[:-h]
    ok = np.isfinite(fc) & np.isfinite(yb)
    return t0[ok], yb[ok], fc[ok]


_DEFAULT_CONFIG = ForecastConfig()  # frozen, so one shared default instance is safe


def rolling_backtest(t_s: np.ndarray, y: np.ndarray, *, config: ForecastConfig = _DEFAULT_CONFIG,
                     horizon_s: float = 600.0, start_s: float | None = None, refit_every_s: float = DAY_S,
                     history_for_predict_s: float = 4 * 3600.0, name: str = "y",
                     period_s: float = DAY_S) -> dict[str, float]:
    """Walk forward through a series: refit every `refit_every_s` on everything before, forecast
    `horizon_s` ahead from every bin, and compare with seasonal-naive on the same targets.

    Returns {"mae": …, "naive_mae": …, "ratio": mae / naive_mae, "coverage_p90": share of actuals
    ≤ p90, "n": targets}. Pure and deterministic; used by `governor bench models` and the tests.
    """
    t0, yb = bin_series(t_s, y, config.step_s)
    if len(t0) == 0:
        return {"mae": math.nan, "naive_mae": math.nan, "ratio": math.nan, "coverage_p90": math.nan, "n": 0}
    h = max(1, int(round(horizon_s / config.step_s)))
    p = int(round(period_s / config.step_s))
    first = t0[0] + (start_s if start_s is not None else min(DAY_S, 0.25 * (t0[-1] - t0[0])))
    origins = np.flatnonzero((t0 >= first) & (np.arange(len(t0)) + h < len(t0)))
    errs, nerrs, cover = [], [], []
    model: SeriesModel | None = None
    next_refit = -math.inf
    hist_bins = int(history_for_predict_s / config.step_s)
    long = len(t0) > p + h
    fitted_bins = 0
    for i in origins:
        now = t0[i] + config.step_s  # bin i is complete
        # refit on schedule, and early on whenever the history grew by a quarter (a young series
        # changes its best half-life quickly)
        if now >= next_refit or i + 1 >= 1.25 * fitted_bins:
            model = fit_series(name, t0[: i + 1] + 0.5 * config.step_s, yb[: i + 1], config)
            next_refit = now + refit_every_s
            fitted_bins = int(i) + 1
        lo = max(0, i + 1 - hist_bins)
        assert model is not None  # fitted at the first origin: fitted_bins starts at 0
        fm = ForecasterModel(config, {name: model})
        # the target bin starts h bins after the origin bin; its centre is now + (h − 0.5)·step
        f = fm.predict({name: (t0[lo: i + 1] + 0.5 * config.step_s, yb[lo: i + 1])}, now,
                       [(h - 0.5) * config.step_s])
        actual = yb[i + h]
        naive = yb[i + h - p] if long and i + h - p >= 0 else yb[i]
        if not (np.isfinite(actual) and np.isfinite(naive) and np.isfinite(f.p50[name][0])):
            continue
        errs.append(abs(float(f.p50[name][0]) - actual))
        nerrs.append(abs(float(naive) - actual))
        cover.append(float(actual <= f.p90[name][0]))
    if not errs:
        return {"mae": math.nan, "naive_mae": math.nan, "ratio": math.nan, "coverage_p90": math.nan, "n": 0}
    mae, nmae = float(np.mean(errs)), float(np.mean(nerrs))
    return {"mae": mae, "naive_mae": nmae, "ratio": mae / nmae if nmae > 0 else math.nan,
            "coverage_p90": float(np.mean(cover)), "n": len(errs)}



def holdout_mae(model: ForecasterModel, series: Mapping[str, tuple[np.ndarray, np.ndarray]], split_s: float,
                horizon_s: float, *, max_origins: int = 120, history_s: float = 4 * 3600.0) -> dict[str, float]:
    """Walk-forward MAE of `model` at `horizon_s` over the points after `split_s` (fixed model, no
    refits): the validation gate's score for a forecaster. Per series, plus "mean" (of the series'
    MAEs relative to their mean level, so series of different units average fairly)."""
    out: dict[str, float] = {}
    rel: list[float] = []
    for name, (t, y) in series.items():
        t = np.asarray(t, float)
        y = np.asarray(y, float)
        origins = np.flatnonzero((t >= split_s) & (t + horizon_s <= t[-1] if len(t) else False))
        if len(origins) == 0:
            continue
        if len(origins) > max_origins:
            origins = origins[np.linspace(0, len(origins) - 1, max_origins).astype(np.int64)]
        errs = []
        for i in origins:
            now = float(t[i])
            lo = np.searchsorted(t, now - history_s)
            f = model.predict({name: (t[lo: i + 1], y[lo: i + 1])}, now, [horizon_s])
            j = np.searchsorted(t, now + horizon_s)
            if j < len(t) and np.isfinite(f.p50[name][0]):
                errs.append(abs(float(f.p50[name][0]) - float(y[j])))
        if errs:
            out[name] = float(np.mean(errs))
            scale = float(np.mean(np.abs(y))) or 1.0
            rel.append(out[name] / scale)
    out["mean"] = float(np.mean(rel)) if rel else math.nan
    return out
