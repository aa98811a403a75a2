"""Tail probabilities of the planner's latencies: P(X > SLO) for a log-normal through a p50 and a p95.

`lognormal_exceed` is the formula (with the spread beyond the p95 bounded, see its docstring);
`lognormal_exceed_into` the same operations written into caller-owned work arrays (the scorer
runs it on tens of thousands of rows twice per batch); `lognormal_exceed_ref` the formula as it
reads, the tests' reference. 1 − Φ(z) is controller.core.distributions.upper_tail.

Must not: know about pools, plans or the search; allocate more than the formula needs.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtr

from controller.core.distributions import PROMPT_LOG_SIGMA, upper_tail
from controller.core.mpc_model import compiled_kernel

# log-spread of TTFT beyond its p95: the prompt-length spread (see lognormal_exceed)
TTFT_TAIL_SIGMA = PROMPT_LOG_SIGMA
# log-spread of a request's TPOT beyond its p95: a request's TPOT averages the steps of its whole
# life, so its tail is thin whatever widens the p50→p95 (bursts, corrections); 0.5 is the widest
# spread beyond the p95 the simulated workloads show (docs/decisions/0007-latency-tails-and-corrections.md).
TPOT_TAIL_SIGMA = 0.5


def lognormal_exceed(p50: np.ndarray | float, p95: np.ndarray | float, bound: np.ndarray | float,
                     tail_sigma: float | None = None) -> np.ndarray:
    """P(X > bound) for a log-normal through (p50, p95). p50 2 s, p95 4 s, bound 4 s → 0.05.

    `tail_sigma` bounds the log-spread beyond the p95 (the tail continues from the p95 with
    σ = min(fitted σ, tail_sigma)); below the p95 the fitted curve stands, so the two meet
    there. Why, for TTFT: a wide p50→p95 ratio comes from mixing cache hits and short prompts
    with long uncached ones; beyond the p95 what is left is the request's own prefill of a long
    prompt, whose length spreads with σ ≈ 1 (PROMPT_LOG_SIGMA) and is capped by the context.
    Example: TTFT p50 0.32 s, p95 3.43 s → fitted σ 1.44 puts 0.80 % beyond 3 × p95; σ = 1 from
    the p95 puts 0.30 % there.
    """
    # (the same operations as the formula reads, done in place on scratch arrays: the planner
    # scores this twice per batch on ~60k rows, where allocation costs as much as arithmetic)
    if min(np.ndim(p50), np.ndim(p95)) == 0:  # a scalar: no scratch arrays to reuse
        return lognormal_exceed_ref(p50, p95, bound, tail_sigma)
    m = np.maximum(p50, 1e-6)
    sigma = np.maximum(p95, m * 1.0001)
    sigma /= m
    np.log(sigma, out=sigma)
    sigma /= 1.6449
    np.maximum(sigma, 0.05, out=sigma)  # σ = max(ln(max(p95, 1.0001 p50) / p50) / 1.6449, 0.05)
    z = np.divide(np.maximum(bound, 1e-9), m)
    np.log(z, out=z)
    in_place = z.shape == np.broadcast_shapes(z.shape, sigma.shape)
    z = np.divide(z, sigma, out=z if in_place else None)  # z = ln(bound / p50) / σ
    if tail_sigma is not None and float(sigma.max(initial=0.0)) > tail_sigma:
        # beyond the p95 (z > 1.6449) stretch z by σ / σ_tail where the fit is wider than the tail:
        # z = 1.6449 + ln(bound / p95) / σ_tail, written on the fitted z (no second log). Only when
        # some row needs it: the planner scores this twice per batch.
        stretch = sigma * (1.0 / tail_sigma)
        stretch -= 1.0
        np.maximum(stretch, 0.0, out=stretch)
        over = z - 1.6449
        np.maximum(over, 0.0, out=over)
        over *= stretch
        z += over
    return _upper_tail(z)


def _upper_tail(z: np.ndarray) -> np.ndarray:
    """upper_tail (1 − Φ(z), overwriting z), as one compiled loop where numba is installed and z is a
    contiguous float array (mpc_kernel.upper_tail_rows: scipy's ndtr to the bit, no masking passes)."""
    kern = compiled_kernel()
    if kern is None or z.dtype != np.float64 or not z.flags.c_contiguous:
        return upper_tail(z)
    kern.upper_tail_rows(z)
    return z


def lognormal_exceed_ref(p50: np.ndarray | float, p95: np.ndarray | float, bound: np.ndarray | float,
                         tail_sigma: float | None = None) -> np.ndarray:
    """lognormal_exceed as the formula reads, without scratch arrays (scalars; the test's reference)."""
    m = np.maximum(p50, 1e-6)
    sigma = np.maximum(np.log(np.maximum(p95, m * 1.0001) / m) / 1.6449, 0.05)
    z = np.log(np.maximum(bound, 1e-9) / m) / sigma
    if tail_sigma is not None and float(np.max(sigma, initial=0.0)) > tail_sigma:
        z = z + np.maximum(z - 1.6449, 0.0) * np.maximum(sigma * (1.0 / tail_sigma) - 1.0, 0.0)
    res: np.ndarray = 1.0 - ndtr(z)
    return res


def lognormal_exceed_into(p50: np.ndarray, p95: np.ndarray, bound: np.ndarray, tail_sigma: float, *,
                          z: np.ndarray, scratch: np.ndarray, own: bool = False) -> np.ndarray:
    """lognormal_exceed written into `z` (an array of the broadcast shape), with `scratch` (same
    shape) for temporaries; with `own`, p50 and p95 are of that shape too and may be overwritten
    (z may then be p50). The same operations in the same order, so the same values."""
    if own:
        m = np.maximum(p50, 1e-6, out=p50)
        sigma = np.maximum(p95, np.multiply(m, 1.0001, out=scratch), out=p95)
    else:
        m = np.maximum(p50, 1e-6)
        sigma = np.maximum(p95, m * 1.0001)
    sigma /= m
    np.log(sigma, out=sigma)
    sigma /= 1.6449
    np.maximum(sigma, 0.05, out=sigma)
    np.divide(np.maximum(bound, 1e-9), m, out=z)
    np.log(z, out=z)
    z /= sigma
    if float(sigma.max(initial=0.0)) > tail_sigma:  # see lognormal_exceed
        stretch = np.multiply(sigma, 1.0 / tail_sigma, out=sigma if own else None)
        stretch -= 1.0
        np.maximum(stretch, 0.0, out=stretch)
        over = np.subtract(z, 1.6449, out=scratch)
        np.maximum(over, 0.0, out=over)
        over *= stretch
        z += over
    return _upper_tail(z)

