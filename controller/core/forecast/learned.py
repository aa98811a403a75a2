"""The learned load forecaster: arrival rate and token mix per series, fitted to history, p50 and p90.

Each named series (e.g. "arrival_rps:critical", "prompt_tokens_per_request") is modelled as
y(t) = e^s(t) · z(t):

- s(t): seasonality, estimated only when the history covers at least two periods — a daily
  shape on `slot_s` slots (mean over days of the slot's deviation from that day's mean, smoothed)
  and, with two weeks, a day-of-week offset. Without enough history s = 0.
- z(t) = y(t)/e^s(t): the deseasonalised level, tracked in linear space by an exponentially
  weighted mean (half-life chosen among `half_lives_s` by backtesting the history at the target
  horizon) and damped towards its long-run mean: ẑ(t + H) = μ + φ^(H/step)·(L(t) − μ), φ also
  chosen by backtest; ŷ(t + H) = e^s(t+H)·ẑ.

Quantiles come from the same backtest: the empirical quantiles of y / ŷ per horizon, so the
p90 is as wide as this series' own forecast errors have been. With little history (fewer than
`min_bins` bins) the model falls back to the last value with a default spread and reports a low
confidence.

`fit_forecaster` fits a `ForecasterModel` (stored by controller/learning/store.py, scored by
backtest.py); `LearnedForecaster` puts one of its series behind the planner's `Forecaster`
interface (interface.py).

Must not: do I/O, read the clock (time is the `now_s` argument) or keep state between calls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from scipy.signal import lfilter

from controller.core.forecast.interface import LoadForecast

DAY_S = 86_400.0
WEEK_S = 7 * DAY_S


@dataclass(frozen=True)
class ForecastConfig:
    step_s: float = 60.0  # bin width of the internal series
    target_horizon_s: float = 600.0  # the horizon the backtest optimises (10 minutes)
    max_horizon_s: float = 1800.0  # residual quantiles are estimated up to here
    half_lives_s: tuple[float, ...] = (60.0, 180.0, 600.0, 1800.0, 7200.0)
    dampings: tuple[float, ...] = (1.0, 0.995, 0.98, 0.95)
    # damped-trend (Holt) candidates: level smoothing α, trend smoothing β, damping φ
    holt_alphas: tuple[float, ...] = (0.2, 0.5, 0.8)
    holt_betas: tuple[float, ...] = (0.05, 0.2)
    holt_dampings: tuple[float, ...] = (0.8, 0.9)
    # a smoother replaces the last value only if its backtest MAE is this much lower: with little
    # history the choice among many candidates is itself noisy, and the last value is the
    # reference the bench compares against
    naive_margin: float = 0.03
    min_scored: int = 30  # fewer backtest targets than this: keep the last value
    median_shrink_n: float = 100.0  # the p50's bias factor is shrunk to 1 by n / (n + this)
    slot_s: float = 600.0  # resolution of the daily shape
    min_bins: int = 10  # below this: last value, default spread, confidence 0
    quantiles: tuple[float, ...] = (0.5, 0.9)
    default_log_spread: float = math.log(1.5)  # p90/p50 when the history is too short to measure it
    max_fit_bins: int = 30 * 1440  # keep at most this many recent bins (30 days of minutes)

    def __post_init__(self) -> None:
        if not (self.step_s > 0 and self.slot_s >= self.step_s):
            raise ValueError(f"ForecastConfig: need step_s > 0 and slot_s >= step_s (got {self.step_s}, {self.slot_s})")
        if not self.half_lives_s or min(self.half_lives_s) <= 0:
            raise ValueError("ForecastConfig.half_lives_s: need positive half-lives")
        if not self.dampings or not all(0 < d <= 1 for d in self.dampings):
            raise ValueError("ForecastConfig.dampings: each must be in (0, 1]")


@dataclass(frozen=True)
class SeriesModel:
    """The fitted forecaster of one series."""

    name: str
    step_s: float
    half_life_s: float  # "ewma": the level's half-life
    damping: float  # "ewma": pull of the level towards its mean per step; "holt": trend damping φ
    log_offset: float  # the seasonal shape is estimated on log(y + offset); offset = 5% of the mean (zeros are fine)
    slot_s: float
    daily: tuple[float, ...] = ()  # daily shape per slot (log space); () = no daily seasonality
    weekly: tuple[float, ...] = ()  # day-of-week offsets (log space); () = none
    mean_z: float = 0.0
    horizons_s: tuple[float, ...] = ()  # where residual quantiles were measured
    resid_q: Mapping[float, tuple[float, ...]] = field(default_factory=dict)  # quantile → y/ŷ per horizon
    n_bins: int = 0
    backtest_mae: float = math.nan  # at the target horizon, in the series' units
    fallback: bool = False  # too little history: last value, default spread
    kind: str = "ewma"  # "naive" (last value) | "ewma" (damped level) | "holt" (level + damped trend)
    alpha: float = 1.0  # "holt": level smoothing
    beta: float = 0.0  # "holt": trend smoothing

    def season(self, t_s: np.ndarray) -> np.ndarray:
        t = np.asarray(t_s, dtype=float)
        s = np.zeros_like(t)
        if self.daily:
            # linear between slot centres: slot i's value sits at (i + ½)·slot_s into the day
            d = np.asarray(self.daily)
            pos = (t % DAY_S) / self.slot_s - 0.5
            i = np.floor(pos)
            w = pos - i
            i = i.astype(np.int64) % len(d)
            s = s + d[i] * (1.0 - w) + d[(i + 1) % len(d)] * w
        if self.weekly:
            wk = np.asarray(self.weekly)
            s = s + wk[((t % WEEK_S) // DAY_S).astype(np.int64) % 7]
        return s


@dataclass(frozen=True)
class Forecast:
    """p50 and p90 per series at each horizon (seconds after now_s)."""

    now_s: float
    horizons_s: np.ndarray
    p50: Mapping[str, np.ndarray]
    p90: Mapping[str, np.ndarray]
    confidence: Mapping[str, float]  # 0 = fallback (too little history) … 1 = seasonal model with a long history
    seasonal: Mapping[str, bool]

    def quantile(self, name: str, q: float) -> np.ndarray:
        """p50/p90 as stored; other quantiles are interpolated/extrapolated in log space (normal tail)."""
        if q == 0.5:
            return self.p50[name]
        if q == 0.9:
            return self.p90[name]
        z = {0.5: 0.0, 0.9: 1.2815515655446004}
        from scipy.special import ndtri

        lo, hi = np.log(np.maximum(self.p50[name], 1e-12)), np.log(np.maximum(self.p90[name], 1e-12))
        res: np.ndarray = np.exp(lo + (hi - lo) * float(ndtri(q)) / z[0.9])
        return res


@dataclass(frozen=True)
class ForecasterModel:
    config: ForecastConfig
    series: Mapping[str, SeriesModel]
    default: SeriesModel | None = None  # used for a series without its own fit (e.g. a shipped prior)

    def predict(self, history: Mapping[str, tuple[np.ndarray, np.ndarray]], now_s: float,
                horizons_s: Sequence[float] | np.ndarray) -> Forecast:
        """Forecast each fitted series from its recent history (times ≤ now_s are used).

        The history needs only a few half-lives of recent points; a series without a fitted
        model, or without points, gets a last-value fallback (NaN if it has no points at all).
        """
        H = np.asarray(horizons_s, dtype=float)
        p50: dict[str, np.ndarray] = {}
        p90: dict[str, np.ndarray] = {}
        conf: dict[str, float] = {}
        seas: dict[str, bool] = {}
        names = set(self.series) | set(history)
        for name in sorted(names):
            t, y = history.get(name, (np.empty(0), np.empty(0)))
            m = self.series.get(name)
            if m is None and self.default is not None:
                m = replace(self.default, name=name)
            if m is None:
                m = SeriesModel(name=name, step_s=self.config.step_s, half_life_s=self.config.half_lives_s[0],
                                damping=1.0, log_offset=0.0, slot_s=self.config.slot_s, fallback=True)
            a, b, c = _predict_series(m, np.asarray(t, float), np.asarray(y, float), now_s, H, self.config)
            p50[name], p90[name], conf[name] = a, b, c
            seas[name] = bool(m.daily)
            if name not in self.series:
                conf[name] = min(conf[name], 0.3)  # a borrowed model: be cautious
        return Forecast(now_s=now_s, horizons_s=H, p50=p50, p90=p90, confidence=conf, seasonal=seas)


# --------------------------------------------------------------------------- binning


def bin_series(t_s: np.ndarray, y: np.ndarray, step_s: float,
               end_s: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Average (t, y) points into bins [k·step, (k+1)·step) aligned to multiples of step_s.

    Returns (bin start times, mean per bin; NaN where a bin has no finite point). Only bins that
    end at or before end_s are returned (a partly filled last bin would bias the level).
    """
    t = np.asarray(t_s, dtype=float)
    v = np.asarray(y, dtype=float)
    ok = np.isfinite(t) & np.isfinite(v)
    t, v = t[ok], v[ok]
    if len(t) == 0:
        return np.empty(0), np.empty(0)
    k = np.floor(t / step_s).astype(np.int64)
    k0 = int(k.min())
    last = int(k.max()) if end_s is None else int(math.floor(end_s / step_s)) - 1
    if last < k0:
        return np.empty(0), np.empty(0)
    keep = k <= last
    k, v = k[keep], v[keep]
    n = last - k0 + 1
    sums = np.bincount(k - k0, weights=v, minlength=n)[:n]
    counts = np.bincount(k - k0, minlength=n)[:n]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return (np.arange(k0, last + 1) * step_s).astype(float), mean


