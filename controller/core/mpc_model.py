"""What the MPC planner needs predicted, in bulk, and a prior-only implementation from queueing theory.

The planner scores thousands of candidate plans per tick, so every prediction here takes
flat numpy arrays (one row per candidate × horizon step × pool) and returns arrays:

- `PlanModel.latency(q)`: p50/p95 TTFT and TPOT, the per-replica rate the pool sustains
  at its concurrency limit, utilisation, and a confidence, given the load per replica,
  the prompt/output mix, the prefix hit rate and the batching levers (in-flight cap,
  max_num_seqs, max_num_batched_tokens);
- `PlanModel.hit_rate(...)`: steady-state prefix-cache hit rate given the routing
  affinity (prefix weight against the load weights), the replicas serving, the KV
  capacity per replica and the traffic's reuse profile (`ReuseEstimate`).

`QueueingPrior` answers both from first principles plus per-engine step-time figures
(`EngineFigures`: a linear step-time model a + b·seqs + c·context + d·prefill tokens +
e·attention work). The figures are constructor data: the policy passes either an
operator's profile or `figures_for(pool)` (controller.perf.figures), which looks the engine
up in `PROFILED_FIGURES` (least-squares fits of the calibrated step times at batch 0–256,
context 0.5k–12k tokens, prefill 0–8k tokens; MAPE 2–6 %) and falls back to a roofline from
the model's parameter count and the SKU's memory bandwidth for engines not in the table.

The fluid model of one replica (worked example, Llama-3-70B TP4 on H100, 3.3 req/s per
replica, 1,155-token prompts with 35 % hits, 211 output tokens):
  prefill GPU-seconds per request  pc = d·u + e·u·(P·h + u/2), u = P(1−h) = 751 → 0.051 s
  decode GPU-seconds per token      β = b + c·(P + O/2) = 0.295 ms + 35 ns × 1,260 → 0.339 ms
  utilisation                       ρ = λ·(pc + O·β) = 3.3 × (0.051 + 0.072) = 0.40
  step time (= mean TPOT)           t = a / (1 − ρ) = 32.7 ms / 0.60 = 55 ms
  sequences in the batch            N = λ·O·t = 38
  rate at the concurrency limit     λ_cap = N_lim / (O·a + N_lim·(pc + O·β))
Above λ_cap requests queue (at the router behind an in-flight cap, else in the engine);
the stochastic wait near λ_cap uses the Halfin–Whitt approximation of M/M/c with
c = N_lim slots. p95s come from log-normal spreads (prompt length σ = 1 in log space)
times per-pool correction factors the policy learns online (observed / predicted).

The cache prior: with affinity a = w_prefix / (w_prefix + w_half) a prefix is served by
the replica holding it, so the fleet caches n·K tokens; without, every replica must
hold the whole working set: effective cache K_eff = K_free · (a·n + 1 − a), and
hit = inf_hit · min(1, K_eff / working_set)^0.5. Example: inf_hit 0.4, working set
2M tokens, 4 replicas of 450k free tokens, a = 0.6 → K_eff = 450k × 3.0 = 1.35M →
hit = 0.4 × 0.82 = 0.33.

Must not: do I/O, read the clock, use global randomness, or import the simulator
(controller.sim): figures arrive as data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from controller.core.coupling.cache_prior import router_affinity
from controller.core.distributions import PROMPT_LOG_SIGMA, ndtr_saturated
from controller.perf.engine_figures import EngineFigures
from controller.perf.figures import figures_for, figures_key
from controller.types import PoolSpec

_P50_OF_MEAN = math.exp(-PROMPT_LOG_SIGMA**2 / 2)  # median / mean of a log-normal: 0.61
_P95_OF_MEAN = math.exp(1.6449 * PROMPT_LOG_SIGMA - PROMPT_LOG_SIGMA**2 / 2)  # p95 / mean: 3.14
TPOT_P95_OF_MEAN = 1.2  # prior: request TPOT p95 / mean step time from batch-size variation
TTFT_P95_FACTOR = 1.6  # prior: p95 TTFT / the fluid estimate (other prompts share the prefill step; bursts)
KV_FREE_FRAC = 0.9  # share of the KV pool running sequences may take before the engine preempts
CACHE_COVERAGE_EXP = 0.5  # hit ~ coverage^0.5: LRU keeps the hottest prefixes first
UTIL_CLIP = 0.995
PROMPT_M2, PROMPT_M3, PROMPT_M4 = 2.4, 7.0, 50.0  # E[u^k]/E[u]^k of prompt lengths (see latency())


# --------------------------------------------------------------------------- queries and answers


@dataclass(frozen=True)
class LatencyQuery:
    """One row per (candidate, step, pool); every array has the same shape (any shape), or shapes
    that broadcast together (the planner passes per-pool constants as (P,) and per-candidate levers
    as (C, 1, 1, P), so the model computes each quantity once per distinct value; the answer has
    the broadcast shape)."""

    pool_index: np.ndarray  # int, row into the model's pools
    rps_per_replica: np.ndarray  # admitted requests/s per serving replica
    prompt_tokens: np.ndarray  # mean prompt tokens per request
    output_tokens: np.ndarray  # mean output tokens per request
    hit_rate: np.ndarray  # prefix-cache hit rate, 0..1
    inflight_cap: np.ndarray  # per replica, 0 = none
    max_num_seqs: np.ndarray  # engine cap
    max_num_batched_tokens: np.ndarray  # engine token budget per step


@dataclass(frozen=True)
class LatencyAnswer:
    ttft_p50_s: np.ndarray
    ttft_p95_s: np.ndarray  # excluding the fluid backlog the planner adds itself
    tpot_p50_s: np.ndarray
    tpot_p95_s: np.ndarray
    capacity_rps: np.ndarray  # per replica, at the concurrency limit (fluid)
    utilisation: np.ndarray  # rps / capacity_rps
    batch: np.ndarray  # mean sequences running per replica
    confidence: np.ndarray  # 0 (prior only, unchecked) .. 1
    slot_wait_p50_s: np.ndarray | None = None  # the part of the TTFTs that is waiting for a batch slot
    slot_wait_p95_s: np.ndarray | None = None  # (first come first served; callers may re-weigh by priority)
    # the longest TPOT a request can have: every step of its life carrying a full prefill chunk
    # (the batch-token budget bounds a step); None = unbounded
    tpot_max_s: np.ndarray | None = None


@dataclass(frozen=True)
class ReuseEstimate:
    """The traffic's prefix reuse: what an infinite cache would hit, and over how many tokens."""

    inf_hit: float = 0.0
    working_set_tokens: float = 0.0

    def __post_init__(self) -> None:
        if not (0.0 <= self.inf_hit <= 1.0) or not (self.working_set_tokens >= 0):
            raise ValueError(f"ReuseEstimate: inf_hit in [0, 1], working_set_tokens >= 0 (got {self})")


