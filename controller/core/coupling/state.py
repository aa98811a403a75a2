"""CouplingModels ⇄ a dict of plain values, numpy arrays and fitted estimators (the store persists
it with skops: controller/learning/store.py).

Must not: do I/O or construct estimators (it only checks the ones it is given).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from controller.core.coupling.bundle import CouplingModels
from controller.core.coupling.corrections import Correction
from controller.core.coupling.features import ALL_TARGETS, CACHE_FEATURE_NAMES, LATENCY_FEATURE_NAMES
from controller.core.coupling.physics import Calibration, PoolPhysics

STATE_FORMAT = "governor-coupling/1"


def coupling_to_state(models: CouplingModels) -> dict[str, Any]:
    """A dict of plain values, numpy arrays and fitted estimators (what the store persists with skops)."""
    return {
        "format": STATE_FORMAT,
        "physics": [p.to_dict() for p in models.physics],
        "corrections": {
            name: {"target": c.target, "quantile": c.quantile, "estimator": c.estimator, "n_train": c.n_train,
                   "lo": np.asarray(c.lo, dtype=float), "hi": np.asarray(c.hi, dtype=float),
                   "scale": np.asarray(c.scale, dtype=float), "data_weight": c.data_weight,
                   "residual_clip": c.residual_clip}
            for name, c in models.corrections.items()},
        "seed": models.seed,
        "n_train": models.n_train,
        "train_window_s": [float(models.train_window_s[0]), float(models.train_window_s[1])],
        "holdout_errors": {k: float(v) for k, v in models.holdout_errors.items()},
        "calibration": {k: [c.time_scale, c.wait_scale, c.ttft_tail_width] for k, c in models.calibration.items()},
    }


def coupling_from_state(state: Mapping[str, Any]) -> CouplingModels:
    """Rebuild CouplingModels from `coupling_to_state` output. ValueError names what is wrong."""
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        got = state.get("format") if isinstance(state, Mapping) else type(state).__name__
        raise ValueError(f"not a coupling-model state (format {got!r}, expected {STATE_FORMAT!r})")
    physics = tuple(PoolPhysics.from_dict(p) for p in state["physics"])
    n_feat = {"hit_rate": len(CACHE_FEATURE_NAMES)}
    corrections: dict[str, Correction] = {}
    for name, c in state["corrections"].items():
        base = name.split("@")[0]
        if base not in ALL_TARGETS:
            raise ValueError(f"corrections: unknown target {name!r}; known: {list(ALL_TARGETS)}")
        m = n_feat.get(base, len(LATENCY_FEATURE_NAMES))
        est = c["estimator"]
        if est is not None:
            coef = np.asarray(getattr(est, "coef_", None), dtype=float)
            if coef.shape != (m,) or not np.all(np.isfinite(coef)):
                raise ValueError(f"corrections.{name}: estimator has coefficients of shape {coef.shape}, "
                                 f"expected ({m},) finite values")
        lo, hi, scale = (np.asarray(c[k], dtype=float) for k in ("lo", "hi", "scale"))
        if lo.shape != (m,) or hi.shape != (m,) or scale.shape != (m,) or np.any(scale <= 0):
            raise ValueError(f"corrections.{name}: bounds must have shape ({m},) and positive scales")
        dw = float(c["data_weight"])
        if not 0.0 <= dw <= 1.0:
            raise ValueError(f"corrections.{name}: data_weight {dw} outside [0, 1]")
        corrections[name] = Correction(target=str(c["target"]), quantile=float(c["quantile"]), estimator=est,
                                       n_train=int(c["n_train"]), lo=lo, hi=hi, scale=scale, data_weight=dw,
                                       residual_clip=float(c.get("residual_clip", 3.0)))
    w = state.get("train_window_s", [0.0, 0.0])
    return CouplingModels(physics=physics, corrections=corrections, seed=int(state.get("seed", 0)),
                          n_train=int(state.get("n_train", 0)), train_window_s=(float(w[0]), float(w[1])),
                          holdout_errors={k: float(v) for k, v in (state.get("holdout_errors") or {}).items()},
                          calibration={str(k): Calibration(float(v[0]), float(v[1]),
                                                           float(v[2]) if len(v) > 2 else 1.0)
                                       for k, v in (state.get("calibration") or {}).items()})
