"""The learned forecaster as plain state (dicts, lists, numbers) for storage, and back.

Must not: do I/O (controller/learning/store.py writes and reads the state).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from controller.core.forecast.learned import ForecastConfig, ForecasterModel, SeriesModel

STATE_FORMAT = "governor-forecast/1"
_CONFIG_FIELDS = ("step_s", "target_horizon_s", "max_horizon_s", "half_lives_s", "dampings", "holt_alphas",
                  "holt_betas", "holt_dampings", "naive_margin", "min_scored", "median_shrink_n", "slot_s",
                  "min_bins", "quantiles", "default_log_spread", "max_fit_bins")


def _series_to_state(m: SeriesModel) -> dict[str, Any]:
    return {"name": m.name, "step_s": m.step_s, "half_life_s": m.half_life_s, "damping": m.damping,
            "log_offset": m.log_offset, "slot_s": m.slot_s, "daily": list(m.daily), "weekly": list(m.weekly),
            "mean_z": m.mean_z, "horizons_s": list(m.horizons_s),
            "resid_q": {str(q): list(v) for q, v in m.resid_q.items()}, "n_bins": m.n_bins,
            "backtest_mae": None if math.isnan(m.backtest_mae) else m.backtest_mae, "fallback": m.fallback,
            "kind": m.kind, "alpha": m.alpha, "beta": m.beta}


def _series_from_state(d: Mapping[str, Any]) -> SeriesModel:
    kind = str(d.get("kind", "ewma"))
    if kind not in ("naive", "ewma", "holt"):
        raise ValueError(f"series {d.get('name')!r}: unknown kind {kind!r}")
    mae = d.get("backtest_mae")
    return SeriesModel(
        name=str(d["name"]), step_s=float(d["step_s"]), half_life_s=float(d["half_life_s"]),
        damping=float(d["damping"]), log_offset=float(d["log_offset"]), slot_s=float(d["slot_s"]),
        daily=tuple(float(v) for v in d.get("daily", ())), weekly=tuple(float(v) for v in d.get("weekly", ())),
        mean_z=float(d["mean_z"]), horizons_s=tuple(float(v) for v in d.get("horizons_s", ())),
        resid_q={float(q): tuple(float(x) for x in v) for q, v in (d.get("resid_q") or {}).items()},
        n_bins=int(d.get("n_bins", 0)), backtest_mae=math.nan if mae is None else float(mae),
        fallback=bool(d.get("fallback", False)), kind=kind, alpha=float(d.get("alpha", 1.0)),
        beta=float(d.get("beta", 0.0)))


def forecaster_to_state(model: ForecasterModel) -> dict[str, Any]:
    cfg = {k: (list(getattr(model.config, k)) if isinstance(getattr(model.config, k), tuple)
               else getattr(model.config, k)) for k in _CONFIG_FIELDS}
    return {"format": STATE_FORMAT, "config": cfg,
            "series": {n: _series_to_state(m) for n, m in model.series.items()},
            "default": _series_to_state(model.default) if model.default is not None else None}


def forecaster_from_state(state: Mapping[str, Any]) -> ForecasterModel:
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        got = state.get("format") if isinstance(state, Mapping) else type(state).__name__
        raise ValueError(f"not a forecaster state (format {got!r}, expected {STATE_FORMAT!r})")
    c = dict(state["config"])
    unknown = set(c) - set(_CONFIG_FIELDS)
    if unknown:
        raise ValueError(f"forecaster config: unknown field(s) {sorted(unknown)}")
    for k, v in list(c.items()):
        if isinstance(v, list):
            c[k] = tuple(float(x) for x in v)
    config = ForecastConfig(**c)
    series = {str(n): _series_from_state(d) for n, d in state["series"].items()}
    default = _series_from_state(state["default"]) if state.get("default") is not None else None
    return ForecasterModel(config=config, series=series, default=default)