class PlanModel(Protocol):
    """What the planner asks, in bulk. Implementations: QueueingPrior, LearnedPlanModel."""

    @property
    def pools(self) -> tuple[str, ...]: ...  # read-only: the implementations are frozen dataclasses

    def latency(self, q: LatencyQuery) -> LatencyAnswer: ...

    def hit_rate(self, pool_index: np.ndarray, replicas: np.ndarray, prefix_weight: np.ndarray,
                 load_weight: np.ndarray, reuse_inf_hit: np.ndarray, reuse_working_set: np.ndarray,
                 batch_tokens: np.ndarray) -> np.ndarray: ...

    def kv_tokens(self) -> np.ndarray: ...

    def with_corrections(self, ttft: Sequence[float], tpot: Sequence[float], confidence: float,
                         burst: Sequence[float] | None = None) -> PlanModel: ...

    def burst_for(self, q: LatencyQuery, tpot_p95_s: float, hi: float = 200.0) -> float: ...



# From β = 3 on, P(wait) = 1/(1 + β·Φ(β)/φ(β)) ≤ 0.00148 (its value at 3; it falls with β): at most
# the tail 1 − q of any quantile q ≤ 0.998, whose wait is then 0 (the tests check the formula's zeros).
HW_WAIT_FREE_BETA = 3.0
HW_MAX_QUANTILE = 0.998


_KERNEL: list[ModuleType | None] = []  # controller.core.mpc_kernel once imported; [None] without numba


def compiled_kernel() -> ModuleType | None:
    """controller.core.mpc_kernel (the planner's compiled loops), imported and its loops compiled on
    first use (numba takes ~0.2 s to import; compiling takes seconds where numba's disk cache is cold,
    under a second from the cache), or None where numba is not installed or cannot compile here: the
    numpy formulas then answer, with the same values to the last bits of a transcendental function."""
    if not _KERNEL:
        try:
            from controller.core import mpc_kernel

            mpc_kernel.warm_up()
        except Exception:  # noqa: BLE001  no numba, or numba unusable here (e.g. no cache location): numpy
            _KERNEL.append(None)
        else:
            _KERNEL.append(mpc_kernel)
    return _KERNEL[0]


