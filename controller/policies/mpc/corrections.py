"""The MPC policy's online learning: correction factors for its model's p95 TTFT and TPOT.

Per pool, observed / predicted, learned as an EWMA in log space (`learn`) while the pool runs
below saturation with no standing queue (a backlog's wait is the planner's own term); the
burst length that p95 TPOT above the smooth-arrival model implies; the error of the corrected
predictions, which gives the model's confidence (`confidence`). A bench/operator load profile
(`capacity`) only seeds the factors (`seed_from_capacity`).

Must not: do I/O or read a clock; touch anything but the corrections in the pool memory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from controller.core.estimate import standing_queue
from controller.core.mpc_model import LatencyQuery, PlanModel, QueueingPrior
from controller.perf.replica_capacity import ReplicaCapacity
from controller.policies.common import value
from controller.policies.mpc.memory import MpcPoolMemory
from controller.types import FleetSpec, PolicyInput

CORRECTION_BOUNDS = (0.4, 10.0)
BURST_EVIDENCE = 2.0  # p95 TPOT this far above the smooth-arrival model is taken as bursts
BURST_DECAY = 0.97  # per tick: a burst regime seen once is remembered for ~5 minutes (15 s ticks)


def log_step(log_k: float, log_r: float, alpha: float, clip: float = 0.7) -> float:
    """EWMA of a log correction with each sample clipped to ±clip around the current value, so
    one window that caught a burst's backlog moves the factor by at most α × clip (×1.1)."""
    return log_k + alpha * min(max(log_r - log_k, -clip), clip)


def learn(mem: dict[str, MpcPoolMemory], inp: PolicyInput, prior: PlanModel, j_of: Mapping[str, int],
          settled: bool = True, *, alpha: float) -> tuple[dict[str, MpcPoolMemory], dict[str, Any]]:
    """Update reuse estimates and the p95 correction factors from what was observed this tick."""
    fleet, obs = inp.fleet, inp.observation
    out = dict(mem)
    diag: dict[str, Any] = {}
    first_hop = [p for p in fleet.pools if p.role != "decode"]
    single = len(first_hop) == 1 and len({p.group for p in fleet.pools}) == 1
    ttft_seen = [value(c.ttft_p95_s) for c in obs.classes.values()]
    tpot_seen = [value(c.tpot_p95_s) for c in obs.classes.values()]
    cls_ttft = max((x for x in ttft_seen if x is not None), default=None)
    cls_tpot = max((x for x in tpot_seen if x is not None), default=None)
    for spec in fleet.pools:
        m = mem[spec.name]
        po = obs.pools.get(spec.name)
        if po is None:
            continue
        j = j_of[spec.name]
        ready, arr, hit = value(po.replicas_ready), value(po.arrival_rps), value(po.hit_rate)
        pd = inp.current.pools.get(spec.name) if inp.current is not None else None
        inf_hit = m.inf_hit
        if hit is not None:
            inf_hit = max(inf_hit * 0.999, min(0.99, hit * 1.02))
        m = replace(m, inf_hit=inf_hit)
        if not (ready and ready >= 1 and arr is not None and arr > 0.05 and m.prompt_tokens and m.output_tokens):
            out[spec.name] = m
            continue
        caps = m.caps or (spec.max_num_seqs, spec.max_num_batched_tokens)
        q = LatencyQuery(pool_index=np.array([j]), rps_per_replica=np.array([arr / ready]),
                         prompt_tokens=np.array([m.prompt_tokens]), output_tokens=np.array([m.output_tokens]),
                         hit_rate=np.array([hit if hit is not None else 0.0]),
                         inflight_cap=np.array([float(pd.inflight_cap) if pd else 0.0]),
                         max_num_seqs=np.array([float(caps[0])]), max_num_batched_tokens=np.array([float(caps[1])]))
        bursts = [mem[p.name].burst for p in fleet.pools]
        ones = [1.0] * len(bursts)
        a0 = prior.with_corrections(ones, ones, 0.0, [0.0] * len(bursts)).latency(q)  # smooth arrivals
        a = prior.with_corrections(ones, ones, 0.0, bursts).latency(q)  # with today's burst depth
        util = float(a0.utilisation[0])
        # The pool's own p95 TTFT is what the model predicts (all classes together); the worst
        # class's p95 carries the priority queue's wait of the least protected class, which
        # calibrating on it would plan every class with.
        pool_ttft = value(po.ttft_p95_s)
        o_ttft = pool_ttft if pool_ttft is not None else (cls_ttft if single else None)
        # TPOT: the router's per-class p95 when one pool serves everything; else the pool's own
        # per-request TPOT p95 (vllm:request_time_per_output_token_seconds, what the model predicts
        # and the SLO judges); an engine without it: its per-token ITL p95, scaled down (chunked-
        # prefill steps put the per-token p95 above the per-request one)
        req_tpot, itl = value(po.request_tpot_p95_s), value(po.tpot_p95_s)
        o_tpot = (cls_tpot if single
                  else (req_tpot if req_tpot is not None else (itl * 0.8 if itl is not None else None)))
        lk_t, lk_p, err, n, burst = m.log_k_ttft, m.log_k_tpot, m.err, m.samples, m.burst
        d: dict[str, Any] = {"util": round(util, 3)}
        if util < 0.9:
            errs = []
            queue_free = not standing_queue(value(po.waiting), ready)
            if o_tpot is not None and o_tpot > 0:
                fluid = max(float(a0.tpot_p95_s[0]), 1e-9)
                pred = float(a.tpot_p95_s[0]) * math.exp(lk_p)
                errs.append(abs(math.log(o_tpot / max(pred, 1e-9))))
                calm = util < 0.7 and queue_free and settled  # arrivals themselves, not a backlog
                if o_tpot > BURST_EVIDENCE * fluid and calm:
                    # above what smooth arrivals explain: prompts come in bursts (chunk-bound
                    # steps); what a full chunk per step cannot explain goes to the factor
                    full_d = float(caps[1]) / max(float(q.prompt_tokens[0]) * (1 - float(q.hit_rate[0]))
                                                  * float(q.rps_per_replica[0]), 1e-6)
                    full = float(prior.with_corrections(ones, ones, 0.0, [full_d if k == j else 0.0
                                                                           for k in range(len(bursts))])
                                 .latency(q).tpot_p95_s[0])
                    target = prior.burst_for(q, o_tpot, hi=full_d) if o_tpot < full else full_d
                    # a decaying maximum, not a mean: the p95 is set by the bursty windows
                    burst = max(burst * BURST_DECAY, min(target, 2 * burst + 0.5))
                    lk_p = log_step(lk_p, math.log(max(o_tpot / max(full, 1e-9), 1.0)), alpha)
                elif o_tpot <= BURST_EVIDENCE * fluid:
                    burst = burst * BURST_DECAY
                    # while a burst is remembered the prediction is max(smooth, burst term) × k:
                    # k carries only what that does not explain (as in the branch above), else a
                    # factor learned against the smooth model multiplies the burst term too.
                    # Example: smooth 0.024 s, burst term 0.057 s, observed 0.045 s:
                    # k → 1 (not 1.9), predicted 0.057 s (not 0.11 s).
                    ref = max(float(a.tpot_p95_s[0]), 1e-9) if burst > 0 else fluid
                    r = o_tpot / ref
                    lk_p = log_step(lk_p, math.log(max(r, 1.0) if burst > 0 else r), alpha)
                d["tpot_obs_over_smooth"] = round(o_tpot / fluid, 3)
            # TTFT: learned only from windows without a standing queue. A backlog's wait is the
            # planner's own fluid term (added at plan time); a window that carries one, folded
            # into the factor too, counts it twice for every later plan.
            if o_ttft is not None and o_ttft > 0 and queue_free:
                r = math.log(o_ttft / max(float(a.ttft_p95_s[0]), 1e-9))
                errs.append(abs(r - lk_t))
                lk_t = log_step(lk_t, r, alpha)
                d["ttft_obs_over_prior"] = round(math.exp(r), 3)
            if errs:
                err = (1 - alpha) * err + alpha * max(errs)
                n += 1
        lo, hi = (math.log(x) for x in CORRECTION_BOUNDS)
        lk_t, lk_p = min(max(lk_t, lo), hi), min(max(lk_p, lo), hi)
        d.update(k_ttft=round(math.exp(lk_t), 3), k_tpot=round(math.exp(lk_p), 3), burst=round(burst, 2))
        diag[spec.name] = d
        out[spec.name] = replace(m, log_k_ttft=lk_t, log_k_tpot=lk_p, err=err, samples=n, burst=burst)
    return out, diag


