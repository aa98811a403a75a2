"""Learned coupling models: prefix-cache hit rate, latency quantiles, capacity and GPU busy fraction.

Grey-box (DESIGN.md §6). Each model is a physical or queueing *prior*, computed in closed form
from the pool's step-time physics, then two learned layers fitted on observed steady windows.
The prior predicts the statistic the telemetry reports: the p95s are read from the prior's TTFT
and ITL distributions through vLLM's histogram buckets, as histogram_quantile does (a decode-only
pool whose ITLs all fall in (10, 25] ms reads p95 = 24.25 ms, whatever its true p95).

1. calibration: physical knobs of the prior per replica type (all step times × time_scale,
   queueing stretch × wait_scale by robust least squares; the TTFT tail width by a grid search),
   kept only if it beats the uncalibrated prior on time-blocked cross-validation;
2. correction: a scikit-learn QuantileRegressor (median; q = 0.9 for the p95 upper bands) on
   features derived from the prior's own intermediate terms (utilisation, batch size, prefill
   share...), in log space (latency, busy fraction) or logit space (hit rate):

       log ŷ = log prior_cal + w · r̂(x)        logit ŷ = logit prior + w · r̂(x)

   kept only if it beats the calibrated prior on time-blocked cross-validation, judged by the
   acceptance metric (absolute percentage error for latency, absolute error for the hit rate:
   an over-prediction costs without bound, an under-prediction at most 100 %).

w ∈ [0, 1] is the *confidence*: how much data the model saw (`data_weight`) times how close the
query is to that data (`coverage`). With little data, or far outside it, w → 0 and the prior
alone answers — and says so, through the returned `confidence`.

Every predict function takes flat numpy arrays (one row per candidate plan × pool) and is
vectorised: 10,000 plans × 10 pools is one call (see `governor bench models`).

Must not: do I/O, read the clock, use global randomness, or import the simulator. The pool
physics arrive as `PoolPhysics` values, built at the edge (controller/learning/physics.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
from scipy.special import ndtri

# --------------------------------------------------------------------------- constants

# Token counts at which a pool's step time is tabulated (log-spaced; linear between points,
# linear extrapolation past the last one).
TOKEN_GRID = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384], dtype=float)

# Reuse-time grid of a ReuseProfile: hit_at[k] = fraction of prompt tokens whose block was last
# referenced less than REUSE_TAU_S[k] seconds earlier. The last entry (inf) is what an infinite
# cache would hit.
REUSE_TAU_S = np.array([5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, math.inf])

# Spread of per-request prompt lengths in log space (Azure 2023 chat: 0.99; the ServeGen
# synthesis uses 1.0). Used by the prior to turn a mean prompt into prompt quantiles.
PROMPT_LOG_SIGMA = 1.0
RHO_CLIP = 0.97  # the prior's queueing terms are evaluated at min(ρ, RHO_CLIP)
FIXED_POINT_ITERS = 3  # Newton steps for the batch size of the latency prior (see latency_prior)
EPS = 1e-9

# Bucket upper bounds of vLLM's latency histograms (TELEMETRY.md): the p50/p95 the telemetry reports
# is histogram_quantile over these, linear inside a bucket, so the prior predicts that statistic.
TTFT_BUCKETS_S = np.array([0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                           20.0, 40.0, 80.0, 160.0, 640.0, 2560.0])
ITL_BUCKETS_S = np.array([0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                          40.0, 80.0])
DECODE_STEP_LOG_SIGMA = 0.15
# TTFT's log-spread is wider than the prompts' alone would give: the wait in the prefill queue
# varies too. The prior reads its p95 from a lognormal through its p50 whose spread is the prior's
# own (p95/p50) spread × this factor (× a calibrated Calibration.ttft_tail_width). 1.1 was chosen
# on the training runs only (fit on one seed, scored on the other: TTFT p95 error 19.8 % at 1.0,
# 17.9 % at 1.1, 21.1 % at 1.2); the test runs played no part.
TTFT_SPREAD_FACTOR = 1.1  # spread of decode-only step times within a window (batch size moves)

LATENCY_TARGETS = ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s")
UPPER_TARGETS = ("ttft_p95_s", "tpot_p95_s")  # these also get an upper-band (q=0.9) correction
ALL_TARGETS = ("hit_rate",) + LATENCY_TARGETS + ("gpu_busy_frac",)


# --------------------------------------------------------------------------- physics


@dataclass(frozen=True)
class PoolPhysics:
    """Step-time physics of one replica type (model × SKU × TP), tabulated on TOKEN_GRID.

    decode_step_s[i]: a step with TOKEN_GRID[i] decoding sequences and no context (weights,
      LM head, per-sequence overhead); prefill_step_s[i]: a step computing TOKEN_GRID[i] prompt
      tokens, no attention. Context and attention are linear terms on top:
      decode: + decode_ctx_s_per_token × Σ context; prefill: + prefill_attn_s_per_work ×
      Σ chunk × (context before + chunk / 2).
    Example (Llama-3-8B, A100, TP1): decode 64 seqs = 32 ms, + 64 × 2,000 context tokens × 92 ns
    = 44 ms; prefill 2,048 tokens = 145 ms.
    """

    key: str  # "llama-3-8b/a100-80gb/tp1"
    decode_step_s: tuple[float, ...]
    prefill_step_s: tuple[float, ...]
    decode_ctx_s_per_token: float
    prefill_attn_s_per_work: float
    kv_capacity_tokens: float  # per replica
    mixed_seq_s: float = 0.0  # extra time per decoding sequence in a step that also prefills
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192

    def __post_init__(self) -> None:
        for name in ("decode_step_s", "prefill_step_s"):
            v = getattr(self, name)
            if len(v) != len(TOKEN_GRID) or not all(math.isfinite(x) and x > 0 for x in v):
                raise ValueError(f"PoolPhysics({self.key}).{name}: need {len(TOKEN_GRID)} finite positive "
                                 f"step times on TOKEN_GRID, got {v!r}")
        for name in ("decode_ctx_s_per_token", "prefill_attn_s_per_work", "mixed_seq_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"PoolPhysics({self.key}).{name} = {v!r} must be finite and >= 0")
        if not (self.kv_capacity_tokens >= 1):
            raise ValueError(f"PoolPhysics({self.key}).kv_capacity_tokens = {self.kv_capacity_tokens!r} must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (list(getattr(self, f.name)) if isinstance(getattr(self, f.name), tuple)
                         else getattr(self, f.name)) for f in fields(self)}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> PoolPhysics:
        known = {f.name for f in fields(PoolPhysics)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"PoolPhysics: unknown field(s) {sorted(unknown)}")
        kw = dict(d)
        for name in ("decode_step_s", "prefill_step_s"):
            kw[name] = tuple(float(x) for x in kw[name])
        return PoolPhysics(**kw)


@dataclass(frozen=True)
class Calibration:
    """Two physical knobs of the prior, fitted per replica type before the residual correction.

    time_scale multiplies every step time (the calibrated kernels are off by a stack-dependent
    factor on a real fleet); wait_scale multiplies the queueing wait (bursty arrivals queue more
    than Poisson, closed-loop clients — the next turn waits for the last answer — queue less).
    Both are 1 in the uncalibrated prior and stay within [0.2, 5]. ttft_tail_width stretches the
    log-spread of the TTFT distribution the p95 is read from (the traffic's prompt-length tail and
    the queueing spread are wider or narrower than the prior's lognormal); 1 in the prior,
    within [0.5, 2].
    """

    time_scale: float = 1.0
    wait_scale: float = 1.0
    ttft_tail_width: float = 1.0

    def __post_init__(self) -> None:
        for name in ("time_scale", "wait_scale"):
            v = getattr(self, name)
            if not (math.isfinite(v) and 0.05 <= v <= 20.0):
                raise ValueError(f"Calibration.{name} = {v!r} must be within [0.05, 20]")
        if not (math.isfinite(self.ttft_tail_width) and 0.5 <= self.ttft_tail_width <= 2.0):
            raise ValueError(f"Calibration.ttft_tail_width = {self.ttft_tail_width!r} must be within [0.5, 2]")


class PhysicsTable:
    """Several PoolPhysics stacked so that per-row lookups are array gathers (calibration applied)."""

    def __init__(self, physics: Sequence[PoolPhysics], calibration: Mapping[str, Calibration] | None = None) -> None:
        if not physics:
            raise ValueError("PhysicsTable: need at least one PoolPhysics")
        self.physics = tuple(physics)
        self.keys = tuple(p.key for p in physics)
        cal = [(calibration or {}).get(p.key, Calibration()) for p in physics]
        ts = np.array([c.time_scale for c in cal], dtype=float)
        self.wait = np.array([c.wait_scale for c in cal], dtype=float)
        self.tail = np.array([c.ttft_tail_width for c in cal], dtype=float)
        self.decode = np.array([p.decode_step_s for p in physics], dtype=float) * ts[:, None]
        self.prefill = np.array([p.prefill_step_s for p in physics], dtype=float) * ts[:, None]
        self.decode_flat = self.decode.ravel()
        self.prefill_flat = self.prefill.ravel()
        # per grid segment [2^i, 2^(i+1)): y = a_i + s_i·x (the last segment extends past the grid)
        self.decode_seg = _segments(self.decode)
        self.prefill_seg = _segments(self.prefill)
        self.ctx = np.array([p.decode_ctx_s_per_token for p in physics], dtype=float) * ts
        self.attn = np.array([p.prefill_attn_s_per_work for p in physics], dtype=float) * ts
        self.kv = np.array([p.kv_capacity_tokens for p in physics], dtype=float)
        self.seq = np.array([p.mixed_seq_s for p in physics], dtype=float) * ts
        self.max_num_seqs = np.array([p.max_num_seqs for p in physics], dtype=float)
        self.max_num_batched_tokens = np.array([p.max_num_batched_tokens for p in physics], dtype=float)

    def index(self, key: str) -> int:
        try:
            return self.keys.index(key)
        except ValueError:
            raise KeyError(f"no physics for {key!r}; known: {list(self.keys)}") from None


def _segments(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(intercepts, slopes) raveled like the table: segment i of a row is y = a_i + s_i·x."""
    g = TOKEN_GRID
    slope = np.zeros_like(table)
    slope[:, :-1] = np.diff(table, axis=1) / np.diff(g)[None, :]
    slope[:, -1] = slope[:, -2]
    inter = table - slope * g[None, :]
    return inter.ravel(), slope.ravel()


def _interp_seg(seg: tuple[np.ndarray, np.ndarray], base: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per-row piecewise-linear table read: the segment is the binary exponent of x (np.frexp),
    then y = a + s·x. x < 1 reads as 1; past the grid the last segment extends. Example: x = 300
    → segment 8 ([256, 512)). Same values as _interp_rows, fewer array passes."""
    x = np.maximum(x, 1.0)
    _, e = np.frexp(x)
    e -= 1
    np.minimum(e, len(TOKEN_GRID) - 2, out=e)
    idx = base + e
    y = np.take(seg[1], idx)
    y *= x
    y += np.take(seg[0], idx)
    return y


def _interp_rows(flat: np.ndarray, base: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per-row linear interpolation over TOKEN_GRID (powers of two) at x; x < 1 reads as 1, linear
    past the end. `flat` is a PhysicsTable's (n_physics × G) table raveled, `base` = row × G.

    The grid index is the binary exponent (np.frexp), not a search: TOKEN_GRID[i] = 2**i, so
    x = 300 → i = 8 (256), frac = 300 / 256 − 1 = 0.17.
    """
    x = np.maximum(x, 1.0)
    _, e = np.frexp(x)
    e -= 1
    np.minimum(e, len(TOKEN_GRID) - 2, out=e)
    frac = x / np.ldexp(1.0, e)
    frac -= 1.0
    idx = base + e
    y0 = np.take(flat, idx)
    d = np.take(flat, idx + 1)
    d -= y0
    d *= frac
    d += y0
    return d


def _interp_rows_slope(flat: np.ndarray, base: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """As _interp_rows, also returning the segment's slope (for the Newton steps of the prior)."""
    x = np.maximum(x, 1.0)
    _, e = np.frexp(x)
    i = np.minimum(e - 1, len(TOKEN_GRID) - 2)
    g0 = np.ldexp(1.0, i)
    idx = base + i
    y0 = np.take(flat, idx)
    slope = (np.take(flat, idx + 1) - y0) / g0
    return y0 + (x - g0) * slope, slope


assert np.array_equal(TOKEN_GRID, 2.0 ** np.arange(len(TOKEN_GRID))), "TOKEN_GRID must be 1, 2, 4, ... (frexp lookup)"


# --------------------------------------------------------------------------- helpers


def _arr(x: Any, n: int, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if a.ndim == 0:
        return np.full(n, float(a))
    if a.shape != (n,):
        raise ValueError(f"{name}: expected shape ({n},) or a scalar, got {a.shape}")
    return a


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _clamp(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """np.clip without its Python-level dispatch (it runs a few hundred times per bulk predict)."""
    return np.minimum(np.maximum(x, lo), hi)


def _stack_columns(cols: Sequence[np.ndarray]) -> np.ndarray:
    """np.column_stack for the bulk path: the (n, m) result is a view of a feature-major (m, n)
    array, filled by m contiguous row copies (~5× faster than column_stack's strided writes)."""
    out = np.empty((len(cols), len(cols[0])))
    for j, c in enumerate(cols):
        out[j] = c
    return out.T


def _logit(p: np.ndarray) -> np.ndarray:
    p = _clamp(p, 1e-4, 1 - 1e-4)
    return np.log(p) - np.log1p(-p)


def _lognormal_quantile(mean: np.ndarray, q: np.ndarray | float, sigma: float = PROMPT_LOG_SIGMA) -> np.ndarray:
    """Quantile q of a lognormal with the given mean and log-sd. Example: mean 1,000, σ 1, q 0.95 →
    1,000 × exp(1.645 − 0.5) = 3,143."""
    z = ndtri(np.clip(np.asarray(q, dtype=float), 1e-6, 1 - 1e-6))
    return mean * np.exp(sigma * z - 0.5 * sigma * sigma)


_BUCKET_GRID_LO, _BUCKET_GRID_PER_E, _BUCKET_GRID_N = -12.0, 128.0, 3200  # log-x grid: e^-12 … e^13


def _half_tanh(x: np.ndarray) -> np.ndarray:
    """½ + ½·tanh(x): ≈ Φ(z) at x = 0.895 z (logistic, exact at z = 1.645)."""
    y = np.tanh(x.astype(np.float32, copy=False))  # float32: 4× faster; a CDF needs no more digits
    y *= np.float32(0.5)
    y += np.float32(0.5)
    return y


@dataclass(frozen=True)
class _Buckets:
    """Histogram bucket bounds with the lookup tables _bucket_quantile reads (built once)."""

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
    (a binary search per row costs ~5× more). Off by one only in a grid cell holding a bound; the
    walk in _bucket_quantile fixes that."""
    table = buckets.index_table
    u = (np.log(np.maximum(x, 1e-300)) - _BUCKET_GRID_LO) * _BUCKET_GRID_PER_E
    np.clip(u, 0.0, _BUCKET_GRID_N - 1, out=u)
    return np.take(table, u.astype(np.intp))


def _bucket_quantile(q: float, buckets: _Buckets | np.ndarray, guess: np.ndarray, cdf_log, *,
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
    frac = _clamp(frac, 0.0, 1.0)
    frac *= width
    frac += lo
    return frac


_TTFT_BUCKETS = _Buckets.of(TTFT_BUCKETS_S)
_ITL_BUCKETS = _Buckets.of(ITL_BUCKETS_S)


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class LatencyInputs:
    """One row per (candidate plan, pool). All arrays shape (n,)."""

    physics_index: np.ndarray  # int: row into the PhysicsTable
    arrival_rps_per_replica: np.ndarray
    prompt_tokens: np.ndarray  # mean prompt tokens per request
    output_tokens: np.ndarray  # mean output tokens per request
    hit_rate: np.ndarray  # prefix-cache hit rate (tokens), 0..1
    inflight_cap: np.ndarray  # per replica; 0 = no cap
    max_num_seqs: np.ndarray  # 0 = the physics default
    max_num_batched_tokens: np.ndarray  # 0 = the physics default
    arrival_dispersion: np.ndarray  # index of dispersion of arrival counts (Poisson = 1; see features.py)

    @staticmethod
    def build(n: int, *, physics_index: Any, arrival_rps_per_replica: Any, prompt_tokens: Any, output_tokens: Any,
              hit_rate: Any = 0.0, inflight_cap: Any = 0, max_num_seqs: Any = 0,
              max_num_batched_tokens: Any = 0, arrival_dispersion: Any = 1.0) -> LatencyInputs:
        """Broadcast scalars to n rows and check shapes."""
        return LatencyInputs(
            physics_index=_arr(physics_index, n, "physics_index").astype(np.intp),
            arrival_rps_per_replica=_arr(arrival_rps_per_replica, n, "arrival_rps_per_replica"),
            prompt_tokens=_arr(prompt_tokens, n, "prompt_tokens"),
            output_tokens=_arr(output_tokens, n, "output_tokens"),
            hit_rate=_arr(hit_rate, n, "hit_rate"),
            inflight_cap=_arr(inflight_cap, n, "inflight_cap"),
            max_num_seqs=_arr(max_num_seqs, n, "max_num_seqs"),
            max_num_batched_tokens=_arr(max_num_batched_tokens, n, "max_num_batched_tokens"),
            arrival_dispersion=_arr(arrival_dispersion, n, "arrival_dispersion"),
        )

    def __len__(self) -> int:
        return len(self.arrival_rps_per_replica)


@dataclass(frozen=True)
class CacheInputs:
    """One row per (candidate plan, pool). All arrays shape (n,); reuse_hit_at shape (n, len(REUSE_TAU_S))
    or (n_profiles, len(REUSE_TAU_S)) with reuse_index selecting a row per input row."""

    physics_index: np.ndarray
    replicas: np.ndarray  # serving replicas in the pool
    arrival_rps: np.ndarray  # requests/s into the pool (all replicas)
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_weight: np.ndarray  # router scorer weights; cache affinity is prefix_weight
    queue_weight: np.ndarray
    kv_weight: np.ndarray
    reuse_hit_at: np.ndarray  # (n_profiles, K): the traffic's reuse profile (ReuseProfile.hit_at)
    reuse_index: np.ndarray  # (n,) int: which profile row applies

    @staticmethod
    def build(n: int, *, physics_index: Any, replicas: Any, arrival_rps: Any, prompt_tokens: Any, output_tokens: Any,
              reuse_hit_at: Any, reuse_index: Any = 0, prefix_weight: Any = 3.0, queue_weight: Any = 2.0,
              kv_weight: Any = 2.0) -> CacheInputs:
        prof = np.asarray(reuse_hit_at, dtype=float)
        if prof.ndim == 1:
            prof = prof[None, :]
        if prof.ndim != 2 or prof.shape[1] != len(REUSE_TAU_S):
            raise ValueError(f"reuse_hit_at: expected shape (profiles, {len(REUSE_TAU_S)}), got {prof.shape}")
        idx = _arr(reuse_index, n, "reuse_index").astype(np.intp)
        if n and (idx.min() < 0 or idx.max() >= len(prof)):
            raise ValueError(f"reuse_index: values must be in [0, {len(prof) - 1}]")
        return CacheInputs(
            physics_index=_arr(physics_index, n, "physics_index").astype(np.intp),
            replicas=_arr(replicas, n, "replicas"), arrival_rps=_arr(arrival_rps, n, "arrival_rps"),
            prompt_tokens=_arr(prompt_tokens, n, "prompt_tokens"), output_tokens=_arr(output_tokens, n, "output_tokens"),
            prefix_weight=_arr(prefix_weight, n, "prefix_weight"), queue_weight=_arr(queue_weight, n, "queue_weight"),
            kv_weight=_arr(kv_weight, n, "kv_weight"), reuse_hit_at=prof, reuse_index=idx,
        )

    def __len__(self) -> int:
        return len(self.replicas)


# --------------------------------------------------------------------------- priors


@dataclass(frozen=True)
class LatencyPrior:
    """The queueing prior's outputs and the intermediate terms the corrections use as features."""

    ttft_p50_s: np.ndarray
    ttft_p95_s: np.ndarray
    tpot_p50_s: np.ndarray
    tpot_p95_s: np.ndarray
    gpu_busy_frac: np.ndarray
    capacity_rps: np.ndarray  # sustainable arrivals per replica at this mix (ρ = 1), router cap included
    rho: np.ndarray  # arrival / capacity
    rho_engine: np.ndarray  # arrival / the engine's own capacity (no router cap)
    router_wait_p95_s: np.ndarray  # time held at the router behind the in-flight cap (0 without a cap)
    rho_prefill: np.ndarray  # occupancy of the prefill pipeline
    batch: np.ndarray  # mean decoding sequences
    batch_max: np.ndarray
    decode_step_s: np.ndarray
    prefill_frac: np.ndarray  # share of busy time spent on prefill
    prefill_step_frac: np.ndarray  # share of steps that carry a prefill chunk
    uncached_prompt_tokens: np.ndarray


def latency_prior(table: PhysicsTable, x: LatencyInputs, *, bucketed: bool = True) -> LatencyPrior:
    """Closed-form steady-state latency of continuous batching with chunked prefill.

    Per replica, with arrival rate λ, mean prompt P (uncached part Pu = P·(1 − hit)), output O,
    token budget M and batch cap B_max = min(max_num_seqs, in-flight cap, KV tokens / (P + O)):

    - prefill: a request needs n = Pu/M + ½ chunks; each chunk adds cost(c) to the step it rides
      on; prefill busy share f_p = λ · n · cost(c).
    - decode: B sequences decode together; one step takes τ_d(1 + B) (the request itself plus the
      B others), stretched by the prefill chunks mixed in: ITL mean τ = τ_d / (1 − f_p).
      Little's law closes the loop, B = λ · O · τ (solved by a few damped iterations).
    - capacity: at B = B_max, a request costs cost_pf + O · τ_d(B_max) / B_max seconds of replica
      time, so λ_max = 1 / that, and ρ = λ / λ_max. Example: Llama-3-8B/A100, P 1,000, O 200,
      B_max 256: ≈ 0.07 + 200 × 0.101 / 256 = 0.15 s → λ_max ≈ 6.7 req/s.
    - ITL quantile q: a share π of steps carry a prefill chunk; if π > 1 − q the quantile falls
      among those steps (τ_d + cost of the chunk at the matching prompt quantile), else τ_d.
      (Blended with a sigmoid in log π so the prior is smooth.)
    - TTFT quantile q: own prefill time at the prompt's q-quantile, stretched by the prefill
      pipeline's load as in processor sharing: × (1 + wait_scale·ρ_q/(1 − ρ_q)).
    - GPU busy fraction: 1 − exp(−N̄), N̄ = λ·(TTFT + O·τ) requests resident (M/G/∞ occupancy).
    """
    k = x.physics_index
    base = k * len(TOKEN_GRID)
    dflat = table.decode_flat
    dseg, pseg = table.decode_seg, table.prefill_seg
    lam = np.maximum(x.arrival_rps_per_replica, 1e-6)
    P = np.maximum(x.prompt_tokens, 1.0)
    O = np.maximum(x.output_tokens, 1.0)
    hit = _clamp(x.hit_rate, 0.0, 0.999)
    Pu = np.maximum(P * (1.0 - hit), 1.0)
    M = np.where(x.max_num_batched_tokens > 0, x.max_num_batched_tokens, table.max_num_batched_tokens[k])
    S = np.where(x.max_num_seqs > 0, x.max_num_seqs, table.max_num_seqs[k])
    ctx_s = table.ctx[k]
    attn_s = table.attn[k]
    seq_s = table.seq[k]
    b_engine = np.maximum(np.minimum(S, table.kv[k] / (P + O)), 1.0)  # what the engine itself can batch
    capped = x.inflight_cap > 0
    any_cap = bool(capped.any())
    b_max = np.maximum(np.minimum(b_engine, np.where(capped, x.inflight_cap, np.inf)), 1.0) if any_cap else b_engine
    ctx_cost = ctx_s * (P + 0.5 * O)  # decode cost per sequence of its context (mean context P + O/2)
    n_chunks = np.maximum(Pu / M + 0.5, 1.0)
    chunk = np.minimum(Pu / n_chunks, M)
    # Attention work of one request's prefill: Pu = P(1 − h) tokens attending to the P·h cached ones
    # plus half their own, P²(1 − h)(1 + h)/2, averaged over lognormal prompts (E[P²] = P̄² e^σ²).
    # Quadratic in P, so long prompts dominate: mean 12k tokens with σ = 1 costs 2.7× the work of
    # a fixed 12k prompt.
    attn_req = attn_s * (P * P * (0.5 * math.exp(PROMPT_LOG_SIGMA**2))) * ((1.0 - hit) * (1.0 + hit))
    attn_tok = attn_s * (P * hit + 0.5 * Pu)  # attention per prefill token (context before + half its own)

    def decode_step(b: np.ndarray) -> np.ndarray:
        return _interp_seg(dseg, base, b) + ctx_cost * b

    def chunk_cost(c: np.ndarray, b: np.ndarray) -> np.ndarray:
        # marginal time of c prefill tokens added to a step that decodes b sequences:
        # step(c prefill + b decode) − step(b decode). Example (Llama-3-70B TP4 H100): 1,000
        # tokens into a 256-sequence decode step: 175 ms − 103 ms = 72 ms.
        return np.maximum(_interp_seg(pseg, base, c + b) + seq_s * b - _interp_seg(dseg, base, b), 0.0)

    # Little's law fixed point B = λ·O·τ_d(1 + B)/(1 − f_p): Newton steps on the step-time
    # table's local segment τ_d(1 + B) ≈ a + s·(1 + B), which solve it exactly within a segment:
    # B = λO(a + s)/(1 − f_p − λOs), or B_max when that is negative or larger (saturated).
    # The prefill share f_p depends on B only through the chunk's marginal cost (mildly): it is
    # computed at B = 0 and refreshed once, which keeps B within 1 % and saves table reads.
    batch = np.zeros_like(lam)
    k_ = lam * O
    cost_pf = n_chunks * chunk_cost(chunk, batch) + attn_req
    for it in range(FIXED_POINT_ITERS):
        b1 = 1.0 + batch
        step, slope = _interp_rows_slope(dflat, base, b1)
        slope = slope + ctx_cost
        tau_d = step + ctx_cost * b1
        if it == 1:
            cost_pf = n_chunks * chunk_cost(chunk, batch) + attn_req
        f_p = np.minimum(lam * cost_pf, 0.95)
        den = 1.0 - f_p - k_ * slope
        new = k_ * (tau_d - slope * batch) / np.maximum(den, 1e-9)
        batch = np.where(den > 1e-9, np.minimum(new, b_max), b_max)
    tau_d = decode_step(1.0 + batch)
    # every later chunk cost rides on the converged batch: the decode-only part is read once
    mixed_base = seq_s * batch - _interp_seg(dseg, base, batch)

    def chunk_at(c: np.ndarray) -> np.ndarray:
        y = _interp_seg(pseg, base, c + batch)
        y += mixed_base
        return np.maximum(y, 0.0, out=y)

    cost_pf = n_chunks * chunk_at(chunk) + attn_req
    f_p = np.minimum(lam * cost_pf, 0.95)
    tau = tau_d / (1.0 - f_p)

    # capacity: the batch at its cap (router cap included) and at the engine's own limit
    def capacity_at(b: np.ndarray) -> np.ndarray:
        per_req_s = n_chunks * chunk_cost(chunk, b) + attn_req + O * decode_step(b) / b
        return 1.0 / np.maximum(per_req_s, EPS)

    capacity_engine = capacity_at(b_engine)
    capacity = capacity_at(b_max) if any_cap else capacity_engine
    rho = lam / capacity
    rho_engine = lam / capacity_engine

    # ITL quantiles: a share π of steps carry a chunk; the q-quantile of ITL is among them when
    # π > 1 − q, at the prompt quantile 1 − (1 − q)/π. Φ⁻¹ per row uses the logistic
    # approximation Φ⁻¹(p) ≈ logit(p)/1.702 (within 5 % of z up to p = 0.98): a prior needs no more.
    pi = _clamp(lam * n_chunks * tau, 1e-6, 1.0)
    log_pi = np.log(pi)
    sig2 = 0.5 * PROMPT_LOG_SIGMA * PROMPT_LOG_SIGMA

    def itl_q(q: float) -> np.ndarray:
        tail = 1.0 - q
        w = _sigmoid((log_pi - math.log(tail)) * (1.0 / 0.35))
        qq = _clamp(1.0 - tail / pi, 0.02, 0.98)
        z = (np.log(qq) - np.log1p(-qq)) * (PROMPT_LOG_SIGMA / 1.702)
        c_q = np.minimum(Pu * np.exp(z - sig2), M)
        return tau_d + w * (chunk_at(c_q) + attn_tok * c_q)

    # TTFT quantiles
    full_step = tau_d + chunk_at(M)
    rho_p = lam * Pu * full_step / M + lam * attn_req
    # Engine-side TTFT (what vLLM's histogram measures) queues only on the engine's own limits; a
    # router in-flight cap moves that queue to the router (router_wait_* below).
    # Prefill is served like processor sharing: the token budget of each step is split among the
    # prompts being prefilled, so a short prompt is not stuck behind a long one (vLLM chunks long
    # prompts), and a request's TTFT is its own prefill time stretched by the load, x / (1 − ρ):
    # TTFT_q ≈ service(prompt_q) · (1 + wait_scale · ρ/(1 − ρ)). The queue that matters is the
    # prefill pipeline's (ρ_p); the engine's own limits (max_num_seqs, KV) only bite close to
    # saturation, hence ρ_engine⁴ (0.9 → 0.66, 0.97 → 0.89). Example: service 1 s, ρ 0.5,
    # wait_scale 3 → 1 × (1 + 3 × 1) = 4 s. (An M/G/1 FCFS wait put the median far too high: the
    # median request has a median prompt and waits for nobody's whole prompt.)
    r2 = rho_engine * rho_engine
    rho_q = np.minimum(np.maximum(rho_p, r2 * r2), RHO_CLIP)
    slowdown = 1.0 + table.wait[k] * rho_q / (1.0 - rho_q)
    hit_ratio = hit / (1.0 - hit + 1e-9)

    def ttft_q(q: float) -> tuple[np.ndarray, np.ndarray]:
        """(TTFT quantile q, the step time of a chunk of the prompt at quantile q)."""
        pu_q = np.minimum(Pu * math.exp(PROMPT_LOG_SIGMA * float(ndtri(q)) - sig2), 4.0 * P + 1.0)
        n_q = np.maximum(pu_q / M + 0.5, 1.0)
        c_q = np.minimum(pu_q / n_q, M)
        step_q = tau_d + chunk_at(c_q)
        service = n_q * step_q + attn_s * pu_q * pu_q * (hit_ratio + 0.5)
        step_q += attn_tok * c_q
        # an arrival also waits for the step in flight to end (uniform residual: q of a step)
        return service * slowdown + q * tau, step_q

    (ttft50, s50), (ttft95, s95) = ttft_q(0.5), ttft_q(0.95)
    tpot50 = itl_q(0.5)
    residence = ttft50 + O * tau
    if bucketed:
        # The telemetry's p50/p95 are histogram_quantile over vLLM's buckets, not the true
        # quantiles: read the prior's distributions through the same buckets.
        # TTFT: lognormal through the prior's p50 and p95 (prompt lengths are lognormal and the
        # service time grows with the prompt).
        # CDFs here: Φ(z) ≈ ½ + ½·tanh(0.895 z), the logistic form exact at Φ(1.645) = 0.95 (the p95
        # lands in the bucket of the continuous p95), within 0.02 elsewhere; the scales carry 0.895
        mu_t = np.log(np.maximum(ttft50, 1e-6))
        sd_t = np.maximum(np.log(np.maximum(ttft95, 1e-6)) - mu_t, 0.05 * 1.645)
        sd_t *= table.tail[k] * (TTFT_SPREAD_FACTOR / 1.645)
        ttft95 = np.exp(mu_t + 1.645 * sd_t)
        inv_sd_t = (0.895 / sd_t).astype(np.float32)
        mu_t = mu_t.astype(np.float32)

        def ttft_cdf(lb: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
            if rows is None:
                return _half_tanh((lb - mu_t) * inv_sd_t)
            return _half_tanh((lb - mu_t[rows]) * inv_sd_t[rows])

        # ITL: a mixture of decode-only steps (lognormal around τ_d) and chunk steps (share π,
        # lognormal through the chunk step of the median and of the 0.95-quantile prompt; chunks
        # are at most the token budget, so long prompts make it narrow).
        mu_d = np.log(np.maximum(tau_d, 1e-6))
        mu_c = np.log(np.maximum(s50, 1e-6))
        f32 = np.float32
        inv_sd_c = ((1.645 * 0.895) / np.maximum(np.log(np.maximum(s95, 1e-6)) - mu_c, 0.05 * 1.645)).astype(f32)
        inv_sd_d = f32(0.895 / DECODE_STEP_LOG_SIGMA)
        mu_d, mu_c, pi32 = mu_d.astype(f32), mu_c.astype(f32), pi.astype(f32)

        def itl_cdf(lb: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
            if rows is None:
                d_ = _half_tanh((lb - mu_d) * inv_sd_d)
                c_ = _half_tanh((lb - mu_c) * inv_sd_c)
                c_ -= d_
                c_ *= pi32
                c_ += d_
                return c_
            d_ = _half_tanh((lb - mu_d[rows]) * inv_sd_d)
            return pi32[rows] * (_half_tanh((lb - mu_c[rows]) * inv_sd_c[rows]) - d_) + d_

        # p95s only: they are what SLOs are checked on, and each read costs ~0.5 ms per 16k rows
        # (bulk predict has a budget); the p50s stay the distributions' own medians.
        ttft50b, tpot50b = ttft50, tpot50
        ttft95b = _bucket_quantile(0.95, _TTFT_BUCKETS, ttft95, ttft_cdf)
        # first guess of the mixture's p95 (the walk fixes the bucket): among the chunk steps at
        # their quantile 1 − 5 %/π when π > 5 %, else high in the decode steps (z = 2)
        z_c = _logit(_clamp(1.0 - 0.05 / pi, 0.01, 0.99)) * (0.895 / 1.79)
        guess = np.where(pi > 0.05, np.exp(mu_c + z_c / inv_sd_c), tau_d * math.exp(2.0 * DECODE_STEP_LOG_SIGMA))
        tpot95b = _bucket_quantile(0.95, _ITL_BUCKETS, guess, itl_cdf)
    else:
        ttft50b, ttft95b, tpot50b, tpot95b = ttft50, ttft95, tpot50, itl_q(0.95)
    if any_cap:
        # Router queue behind an in-flight cap: B_max "servers" each busy for a request's
        # residence; Sakasegawa's M/M/c wait W̄ ≈ ρ^√(2(c+1)) / (c(1 − ρ)) × residence. Example:
        # ρ 0.9, residence 10 s, cap 16 → 0.9^5.8 / (16 × 0.1) × 10 = 3.4 s.
        rho_c = np.minimum(rho, RHO_CLIP)
        queued = capped & (rho > rho_engine * 1.0001)
        w_mean = rho_c ** np.sqrt(2.0 * (b_max + 1.0)) / (b_max * (1.0 - rho_c)) * residence
        router_wait95 = np.where(queued, w_mean / np.maximum(rho_c, 1e-3) * np.log(np.maximum(rho_c, 1e-3) / 0.05).clip(0),
                                 0.0)
    else:
        router_wait95 = np.zeros_like(lam)
    busy = 1.0 - np.exp(-lam * residence)
    return LatencyPrior(
        ttft_p50_s=ttft50b, ttft_p95_s=ttft95b, tpot_p50_s=tpot50b, tpot_p95_s=tpot95b,
        gpu_busy_frac=_clamp(busy, 1e-3, 1.0), capacity_rps=capacity, rho=rho, rho_engine=rho_engine,
        router_wait_p95_s=router_wait95, rho_prefill=rho_p, batch=batch,
        batch_max=b_max, decode_step_s=tau_d, prefill_frac=f_p, prefill_step_frac=pi, uncached_prompt_tokens=Pu,
    )


@dataclass(frozen=True)
class CachePrior:
    hit_rate: np.ndarray
    affinity: np.ndarray  # effective cache affinity of the router, 0..1
    retention_s: np.ndarray  # how long an unreferenced block survives in one replica's cache
    inf_hit: np.ndarray  # what an infinite cache would hit
    temporal_hit: np.ndarray  # hit of one infinite-affinity cache with this retention


def affinity_of(prefix_weight: np.ndarray, queue_weight: np.ndarray, kv_weight: np.ndarray) -> np.ndarray:
    """How strongly the router keeps a prefix on the replica that caches it, 0..1.

    The router's score is prefix_weight × prefix_frac − queue_weight × queue_norm − kv_weight × kv;
    the prefix term wins against a load imbalance of the same size when prefix_weight is large next
    to (queue_weight + kv_weight) / 2. Example: the defaults (3, 2, 2) → 1 − e^(−1.5) = 0.78; no
    prefix weight → 0.
    """
    return 1.0 - np.exp(-np.maximum(prefix_weight, 0.0) / np.maximum(0.5 * (queue_weight + kv_weight), 0.1))


def cache_prior(table: PhysicsTable, x: CacheInputs) -> CachePrior:
    """LRU retention prior for the pool's token hit rate.

    Each replica holds C free KV tokens (capacity minus the running requests' own blocks). New
    content enters at I tokens/s per replica: never-seen tokens, plus reused tokens that landed on
    a replica without them (1 − affinity of them, when R > 1). An unused block survives about
    T = C / I seconds. A reuse whose block was last used τ ago (fleet-wide) finds it:

    - routed with affinity (probability a): on the replica that used it, if it survived: T/(T + τ)
      (≈ 1 when τ ≪ T, ≈ T/τ when τ ≫ T);
    - routed at random (1 − a): on a replica that saw it within T; a block used every τ seconds
      fleet-wide reaches a given replica every R·τ: T/(T + R·τ). Popular prefixes (system
      prompts) are everywhere; a conversation's own history is on one replica in R.

    T/(T + τ) is P(the next use comes within T) when a block's use rate is exponentially spread
    around 1/τ (E[1 − e^(−rT)] over r ~ Exp(mean 1/τ)); it is also cheaper than an exponential.

        hit = Σ_k Δh_k · [a·T/(T + τ_k) + (1 − a)·T/(T + R·τ_k)]

    over the reuse profile's bins (Δh_k tokens reused after about τ_k). Example: all reuse at
    τ = 30 s, T = 60 s, R = 4: a = 1 → 0.67 of h∞; a = 0 → 0.33 of h∞.
    """
    k = x.physics_index
    R = np.maximum(x.replicas, 1.0)
    P = np.maximum(x.prompt_tokens, 1.0)
    O = np.maximum(x.output_tokens, 1.0)
    prof_tab = np.clip(x.reuse_hit_at, 0.0, 1.0)  # (profiles, K), cumulative in τ
    dh_tab = np.maximum(np.diff(prof_tab, axis=1, prepend=0.0), 0.0)  # per bin
    h_inf = prof_tab[x.reuse_index, -1]
    a = affinity_of(x.prefix_weight, x.queue_weight, x.kv_weight)
    lam = np.maximum(x.arrival_rps, 0.0)
    lam_r = lam / R
    # tokens held by running requests: λ_r × (residence ≈ 2 × O unloaded decode steps + 0.5 s) × context
    decode1 = table.decode_flat[k * len(TOKEN_GRID)]
    in_use = np.minimum(lam_r * (2.0 * O * decode1 + 0.5) * (P + 0.5 * O), 0.8 * table.kv[k])
    free = table.kv[k] - in_use
    unique = lam * P * (1.0 - h_inf)
    reinsert = lam * P * h_inf * (1.0 - a) * (1.0 - 1.0 / R)
    insert_r = np.maximum((unique + reinsert) / R, 1e-3)
    T = free / insert_r
    # g_p(T) = Σ_k Δh_k·T/(T + τ_k) for each profile p, tabulated on a log grid of T and read by
    # interpolation: two 1-D reads per row instead of a (rows × bins) sum.
    g_tab = _retention_table(dh_tab)
    temporal = _read_retention(g_tab, x.reuse_index, T)
    hit = a * temporal + (1.0 - a) * _read_retention(g_tab, x.reuse_index, T / R)
    return CachePrior(hit_rate=_clamp(hit, 0.0, 1.0), affinity=a, retention_s=T, inf_hit=h_inf,
                      temporal_hit=temporal)


# log10 grid of retention times for g_p(T): 10 ms … 10^7 s, 16 points per decade
_RET_LOG10_LO, _RET_PER_DECADE, _RET_POINTS = -2.0, 16, 9 * 16 + 1
_RET_T = 10.0 ** (_RET_LOG10_LO + np.arange(_RET_POINTS) / _RET_PER_DECADE)


def _retention_table(dh_tab: np.ndarray) -> np.ndarray:
    """(profiles × _RET_POINTS) raveled: g_p(T) = Σ_k Δh_pk · T/(T + τ_k) on _RET_T."""
    frac = _RET_T[None, :] / (_RET_T[None, :] + _REUSE_BIN_TAU_S[:, None])  # (K, points)
    return (dh_tab @ frac).ravel()


def _read_retention(g_flat: np.ndarray, profile: np.ndarray, T: np.ndarray) -> np.ndarray:
    u = (np.log10(np.maximum(T, 1e-9)) - _RET_LOG10_LO) * _RET_PER_DECADE
    np.maximum(u, 0.0, out=u)
    np.minimum(u, _RET_POINTS - 1.000001, out=u)
    i = u.astype(np.intp)
    idx = profile * _RET_POINTS + i
    y0 = np.take(g_flat, idx)
    return y0 + (u - i) * (np.take(g_flat, idx + 1) - y0)


# representative reuse time of each profile bin: geometric middle of (τ_{k−1}, τ_k]; the first
# bin (0, 5 s] → 2.5 s, the last (1 h, ∞) → 4 h
_REUSE_BIN_TAU_S = np.array([2.5] + [math.sqrt(REUSE_TAU_S[i - 1] * REUSE_TAU_S[i]) for i in range(1, len(REUSE_TAU_S) - 1)]
                            + [4 * 3600.0])


# --------------------------------------------------------------------------- correction features


def latency_features(prior: LatencyPrior, x: LatencyInputs, target: str) -> np.ndarray:
    """Features of the latency/busy correction for one target: log of the target's prior, then the
    shared prior terms (all dimensionless or logs)."""
    return np.column_stack([np.log(np.maximum(getattr(prior, target), 1e-4)), latency_shared_features(prior, x)])


def latency_shared_features(prior: LatencyPrior, x: LatencyInputs) -> np.ndarray:
    """The target-independent columns of latency_features (computed once per bulk predict)."""
    rho_c = np.minimum(prior.rho_engine, RHO_CLIP)
    return _stack_columns([
        rho_c,
        rho_c / (1.0 - rho_c),
        np.minimum(prior.rho_prefill, 2.0),
        prior.prefill_frac,
        np.log(prior.prefill_step_frac),
        np.log1p(prior.batch),
        np.log(np.maximum(prior.uncached_prompt_tokens, 1.0)),
        np.log(np.maximum(x.output_tokens, 1.0)),
        np.log(np.maximum(prior.decode_step_s, 1e-4)),
        _clamp(x.hit_rate, 0.0, 1.0),
        np.log(_clamp(x.arrival_dispersion, 0.5, 100.0)),
    ])


LATENCY_FEATURE_NAMES = ("log_prior", "rho", "rho_over_slack", "rho_prefill", "prefill_frac", "log_prefill_step_frac",
                         "log1p_batch", "log_uncached_prompt", "log_output", "log_decode_step", "hit_rate",
                         "log_dispersion")


def cache_features(prior: CachePrior, x: CacheInputs) -> np.ndarray:
    return _stack_columns([
        _logit(prior.hit_rate),
        prior.affinity,
        1.0 / np.maximum(x.replicas, 1.0),
        np.log(np.maximum(prior.retention_s, 1e-2)),
        prior.inf_hit,
        _logit(np.maximum(prior.temporal_hit, 1e-4)),
        np.log1p(np.maximum(x.arrival_rps, 0.0) / np.maximum(x.replicas, 1.0)),
    ])


CACHE_FEATURE_NAMES = ("logit_prior", "affinity", "inv_replicas", "log_retention", "inf_hit", "logit_temporal",
                       "log1p_rps_per_replica")


# --------------------------------------------------------------------------- the correction


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


def _coverage(X: np.ndarray, lo: np.ndarray, hi: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """exp(−½ Σ_j d_j²), d_j = distance of X[:, j] outside [lo_j, hi_j] in units of scale_j.
    (One temporary, the rest in place: this runs on every bulk predict.)"""
    d = np.maximum(X, lo)
    np.minimum(d, hi, out=d)
    np.subtract(X, d, out=d)
    d *= 1.0 / scale
    s = np.einsum("ij,ij->i", d, d)
    s *= -0.5
    return np.exp(s, out=s)


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
        return _clamp(r, -self.residual_clip, self.residual_clip)

    def coverage_tail(self, S: np.ndarray) -> np.ndarray:
        """Coverage (no data weight) over the features after the first (the shared latency columns)."""
        return _coverage(S, self.lo[1:], self.hi[1:], self.scale[1:])

    def residual_split(self, first: np.ndarray, S: np.ndarray) -> np.ndarray:
        """residual(column_stack([first, S])) without building the stacked matrix."""
        if self.estimator is None:
            return np.zeros(len(S))
        coef = self._coef()
        r = first * coef[0] + S @ coef[1:] + self._intercept()
        return _clamp(r, -self.residual_clip, self.residual_clip)

    def _coef(self) -> np.ndarray:
        return np.asarray(self.estimator.coef_, dtype=float)

    def _intercept(self) -> float:
        return float(self.estimator.intercept_)


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
                y_f = _sigmoid(base_l[f] + r[f])
                loss_corr += float(np.sum(np.abs(_sigmoid(base_l[f] + pred) - y_f)))
                loss_prior += float(np.sum(np.abs(_sigmoid(base_l[f] + base) - y_f)))
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


# --------------------------------------------------------------------------- fitted models


@dataclass(frozen=True)
class Prediction:
    """Bulk prediction for n rows (candidate plans × pools). Latencies in seconds."""

    hit_rate: np.ndarray
    ttft_p50_s: np.ndarray
    ttft_p95_s: np.ndarray
    tpot_p50_s: np.ndarray
    tpot_p95_s: np.ndarray
    ttft_p95_upper_s: np.ndarray  # upper band: the 0.9 quantile of the window p95 (for chance constraints)
    tpot_p95_upper_s: np.ndarray
    gpu_busy_frac: np.ndarray
    capacity_rps_per_replica: np.ndarray  # ρ = 1 arrival rate per replica at this mix (prior)
    router_wait_p95_s: np.ndarray  # queueing at the router behind an in-flight cap (add to TTFT for clients)
    utilisation: np.ndarray  # ρ: arrivals / capacity; ≥ 1 means saturated (latency predictions unreliable)
    confidence: np.ndarray  # 0 = prior only (little or no matching data) … 1 = well inside the training data

    @property
    def saturated(self) -> np.ndarray:
        return self.utilisation >= 1.0


@dataclass(frozen=True)
class CouplingModels:
    """The fitted cache, latency and busy-fraction models of a fleet, plus their physics.

    Immutable: a refit builds a new one and the edge swaps the reference.
    """

    physics: tuple[PoolPhysics, ...]
    corrections: Mapping[str, Correction]  # by target (and "<target>@upper")
    seed: int = 0
    n_train: int = 0
    train_window_s: tuple[float, float] = (0.0, 0.0)
    holdout_errors: Mapping[str, float] = field(default_factory=dict)
    calibration: Mapping[str, Calibration] = field(default_factory=dict)  # per physics key
    table: PhysicsTable = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "table", PhysicsTable(self.physics, self.calibration))

    # -- construction

    @staticmethod
    def prior_only(physics: Sequence[PoolPhysics]) -> CouplingModels:
        """No data: every correction is empty and confidence is 0."""
        return CouplingModels(physics=tuple(physics), corrections={})

    def physics_index(self, key: str) -> int:
        return self.table.index(key)

    # -- prediction

    def predict_hit_rate(self, x: CacheInputs) -> tuple[np.ndarray, np.ndarray]:
        """(hit rate, confidence) per row."""
        prior = cache_prior(self.table, x)
        corr = self.corrections.get("hit_rate")
        if corr is None or corr.data_weight <= 0.0:
            return prior.hit_rate, np.zeros(len(x))
        X = cache_features(prior, x)
        w = corr.weight(X)
        if corr.estimator is None:  # declined by cross-validation: the prior, with its confidence
            return prior.hit_rate, w
        logit = _logit(np.maximum(prior.hit_rate, 1e-4)) + w * corr.residual(X)
        hit = _sigmoid(logit)
        # a traffic without reuse has no hits whatever the correction says
        hit = np.where(prior.inf_hit < 1e-3, 0.0, np.minimum(hit, prior.inf_hit))
        return hit, w

    def _latency_plan(self) -> tuple[list[str], list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray, Any]:
        """The latency corrections stacked for one matrix product (cached on the instance).

        Returns (column names, base target of each column, first-feature coefficients (m,),
        shared-feature coefficients (11, m), intercepts (m,), data weights (m,), the correction
        whose training ranges give the coverage). Columns without an estimator have zero
        coefficients, i.e. the prior.
        """
        cached = self.__dict__.get("_plan")
        if cached is not None:
            return cached
        names: list[str] = []
        bases: list[str] = []
        c0, ct, ic, dw = [], [], [], []
        ref = None
        m = len(LATENCY_FEATURE_NAMES)
        for t in LATENCY_TARGETS + ("gpu_busy_frac",):
            main = self.corrections.get(t)
            for name in (t, t + "@upper") if t in UPPER_TARGETS else (t,):
                corr = self.corrections.get(name)
                if name.endswith("@upper") and (corr is None or corr.estimator is None):
                    continue  # no upper model: the holdout spread stands in (see predict_latency)
                names.append(name)
                bases.append(t)
                weight = main.data_weight if main is not None else 0.0
                if corr is not None and corr.estimator is not None and weight > 0.0:
                    coef = np.asarray(corr.estimator.coef_, dtype=float)
                    c0.append(coef[0])
                    ct.append(coef[1:])
                    ic.append(float(corr.estimator.intercept_))
                else:
                    c0.append(0.0)
                    ct.append(np.zeros(m - 1))
                    ic.append(0.0)
                dw.append(weight)
                if ref is None and main is not None and main.data_weight > 0.0:
                    ref = main
        plan = (names, bases, np.array(c0), np.array(ct).T, np.array(ic), np.array(dw), ref)
        object.__setattr__(self, "_plan", plan)
        return plan

    def predict_latency(self, x: LatencyInputs) -> tuple[dict[str, np.ndarray], LatencyPrior, np.ndarray]:
        """Latency/busy predictions by target (plus "<t>@upper"), the prior, and the min confidence.

        All corrections are applied at once: residuals R = log(prior)·c₀ + S·C + b for every
        column (one matrix product), each weighted by data_weight × coverage (one coverage for
        all latency targets: their shared features were trained on the same rows).
        """
        prior = latency_prior(self.table, x)
        names, bases, c0, ct, ic, dw, ref = self._latency_plan()
        n = len(x)
        out: dict[str, np.ndarray] = {}
        if ref is None:  # no data at all: the prior, confidence 0
            for t in LATENCY_TARGETS + ("gpu_busy_frac",):
                out[t] = getattr(prior, t)
            conf = np.zeros(n)
        else:
            S = latency_shared_features(prior, x)
            coverage = ref.coverage_tail(S)
            # columns without an estimator are the prior itself (their residual is 0): skip them
            act = [j for j in range(len(names)) if c0[j] != 0.0 or ic[j] != 0.0 or np.any(ct[:, j] != 0.0)]
            for j, name in enumerate(names):
                if j not in act:
                    out[name] = getattr(prior, bases[j])
            if act:
                B = _stack_columns([getattr(prior, bases[j]) for j in act])
                R = np.log(np.maximum(B, 1e-4))
                R *= c0[act]
                R += S @ ct[:, act]
                R += ic[act]
                np.maximum(R, -ref.residual_clip, out=R)
                np.minimum(R, ref.residual_clip, out=R)
                W = coverage[:, None] * dw[act][None, :]
                R *= W
                np.exp(R, out=R)
                R *= B
                for jj, j in enumerate(act):
                    out[names[j]] = R[:, jj]
            main_w = [dw[j] for j, name in enumerate(names) if "@" not in name]
            conf = coverage * min(main_w) if main_w else np.zeros(n)
        for t in UPPER_TARGETS:
            # without an upper model: the holdout spread (log-space q90 of errors), else ×1.5
            spread = self.holdout_errors.get(t + "_log_q90", math.log(1.5))
            up = out.get(t + "@upper")
            out[t + "@upper"] = np.maximum(up if up is not None else out[t] * math.exp(spread), out[t])
        out["gpu_busy_frac"] = _clamp(out["gpu_busy_frac"], 0.0, 1.0)
        return out, prior, conf

    def predict(self, cache: CacheInputs, latency: LatencyInputs | None = None) -> Prediction:
        """Hit rate from the cache model, then latency at that hit rate (the coupling).

        Large inputs are evaluated in blocks of PREDICT_BLOCK rows: the prior makes a few hundred
        temporary arrays, which the allocator then recycles within a bounded footprint.
        """
        n = len(cache)
        if latency is not None and len(latency) != n:
            raise ValueError(f"predict: cache has {n} rows, latency {len(latency)}")
        if n <= PREDICT_BLOCK:
            return self._predict(cache, latency)
        names = [f.name for f in fields(Prediction)]
        out = {name: np.empty(n) for name in names}
        for a in range(0, n, PREDICT_BLOCK):
            b = min(a + PREDICT_BLOCK, n)
            part = self._predict(_rows(cache, a, b), None if latency is None else _rows(latency, a, b))
            for name in names:
                out[name][a:b] = getattr(part, name)
        return Prediction(**out)

    def _predict(self, cache: CacheInputs, latency: LatencyInputs | None = None) -> Prediction:
        """Hit rate from the cache model, then latency at that hit rate (the coupling).

        `latency` carries the per-replica load and batching levers; its hit_rate is replaced by the
        cache model's prediction. When None, it is derived from `cache` (no in-flight cap, engine
        defaults).
        """
        hit, conf_c = self.predict_hit_rate(cache)
        n = len(cache)
        if latency is None:
            latency = LatencyInputs.build(
                n, physics_index=cache.physics_index,
                arrival_rps_per_replica=cache.arrival_rps / np.maximum(cache.replicas, 1.0),
                prompt_tokens=cache.prompt_tokens, output_tokens=cache.output_tokens)
        latency = LatencyInputs(**{**{f.name: getattr(latency, f.name) for f in fields(latency)}, "hit_rate": hit})
        lat, prior, conf_l = self.predict_latency(latency)
        return Prediction(
            hit_rate=hit, ttft_p50_s=lat["ttft_p50_s"], ttft_p95_s=lat["ttft_p95_s"], tpot_p50_s=lat["tpot_p50_s"],
            tpot_p95_s=lat["tpot_p95_s"], ttft_p95_upper_s=lat["ttft_p95_s@upper"],
            tpot_p95_upper_s=lat["tpot_p95_s@upper"], gpu_busy_frac=lat["gpu_busy_frac"],
            capacity_rps_per_replica=prior.capacity_rps, router_wait_p95_s=prior.router_wait_p95_s,
            utilisation=prior.rho,
            confidence=np.where(cache.reuse_hit_at[:, -1][cache.reuse_index] < 1e-3, conf_l, np.minimum(conf_c, conf_l)),
        )

    def sustainable_rps(self, x: LatencyInputs, ttft_p95_slo_s: Any, tpot_p95_slo_s: Any, *,
                        upper: bool = False, iterations: int = 24) -> np.ndarray:
        """Capacity model: the largest arrival rate per replica whose predicted p95 TTFT and TPOT stay
        within the SLOs (bisection on λ, vectorised over rows; 0 if even an idle replica misses them).

        With upper=True the upper band (q = 0.9 of the window p95) must meet the SLO: a cautious
        capacity for chance constraints. Tokens/s at that rate: × prompt_tokens / output_tokens.
        """
        n = len(x)
        ttft_slo = _arr(ttft_p95_slo_s, n, "ttft_p95_slo_s")
        tpot_slo = _arr(tpot_p95_slo_s, n, "tpot_p95_slo_s")
        hi = latency_prior(self.table, x).capacity_rps * 1.0  # never beyond saturation
        lo = np.zeros(n)
        names = ("ttft_p95_s@upper", "tpot_p95_s@upper") if upper else ("ttft_p95_s", "tpot_p95_s")
        base = {f.name: getattr(x, f.name) for f in fields(x)}
        for _ in range(iterations):
            mid = 0.5 * (lo + hi)
            lat, _, _ = self.predict_latency(LatencyInputs(**{**base, "arrival_rps_per_replica": mid}))
            ok = (lat[names[0]] <= ttft_slo) & (lat[names[1]] <= tpot_slo)
            lo = np.where(ok, mid, lo)
            hi = np.where(ok, hi, mid)
        return lo


# Rows per block of a bulk predict: the prior's few hundred temporaries of a block stay within what
# the allocator keeps (see controller/runtime/allocator.py; 65,536 rows ≈ 30 MB of them). 100,000
# rows (10,000 plans × 10 pools): 16,384-row blocks 51 ms, 65,536 47 ms, unblocked 45 ms (+45 MB).
PREDICT_BLOCK = 65536


def _rows(x: Any, a: int, b: int) -> Any:
    """Rows [a, b) of a LatencyInputs or CacheInputs (views; a CacheInputs keeps its profile table)."""
    return type(x)(**{f.name: (getattr(x, f.name) if f.name == "reuse_hit_at" else getattr(x, f.name)[a:b])
                      for f in fields(x)})


# --------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class TrainingData:
    """Observed windows for fitting, one row per (tick, pool). Built by controller/core/features.py."""

    latency: LatencyInputs
    cache: CacheInputs
    targets: Mapping[str, np.ndarray]  # ALL_TARGETS → observed values (NaN where unknown)
    t_s: np.ndarray  # time of each row
    steady: np.ndarray  # bool: settings stable over the window (no change, nobody starting/draining)
    aux: Mapping[str, np.ndarray] = field(default_factory=dict)  # observed state, not model inputs:
    # waiting_per_replica, running_per_replica, kv_usage_frac (used to tell saturated windows)

    def __len__(self) -> int:
        return len(self.t_s)

    def subset(self, mask: np.ndarray) -> TrainingData:
        idx = np.flatnonzero(mask)
        lat = LatencyInputs(**{f.name: getattr(self.latency, f.name)[idx] for f in fields(self.latency)})
        c = self.cache
        cache = CacheInputs(**{f.name: (getattr(c, f.name) if f.name == "reuse_hit_at" else getattr(c, f.name)[idx])
                               for f in fields(c)})
        return TrainingData(lat, cache, {k: v[idx] for k, v in self.targets.items()}, self.t_s[idx], self.steady[idx],
                            {k: v[idx] for k, v in self.aux.items()})


MIN_WINDOW_REQUESTS = 30  # a window's p95 from fewer requests is noise, not signal


def _enough_requests(data: TrainingData) -> np.ndarray:
    n = data.aux.get("requests_in_window")
    return np.ones(len(data), dtype=bool) if n is None else n >= MIN_WINDOW_REQUESTS


def _valid_latency_rows(data: TrainingData, target: str) -> np.ndarray:
    y = data.targets[target]
    return (np.isfinite(y) & (y > 0) & (data.latency.arrival_rps_per_replica > 0) & data.steady
            & _enough_requests(data))


MAX_QUEUED_PER_REPLICA = 1.0  # an engine queue this long at the window's end: the engines cannot admit


def engine_not_saturated(data: TrainingData, max_queued_per_replica: float = MAX_QUEUED_PER_REPLICA) -> np.ndarray:
    """Rows whose engines were admitting what arrived: the engine queue (vllm:num_requests_waiting,
    per ready replica, read at the window's end) below max_queued_per_replica. vLLM queues a
    request only when it cannot schedule it (KV cache or max_num_seqs full), so a standing queue
    means the window measured how long a queue grew, not a load. Rows without the gauge count as
    not saturated (the prior's utilisation rule still applies)."""
    w = data.aux.get("waiting_per_replica")
    if w is None:
        return np.ones(len(data), dtype=bool)
    w = np.asarray(w, dtype=float)
    return ~(w >= max_queued_per_replica)


def _valid_cache_rows(data: TrainingData) -> np.ndarray:
    y = data.targets["hit_rate"]
    prof_inf = data.cache.reuse_hit_at[data.cache.reuse_index][:, -1]
    return (np.isfinite(y) & (prof_inf >= 1e-3) & (data.cache.arrival_rps > 0) & data.steady
            & _enough_requests(data))


def fit_coupling(data: TrainingData, physics: Sequence[PoolPhysics], rng: np.random.Generator,
                 config: CorrectionConfig = CorrectionConfig(), seed: int = 0) -> CouplingModels:
    """Fit every correction on the steady rows of `data` (time order does not matter here).

    Targets with fewer than `config.min_rows` usable rows keep the prior alone (confidence 0).
    Deterministic for a given rng state (subsampling is the only random step).
    """
    table = PhysicsTable(physics)
    corrections: dict[str, Correction] = {}
    m = _valid_cache_rows(data)
    if m.any():
        sub = data.subset(m)
        prior = cache_prior(table, sub.cache)
        X = cache_features(prior, sub.cache)
        y = np.clip(sub.targets["hit_rate"], 0.0, 1.0)
        r = _logit(np.clip(y, 2e-3, 0.998)) - _logit(np.maximum(prior.hit_rate, 1e-4))
        corrections["hit_rate"] = _fit_correction("hit_rate", X, r, 0.5, config, rng, sub.t_s,
                                                  logit_base=_logit(np.maximum(prior.hit_rate, 1e-4)),
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
        m = _valid_latency_rows(data, t) & operating
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
        masks = {t: rows & _valid_latency_rows(data, t) for t in CALIBRATION_TARGETS}
        if int(np.any(np.column_stack(list(masks.values())), axis=1).sum()) < config.min_rows:
            continue
        sub_idx = np.flatnonzero(np.any(np.column_stack(list(masks.values())), axis=1))
        sub = data.subset(np.isin(np.arange(len(data)), sub_idx))
        ys = {t: sub.targets[t] for t in CALIBRATION_TARGETS}
        oks = {t: _valid_latency_rows(sub, t) for t in CALIBRATION_TARGETS}

        def residuals(theta: np.ndarray, sub: TrainingData = sub, ys=ys, oks=oks, ph=ph) -> np.ndarray:
            cal = {ph.key: Calibration(float(np.exp(theta[0])), float(np.exp(theta[1])))}
            pr = latency_prior(PhysicsTable(physics, cal), sub.latency)
            parts = [np.log(np.maximum(getattr(pr, t)[oks[t]], 1e-6)) - np.log(ys[t][oks[t]])
                     for t in CALIBRATION_TARGETS]
            return np.concatenate(parts)

        lim = math.log(5.0)

        def solve(mask: np.ndarray) -> Calibration:
            part = sub.subset(mask)
            ys_p = {t: part.targets[t] for t in CALIBRATION_TARGETS}
            oks_p = {t: _valid_latency_rows(part, t) for t in CALIBRATION_TARGETS}
            res = least_squares(lambda th: residuals(th, part, ys_p, oks_p), x0=np.zeros(2),
                                bounds=([-lim, -lim], [lim, lim]), loss="soft_l1", f_scale=0.3, max_nfev=60,
                                diff_step=1e-3)
            return Calibration(float(np.exp(res.x[0])), float(np.exp(res.x[1])))

        def with_tail(part: TrainingData, cal: Calibration) -> Calibration:
            """The TTFT tail width (grid) that minimises the p95's absolute percentage error."""
            ok = _valid_latency_rows(part, "ttft_p95_s")
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

        def solve_full(mask: np.ndarray) -> Calibration:
            return with_tail(sub.subset(mask), solve(mask))

        def solve_tail(mask: np.ndarray) -> Calibration:
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
            ok = hold & _valid_latency_rows(sub, t) & (prior0.rho_engine < config.max_train_rho)
            y = sub.targets[t][ok]
            loss_cal += float(np.sum(np.abs(getattr(pr, t)[ok] - y) / y))
            loss_prior += float(np.sum(np.abs(getattr(prior0, t)[ok] - y) / y))
    return loss_cal < config.cv_min_gain * loss_prior


# --------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class ModelErrors:
    """Errors of a CouplingModels on observed rows (steady rows only, below saturation for latency)."""

    mape: Mapping[str, float]  # latency targets: mean |ŷ − y| / y
    hit_rate_mae: float
    rows: Mapping[str, int]
    log_q90: Mapping[str, float]  # 0.9 quantile of log(y / ŷ): the spread for the upper band
    gpu_busy_frac_mae: float = math.nan

    def score(self) -> float:
        """One number to compare two models (lower is better): mean of the p95 MAPEs and 2× the hit MAE."""
        parts = [v for k, v in self.mape.items() if k in ("ttft_p95_s", "tpot_p95_s") and math.isfinite(v)]
        if math.isfinite(self.hit_rate_mae):
            parts.append(2.0 * self.hit_rate_mae)
        return float(np.mean(parts)) if parts else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {"mape": dict(self.mape), "hit_rate_mae": self.hit_rate_mae, "gpu_busy_frac_mae": self.gpu_busy_frac_mae,
                "rows": dict(self.rows), "log_q90": dict(self.log_q90), "score": self.score()}


def evaluate(models: CouplingModels, data: TrainingData, *, max_rho: float = 0.9,
             use_observed_hit: bool = True) -> ModelErrors:
    """MAPE per latency target, MAE of the hit rate and of the GPU busy fraction, on the steady
    rows of `data` (a busy fraction near 0 would make a percentage error meaningless).

    Latency rows count only below saturation: the uncalibrated prior's engine utilisation below
    max_rho and no standing engine queue (engine_not_saturated). With use_observed_hit the
    latency model gets the observed hit rate (isolates its error); otherwise the cache model's
    prediction (the planner's chain).
    """
    mape: dict[str, float] = {}
    rows: dict[str, int] = {}
    logq: dict[str, float] = {}
    lat_in = data.latency
    if not use_observed_hit:
        hit, _ = models.predict_hit_rate(data.cache)
        obs_hit = data.latency.hit_rate
        lat_in = LatencyInputs(**{**{f.name: getattr(lat_in, f.name) for f in fields(lat_in)},
                                  "hit_rate": np.where(np.isfinite(hit), hit, obs_hit)})
    pred, _, _ = models.predict_latency(lat_in)
    # the operating range is judged by the uncalibrated prior: the same rows for every model compared
    below = (latency_prior(PhysicsTable(models.physics), lat_in).rho_engine < max_rho) & engine_not_saturated(data)
    for t in LATENCY_TARGETS:
        m = _valid_latency_rows(data, t) & below
        rows[t] = int(m.sum())
        if m.any():
            y, yh = data.targets[t][m], pred[t][m]
            mape[t] = float(np.mean(np.abs(yh - y) / y))
            logq[t] = float(np.quantile(np.log(y / yh), 0.9))
        else:
            mape[t] = math.nan
            logq[t] = math.nan
    m = _valid_latency_rows(data, "gpu_busy_frac") & below
    rows["gpu_busy_frac"] = int(m.sum())
    busy_mae = float(np.mean(np.abs(pred["gpu_busy_frac"][m] - data.targets["gpu_busy_frac"][m]))) if m.any() else math.nan
    m = _valid_cache_rows(data)
    rows["hit_rate"] = int(m.sum())
    if m.any():
        hit, _ = models.predict_hit_rate(data.subset(m).cache)
        mae = float(np.mean(np.abs(hit - data.targets["hit_rate"][m])))
    else:
        mae = math.nan
    return ModelErrors(mape, mae, rows, logq, busy_mae)


# --------------------------------------------------------------------------- plain state (for storage)

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


def with_physics(models: CouplingModels, physics: Sequence[PoolPhysics]) -> CouplingModels:
    """The same corrections over another set of pool physics (the corrections are physics-free:
    their features are dimensionless or logs of prior terms), e.g. a shipped model for a new fleet."""
    return replace(models, physics=tuple(physics))


# --------------------------------------------------------------------------- reuse profile from telemetry

# Shape of a reuse profile when only the hit rate is known (the Mooncake conversation trace's,
# normalised to h∞ = 1): most reuse within minutes, a tail to an hour.
DEFAULT_REUSE_SHAPE = np.array([0.14, 0.27, 0.38, 0.49, 0.59, 0.76, 0.86, 0.95, 0.98, 1.0])


def infer_reuse_profile(models: CouplingModels, x: CacheInputs, observed_hit: np.ndarray, *,
                        shape: np.ndarray = DEFAULT_REUSE_SHAPE, iterations: int = 30) -> np.ndarray:
    """Reuse profiles (rows × len(REUSE_TAU_S)) that make the cache model reproduce `observed_hit`
    under each row's current settings: h∞ × shape, h∞ found by bisection (the model is monotone
    in h∞). For a deployment whose router does not report prefix reuse: the planner calls this
    once per tick with the pools' current state, then asks "what if" with the returned profiles.
    Rows whose observed hit is NaN get no reuse (zeros).
    """
    n = len(x)
    obs = np.asarray(observed_hit, dtype=float)
    lo, hi = np.zeros(n), np.ones(n)
    shape = np.asarray(shape, dtype=float)
    base = {f.name: getattr(x, f.name) for f in fields(x)}
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        prof = mid[:, None] * shape[None, :]
        probe = CacheInputs(**{**base, "reuse_hit_at": prof, "reuse_index": np.arange(n)})
        hit, _ = models.predict_hit_rate(probe)
        low = hit < obs
        lo = np.where(low, mid, lo)
        hi = np.where(low, hi, mid)
    h_inf = np.where(np.isfinite(obs), 0.5 * (lo + hi), 0.0)
    return h_inf[:, None] * shape[None, :]