def _halfin_whitt_wait(util: np.ndarray, servers: np.ndarray, service_s: np.ndarray,
                       qs: tuple[float, ...]) -> tuple[np.ndarray, ...]:
    """q-quantiles of the wait in an M/M/c queue (Halfin–Whitt P(wait), exponential conditional wait).

    Example: c = 64 slots, utilisation 0.97, service 15 s → β = 0.24, P(wait) = 1/(1 + β·Φ(β)/φ(β))
    = 0.79, p95 wait = ln(0.79/0.05) × 15 / (64 × 0.03) = 21.6 s.

    P(wait) falls with β, and from β = `HW_WAIT_FREE_BETA` on it is below the tail 1 − q of every
    quantile asked for (q ≤ `HW_MAX_QUANTILE`), so the wait is exactly 0 there: only the rows below are
    evaluated (most of the planner's rows, tens of slots at moderate utilisation, lie beyond).
    Where no row is below, the answer is zeros; otherwise the same formula on those rows.
    """
    if all(q <= HW_MAX_QUANTILE for q in qs):
        u = np.clip(util, 0.0, UTIL_CLIP)
        c = np.maximum(servers, 1.0)
        idle = 1.0 - u
        beta = idle * np.sqrt(c)
        shape = beta.shape
        rows = beta < HW_WAIT_FREE_BETA  # NaN is not below: a NaN row waits 0, as the formula's `where` gives
        if not rows.any():
            return tuple(np.zeros(shape) for _ in qs)
        sub = _halfin_whitt_rows(u[rows], np.broadcast_to(c, shape)[rows], beta[rows],
                                 np.broadcast_to(service_s, shape)[rows], idle[rows], qs)
        out = []
        for s in sub:
            full = np.zeros(shape)
            full[rows] = s
            out.append(full)
        return tuple(out)
    u = np.clip(util, 0.0, UTIL_CLIP)
    c = np.maximum(servers, 1.0)
    idle = 1.0 - u
    beta = idle * np.sqrt(c)
    return _halfin_whitt_rows(u, c, beta, service_s, idle, qs)


def _halfin_whitt_rows(u: np.ndarray, c: np.ndarray, beta: np.ndarray, service_s: np.ndarray, idle: np.ndarray,
                       qs: tuple[float, ...]) -> tuple[np.ndarray, ...]:
    """`_halfin_whitt_wait` from its clipped utilisation, slots, β and idle share (same shapes or broadcastable)."""
    phi = np.exp(-0.5 * beta * beta) / math.sqrt(2 * math.pi)
    p_wait = 1.0 / (1.0 + beta * ndtr_saturated(beta) / np.maximum(phi, 1e-300))
    p_wait = np.where(u <= 0.0, 0.0, p_wait)
    rate = c * idle / np.maximum(service_s, 1e-9)
    out = []
    for q in qs:
        tail = 1.0 - q
        out.append(np.where(p_wait > tail, np.log(np.maximum(p_wait, tail) / tail) / rate, 0.0))
    return tuple(out)


