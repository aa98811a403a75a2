"""The latency prior: closed-form steady-state TTFT/TPOT quantiles, capacity and GPU busy fraction
of continuous batching with chunked prefill, per row (candidate plan × pool), vectorised.

`LatencyInputs` are the rows; `latency_prior` returns a `LatencyPrior` holding the predicted
statistics and the intermediate terms the learned corrections use as features.

Must not: fit anything, do I/O or import the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import ndtri

from controller.core.coupling.buckets import ITL_BUCKETS, TTFT_BUCKETS, bucket_quantile, half_tanh
from controller.core.coupling.numeric import as_rows, clamp, logit, sigmoid
from controller.core.coupling.physics import TOKEN_GRID, PhysicsTable, interp_rows_slope, interp_seg
from controller.core.distributions import PROMPT_LOG_SIGMA

RHO_CLIP = 0.97  # the prior's queueing terms are evaluated at min(ρ, RHO_CLIP)
FIXED_POINT_ITERS = 3  # Newton steps for the batch size of the latency prior (see latency_prior)
EPS = 1e-9
DECODE_STEP_LOG_SIGMA = 0.15  # spread of decode-only step times within a window (batch size moves)
# TTFT's log-spread is wider than the prompts' alone would give: the wait in the prefill queue
# varies too. The prior reads its p95 from a lognormal through its p50 whose spread is the prior's
# own (p95/p50) spread × this factor (× a calibrated Calibration.ttft_tail_width). Chosen on the
# training runs only (fit on one seed, scored on the other); the test runs played no part.
TTFT_SPREAD_FACTOR = 1.1


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
    arrival_dispersion: np.ndarray  # index of dispersion of arrival counts (Poisson = 1; core/observations.py)

    @staticmethod
    def build(n: int, *, physics_index: Any, arrival_rps_per_replica: Any, prompt_tokens: Any, output_tokens: Any,
              hit_rate: Any = 0.0, inflight_cap: Any = 0, max_num_seqs: Any = 0,
              max_num_batched_tokens: Any = 0, arrival_dispersion: Any = 1.0) -> LatencyInputs:
        """Broadcast scalars to n rows and check shapes."""
        return LatencyInputs(
            physics_index=as_rows(physics_index, n, "physics_index").astype(np.intp),
            arrival_rps_per_replica=as_rows(arrival_rps_per_replica, n, "arrival_rps_per_replica"),
            prompt_tokens=as_rows(prompt_tokens, n, "prompt_tokens"),
            output_tokens=as_rows(output_tokens, n, "output_tokens"),
            hit_rate=as_rows(hit_rate, n, "hit_rate"),
            inflight_cap=as_rows(inflight_cap, n, "inflight_cap"),
            max_num_seqs=as_rows(max_num_seqs, n, "max_num_seqs"),
            max_num_batched_tokens=as_rows(max_num_batched_tokens, n, "max_num_batched_tokens"),
            arrival_dispersion=as_rows(arrival_dispersion, n, "arrival_dispersion"),
        )

    def __len__(self) -> int:
        return len(self.arrival_rps_per_replica)


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


def _bucketed_p95s(table: PhysicsTable, k: np.ndarray, ttft50: np.ndarray, ttft95: np.ndarray, tau_d: np.ndarray,
                   s50: np.ndarray, s95: np.ndarray, pi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The prior's TTFT and ITL p95s read through vLLM's histogram buckets, as the telemetry reads them:
    (TTFT p95, ITL p95). `s50`/`s95`: the step time of a chunk of the median and of the 0.95-quantile prompt;
    `pi`: the share of steps that carry a chunk."""
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
            return half_tanh((lb - mu_t) * inv_sd_t)
        return half_tanh((lb - mu_t[rows]) * inv_sd_t[rows])

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
            d_ = half_tanh((lb - mu_d) * inv_sd_d)
            c_ = half_tanh((lb - mu_c) * inv_sd_c)
            c_ -= d_
            c_ *= pi32
            c_ += d_
            return c_
        d_ = half_tanh((lb - mu_d[rows]) * inv_sd_d)
        res: np.ndarray = pi32[rows] * (half_tanh((lb - mu_c[rows]) * inv_sd_c[rows]) - d_) + d_
        return res

    # p95s only: they are what SLOs are checked on, and each read costs a pass over the rows
    # (bulk predict has a budget); the p50s stay the distributions' own medians.
    ttft95b = bucket_quantile(0.95, TTFT_BUCKETS, ttft95, ttft_cdf)
    # first guess of the mixture's p95 (the walk fixes the bucket): among the chunk steps at
    # their quantile 1 − 5 %/π when π > 5 %, else high in the decode steps (z = 2)
    z_c = logit(clamp(1.0 - 0.05 / pi, 0.01, 0.99)) * (0.895 / 1.79)
    guess = np.where(pi > 0.05, np.exp(mu_c + z_c / inv_sd_c), tau_d * math.exp(2.0 * DECODE_STEP_LOG_SIGMA))
    tpot95b = bucket_quantile(0.95, ITL_BUCKETS, guess, itl_cdf)
    return ttft95b, tpot95b


