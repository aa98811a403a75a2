"""A fitted residual correction of a prior, and its confidence (how close a query is to its data).

    log ŷ = log prior_cal + w · r̂(x)        logit ŷ = logit prior + w · r̂(x)

r̂ is a linear quantile regression on the features of controller/core/coupling/features.py; w is
`data_weight` × coverage. Fitting (and the cross-validation that decides whether a correction is
kept) is at the learning edge: controller/learning/fit.py.

Must not: fit (no scikit-learn import here: a Correction only reads the estimator's coef_ and
intercept_).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from controller.core.coupling.numeric import clamp


def _coverage(X: np.ndarray, lo: np.ndarray, hi: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """exp(−½ Σ_j d_j²), d_j = distance of X[:, j] outside [lo_j, hi_j] in units of scale_j.
    (One temporary, the rest in place: this runs on every bulk predict.)"""
    d = np.maximum(X, lo)
    np.minimum(d, hi, out=d)
    np.subtract(X, d, out=d)
    d *= 1.0 / scale
    s = np.einsum("ij,ij->i", d, d)
    s *= -0.5
    res: np.ndarray = np.exp(s, out=s)
    return res


@dataclass(frozen=True)
class Correction:
    """A fitted residual model r̂(x) with the support of its training data.

    `estimator` is a fitted scikit-learn regressor (or None: prior only). lo/hi/scale describe
    the training features (1st/99th percentiles and standard deviation) for the coverage weight.
    """

    target: str
    quantile: float
    estimator: Any
    n_train: int
    lo: np.ndarray
    hi: np.ndarray
    scale: np.ndarray
    data_weight: float
    residual_clip: float = 3.0  # |r̂| is clipped: a correction never moves the prior by more than e^3

    def weight(self, X: np.ndarray) -> np.ndarray:
        """Per-row confidence: data_weight × coverage (exp(−½ Σ d²), d = distance outside the
        training range in units of the feature's spread). 0 without training data."""
        if self.data_weight <= 0.0:
            return np.zeros(len(X))
        return self.data_weight * _coverage(X, self.lo, self.hi, self.scale)

    def residual(self, X: np.ndarray) -> np.ndarray:
        if self.estimator is None:
            return np.zeros(len(X))
        r = X @ self._coef() + self._intercept()
        return clamp(r, -self.residual_clip, self.residual_clip)

    def coverage_tail(self, S: np.ndarray) -> np.ndarray:
        """Coverage (no data weight) over the features after the first (the shared latency columns)."""
        return _coverage(S, self.lo[1:], self.hi[1:], self.scale[1:])

    def residual_split(self, first: np.ndarray, S: np.ndarray) -> np.ndarray:
        """residual(column_stack([first, S])) without building the stacked matrix."""
        if self.estimator is None:
            return np.zeros(len(S))
        coef = self._coef()
        r = first * coef[0] + S @ coef[1:] + self._intercept()
        return clamp(r, -self.residual_clip, self.residual_clip)

    def _coef(self) -> np.ndarray:
        return np.asarray(self.estimator.coef_, dtype=float)

    def _intercept(self) -> float:
        return float(self.estimator.intercept_)