@dataclass(frozen=True)
class QueueingPrior:
    """The prior-only PlanModel: fluid continuous batching + M/M/c waiting + log-normal spreads."""

    pools: tuple[str, ...]
    figures: tuple[EngineFigures, ...]
    roles: tuple[str, ...] = ()
    ttft_correction: tuple[float, ...] = ()  # observed / predicted p95 TTFT, per pool (1 = none)
    tpot_correction: tuple[float, ...] = ()
    burst: tuple[float, ...] = ()  # burst length, s: at the p95 a replica's prompts of this many seconds
    # arrive together (0 = Poisson-smooth arrivals)
    base_confidence: float = 0.3
    # answer bulk queries with the compiled loop (controller/core/mpc_kernel.py) where numba is
    # installed; False = the numpy formula below (the reference the tests compare it with)
    compiled: bool = field(default=True, compare=False)
    _arr: Mapping[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.pools)
        if len(self.figures) != n:
            raise ValueError(f"QueueingPrior: {n} pools but {len(self.figures)} figures")
        if not self.roles:
            object.__setattr__(self, "roles", ("mixed",) * n)
        if not self.ttft_correction:
            object.__setattr__(self, "ttft_correction", (1.0,) * n)
        if not self.tpot_correction:
            object.__setattr__(self, "tpot_correction", (1.0,) * n)
        if not self.burst:
            object.__setattr__(self, "burst", (0.0,) * n)
        f = self.figures
        arr = {
            "a": np.array([x.a_s for x in f]), "b": np.array([x.b_s_per_seq for x in f]),
            "c": np.array([x.c_s_per_ctx_token for x in f]), "d": np.array([x.d_s_per_prefill_token for x in f]),
            "e": np.array([x.e_s_per_attn_work for x in f]), "kv": np.array([x.kv_tokens for x in f]),
            "prefill_only": np.array([r == "prefill" for r in self.roles]),
            "decode_only": np.array([r == "decode" for r in self.roles]),
            "k_ttft": np.array(self.ttft_correction, dtype=float),
            "k_tpot": np.array(self.tpot_correction, dtype=float),
            "burst": np.array(self.burst, dtype=float),
        }
        # per pool, the columns the compiled loop reads (mpc_kernel._static), with √ of the corrections
        arr["fig"] = np.stack([arr[k].astype(float) for k in ("a", "b", "c", "d", "e", "kv", "prefill_only",
                                                              "decode_only", "k_ttft", "k_tpot", "burst")]
                              + [np.sqrt(arr["k_ttft"]), np.sqrt(arr["k_tpot"])], axis=1)
        object.__setattr__(self, "_arr", arr)

    @staticmethod
    def for_pools(pools: Sequence[PoolSpec], figures: Mapping[str, EngineFigures] | None = None) -> QueueingPrior:
        """Figures by pool name from `figures`, else `figures_for(pool)`."""
        figs = tuple(EngineFigures.of(figures[p.name]) if figures and p.name in figures else figures_for(p)
                     for p in pools)
        return QueueingPrior(pools=tuple(p.name for p in pools), figures=figs, roles=tuple(p.role for p in pools))

    def with_corrections(self, ttft: Sequence[float], tpot: Sequence[float], confidence: float,
                         burst: Sequence[float] | None = None) -> QueueingPrior:
        return replace(self, ttft_correction=tuple(float(x) for x in ttft),
                       tpot_correction=tuple(float(x) for x in tpot), base_confidence=float(confidence),
                       burst=tuple(float(x) for x in burst) if burst is not None else self.burst, _arr={})

    def kv_tokens(self) -> np.ndarray:
        return self._arr["kv"]

    # ---- latency

    def latency(self, q: LatencyQuery) -> LatencyAnswer:
        if self.compiled:
            fast = self._latency_compiled(q)
            if fast is not None:
                return fast
        return self._latency(q)[0]

    def _latency_compiled(self, q: LatencyQuery) -> LatencyAnswer | None:
        """`_latency`'s answer from the compiled loop (see controller/core/mpc_kernel.py), or None where
        numba is missing or the query is not one it takes (more than 4 dimensions, no rows)."""
        kern = compiled_kernel()
        shape = np.broadcast_shapes(*(np.shape(getattr(q, f)) for f in LatencyQuery.__dataclass_fields__))
        if kern is None or math.prod(shape) == 0:
            return None
        A = self._arr
        pool = np.asarray(q.pool_index).astype(np.intp)
        consts = np.array([PROMPT_M2, PROMPT_M3, PROMPT_M4, KV_FREE_FRAC, UTIL_CLIP, _P50_OF_MEAN, _P95_OF_MEAN,
                           TTFT_P95_FACTOR, TPOT_P95_OF_MEAN, self.base_confidence, HW_WAIT_FREE_BETA,
                           1.0 - 0.95, 1.0 - 0.50, float(A["burst"][pool].any())])
        inputs = [pool] + [np.asarray(getattr(q, f), dtype=float) for f in (
            "rps_per_replica", "prompt_tokens", "output_tokens", "hit_rate", "inflight_cap", "max_num_seqs",
            "max_num_batched_tokens")]
        rows = kern.latency_rows(shape, inputs, A["fig"], consts)
        if rows is None:
            return None
        return LatencyAnswer(ttft_p50_s=rows[0], ttft_p95_s=rows[1], tpot_p50_s=rows[2], tpot_p95_s=rows[3],
                             capacity_rps=rows[4], utilisation=rows[5], batch=rows[6], confidence=rows[7],
                             slot_wait_p50_s=rows[8], slot_wait_p95_s=rows[9], tpot_max_s=rows[10])

    def _latency(self, q: LatencyQuery) -> tuple[LatencyAnswer, Callable[[np.ndarray], np.ndarray]]:
        """The answer, and p95 TPOT as a function of the burst length per row (the only term the burst
        moves; `burst_for` bisects on it without recomputing the rest)."""
        # Inputs may be broadcastable rather than equal in shape (see LatencyQuery): every formula
        # below is element-wise, so a quantity that depends only on the pool, the levers or the hit
        # rate is computed at that smaller shape (once per distinct value, the same floating-point
        # result per element) and only the load-dependent ones at the full shape.
        shape = np.broadcast_shapes(*(np.shape(getattr(q, f)) for f in LatencyQuery.__dataclass_fields__))
        A = self._arr
        i = np.asarray(q.pool_index).astype(np.intp)
        a, b, c, d, e, kv = A["a"][i], A["b"][i], A["c"][i], A["d"][i], A["e"][i], A["kv"][i]
        pre_only, dec_only = A["prefill_only"][i], A["decode_only"][i]
        lam = np.maximum(q.rps_per_replica, 0.0)
        P = np.maximum(q.prompt_tokens, 1.0)
        hit = np.clip(q.hit_rate, 0.0, 0.99)
        O = np.maximum(q.output_tokens, 1.0)  # noqa: E741  O: output tokens, the formulas' symbol
        if pre_only.any():
            O = np.where(pre_only, 1.0, O)  # noqa: E741  O: output tokens, the formulas' symbol
        u = P * (1.0 - hit)
        if dec_only.any():
            u = np.where(dec_only, 0.0, u)
        # Prompt-length moments E[u^k] / E[u]^k of a log-normal (σ ≈ 1) truncated at the context
        # length: an untruncated σ = 1 gives 2.7, 20 and 403; real traces give ~2-2.7, 5-9 and
        # 15-90 (Azure 2023 chat: 1.9, -, 19; Mooncake: 2.7, -, 93), so the tail is capped.
        u2, u3, u4 = u * u * PROMPT_M2, u**3 * PROMPT_M3, u**4 * PROMPT_M4
        ph = P * hit  # cached context each uncached chunk attends to
        pc = d * u + e * (u * ph + 0.5 * u2)
        pc2 = (d + e * ph) ** 2 * u2 + (d + e * ph) * e * u3 + 0.25 * e * e * u4  # E[prefill seconds²]
        ctx = P + 0.5 * O
        beta = b + c * ctx
        work = pc + O * beta  # GPU-seconds per request beyond the fixed step cost
        seq_cap = np.where(q.max_num_seqs > 0, q.max_num_seqs, 256.0)
        n_lim = np.minimum(seq_cap, KV_FREE_FRAC * kv / ctx)
        n_lim = np.where(q.inflight_cap > 0, np.minimum(n_lim, q.inflight_cap), n_lim)
        n_lim = np.maximum(n_lim, 1.0)
        cap_rps = n_lim / (O * a + n_lim * work)
        util = lam / np.maximum(cap_rps, 1e-12)
        lam_eff = np.minimum(lam, cap_rps * UTIL_CLIP)
        rho = lam_eff * work
        free = np.maximum(1.0 - rho, 1e-3)
        t = a / free
        batch = lam_eff * O * t
        # Waiting for a batch slot (engine queue, or the router behind an in-flight cap).
        service = O * t
        # (at and past saturation the caller's fluid backlog takes over: the stochastic term is
        # evaluated at most at 98 % utilisation so the two are not counted twice)
        w95, w50 = _halfin_whitt_wait(np.minimum(util, 0.98), n_lim, service, (0.95, 0.50))
        # Waiting behind other prompts' prefill (Pollaczek–Khinchine on the prefill work):
        # mean λ·E[pc²] / (2(1−ρ)); its tail is roughly exponential (p95 ≈ 3 × mean).
        w_pk = lam_eff * pc2 / (2.0 * free)
        budget = np.where(q.max_num_batched_tokens > 0, q.max_num_batched_tokens, 8192.0)
        budget = np.maximum(budget - batch, 256.0)

        def prefill_s(uq: np.ndarray) -> np.ndarray:
            steps = np.ceil(uq / budget)
            res: np.ndarray = steps * t + d * uq + e * uq * (ph + 0.5 * uq)
            return res

        u50 = u * _P50_OF_MEAN
        u95 = u * _P95_OF_MEAN
        k_ttft, k_tpot, burst = A["k_ttft"][i], A["k_tpot"][i], A["burst"][i]
        # Bursts: when a replica's prompts of `burst` seconds arrive together, the steps of the
        # burst carry chunks of that much prefill, so decoders then run at the chunked step time.
        # More replicas make each replica's share of a burst smaller; the batch-token budget
        # bounds the chunk, which is why a smaller max_num_batched_tokens protects TPOT under
        # bursty arrivals. Example (8B, A100): 3 req/s per replica, 1,350 uncached tokens,
        # burst 1 s → 4,050-token chunks → 11 ms + 65 µs × 4,050 = 0.28 s per step; a
        # 1,024-token budget caps it at 0.08 s.
        t_dec: np.ndarray = a + beta * batch

        def tpot_burst_of(burst: np.ndarray) -> np.ndarray:
            if not burst.any():  # no burst anywhere: the chunk is 0 and the burst step is the decode step
                return t_dec
            chunk = np.minimum(budget, burst * lam_eff * u)
            res: np.ndarray = t_dec + d * chunk + e * chunk * (ph + 0.5 * chunk)
            return res

        ttft50 = (0.5 * t + prefill_s(u50) + 0.7 * w_pk + w50) * np.sqrt(k_ttft)
        ttft95 = (TTFT_P95_FACTOR * (0.95 * t + prefill_s(u95)) + 3.0 * w_pk + w95) * k_ttft
        # Decode-only pools: the first token is one decode step after the KV arrives.
        if dec_only.any():
            ttft50 = np.where(dec_only, 1.5 * t + w50, ttft50)
            ttft95 = np.where(dec_only, 1.95 * t + w95, ttft95)
        # A request's TPOT averages the steps of its lifetime L = O·t; the prefill work that
        # lands in them is compound Poisson (rate λ, sizes pc): sd √(λ·L·E[pc²]) / O per token.
        spread = np.sqrt(lam_eff * service * pc2) / O
        tpot50 = t * np.sqrt(k_tpot)
        tpot95_smooth = t * TPOT_P95_OF_MEAN + 1.645 * spread

        def tpot95_of(burst: np.ndarray) -> np.ndarray:
            res: np.ndarray = np.maximum(tpot95_smooth, tpot_burst_of(burst)) * k_tpot
            return res

        tpot95 = tpot95_of(burst)
        # A request's TPOT is the mean of its steps, and no step carries more prefill than the
        # batch-token budget: with the batch at its p95 (Poisson: mean + 1.645·√mean), one full chunk
        # per step bounds it. Under bursts the p95 sits at that bound, so the tail beyond the p95 is
        # cut there (an uncut log-normal tail would put requests past a bound no step can exceed).
        # Decode-only pools run no prefill: no bound from this.
        t_hi = a + beta * (batch + 1.645 * np.sqrt(batch))
        tpot_max = np.maximum((t_hi + d * budget + e * budget * (ph + 0.5 * budget)) * k_tpot, tpot95)
        if dec_only.any():
            tpot_max = np.where(dec_only, np.inf, tpot_max)
        # Past saturation the fluid model has no steady state: the planner adds the backlog;
        # confidence drops there (we extrapolate) and near idle (little signal in corrections).
        conf = np.where(util < 0.95, self.base_confidence, self.base_confidence * 0.5)

        def full(x: np.ndarray) -> np.ndarray:  # a quantity computed at a smaller shape, as a read-only view
            return x if np.shape(x) == shape else np.broadcast_to(x, shape)

        return LatencyAnswer(ttft_p50_s=full(ttft50), ttft_p95_s=full(ttft95), tpot_p50_s=full(tpot50),
                             tpot_p95_s=full(tpot95), capacity_rps=full(cap_rps), utilisation=full(util),
                             batch=full(batch), confidence=full(conf),
                             slot_wait_p50_s=full(w50 * np.sqrt(k_ttft)),
                             slot_wait_p95_s=full(w95 * k_ttft), tpot_max_s=full(tpot_max)), tpot95_of

    # ---- cache

    def hit_rate(self, pool_index: np.ndarray, replicas: np.ndarray, prefix_weight: np.ndarray,
                 load_weight: np.ndarray, reuse_inf_hit: np.ndarray, reuse_working_set: np.ndarray,
                 batch_tokens: np.ndarray) -> np.ndarray:
        """Steady-state hit rate; `batch_tokens` is the KV the running batch holds per replica."""
        kv = self._arr["kv"][pool_index]
        free = np.maximum(kv - batch_tokens, 0.1 * kv)
        aff = router_affinity(prefix_weight, load_weight)
        n = np.maximum(replicas, 1.0)
        k_eff = free * (aff * n + 1.0 - aff)
        cover = np.where(reuse_working_set > 0, np.minimum(1.0, k_eff / np.maximum(reuse_working_set, 1.0)), 1.0)
        return reuse_inf_hit * cover**CACHE_COVERAGE_EXP

    def burst_for(self, q: LatencyQuery, tpot_p95_s: float, hi: float = 200.0) -> float:
        """The burst length (s) at which the burst term alone predicts the
        observed p95 TPOT for the single-row query `q` (uncorrected): a bisection on [0, hi].
        Returns hi when even the full batch-token budget per step cannot explain it."""
        base = replace(self, ttft_correction=(1.0,) * len(self.pools), tpot_correction=(1.0,) * len(self.pools),
                       _arr={})
        # Only the burst term depends on the burst: the rest of the answer is computed once, and each
        # step re-evaluates p95 TPOT with the query's pool at `mid` (the model it would be with that burst).
        _, tpot95_of = base._latency(q)
        rows = np.asarray(q.pool_index).astype(np.intp)
        b = np.array(base.burst, dtype=float)
        lo, top = 0.0, hi
        for _ in range(30):
            mid = 0.5 * (lo + top)
            b[int(q.pool_index[0])] = mid
            if float(tpot95_of(b[rows])[0]) < tpot_p95_s:
                lo = mid
            else:
                top = mid
        return lo

    def sustainable_rps(self, pool_index: int, prompt_tokens: float, output_tokens: float, hit_rate: float,
                        ttft_slo_s: float, tpot_slo_s: float, inflight_cap: float = 0.0,
                        max_num_seqs: float = 256.0, max_num_batched_tokens: float = 8192.0) -> float:
        """Largest rate per replica whose predicted p95s meet the SLOs (bisection; 0 if none)."""
        lo, hi = 0.0, None

        def query(lam: np.ndarray) -> LatencyAnswer:
            n = len(lam)
            return self.latency(LatencyQuery(
                pool_index=np.full(n, pool_index), rps_per_replica=lam, prompt_tokens=np.full(n, prompt_tokens),
                output_tokens=np.full(n, output_tokens), hit_rate=np.full(n, hit_rate),
                inflight_cap=np.full(n, inflight_cap), max_num_seqs=np.full(n, max_num_seqs),
                max_num_batched_tokens=np.full(n, max_num_batched_tokens)))

        hi = float(query(np.array([1e-9])).capacity_rps[0])
        for _ in range(30):
            mid = 0.5 * (lo + hi)
            r = query(np.array([mid]))
            if r.ttft_p95_s[0] <= ttft_slo_s and r.tpot_p95_s[0] <= tpot_slo_s and r.utilisation[0] < 1.0:
                lo = mid
            else:
                hi = mid
        return lo


