"""The prior load forecaster: level, damped trend and empirical spread from the series' own history.

Needs no fitting and no stored model: it reads the recent history of the series it forecasts
(see `PriorForecaster`). The MPC policy's forecaster.

Must not: do I/O, read the clock (time is the `now_s` argument) or keep state between calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from controller.core.forecast.interface import LoadForecast


@dataclass(frozen=True)
class PriorForecaster:
    """Level + damped trend + empirical spread, from the series' own recent history.

    - level: the newest value (a windowed rate, so already smoothed);
    - trend: least-squares slope over the last `trend_window_s` (at least
      `min_trend_samples` points), damped with time constant `damping_s` and moving the
      forecast by at most `max_trend_frac` of the level (a trend never runs away over the
      horizon), kept only when it is larger than twice its standard error (noise is not a
      trend);
    - spread: for lead L, an additive deviation (see `_spread`): the p90 is p50 + spread,
      at most `max_rel_spread` × the larger of the level and the history's peak.
    """

    trend_window_s: float = 300.0
    damping_s: float = 150.0
    min_rel_spread: float = 0.03
    max_rel_spread: float = 1.0
    max_trend_frac: float = 0.25
    min_trend_samples: int = 8
    window_s: float = 60.0

    def forecast(self, t_s: np.ndarray, y: np.ndarray, now_s: float, lead_s: np.ndarray) -> LoadForecast:
        t_s = np.asarray(t_s, dtype=float)
        y = np.asarray(y, dtype=float)
        lead_s = np.asarray(lead_s, dtype=float)
        ok = np.isfinite(y)
        t_s, y = t_s[ok], y[ok]
        if len(y) == 0:
            z = np.zeros_like(lead_s)
            return LoadForecast(lead_s, z, z, 0.0, 0.0)
        level = float(max(y[-1], 0.0))
        trend = 0.0
        recent = t_s > now_s - self.trend_window_s
        if recent.sum() >= self.min_trend_samples:
            tt, yy = t_s[recent], y[recent]
            tm = tt.mean()
            den = float(((tt - tm) ** 2).sum())
            if den > 0:
                slope = float(((tt - tm) * (yy - yy.mean())).sum() / den)
                resid = yy - (yy.mean() + slope * (tt - tm))
                se = math.sqrt(float((resid**2).sum()) / max(len(yy) - 2, 1) / den)
                if abs(slope) > 2.0 * se:
                    trend = slope
                    # the newest value is a window mean centred half a window back
                    level = max(level + trend * 0.5 * self.window_s, 0.0)
        grow = self.damping_s * (1.0 - np.exp(-lead_s / self.damping_s))
        # a trend moves the forecast by at most max_trend_frac of the level (it is local, not a law)
        move = np.clip(trend * grow, -self.max_trend_frac * level, self.max_trend_frac * level)
        p50 = np.maximum(level + move, 0.0)
        spread = np.array([self._spread(t_s, y, float(L), level) for L in lead_s])
        p90 = p50 + np.minimum(spread, self.max_rel_spread * max(level, float(np.max(y))))
        return LoadForecast(lead_s, p50, p90, level, trend)

    def _spread(self, t_s: np.ndarray, y: np.ndarray, lead: float, level: float) -> float:
        """Additive p90 deviation at `lead` (req/s): empirical when the history covers it, else a prior.

        Empirical: the 90th percentile of |y(t+L) − y(t) − mean drift| over the history
        (additive, so a bursty series that drops to zero between bursts keeps capacity for
        the next one). The prior grows with the lead and saturates (rates revert to a level;
        they are not a random walk): level × (0.05 + 0.2 × min(1, lead / 600 s)), never below
        Poisson noise. Example: level 20 req/s, the series moved ±2.4 req/s over 5 minutes
        before → p90 at 5 minutes = p50 + 2.4.
        """
        noise = 1.28 * math.sqrt(max(level, 0.0) / self.window_s)
        base = self.min_rel_spread * level + noise
        prior = max(base, level * (0.05 + 0.2 * min(1.0, lead / 600.0)))
        if len(y) < 3:
            return prior
        dt = float(np.median(np.diff(t_s))) if len(t_s) > 1 else 15.0
        k = max(1, int(round(lead / max(dt, 1e-9))))
        if len(y) > k + 8:
            dev = y[k:] - y[:-k]
            emp = float(np.quantile(np.abs(dev - dev.mean()), 0.9))
            # blend towards the prior while the history holds few independent windows
            w = min(1.0, len(dev) * dt / (4.0 * max(lead, self.window_s)))
            return max(base, w * emp + (1 - w) * prior)
        return prior