def _ffill(x: np.ndarray) -> np.ndarray:
    ok = np.isfinite(x)
    if not ok.any():
        return x
    idx = np.where(ok, np.arange(len(x)), 0)
    np.maximum.accumulate(idx, out=idx)
    out = x[idx]
    first = int(np.argmax(ok))
    out[:first] = x[first]
    return out


def _ewma(z: np.ndarray, alpha: float) -> np.ndarray:
    """EWMA with the first value as the start (lfilter: y[n] = α z[n] + (1 − α) y[n − 1])."""
    y, _ = lfilter([alpha], [1.0, alpha - 1.0], z[1:], zi=[(1.0 - alpha) * z[0]])
    return np.concatenate([[z[0]], y])


# --------------------------------------------------------------------------- fitting


def _daily_shape(t0: np.ndarray, logy: np.ndarray, slot_s: float) -> tuple[float, ...]:
    """Mean over whole days of each slot's deviation from its day's mean (circularly smoothed)."""
    n_slots = int(round(DAY_S / slot_s))
    day = np.floor(t0 / DAY_S).astype(np.int64)
    slot = ((t0 % DAY_S) // slot_s).astype(np.int64)
    ok = np.isfinite(logy)
    days = np.unique(day[ok])
    dev_sum = np.zeros(n_slots)
    dev_n = np.zeros(n_slots)
    for d in days:
        m = (day == d) & ok
        sl = np.bincount(slot[m], weights=logy[m], minlength=n_slots)
        cn = np.bincount(slot[m], minlength=n_slots)
        if (cn > 0).sum() < 0.8 * n_slots:  # a partial day would bias the shape
            continue
        mean_slot = np.where(cn > 0, sl / np.maximum(cn, 1), np.nan)
        dev = mean_slot - np.nanmean(mean_slot)
        good = np.isfinite(dev)
        dev_sum[good] += dev[good]
        dev_n[good] += 1
    if (dev_n > 0).sum() < 0.8 * n_slots:
        return ()
    shape = np.where(dev_n > 0, dev_sum / np.maximum(dev_n, 1), 0.0)
    # circular 3-slot smoothing: a slot's mean over few days is noisy
    shape = (np.roll(shape, 1) + shape + np.roll(shape, -1)) / 3.0
    shape -= shape.mean()
    return tuple(float(v) for v in shape)


def _weekly_offsets(t0: np.ndarray, z: np.ndarray) -> tuple[float, ...]:
    """Day-of-week offsets of the (daily-deseasonalised) log series; needs two full weeks."""
    ok = np.isfinite(z)
    dow = ((t0 % WEEK_S) // DAY_S).astype(np.int64)
    day = np.floor(t0 / DAY_S).astype(np.int64)
    days = np.unique(day[ok])
    if len(days) < 14:
        return ()
    per_dow: list[list[float]] = [[] for _ in range(7)]
    for d in days:
        m = (day == d) & ok
        per_dow[int(dow[m][0])].append(float(np.mean(z[m])))
    if any(len(v) < 2 for v in per_dow):
        return ()
    off = np.array([np.mean(v) for v in per_dow])
    off -= off.mean()
    return tuple(float(v) for v in off)


def _holt(z: np.ndarray, alpha: float, beta: float, phi: float) -> tuple[np.ndarray, np.ndarray]:
    """Damped-trend exponential smoothing (Gardner & McKenzie): level and trend after each point."""
    L = np.empty(len(z))
    T = np.empty(len(z))
    lv, tr = float(z[0]), 0.0
    for i, v in enumerate(z.tolist()):
        prev = lv
        lv = alpha * v + (1.0 - alpha) * (lv + phi * tr)
        tr = beta * (lv - prev) + (1.0 - beta) * phi * tr
        L[i] = lv
        T[i] = tr
    return L, T


def _smooth(kind: str, z: np.ndarray, alpha: float, beta: float, phi: float) -> tuple[np.ndarray, np.ndarray]:
    if kind == "naive":
        return z, np.zeros(len(z))
    if kind == "holt":
        return _holt(z, alpha, beta, phi)
    return _ewma(z, alpha), np.zeros(len(z))


def _ahead(kind: str, L: np.ndarray | float, T: np.ndarray | float, phi: float, mean_z: float,
           h: np.ndarray | float | np.integer[Any]) -> np.ndarray | float:
    """Deseasonalised forecast h steps ahead from level L (and trend T)."""
    if kind == "naive":
        return L
    if kind == "holt":
        gain = h if phi >= 1.0 else phi * (1.0 - np.power(phi, h)) / (1.0 - phi)
        return L + T * gain
    return mean_z + np.power(phi, h) * (L - mean_z)


def fit_series(name: str, t_s: np.ndarray, y: np.ndarray, config: ForecastConfig = ForecastConfig()) -> SeriesModel:
    """Fit one series from its history (any spacing; binned to config.step_s).

    Candidates — the last value, damped-level EWMAs and damped-trend Holt smoothers — are scored by
    their MAE at the target horizon over the history (walk-forward, no look-ahead); the best one is
    kept if it beats the last value by `naive_margin`.
    """
    t0, yb = bin_series(t_s, y, config.step_s)
    if len(t0) > config.max_fit_bins:
        t0, yb = t0[-config.max_fit_bins:], yb[-config.max_fit_bins:]
    n_ok = int(np.isfinite(yb).sum())
    if n_ok < config.min_bins:
        return SeriesModel(name=name, step_s=config.step_s, half_life_s=config.half_lives_s[0], damping=1.0,
                           log_offset=float(0.05 * np.nanmean(yb)) if n_ok else 0.0, slot_s=config.slot_s,
                           n_bins=n_ok, fallback=True, kind="naive")
    yb = np.where(np.isfinite(yb), np.maximum(yb, 0.0), np.nan)
    mean = float(np.nanmean(yb))
    offset = max(0.05 * abs(mean), 1e-6)
    logy = np.log(yb + offset)
    span_s = float(t0[-1] - t0[0] + config.step_s)
    daily: tuple[float, ...] = ()
    if span_s >= 2 * DAY_S:
        daily = _daily_shape(t0, logy, config.slot_s)
    base = SeriesModel(name=name, step_s=config.step_s, half_life_s=config.half_lives_s[0], damping=1.0,
                       log_offset=offset, slot_s=config.slot_s, daily=daily)
    if daily and span_s >= 2 * WEEK_S:
        weekly = _weekly_offsets(t0, logy - base.season(t0 + 0.5 * config.step_s))
        if weekly:
            base = replace(base, weekly=weekly)
    # The level is tracked in linear space on the deseasonalised series z = y / e^s(t): a log-space
    # level of a spiky series (zeros, bursts) sits far below its mean and forecasts too low.
    factor = np.exp(base.season(t0 + 0.5 * config.step_s))
    z = yb / factor
    zf = _ffill(z)
    mean_z = float(np.nanmean(z))
    h = max(1, int(round(config.target_horizon_s / config.step_s)))
    # every candidate is scored on the same targets: after a warm-up of 3 of the longest
    # half-lives (capped at a third of the history)
    warm = min(int(3 * max(config.half_lives_s) / config.step_s), len(zf) // 3)
    actual = yb[h:]
    ok = np.isfinite(actual)
    ok[:warm] = False
    cands: list[tuple[str, float, float, float, float]] = [("naive", 1.0, 0.0, 1.0, 0.0)]
    for hl in config.half_lives_s:
        for phi in config.dampings:
            cands.append(("ewma", 1.0 - 0.5 ** (config.step_s / hl), 0.0, phi, hl))
    for a in config.holt_alphas:
        for b in config.holt_betas:
            for phi in config.holt_dampings:
                cands.append(("holt", a, b, phi, 0.0))
    scores: list[tuple[float, int]] = []
    cache: dict[tuple[str, float, float, float], tuple[np.ndarray, np.ndarray]] = {}
    for i, (kind, a, b, phi, _hl) in enumerate(cands):
        if ok.sum() < config.min_scored:
            break
        key = (kind, a, b, phi if kind == "holt" else 0.0)
        if key not in cache:
            cache[key] = _smooth(kind, zf, a, b, phi)
        L, T = cache[key]
        zhat = _ahead(kind, L[:-h], T[:-h], phi, mean_z, h)
        yhat = factor[h:] * np.maximum(zhat, 0.0)
        scores.append((float(np.mean(np.abs(yhat[ok] - actual[ok]))), i))
    if scores:
        naive_mae = scores[0][0]
        best_mae, best_i = min(scores)
        if best_i != 0 and best_mae > (1.0 - config.naive_margin) * naive_mae:
            best_mae, best_i = naive_mae, 0
    else:
        best_mae, best_i = math.nan, 0
    kind, a, b, phi, hl = cands[best_i]
    L, T = _smooth(kind, zf, a, b, phi)
    hs = np.arange(1, max(1, int(round(config.max_horizon_s / config.step_s))) + 1)
    resid_q: dict[float, list[float]] = {q: [] for q in config.quantiles}
    for k in hs:
        e = np.empty(0)
        if k < len(zf):
            yhat = factor[k:] * np.maximum(_ahead(kind, L[:-k], T[:-k], phi, mean_z, k), 0.0)
            # multiplicative error: actual / forecast (0 when the actual is 0)
            e = yb[k:] / np.maximum(yhat, 1e-12)
            e = e[warm:] if len(e) > warm + 5 else e
            e = e[np.isfinite(e)]
        for q in config.quantiles:
            if len(e) >= 5:
                v = float(np.quantile(e, q))
                if q == 0.5:
                    # a median bias measured on few points is mostly noise: none below min_scored
                    # points, then shrunk towards 1
                    w = len(e) / (len(e) + config.median_shrink_n) if len(e) >= config.min_scored else 0.0
                    v = math.exp(math.log(max(v, 1e-6)) * w)
                resid_q[q].append(v)
            elif resid_q[q]:
                resid_q[q].append(resid_q[q][-1])
            else:
                resid_q[q].append(1.0 if q == 0.5 else math.exp(config.default_log_spread))
    return replace(base, half_life_s=float(hl) if kind == "ewma" else 0.0, damping=float(phi), mean_z=mean_z,
                   horizons_s=tuple(float(k * config.step_s) for k in hs),
                   resid_q={q: tuple(v) for q, v in resid_q.items()}, n_bins=n_ok, backtest_mae=float(best_mae),
                   kind=kind, alpha=float(a), beta=float(b))


def fit_forecaster(history: Mapping[str, tuple[np.ndarray, np.ndarray]],
                   config: ForecastConfig = ForecastConfig()) -> ForecasterModel:
    """Fit every named series of `history` ({name: (t_s, values)})."""
    return ForecasterModel(config=config, series={n: fit_series(n, t, y, config) for n, (t, y) in history.items()})


# --------------------------------------------------------------------------- prediction


def _predict_series(m: SeriesModel, t: np.ndarray, y: np.ndarray, now_s: float, H: np.ndarray,
                    config: ForecastConfig) -> tuple[np.ndarray, np.ndarray, float]:
    keep = np.isfinite(t) & np.isfinite(y) & (t <= now_s)
    t, y = t[keep], y[keep]
    if len(t) == 0:
        nan = np.full(len(H), np.nan)
        return nan, nan, 0.0
    if m.fallback or len(t) < 2:
        # too little history: the last value, with the default spread
        last = float(y[-1])
        return np.full(len(H), last), np.full(len(H), last * math.exp(config.default_log_spread)), 0.0
    # bins up to the last one that is complete at now_s; the partial current bin still counts as a point
    t0, yb = bin_series(t, y, m.step_s, end_s=now_s + m.step_s)
    z = _ffill(np.maximum(yb, 0.0) / np.exp(m.season(t0 + 0.5 * m.step_s)))
    if len(z):
        Ls, Ts = _smooth(m.kind, z, m.alpha, m.beta, m.damping)
        L, T = float(Ls[-1]), float(Ts[-1])
    else:
        L, T = m.mean_z, 0.0
    steps = np.maximum(H / m.step_s, 0.0)
    zhat = np.asarray(_ahead(m.kind, L, T, m.damping, m.mean_z, steps), dtype=float) * np.ones(len(H))
    # the forecast is for the bin centred at now + H
    yhat = np.exp(m.season(now_s + H)) * np.maximum(zhat, 0.0)
    hs = np.asarray(m.horizons_s) if m.horizons_s else np.array([m.step_s])

    def band(q: float, default: float) -> np.ndarray:
        r = m.resid_q.get(q)
        if not r:
            return np.full(len(H), default)
        res: np.ndarray = np.interp(H, hs, np.asarray(r))
        return res

    p50 = np.maximum(yhat * band(0.5, 1.0), 0.0)
    p90 = np.maximum(yhat * band(0.9, math.exp(config.default_log_spread)), p50)
    # confidence: how much history backs the fit (a day of bins → 0.5, more → towards 1), seasonal or not
    n_day = DAY_S / m.step_s
    conf = float(m.n_bins / (m.n_bins + n_day))
    if m.daily:
        conf = max(conf, 0.8)
    return p50, p90, conf



# --------------------------------------------------------------------------- the planner's interface


@dataclass(frozen=True)
class LearnedForecaster:
    """A fitted `ForecasterModel` behind the planner's `Forecaster` interface, for one of its series.

    `series` names the model's series the history passed in is of ("arrival_rps": the fleet's
    arrivals, see controller/core/features.forecast_series); a model without that series
    forecasts it with its default or a last-value fallback (`ForecasterModel.predict`). A series
    with no usable point forecasts 0, as the prior does. The level is the newest finite value
    (as the prior's), the trend the p50's mean slope over the leads. Example: p50 10 → 12 req/s
    from lead 15 s to 285 s → trend 0.0074 req/s per s.
    """

    model: ForecasterModel
    series: str = "arrival_rps"

    def forecast(self, t_s: np.ndarray, y: np.ndarray, now_s: float, lead_s: np.ndarray) -> LoadForecast:
        t_s = np.asarray(t_s, dtype=float)
        y = np.asarray(y, dtype=float)
        lead_s = np.asarray(lead_s, dtype=float)
        f = self.model.predict({self.series: (t_s, y)}, now_s, lead_s)
        p50 = np.nan_to_num(np.asarray(f.p50[self.series], dtype=float), nan=0.0)
        p90 = np.maximum(np.nan_to_num(np.asarray(f.p90[self.series], dtype=float), nan=0.0), p50)
        ok = np.isfinite(t_s) & np.isfinite(y) & (t_s <= now_s)
        level = float(max(y[ok][-1], 0.0)) if ok.any() else 0.0
        span_s = float(lead_s[-1] - lead_s[0]) if len(lead_s) > 1 else 0.0
        trend = float(p50[-1] - p50[0]) / span_s if span_s > 0 else 0.0
        return LoadForecast(lead_s, p50, p90, level, trend, method="learned")