# --------------------------------------------------------------------------- learned models adapter


@dataclass(frozen=True)
class LearnedPlanModel:
    """PlanModel over the learned coupling models (controller/core/coupling/).

    TTFT quantiles come from `CouplingModels.predict_latency` (calibrated queueing prior +
    quantile-regression correction); the router wait behind an in-flight cap is added to TTFT as
    that module's notes say. TPOT comes from the fallback: the coupling models predict what the
    pool's telemetry reads, the per-token inter-token latency (vLLM's `inter_token_latency_seconds`),
    which chunked-prefill steps inflate, while a TPOT SLO judges each request's mean TPOT, the
    statistic the fallback models; planning on the former would buy replicas for a tail the SLO
    does not check. The sustainable rate, utilisation and batch come from the fallback too, so the
    in-flight cap is judged on one model's TPOT, batch and capacity: with the batch and capacity of
    one model and the TPOT of the other the cap can flap on and off tick by tick. The cache model and the
    planner's own online corrections and burst term stay with the `QueueingPrior` passed as
    `fallback` (the coupling cache model needs a reuse profile the telemetry does not carry),
    and the policy's correction factors multiply the learned quantiles only by the part the
    learned model did not already explain: they are learned against this model's own
    predictions. Confidence is the coupling models' (0 = prior only).

    `physics_index[j]` is the row of pool j in the coupling models' physics table
    (`CouplingModels.physics_index(physics_key(...))`, computed by the edge that loads them).
    """

    models: object  # controller.core.coupling.CouplingModels (typed loosely: an optional import)
    physics_index: tuple[int, ...]
    fallback: QueueingPrior

    @property
    def pools(self) -> tuple[str, ...]:
        return self.fallback.pools

    def with_corrections(self, ttft: Sequence[float], tpot: Sequence[float], confidence: float,
                         burst: Sequence[float] | None = None) -> LearnedPlanModel:
        return replace(self, fallback=self.fallback.with_corrections(ttft, tpot, confidence, burst))

    def kv_tokens(self) -> np.ndarray:
        return self.fallback.kv_tokens()

    def hit_rate(self, pool_index: np.ndarray, replicas: np.ndarray, prefix_weight: np.ndarray,
                 load_weight: np.ndarray, reuse_inf_hit: np.ndarray, reuse_working_set: np.ndarray,
                 batch_tokens: np.ndarray) -> np.ndarray:
        return self.fallback.hit_rate(pool_index, replicas, prefix_weight, load_weight, reuse_inf_hit,
                                      reuse_working_set, batch_tokens)

    def latency(self, q: LatencyQuery) -> LatencyAnswer:
        from controller.core.coupling import LatencyInputs  # optional dependency, pure

        shape = np.shape(q.rps_per_replica)
        flat = {f: np.ravel(np.broadcast_to(getattr(q, f), shape)) for f in LatencyQuery.__dataclass_fields__}
        n = flat["rps_per_replica"].size
        rows = np.asarray(self.physics_index, dtype=np.intp)[flat["pool_index"].astype(np.intp)]
        x = LatencyInputs.build(n, physics_index=rows, arrival_rps_per_replica=flat["rps_per_replica"],
                                prompt_tokens=flat["prompt_tokens"], output_tokens=flat["output_tokens"],
                                hit_rate=flat["hit_rate"], inflight_cap=flat["inflight_cap"],
                                max_num_seqs=flat["max_num_seqs"],
                                max_num_batched_tokens=flat["max_num_batched_tokens"])
        out, prior, conf = self.models.predict_latency(x)  # type: ignore[attr-defined]
        A = self.fallback._arr
        i = flat["pool_index"].astype(np.intp)
        k_ttft = A["k_ttft"][i]
        # per-request TPOT (with its corrections and burst term) from the fallback, see the docstring
        own = self.fallback.latency(LatencyQuery(**flat))
        wait = prior.router_wait_p95_s
        assert own.tpot_max_s is not None  # QueueingPrior.latency always bounds TPOT
        ans = LatencyAnswer(
            ttft_p50_s=(out["ttft_p50_s"] + 0.5 * wait) * np.sqrt(k_ttft),
            ttft_p95_s=(out["ttft_p95_s"] + wait) * k_ttft,
            tpot_p50_s=own.tpot_p50_s, tpot_p95_s=own.tpot_p95_s,
            capacity_rps=own.capacity_rps, utilisation=own.utilisation, batch=own.batch,
            confidence=np.asarray(conf, dtype=float) * np.ones(n),
            slot_wait_p50_s=0.5 * wait * np.sqrt(k_ttft), slot_wait_p95_s=wait * k_ttft,
            tpot_max_s=np.maximum(own.tpot_max_s, own.tpot_p95_s))
        reshaped: dict[str, Any] = {f: (None if getattr(ans, f) is None else np.reshape(getattr(ans, f), shape))
                                    for f in LatencyAnswer.__dataclass_fields__}
        return LatencyAnswer(**reshaped)

    def burst_for(self, q: LatencyQuery, tpot_p95_s: float, hi: float = 200.0) -> float:
        return self.fallback.burst_for(q, tpot_p95_s, hi)

    @staticmethod
    def for_pools(models: object, pools: Sequence[PoolSpec], fallback: QueueingPrior | None = None) -> LearnedPlanModel:
        """Wrap coupling models for a fleet; the physics key is "{model}/{sku}/tp{n}" (figures_key).
        Raises KeyError naming a pool whose engine the models have no physics for."""
        idx = []
        for p in pools:
            try:
                idx.append(int(models.physics_index(figures_key(p))))  # type: ignore[attr-defined]
            except (KeyError, ValueError) as e:
                raise KeyError(f"learned models have no physics for pool {p.name} ({figures_key(p)}): {e}") from None
        return LearnedPlanModel(models=models, physics_index=tuple(idx),
                                fallback=fallback or QueueingPrior.for_pools(pools))