def confidence(mem: Mapping[str, MpcPoolMemory]) -> float:
    """exp(−error) of the worst pool's recent corrected predictions; low until it has seen data."""
    if not mem:
        return 0.3
    vals = []
    for m in mem.values():
        seen = min(1.0, m.samples / 8.0)
        vals.append(0.3 * (1 - seen) + seen * math.exp(-m.err))
    return float(min(vals))


def seed_from_capacity(m: QueueingPrior, fleet: FleetSpec,
                       capacity: Mapping[str, ReplicaCapacity]) -> QueueingPrior:
    """Correction factors from a bench/operator load profile (p95 at known loads), if given."""
    if not capacity:
        return m
    kt, kp = list(m.ttft_correction), list(m.tpot_correction)
    for j, p in enumerate(fleet.pools):
        cap = capacity.get(p.name)
        if cap is None or not cap.profile_rps or cap.rps <= 0:
            continue
        prompt = cap.prompt_tokens_per_s / cap.rps if cap.prompt_tokens_per_s > 0 else 1000.0
        out = cap.generation_tokens_per_s / cap.rps if cap.generation_tokens_per_s > 0 else 200.0
        lam = np.array(cap.profile_rps)
        n = len(lam)
        ans = m.latency(LatencyQuery(pool_index=np.full(n, j), rps_per_replica=lam, prompt_tokens=np.full(n, prompt),
                                     output_tokens=np.full(n, out), hit_rate=np.zeros(n),
                                     inflight_cap=np.zeros(n), max_num_seqs=np.full(n, float(p.max_num_seqs)),
                                     max_num_batched_tokens=np.full(n, float(p.max_num_batched_tokens))))
        ok = ans.utilisation < 0.9
        if cap.profile_ttft_s and ok.any():
            r = np.array(cap.profile_ttft_s)[ok] / np.maximum(ans.ttft_p95_s[ok], 1e-9)
            kt[j] = float(np.clip(np.exp(np.median(np.log(np.maximum(r, 1e-9)))), *CORRECTION_BOUNDS))
        if cap.profile_tpot_s and ok.any():
            r = np.array(cap.profile_tpot_s)[ok] / np.maximum(ans.tpot_p95_s[ok], 1e-9)
            kp[j] = float(np.clip(np.exp(np.median(np.log(np.maximum(r, 1e-9)))), *CORRECTION_BOUNDS))
    return m.with_corrections(kt, kp, m.base_confidence)
