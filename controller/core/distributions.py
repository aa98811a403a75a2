"""Normal and log-normal tail statistics shared by the planner and the coupling priors.

`ndtr_saturated` is Φ(x) and `upper_tail` 1 − Φ(z), both the values scipy's ndtr gives, with
the saturated arguments (where the answer is exactly 0 or 1 in double precision) set directly
instead of evaluated; `lognormal_quantile` is a quantile of a log-normal given its mean;
`PROMPT_LOG_SIGMA` the log-spread of per-request prompt lengths both priors assume.

Must not: know about pools, plans or models; change a value scipy's ndtr would give.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy.special import ndtr, ndtri

FloatArray = npt.NDArray[np.float64]

# Spread of per-request prompt lengths in log space: prompt lengths are close to log-normal with
# σ ≈ 1 (the Azure 2023 chat trace fits 0.99; the ServeGen synthesis uses 1.0). The priors use it
# to turn a mean prompt into prompt quantiles and into the mean of the squared prompt.
PROMPT_LOG_SIGMA = 1.0

# |z| beyond which 1 − Φ(z) is exactly 0 (z > 0) or exactly 1 (z < 0) in double precision, and Φ(z)
# exactly 1 (z > 0): Φ(9) misses 1 by 1e-19, under half an ulp of 1 (checked on a grid of z from 9
# to 1e300, and ±inf).
SATURATED_Z = 9.0


def ndtr_saturated(x: npt.ArrayLike) -> FloatArray:
    """Φ(x), the same values as scipy's ndtr, without evaluating it where it is exactly 1 (x > 9):
    ndtr dominates the cost where it is called on many values, and most Halfin–Whitt
    β (= (1 − ρ)·√slots, tens of slots) lie beyond 9."""
    x = np.asarray(x, dtype=float)
    one = x > SATURATED_Z
    n_one = int(np.count_nonzero(one))
    if n_one < x.size // 8:  # few saturated: masking would cost more than it saves
        full: FloatArray = ndtr(x)
        return full
    out = np.ones_like(x)
    rest = ~one  # NaN included: ndtr keeps it NaN
    out[rest] = ndtr(x[rest])
    return out


def upper_tail(z: FloatArray) -> FloatArray:
    """1 − Φ(z), overwriting z (an array). ndtr dominates the cost of the planner's score, and about
    half the planner's z lie beyond ±9 (a class far inside or far past its SLO), where the answer
    is exactly 0 or 1: those are set directly, the same values ndtr gives."""
    sat = np.abs(z) > SATURATED_Z  # NaN is not saturated: it goes through ndtr and stays NaN
    n_sat = int(np.count_nonzero(sat))
    if n_sat < z.size // 8:  # few saturated: masking would cost more than it saves
        out: FloatArray = ndtr(z, out=z)
        return np.subtract(1.0, out, out=out)
    mid = ~sat
    zm = z[mid]
    low = z < 0.0
    z[...] = 0.0
    z[low] = 1.0
    z[mid] = 1.0 - ndtr(zm)
    return z


def lognormal_quantile(mean: FloatArray, q: FloatArray | float, sigma: float = PROMPT_LOG_SIGMA) -> FloatArray:
    """Quantile q of a log-normal with the given mean and log-sd. Example: mean 1,000, σ 1, q 0.95 →
    1,000 × exp(1.645 − 0.5) = 3,143."""
    z = ndtri(np.clip(np.asarray(q, dtype=float), 1e-6, 1 - 1e-6))
    out: FloatArray = mean * np.exp(sigma * z - 0.5 * sigma * sigma)
    return out
