"""Stage 3 of scoring a plan: hit rate and latency per pool and step, with the backlog's wait.

Hit rate: the cache model's steady state at the plan's affinity and replicas, approached from
today's hit rate with time constant `cache_refill_s` (new replicas, and every replica after a
batch-cap change, start cold). Latency from the PlanModel (load per ready replica, mix, hit
rate, in-flight cap, batch caps); above the pool's sustainable rate a fluid backlog builds,
served in priority order (critical first), and its wait is added to TTFT.

Must not: turn latencies into probabilities or prices (risk.py, score.py), or change its inputs
(the traffic stage's cumulative arrivals excepted: they are a work array this stage reuses).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from controller.core.mpc.candidates import Candidates, WorkArrays
from controller.core.mpc.problem import MpcConfig, PlanProblem
from controller.core.mpc.traffic import Flow
from controller.core.mpc_model import LatencyAnswer, LatencyQuery, PlanModel, compiled_kernel


@dataclass
class PoolLatencies:
    """What the latency stage hands on, per candidate; (…) shapes with K classes, C candidates, two
    load scenarios, H steps and P pools."""

    shape: tuple[int, ...]  # (C,2,H,P)
    lat: LatencyAnswer  # the model's answer (its TPOT bound is read by the risk stage)
    restart: np.ndarray  # (C,P) bool: the plan changes the pool's batch caps (a rolling restart)
    hit: np.ndarray  # (C,1,H,P) prefix hit rate
    cap_rps: np.ndarray  # (C,2,H,P) pool rate sustained
    ttft95: np.ndarray  # (C,2,H,P) the model's TTFT p95 (no backlog wait)
    tpot50: np.ndarray  # (C,2,H,P)
    tpot95: np.ndarray  # (C,2,H,P)
    t50: np.ndarray  # (K,C,2,H,P) TTFT p50 with the slot and backlog waits (work array "c")
    t95: np.ndarray  # (K,C,2,H,P) TTFT p95 with the waits (work array "a")
    timed_out: np.ndarray  # (K,C,2,H,P) bool: the backlog's wait exceeds the client's timeout
    scratch: np.ndarray  # (K,C,2,H,P) work array "b", free for the next stage
    wait_detail: np.ndarray | None  # (C,2,H,P,K) the backlog's wait (only when asked for detail)


@dataclass
class ModelAnswer:
    """The latency stage's first half (hit rate and the model's answer, no backlog), per candidate."""

    shape: tuple[int, ...]  # (C,2,H,P)
    lat: LatencyAnswer
    restart: np.ndarray  # (C,P) bool: the plan changes the pool's batch caps (a rolling restart)
    hit: np.ndarray  # (C,1,H,P) prefix hit rate
    cap_rps: np.ndarray  # (C,2,H,P) pool rate sustained


class Latency:
    """Per-tick constants of the hit-rate and latency predictions, and the prediction for a batch."""

    def __init__(self, prob: PlanProblem, model: PlanModel, cfg: MpcConfig, H: int, lam: np.ndarray,
                 incumbent: Candidates, compiled: bool = True) -> None:
        pools = prob.pools
        # the backlog stage as a compiled loop where numba is installed (mpc_kernel.queue_rows); False =
        # the numpy below throughout (the reference)
        self.compiled = compiled
        P, K = len(pools), len(prob.classes)
        self.model, self.cfg = model, cfg
        self.P = P
        self.dt = cfg.step_s
        self.incumbent = incumbent
        self.idx = np.array([p.model_index for p in pools], dtype=np.intp)
        self.P_tok = np.array([p.prompt_tokens for p in pools])
        self.O_tok = np.array([p.output_tokens for p in pools])
        self.hit0 = np.array([p.hit_rate for p in pools])
        self.inf_hit = np.array([p.reuse_inf_hit for p in pools])
        self.ws = np.array([p.reuse_working_set for p in pools])
        self.load_w = np.array([p.load_weight for p in pools])
        self.backlog0 = np.array([p.backlog for p in pools])
        self.max_num_seqs = np.array([float(p.max_num_seqs) for p in pools])
        self.max_num_batched_tokens = np.array([float(p.max_num_batched_tokens) for p in pools])
        # Backlog per pool and class at t=0: the pool's waiting requests split by class demand.
        demand_now = lam[0, 0]
        share_k = demand_now / demand_now.sum() if K and demand_now.sum() > 0 else np.full(K, 1.0 / max(K, 1))
        self.q0 = self.backlog0[:, None] * share_k[None, :]
        self.q0_cum = np.cumsum(self.q0, axis=1)
        t_mid = (np.arange(H) + 0.5) * self.dt
        self.relax = np.exp(-t_mid / cfg.cache_refill_s)[None, None, :, None]

    def capacity_now(self) -> np.ndarray:
        """(P,) req/s one replica of each pool sustains at its concurrency limit, at today's mix, hit
        rate and batch caps (the model's answer at a vanishing load)."""
        P = self.P
        lat = self.model.latency(LatencyQuery(
            pool_index=self.idx, rps_per_replica=np.full(P, 0.01), prompt_tokens=self.P_tok, output_tokens=self.O_tok,
            hit_rate=self.hit0, inflight_cap=np.zeros(P), max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens))
        return np.asarray(lat.capacity_rps, dtype=float)

    def answer(self, cand: Candidates, flow: Flow, fresh: np.ndarray) -> ModelAnswer:
        """The hit rate and the PlanModel's answer for each candidate, before any backlog; `fresh` (C,P,H)
        is the dynamics stage's share of new replicas."""
        P = self.P
        pool_rps = flow.pool_rps
        ready_t = flow.ready_hp[:, None]  # (C,1,H,P)
        fresh_t = np.transpose(fresh, (0, 2, 1))[:, None]
        lam_rep = pool_rps / np.maximum(ready_t, 1e-9)
        # Hit rate: steady state at the plan's affinity and replicas, approached from today's. It
        # does not depend on the load scenario, so it is computed once for both (C,1,H,P).
        hit_ss = self.model.hit_rate(self.idx, ready_t, cand.pw[:, None, None, :], self.load_w, self.inf_hit,
                                     self.ws, np.zeros(P))
        relax = self.relax
        # a batch-cap change is a rolling restart: every replica comes back with an empty cache, so
        # the hit rate refills from zero (a cost the restart's GPU time alone does not show)
        restart = (cand.mbt != self.incumbent.mbt) | (cand.mns != self.incumbent.mns)  # (C,P)
        if restart.any():
            hit_from = np.where(restart, 0.0, self.hit0[None, :])[:, None, None, :]
            hit = hit_ss + (hit_from - hit_ss) * relax
        else:
            hit = hit_ss + (self.hit0 - hit_ss) * relax
        hit = hit * (1.0 - fresh_t * relax * 0.5)  # new replicas start cold (same time constant)
        shape = lam_rep.shape
        # per-pool constants as (P,), levers as (C,1,1,P): the model broadcasts (see LatencyQuery)
        q = LatencyQuery(
            pool_index=self.idx, rps_per_replica=lam_rep, prompt_tokens=self.P_tok, output_tokens=self.O_tok,
            hit_rate=hit, inflight_cap=cand.cap[:, None, None, :], max_num_seqs=cand.mns[:, None, None, :],
            max_num_batched_tokens=cand.mbt[:, None, None, :])
        lat = self.model.latency(q)
        cap_rps = np.reshape(lat.capacity_rps, shape) * ready_t  # pool rps it sustains
        return ModelAnswer(shape=shape, lat=lat, restart=restart, hit=hit, cap_rps=cap_rps)

    def predict(self, cand: Candidates, flow: Flow, fresh: np.ndarray, work: WorkArrays,
                detail: bool = False) -> PoolLatencies:
        """Latencies of each candidate; `fresh` (C,P,H) is the dynamics stage's share of new replicas."""
        cfg = self.cfg
        dt = self.dt
        cum_in, pool_rps = flow.cum_in, flow.pool_rps
        K, C, _, H, P = cum_in.shape
        kshape = cum_in.shape
        ans = self.answer(cand, flow, fresh)
        lat, restart, hit, cap_rps, shape = ans.lat, ans.restart, ans.hit, ans.cap_rps, ans.shape
        ttft50, ttft95 = np.reshape(lat.ttft_p50_s, shape), np.reshape(lat.ttft_p95_s, shape)
        tpot50, tpot95 = np.reshape(lat.tpot_p50_s, shape), np.reshape(lat.tpot_p95_s, shape)
        kern = compiled_kernel() if self.compiled and not detail else None
        if kern is not None:  # the rest of this method as one compiled loop (mpc_kernel.queue_rows)
            slot = lat.slot_wait_p95_s is not None and lat.slot_wait_p50_s is not None

            def rows(x: np.ndarray | None) -> np.ndarray:
                return np.zeros(shape) if x is None else np.ascontiguousarray(np.reshape(x, shape), dtype=float)

            wait, t50 = work.get("b", kshape), work.get("c", kshape)
            timed_out = np.empty(kshape, dtype=bool)
            kern.queue_rows(cum_in, rows(cap_rps), rows(pool_rps), rows(ttft50), rows(ttft95),
                            rows(lat.slot_wait_p50_s), rows(lat.slot_wait_p95_s), self.q0_cum,
                            np.array([dt, cfg.client_timeout_s, float(slot)]), wait, t50, cum_in, timed_out)
            return PoolLatencies(shape=shape, lat=lat, restart=restart, hit=hit, cap_rps=cap_rps, ttft95=ttft95,
                                 tpot50=tpot50, tpot95=tpot95, t50=t50, t95=cum_in, timed_out=timed_out,
                                 scratch=wait, wait_detail=None)
        # Backlog per step: q_h+1 = max(q_h + (in_h − m_h)·dt, 0), waited ½(q_h + q_h+1) / max(m_h, 1e-9).
        # Only the max is sequential: the increments before the loop, the waits after it, over all steps.
        m_all = np.maximum(cap_rps, 1e-9)
        wait = np.subtract(cum_in, cap_rps, out=work.get("b", kshape))
        wait *= dt  # the increments (in − m)·dt, then the waits in place
        qs = work.get("d", (K, C, 2, H + 1, P))  # backlog at each step's start, and after the last
        qs[:, :, :, 0, :] = self.q0_cum.T[:, None, None, :]
        for h in range(H):
            q_next = qs[:, :, :, h + 1, :]
            np.add(qs[:, :, :, h, :], wait[:, :, :, h, :], out=q_next)
            np.maximum(q_next, 0.0, out=q_next)
        np.add(qs[:, :, :, :-1, :], qs[:, :, :, 1:, :], out=wait)
        wait *= 0.5
        wait /= m_all
        np.minimum(wait, 10 * cfg.client_timeout_s, out=wait)
        timed_out = wait > cfg.client_timeout_s
        wait_detail = np.ascontiguousarray(np.moveaxis(wait, 0, -1)) if detail else None
        # Waiting for a batch slot is served by priority (router holds and the engine queue both
        # go critical first): Cobham's factor for non-preemptive priority, class k waits
        # W × (1 − ρ) / ((1 − σ_{k−1})(1 − σ_k)), σ_k the utilisation of classes up to k.
        # Example: ρ = 0.95 with critical 20 % of the load → critical waits 0.05/0.81 = 0.06 W;
        # sheddable (the last 20 %) waits 0.05/(0.24 × 0.05) = 4.2 W.
        # (Computed in place in the work arrays: "a" holds cum_in → frac → σ_k → the factor → t95,
        # "c" t50; "b" holds the wait, then scratch.)
        if lat.slot_wait_p95_s is not None:
            assert lat.slot_wait_p50_s is not None  # the models set both slot waits or neither
            sw50 = np.reshape(lat.slot_wait_p50_s, shape)
            sw95 = np.reshape(lat.slot_wait_p95_s, shape)
            rho = np.minimum(pool_rps / m_all, 0.98)
            frac = np.divide(cum_in, np.maximum(pool_rps, 1e-9), out=cum_in)
            one_m = np.multiply(rho, frac, out=frac)  # σ_k
            np.subtract(1.0, one_m, out=one_m)  # 1 − σ_k
            for k in range(K - 1, 0, -1):  # × (1 − σ_{k−1}), taken before row k−1 is itself multiplied
                one_m[k] *= one_m[k - 1]
            # (row 0: × (1 − 0), exact; a NaN ρ makes σ_0 NaN as it made σ_{−1} = ρ × 0 NaN before)
            np.maximum(one_m, 1e-3, out=one_m)
            idle = 1.0 - rho
            cob = np.divide(idle, one_m, out=one_m)
            np.minimum(cob, 1.0 / np.maximum(idle, 0.02), out=cob)
            cob -= 1.0  # the slot wait is re-weighed: t + sw × (cob − 1), plus the backlog's wait
            t50 = np.multiply(sw50, cob, out=work.get("c", kshape))
            t50 += ttft50
            t95 = np.multiply(sw95, cob, out=cob)
            t95 += ttft95
            t50 += wait
            t95 += wait
        else:
            t50 = np.add(ttft50, wait, out=work.get("c", kshape))
            t95 = np.add(ttft95, wait, out=cum_in)
        # the wait is spent (timed_out and the detail copy hold what is still needed): scratch from here
        return PoolLatencies(shape=shape, lat=lat, restart=restart, hit=hit, cap_rps=cap_rps, ttft95=ttft95,
                             tpot50=tpot50, tpot95=tpot95, t50=t50, t95=t95, timed_out=timed_out, scratch=wait,
                             wait_detail=wait_detail)
