"""Fitting the coupling models at the learning edge: the prior's calibration per replica type,
then the residual corrections (scikit-learn quantile regressions), each kept only if it beats
what it corrects on cross-validation (whole runs held out, else time blocks).

`fit_coupling(data, physics, rng)` returns a new immutable CouplingModels; the core only
predicts with it (controller/core/coupling/).

Must not: do I/O, read the clock or use global randomness (the rng is passed in; subsampling is
the only random step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from controller.core.coupling import (
    CACHE_FEATURE_NAMES,
    LATENCY_TARGETS,
    UPPER_TARGETS,
    Calibration,
    Correction,
    CouplingModels,
    PhysicsTable,
    PoolPhysics,
    cache_features,
    cache_prior,
    latency_features,
    latency_prior,
)
from controller.core.coupling.numeric import logit, sigmoid
from controller.learning.training_data import (
    TrainingData,
    engine_not_saturated,
    valid_cache_rows,
    valid_latency_rows,
)

# --------------------------------------------------------------------------- corrections


@dataclass(frozen=True)
class CorrectionConfig:
    """How corrections are fitted. `kind`: "linear" (QuantileRegressor, median) or "none" (prior only)."""

    kind: str = "linear"
    min_rows: int = 30  # below this, no correction: the prior alone answers
    shrink_rows: float = 20.0  # data_weight = 1 − exp(−n / shrink_rows)
    alpha: float = 1e-3  # L1 penalty of the quantile regression (features are O(1))
    max_fit_rows: int = 4000  # subsample (seeded) above this to bound fit time
    upper_quantile: float = 0.9
    max_train_rho: float = 0.95  # latency rows with a higher prior engine utilisation are not fitted
    cv_folds: int = 3  # time-blocked cross-validation that decides whether a correction is kept
    cv_min_gain: float = 0.97  # kept only if its held-out loss is below this share of the prior's
    # held-out loss of a median correction: "ape" = absolute percentage error in the target's own
    # units (the acceptance metric), "pinball" = pinball loss of the log residual
    cv_loss: str = "ape"
    calibrate: bool = True  # fit the prior's time and wait scales per replica type first
    max_calibration_rho: float = 1.3  # rows considered by the calibration (by the uncalibrated prior)

    def __post_init__(self) -> None:
        if self.cv_loss not in ("ape", "pinball"):
            raise ValueError(f"CorrectionConfig.cv_loss = {self.cv_loss!r}; allowed: 'ape', 'pinball'")
        if self.kind not in ("linear", "none"):
            raise ValueError(f"CorrectionConfig.kind = {self.kind!r}; allowed: 'linear', 'none'")
        if self.min_rows < 1 or self.shrink_rows <= 0:
            raise ValueError(f"CorrectionConfig: need min_rows >= 1 and shrink_rows > 0 "
                             f"(got {self.min_rows}, {self.shrink_rows})")


def _pinball(r: np.ndarray, q: float) -> float:
    return float(np.mean(np.maximum(q * r, (q - 1.0) * r)))


def _cv_folds(t: np.ndarray, groups: np.ndarray | None, k: int) -> list[np.ndarray]:
    """Held-out folds: whole runs (groups) dealt round-robin into k folds when there are at least
    k runs — a model must carry over to a run it never saw, as it must in service — else k
    consecutive time blocks (one run: a daemon's own history)."""
    if groups is not None:
        runs = np.unique(groups)
        if len(runs) >= k:
            return [np.flatnonzero(np.isin(groups, runs[i::k])) for i in range(k)]
    order = np.argsort(t, kind="stable")
    return list(np.array_split(order, k))


def _fit_correction(target: str, X: np.ndarray, r: np.ndarray, quantile: float, cfg: CorrectionConfig,
                    rng: np.random.Generator, t_s: np.ndarray | None = None,
                    logit_base: np.ndarray | None = None, groups: np.ndarray | None = None) -> Correction:
    """Fit one residual model, or decline to.

    The correction is kept only if it beats the prior on time-blocked cross-validation (the rows
    split into `cv_folds` consecutive blocks; each block predicted by a model fitted on the
    others): a correction that only fits noise, or that does not carry over to another stretch of
    time, is dropped and the (calibrated) prior answers alone. The training support (lo/hi/scale)
    and the data weight are kept either way: they make the confidence value.
    """
    ok = np.all(np.isfinite(X), axis=1) & np.isfinite(r)
    X, r = X[ok], r[ok]
    base_l = logit_base[ok] if logit_base is not None else None
    g = groups[ok] if groups is not None else None
    t = t_s[ok] if t_s is not None else np.arange(len(r), dtype=float)
    n = len(r)
    m = X.shape[1]
    if cfg.kind == "none" or n < cfg.min_rows:
        return Correction(target, quantile, None, n, np.zeros(m), np.zeros(m), np.ones(m), 0.0)
    if n > cfg.max_fit_rows:
        idx = np.sort(rng.choice(n, size=cfg.max_fit_rows, replace=False))
        X, r, t = X[idx], r[idx], t[idx]
        base_l = base_l[idx] if base_l is not None else None
        g = g[idx] if g is not None else None
    from sklearn.linear_model import QuantileRegressor  # imported lazily: sklearn is heavy to import

    def fit(Xa: np.ndarray, ra: np.ndarray) -> Any:
        est = QuantileRegressor(quantile=quantile, alpha=cfg.alpha, fit_intercept=True, solver="highs")
        return est.fit(Xa, ra)

    lo = np.percentile(X, 1, axis=0)
    hi = np.percentile(X, 99, axis=0)
    scale = np.maximum(np.std(X, axis=0), 1e-3) * 0.5
    # shrink the correction towards the prior while the data is thin: 30 rows → 0.78, 60 → 0.95
    data_weight = float(1.0 - math.exp(-n / cfg.shrink_rows))
    keep = True
    if cfg.cv_folds >= 2:
        folds = _cv_folds(t, g, cfg.cv_folds)
        loss_corr = loss_prior = 0.0
        for f in folds:
            train = np.ones(len(r), dtype=bool)
            train[f] = False
            if train.sum() < cfg.min_rows or len(f) == 0:
                continue
            est = fit(X[train], r[train])
            pred = np.clip(X[f] @ est.coef_ + est.intercept_, -3.0, 3.0)
            # the prior's own quantile: no correction for the median, the training quantile of the
            # residuals for an upper band
            base = 0.0 if quantile == 0.5 else float(np.quantile(r[train], quantile))
            if quantile == 0.5 and cfg.cv_loss == "ape" and base_l is not None:
                # a logit-space target (hit rate) is judged by its absolute error in its own units
                y_f = sigmoid(base_l[f] + r[f])
                loss_corr += float(np.sum(np.abs(sigmoid(base_l[f] + pred) - y_f)))
                loss_prior += float(np.sum(np.abs(sigmoid(base_l[f] + base) - y_f)))
            elif quantile == 0.5 and cfg.cv_loss == "ape":
                # judged as the acceptance metric judges a prediction: |ŷ − y| / y = |e^(r̂ − r) − 1|
                # (an over-prediction by e^2 costs 6.4, an under-prediction at most 1)
                loss_corr += float(np.sum(np.abs(np.expm1(pred - r[f]))))
                loss_prior += float(np.sum(np.abs(np.expm1(base - r[f]))))
            else:
                loss_corr += _pinball(r[f] - pred, quantile) * len(f)
                loss_prior += _pinball(r[f] - base, quantile) * len(f)
        keep = loss_corr < cfg.cv_min_gain * loss_prior
    est = fit(X, r) if keep else None
    return Correction(target, quantile, est, n, lo, hi, scale, data_weight)


# --------------------------------------------------------------------------- the models


def fit_coupling(data: TrainingData, physics: Sequence[PoolPhysics], rng: np.random.Generator,
                 config: CorrectionConfig = CorrectionConfig(), seed: int = 0) -> CouplingModels:
    """Fit every correction on the steady rows of `data` (time order does not matter here).

    Targets with fewer than `config.min_rows` usable rows keep the prior alone (confidence 0).
    Deterministic for a given rng state (subsampling is the only random step).
    """
    table = PhysicsTable(physics)
    corrections: dict[str, Correction] = {}
    m = valid_cache_rows(data)
    if m.any():
        sub = data.subset(m)
        prior = cache_prior(table, sub.cache)
        X = cache_features(prior, sub.cache)
        y = np.clip(sub.targets["hit_rate"], 0.0, 1.0)
        r = logit(np.clip(y, 2e-3, 0.998)) - logit(np.maximum(prior.hit_rate, 1e-4))
        corrections["hit_rate"] = _fit_correction("hit_rate", X, r, 0.5, config, rng, sub.t_s,
                                                  logit_base=logit(np.maximum(prior.hit_rate, 1e-4)),
                                                  groups=sub.aux.get("run"))
    else:
        corrections["hit_rate"] = _fit_correction("hit_rate", np.zeros((0, len(CACHE_FEATURE_NAMES))), np.zeros(0),
                                                  0.5, config, rng)
    calibration = calibrate(data, physics, config) if config.calibrate else {}
    table = PhysicsTable(physics, calibration)
    prior_all = latency_prior(table, data.latency)
    # Saturated windows (queues growing without bound) are left out: their latency is a matter of
    # how long the queue has been growing, not of the load, and a few of them would bend the fit.
    operating = (prior_all.rho_engine < config.max_train_rho) & engine_not_saturated(data)
    runs = data.aux.get("run")
    for t in LATENCY_TARGETS + ("gpu_busy_frac",):
        m = valid_latency_rows(data, t) & operating
        X = latency_features(prior_all, data.latency, t)[m]
        r = np.log(data.targets[t][m]) - np.log(np.maximum(getattr(prior_all, t)[m], 1e-4))
        g = runs[m] if runs is not None else None
        corrections[t] = _fit_correction(t, X, r, 0.5, config, rng, data.t_s[m], groups=g)
        if t in UPPER_TARGETS:
            corrections[t + "@upper"] = _fit_correction(t + "@upper", X, r, config.upper_quantile, config, rng,
                                                        data.t_s[m], groups=g)
    t_s = data.t_s
    window = (float(t_s.min()), float(t_s.max())) if len(t_s) else (0.0, 0.0)
    return CouplingModels(physics=tuple(physics), corrections=corrections, seed=seed, n_train=len(data),
                          train_window_s=window, calibration=calibration)


# --------------------------------------------------------------------------- calibration

CALIBRATION_TARGETS = ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s")


def calibrate(data: TrainingData, physics: Sequence[PoolPhysics], config: CorrectionConfig) -> dict[str, Calibration]:
    """Fit (time_scale, wait_scale) per replica type: robust least squares (soft-L1 on log ratios)
    of the prior's p50/p95 TTFT and p50 TPOT against the observed steady windows.

    TPOT p95 is left out on purpose: it jumps between a decode step and a prefill-chunk step as
    the share of chunk steps crosses 5 %, which would pull time_scale around. Replica types with
    fewer than config.min_rows usable rows stay uncalibrated.
    """
    from scipy.optimize import least_squares  # lazily: fitting only

    out: dict[str, Calibration] = {}
    base_table = PhysicsTable(physics)
    prior0 = latency_prior(base_table, data.latency)
    for k, ph in enumerate(physics):
        rows = ((data.latency.physics_index == k) & (prior0.rho_engine < config.max_calibration_rho)
                & engine_not_saturated(data))
        masks = {t: rows & valid_latency_rows(data, t) for t in CALIBRATION_TARGETS}
        if int(np.any(np.column_stack(list(masks.values())), axis=1).sum()) < config.min_rows:
            continue
        sub_idx = np.flatnonzero(np.any(np.column_stack(list(masks.values())), axis=1))
        sub = data.subset(np.isin(np.arange(len(data)), sub_idx))
        ys = {t: sub.targets[t] for t in CALIBRATION_TARGETS}
        oks = {t: valid_latency_rows(sub, t) for t in CALIBRATION_TARGETS}

        def residuals(theta: np.ndarray, sub: TrainingData = sub, ys=ys, oks=oks, ph=ph) -> np.ndarray:
            cal = {ph.key: Calibration(float(np.exp(theta[0])), float(np.exp(theta[1])))}
            pr = latency_prior(PhysicsTable(physics, cal), sub.latency)
            parts = [np.log(np.maximum(getattr(pr, t)[oks[t]], 1e-6)) - np.log(ys[t][oks[t]])
                     for t in CALIBRATION_TARGETS]
            return np.concatenate(parts)

        lim = math.log(5.0)

        def solve(mask: np.ndarray, sub: TrainingData = sub, lim: float = lim) -> Calibration:
            part = sub.subset(mask)
            ys_p = {t: part.targets[t] for t in CALIBRATION_TARGETS}
            oks_p = {t: valid_latency_rows(part, t) for t in CALIBRATION_TARGETS}
            res = least_squares(lambda th: residuals(th, part, ys_p, oks_p), x0=np.zeros(2),
                                bounds=([-lim, -lim], [lim, lim]), loss="soft_l1", f_scale=0.3, max_nfev=60,
                                diff_step=1e-3)
            return Calibration(float(np.exp(res.x[0])), float(np.exp(res.x[1])))

        def with_tail(part: TrainingData, cal: Calibration, ph: PoolPhysics = ph) -> Calibration:
            """The TTFT tail width (grid) that minimises the p95's absolute percentage error."""
            ok = valid_latency_rows(part, "ttft_p95_s")
            if not ok.any():
                return cal
            y = part.targets["ttft_p95_s"][ok]
            best, best_loss = cal, math.inf
            for w in TTFT_TAIL_GRID:
                c = replace(cal, ttft_tail_width=float(w))
                pr = latency_prior(PhysicsTable(physics, {ph.key: c}), part.subset(ok).latency)
                loss = float(np.mean(np.abs(pr.ttft_p95_s - y) / y))
                if loss < best_loss - 1e-12:
                    best, best_loss = c, loss
            return best

        def solve_full(mask: np.ndarray, sub: TrainingData = sub) -> Calibration:
            return with_tail(sub.subset(mask), solve(mask))

        def solve_tail(mask: np.ndarray, sub: TrainingData = sub) -> Calibration:
            return with_tail(sub.subset(mask), Calibration())

        # the full calibration, else the TTFT tail alone, each only if it pays on held-out time blocks
        for solver in (solve_full, solve_tail):
            if config.cv_folds < 2 or _calibration_pays(sub, physics, ph.key, solver, config):
                out[ph.key] = solver(np.ones(len(sub), dtype=bool))
                break
    return out


TTFT_TAIL_GRID = (0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2, 1.3, 1.5)


def _calibration_pays(sub: TrainingData, physics: Sequence[PoolPhysics], key: str, solve,
                      config: CorrectionConfig) -> bool:
    """Cross-validation of a calibration (folds of whole runs, else time blocks: _cv_folds): each
    fold is predicted by the calibration fitted on the others, scored by the absolute percentage
    error of the p95s (the acceptance metric) on its rows below max_train_rho, against the
    uncalibrated prior. Kept if it wins by the same margin a correction must (cv_min_gain)."""
    loss_cal = loss_prior = 0.0
    prior0 = latency_prior(PhysicsTable(physics), sub.latency)
    for f in _cv_folds(sub.t_s, sub.aux.get("run"), config.cv_folds):
        hold = np.zeros(len(sub), dtype=bool)
        hold[f] = True
        if (~hold).sum() < config.min_rows or not hold.any():
            continue
        cal = solve(~hold)
        pr = latency_prior(PhysicsTable(physics, {key: cal}), sub.latency)
        for t in ("ttft_p95_s", "tpot_p95_s"):
            ok = hold & valid_latency_rows(sub, t) & (prior0.rho_engine < config.max_train_rho)
            y = sub.targets[t][ok]
            loss_cal += float(np.sum(np.abs(getattr(pr, t)[ok] - y) / y))
            loss_prior += float(np.sum(np.abs(getattr(prior0, t)[ok] - y) / y))
    return loss_cal < config.cv_min_gain * loss_prior
