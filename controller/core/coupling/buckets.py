"""What the telemetry's latency quantiles read: Prometheus' histogram_quantile over vLLM's buckets.

The priors predict the statistic the telemetry reports, not the true quantile: `bucket_quantile`
reads a distribution (given by its CDF) through the same bucket bounds, linear inside a bucket.

Must not: know about pools or models; arrays and CDFs in, quantiles out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from controller.core.coupling.numeric import clamp

# Bucket upper bounds of vLLM's latency histograms (TELEMETRY.md): the p50/p95 the telemetry reports
# is histogram_quantile over these, linear inside a bucket, so the prior predicts that statistic.
TTFT_BUCKETS_S = np.array([0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                           20.0, 40.0, 80.0, 160.0, 640.0, 2560.0])
ITL_BUCKETS_S = np.array([0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                          40.0, 80.0])

_BUCKET_GRID_LO, _BUCKET_GRID_PER_E, _BUCKET_GRID_N = -12.0, 128.0, 3200  # log-x grid: e^-12 … e^13


def half_tanh(x: np.ndarray) -> np.ndarray:
    """½ + ½·tanh(x): ≈ Φ(z) at x = 0.895 z (logistic, exact at z = 1.645)."""
    y = np.tanh(x.astype(np.float32, copy=False))  # float32: half the bytes; a CDF needs no more digits
    y *= np.float32(0.5)
    y += np.float32(0.5)
    return y


@dataclass(frozen=True)
class _Buckets:
    """Histogram bucket bounds with the lookup tables bucket_quantile reads (built once)."""

    bounds: np.ndarray
    ext: np.ndarray  # ext[i] = lower edge of bucket i (bucket (ext[i], ext[i+1]]); ext[0] = 0
    log_ext: np.ndarray  # float32; log 0 = −inf
    index_table: np.ndarray  # bucket index per cell of the log grid

    @staticmethod
    def of(bounds: np.ndarray) -> _Buckets:
        ext = np.concatenate([[0.0], bounds])
        with np.errstate(divide="ignore"):
            log_ext = np.log(ext).astype(np.float32)  # the CDFs run in float32 (half the memory traffic)
        cells = _BUCKET_GRID_LO + np.arange(_BUCKET_GRID_N) / _BUCKET_GRID_PER_E
        table = np.minimum(np.searchsorted(bounds, np.exp(cells)), len(bounds) - 1)
        for a in (ext, log_ext, table):
            a.setflags(write=False)
        return _Buckets(bounds, ext, log_ext, table)


def _bucket_index(buckets: _Buckets, x: np.ndarray) -> np.ndarray:
    """≈ np.searchsorted(bounds, x) clipped to the last bucket, by a table read on a fine log grid
    (cheaper than a binary search per row). Off by one only in a grid cell holding a bound; the
    walk in bucket_quantile fixes that."""
    table = buckets.index_table
    u = (np.log(np.maximum(x, 1e-300)) - _BUCKET_GRID_LO) * _BUCKET_GRID_PER_E
    np.clip(u, 0.0, _BUCKET_GRID_N - 1, out=u)
    res: np.ndarray = np.take(table, u.astype(np.intp))
    return res


def bucket_quantile(q: float, buckets: _Buckets | np.ndarray, guess: np.ndarray,
                    cdf_log: Callable[[np.ndarray, np.ndarray | None], np.ndarray], *,
                    walk: bool = True) -> np.ndarray:
    """What Prometheus' histogram_quantile returns for quantile q of a distribution observed into
    buckets with upper `bounds`: linear interpolation inside the bucket where the CDF crosses q.
    `cdf_log(log_b, rows)` is the CDF at log bounds for the given rows (log 0 = −inf → 0).
    `guess` (a first estimate of the continuous quantile) picks the bucket; with `walk`, rows
    whose CDF does not cross q there step up or down until it does. Past the last bound: the
    last bound (as Prometheus).

    Example: every ITL between 10 and 25 ms (all in the bucket (0.01, 0.025]) → p95 reads
    0.01 + 0.015 × 0.95 = 24.25 ms, p50 17.5 ms, whatever the true 95th percentile (say 16 ms).
    """
    if not isinstance(buckets, _Buckets):
        buckets = _Buckets.of(np.asarray(buckets, dtype=float))
    nb = len(buckets.bounds)
    ext, log_ext = buckets.ext, buckets.log_ext
    i = _bucket_index(buckets, guess)
    f_lo = cdf_log(np.take(log_ext, i), None)
    f_hi = cdf_log(np.take(log_ext, i + 1), None)
    if walk:
        for _ in range(nb):  # usually 0 or 1 step, and only for the rows that need it
            rows = np.flatnonzero((f_hi < q) | (f_lo >= q))
            if len(rows):
                ir = i[rows]
                step = np.where(f_hi[rows] < q, np.where(ir < nb - 1, 1, 0), np.where(ir > 0, -1, 0))
                keep = step != 0
                rows, ir = rows[keep], ir[keep] + step[keep]
            if not len(rows):
                break
            i[rows] = ir
            f_lo[rows] = cdf_log(np.take(log_ext, ir), rows)
            f_hi[rows] = cdf_log(np.take(log_ext, ir + 1), rows)
    lo = np.take(ext, i)
    width = np.take(ext, i + 1)
    width -= lo
    # past the last bound F stays below q: the fraction clamps to 1 and the answer is that bound
    frac = q - f_lo
    frac /= np.maximum(f_hi - f_lo, 1e-9)
    frac = clamp(frac, 0.0, 1.0)
    frac *= width
    frac += lo
    return frac


TTFT_BUCKETS = _Buckets.of(TTFT_BUCKETS_S)
ITL_BUCKETS = _Buckets.of(ITL_BUCKETS_S)