def _router_wait95(capped: np.ndarray, rho: np.ndarray, rho_engine: np.ndarray, b_max: np.ndarray,
                   residence: np.ndarray) -> np.ndarray:
    """p95 of the wait at the router behind an in-flight cap (0 where the cap does not queue)."""
    # Router queue behind an in-flight cap: B_max "servers" each busy for a request's
    # residence; Sakasegawa's M/M/c wait W̄ ≈ ρ^√(2(c+1)) / (c(1 − ρ)) × residence. Example:
    # ρ 0.9, residence 10 s, cap 16 → 0.9^5.8 / (16 × 0.1) × 10 = 3.4 s.
    rho_c = np.minimum(rho, RHO_CLIP)
    queued = capped & (rho > rho_engine * 1.0001)
    w_mean = rho_c ** np.sqrt(2.0 * (b_max + 1.0)) / (b_max * (1.0 - rho_c)) * residence
    router_wait95 = np.where(queued,
                             w_mean / np.maximum(rho_c, 1e-3) * np.log(np.maximum(rho_c, 1e-3) / 0.05).clip(0),
                             0.0)
    res: np.ndarray = router_wait95
    return res


def _batch_fixed_point(dflat: np.ndarray, base: np.ndarray, k_: np.ndarray, lam: np.ndarray, ctx_cost: np.ndarray,
                       b_max: np.ndarray, prefill_cost: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The batch B of Little's law B = λ·O·τ_d(1 + B)/(1 − f_p) (`k_` = λ·O), capped at `b_max`;
    `prefill_cost(B)`: a request's prefill time on steps that decode B sequences (see latency_prior)."""
    batch = np.zeros_like(lam)
    cost_pf = prefill_cost(batch)
    for it in range(FIXED_POINT_ITERS):
        b1 = 1.0 + batch
        step, slope = interp_rows_slope(dflat, base, b1)
        slope = slope + ctx_cost
        tau_d = step + ctx_cost * b1
        if it == 1:
            cost_pf = prefill_cost(batch)
        f_p = np.minimum(lam * cost_pf, 0.95)
        den = 1.0 - f_p - k_ * slope
        new = k_ * (tau_d - slope * batch) / np.maximum(den, 1e-9)
        batch = np.where(den > 1e-9, np.minimum(new, b_max), b_max)
    return batch


def _attention_work(attn_s: np.ndarray, P: np.ndarray, hit: np.ndarray,
                    Pu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(attention time of one request's prefill, attention time per prefill token)."""
    # Attention work of one request's prefill: Pu = P(1 − h) tokens attending to the P·h cached ones
    # plus half their own, P²(1 − h)(1 + h)/2, averaged over lognormal prompts (E[P²] = P̄² e^σ²).
    # Quadratic in P, so long prompts dominate: mean 12k tokens with σ = 1 costs 2.7× the work of
    # a fixed 12k prompt.
    attn_req = attn_s * (P * P * (0.5 * math.exp(PROMPT_LOG_SIGMA**2))) * ((1.0 - hit) * (1.0 + hit))
    attn_tok = attn_s * (P * hit + 0.5 * Pu)  # attention per prefill token (context before + half its own)
    return attn_req, attn_tok


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
    O = np.maximum(x.output_tokens, 1.0)  # noqa: E741  O: output tokens, the formulas' symbol
    hit = clamp(x.hit_rate, 0.0, 0.999)
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
    attn_req, attn_tok = _attention_work(attn_s, P, hit, Pu)

    def decode_step(b: np.ndarray) -> np.ndarray:
        res: np.ndarray = interp_seg(dseg, base, b) + ctx_cost * b
        return res

    def chunk_cost(c: np.ndarray, b: np.ndarray) -> np.ndarray:
        # marginal time of c prefill tokens added to a step that decodes b sequences:
        # step(c prefill + b decode) − step(b decode). Example (Llama-3-70B TP4 H100): 1,000
        # tokens into a 256-sequence decode step: 175 ms − 103 ms = 72 ms.
        res: np.ndarray = np.maximum(interp_seg(pseg, base, c + b) + seq_s * b - interp_seg(dseg, base, b), 0.0)
        return res

    # Little's law fixed point B = λ·O·τ_d(1 + B)/(1 − f_p): Newton steps on the step-time
    # table's local segment τ_d(1 + B) ≈ a + s·(1 + B), which solve it exactly within a segment:
    # B = λO(a + s)/(1 − f_p − λOs), or B_max when that is negative or larger (saturated).
    # The prefill share f_p depends on B only through the chunk's marginal cost (mildly): it is
    # computed at B = 0 and refreshed once, which keeps B within 1 % and saves table reads.
    batch = _batch_fixed_point(dflat, base, lam * O, lam, ctx_cost, b_max,
                               lambda b: n_chunks * chunk_cost(chunk, b) + attn_req)
    tau_d = decode_step(1.0 + batch)
    # every later chunk cost rides on the converged batch: the decode-only part is read once
    mixed_base = seq_s * batch - interp_seg(dseg, base, batch)

    def chunk_at(c: np.ndarray) -> np.ndarray:
        y = interp_seg(pseg, base, c + batch)
        y += mixed_base
        res: np.ndarray = np.maximum(y, 0.0, out=y)
        return res

    cost_pf = n_chunks * chunk_at(chunk) + attn_req
    f_p = np.minimum(lam * cost_pf, 0.95)
    tau = tau_d / (1.0 - f_p)

    # capacity: the batch at its cap (router cap included) and at the engine's own limit
    def capacity_at(b: np.ndarray) -> np.ndarray:
        per_req_s = n_chunks * chunk_cost(chunk, b) + attn_req + O * decode_step(b) / b
        res: np.ndarray = 1.0 / np.maximum(per_req_s, EPS)
        return res

    capacity_engine = capacity_at(b_engine)
    capacity = capacity_at(b_max) if any_cap else capacity_engine
    rho = lam / capacity
    rho_engine = lam / capacity_engine

    # ITL quantiles: a share π of steps carry a chunk; the q-quantile of ITL is among them when
    # π > 1 − q, at the prompt quantile 1 − (1 − q)/π. Φ⁻¹ per row uses the logistic
    # approximation Φ⁻¹(p) ≈ logit(p)/1.702 (within 5 % of z up to p = 0.98): a prior needs no more.
    pi = clamp(lam * n_chunks * tau, 1e-6, 1.0)
    log_pi = np.log(pi)
    sig2 = 0.5 * PROMPT_LOG_SIGMA * PROMPT_LOG_SIGMA

    def itl_q(q: float) -> np.ndarray:
        tail = 1.0 - q
        w = sigmoid((log_pi - math.log(tail)) * (1.0 / 0.35))
        qq = clamp(1.0 - tail / pi, 0.02, 0.98)
        z = (np.log(qq) - np.log1p(-qq)) * (PROMPT_LOG_SIGMA / 1.702)
        c_q = np.minimum(Pu * np.exp(z - sig2), M)
        res: np.ndarray = tau_d + w * (chunk_at(c_q) + attn_tok * c_q)
        return res

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
        # p95s only: they are what SLOs are checked on (the p50s stay the distributions' own medians)
        ttft50b, tpot50b = ttft50, tpot50
        ttft95b, tpot95b = _bucketed_p95s(table, k, ttft50, ttft95, tau_d, s50, s95, pi)
    else:
        ttft50b, ttft95b, tpot50b, tpot95b = ttft50, ttft95, tpot50, itl_q(0.95)
    router_wait95 = _router_wait95(capped, rho, rho_engine, b_max, residence) if any_cap else np.zeros_like(lam)
    busy = 1.0 - np.exp(-lam * residence)
    return LatencyPrior(
        ttft_p50_s=ttft50b, ttft_p95_s=ttft95b, tpot_p50_s=tpot50b, tpot_p95_s=tpot95b,
        gpu_busy_frac=clamp(busy, 1e-3, 1.0), capacity_rps=capacity, rho=rho, rho_engine=rho_engine,
        router_wait_p95_s=router_wait95, rho_prefill=rho_p, batch=batch,
        batch_max=b_max, decode_step_s=tau_d, prefill_frac=f_p, prefill_step_frac=pi, uncached_prompt_tokens=Pu,
    )
