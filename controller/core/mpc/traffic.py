"""Stage 2 of scoring a plan: traffic, from the class forecast to the requests each pool receives.

Per class the forecast arrival rate × the share its route group receives × (1 − shed^(1+retries))
(a shed request is retried by its client, so only shed^(1+R) is finally rejected); within a
group, first-hop pools share by traffic weight (decode pools of a disaggregated group share the
decode hop). With tier rules (`PoolInput.eligible`: a pool may serve only a share e of a class's
tasks) each class is split on its own, as the router does: a task draws u in [0, 1) once and may
use the pools with u < e, so for u between two consecutive thresholds the pools at or above the
upper one share it by weight (none: every pool of the hop). Example: a 70B pool (e = 1) and an 8B
pool (e = 0.5 for standard) at equal weights: the 8B gets half of the eligible half, 25 % of the
standard traffic, and none of the critical traffic if its e there is 0. Shedding applies only
while some route group has fewer replicas ready than its planned-for load needs (`shed_active`), and
only to a class the median forecast expects a request of in the step (`expected`).

Must not: predict latency or price anything (latency.py, score.py), or change its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from controller.core.mpc.candidates import Candidates, WorkArrays
from controller.core.mpc.problem import PlanProblem, serving_first_step


@dataclass
class Flow:
    """What the traffic stage hands on, per candidate (arrays are the stage's results, not inputs)."""

    ready_hp: np.ndarray  # (C,H,P) replicas ready during each step
    share: np.ndarray  # (C,H,P) each pool's share of the fleet's class traffic; (K,C,H,P) per class with tier rules
    shed: np.ndarray  # (C,H,K) shed fractions in force per step
    rejected: np.ndarray  # (C,H,K) finally rejected share (shed^(1+retries))
    adm: np.ndarray  # (C,2,H,K) admitted arrival rate per load scenario
    cum_in: np.ndarray  # (K,C,2,H,P) arrivals per pool, cumulative over classes (a work array: "a")
    pool_rps: np.ndarray  # (C,2,H,P) arrivals per pool, all classes


class Traffic:
    """Route groups and hops of the fleet, the forecast, and how a plan's levers split the traffic."""

    def __init__(self, prob: PlanProblem, H: int, step_s: float, client_retries: int) -> None:
        pools = prob.pools
        P = len(pools)
        self.P = P
        self.client_retries = client_retries
        # Replicas serving in the first step (ready now + starting ones due within it). The router
        # splits a group's traffic by the absolute pool weights until the next decision, while the
        # model splits it by weight per replica × replicas ready: the absolute weight is per replica
        # × this count, so the first step is scored with the split the router will apply. Per
        # replica × replicas ready *now* would give a pool whose replicas are landing this step too
        # little traffic and its neighbour too much.
        self.ready_step0 = np.maximum(np.array([serving_first_step(p, step_s) for p in pools], dtype=float), 1.0)
        roles = [p.role for p in pools]
        self.first_hop = np.array([r != "decode" for r in roles])
        self.decode_hop = np.array([r == "decode" for r in roles])
        self.prefill_pool = np.array([r == "prefill" for r in roles])
        groups = sorted({p.group for p in pools})
        self.groups = groups
        gidx = np.array([groups.index(p.group) for p in pools], dtype=np.intp)
        self.gidx = gidx
        share = np.array([float(prob.group_share.get(g, 1.0 / len(groups))) for g in groups])
        share = share / share.sum() if share.sum() > 0 else np.full(len(groups), 1.0 / len(groups))
        self.gshare = share
        self.hop_size = np.array([int(((gidx == gidx[j]) & (self.decode_hop == self.decode_hop[j])).sum())
                                  for j in range(P)])
        cls = prob.classes
        self.K = len(cls)
        self.lam = np.stack([np.array([c.p50_rps for c in cls]).T, np.array([c.p90_rps for c in cls]).T])  # (2,H,K)
        if self.lam.shape[1] != H:
            raise ValueError(f"PlanProblem: forecasts have {self.lam.shape[1]} steps, the plan has {H} "
                             f"(see plan_steps)")
        # route-group × hop masks of `shares` (the groups with pools on that hop)
        self.hop_masks = [(g, m) for g in range(len(groups)) for hop in (self.first_hop, self.decode_hop)
                          for m in [(gidx == g) & hop] if m.any()]
        self.group_masks = [gidx == g for g in range(len(groups))]
        self.floor = np.array([c.min_shed for c in cls])  # the breaker's shed floors
        # (H,K) the steps where the median forecast expects a request of the class or more (`admit`)
        self.expected = self.lam[0] * step_s >= 1.0
        # tier rules: elig[k, j] = share of class k's tasks pool j may serve (all 1: no rule, one split)
        self.elig = np.array([[dict(p.eligible).get(c.name, 1.0) for p in pools] for c in cls]).reshape(self.K, P)
        self.tiered = bool((self.elig < 1.0).any())
        # class weights of the aggregate share (`shares`) under tier rules: the classes' planned traffic
        tot = self.lam[1].sum(axis=0)
        self.class_weight = tot / tot.sum() if tot.sum() > 0 else np.full(self.K, 1.0 / max(self.K, 1))

    def per_replica_weights(self, absolute: np.ndarray) -> np.ndarray:
        """(C, P) router weights → the search's weights per serving replica, the largest of each hop 1.

        Only the ratios within a hop route traffic; fixing the scale keeps the search box [0, 1]
        meaningful and a plan's weights from drifting towards 0 tick after tick (the router
        splits evenly when a hop's weights are all 0). Example: A100 0.06 on 2 replicas, H100
        0.94 on 5 → 0.16 and 1.0 per replica."""
        out: np.ndarray = np.maximum(absolute, 0.0) / self.ready_step0[None, :]
        for _, m in self.hop_masks:
            if m.sum() > 1:
                top = out[:, m].max(axis=1, keepdims=True)
                out[:, m] = np.where(top > 0, out[:, m] / np.maximum(top, 1e-12), 1.0)
        return out

    def shed_active(self, ready: np.ndarray, need: np.ndarray | None) -> np.ndarray:
        """(C, H) bool: the plan's shed fractions apply in the steps where some route group has fewer
        replicas ready than its planned-for load needs (`need`, (P, H); elsewhere only the breaker's
        floors stay): shedding delays work while capacity is short or on its way, it is not a way
        to run small. Without `need` (before the search has computed it) they apply throughout."""
        C, P, H = ready.shape
        if need is None:
            return np.ones((C, H), dtype=bool)
        # per route group: traffic can move between its pools, so what counts is the group's total
        short = np.zeros((C, H), dtype=bool)
        for m in self.group_masks:
            short |= ready[:, m, :].sum(axis=1) < need[m].sum(axis=0)[None, :] - 1e-9
        return short

    def shares(self, tw: np.ndarray) -> np.ndarray:
        """(…, P): each pool's share of the fleet's class traffic (group share × weight within its hop).

        `tw` is the effective weight of each pool (the plan's weight per ready replica × the
        replicas ready), so traffic follows capacity as it arrives unless the plan says otherwise.
        With tier rules: the classes' shares (`class_shares`) weighted by their planned traffic.
        """
        if self.tiered:
            return np.tensordot(self.class_weight, self.class_shares(tw), axes=(0, 0))
        tw = np.maximum(tw, 0.0)
        lead = tw.shape[:-1]
        tw = tw.reshape(-1, self.P)
        C = tw.shape[0]
        share = np.zeros((C, self.P))
        for g, m in self.hop_masks:
            sub = tw[:, m]
            tot = sub.sum(axis=1, keepdims=True)
            split = sub / np.maximum(tot, 1e-12)
            if not (tot > 0).all():
                split = np.where(tot > 0, split, 1.0 / m.sum())
            share[:, m] = split * self.gshare[g]
        return share.reshape(lead + (self.P,))

    def class_shares(self, tw: np.ndarray) -> np.ndarray:
        """(K, …, P): each pool's share of each class's traffic under the tier rules (module docstring)."""
        tw = np.maximum(tw, 0.0)
        lead = tw.shape[:-1]
        tw = tw.reshape(-1, self.P)
        out = np.zeros((self.K, tw.shape[0], self.P))
        for k in range(self.K):
            for g, m in self.hop_masks:
                idx = np.flatnonzero(m)
                e = self.elig[k, idx]
                cuts = np.unique(np.concatenate([[0.0, 1.0], np.clip(e, 0.0, 1.0)]))
                for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
                    ok = e >= hi - 1e-12
                    if not ok.any():
                        ok = np.ones_like(ok)  # no pool may take it: the router sends it anywhere in the hop
                    sub = tw[:, idx] * ok
                    tot = sub.sum(axis=1, keepdims=True)
                    split = np.where(tot > 0, sub / np.maximum(tot, 1e-12), ok / ok.sum())
                    out[k][:, idx] += (hi - lo) * split * self.gshare[g]
        return out.reshape((self.K,) + lead + (self.P,))

    def admit(self, cand: Candidates, ready: np.ndarray, need: np.ndarray | None, work: WorkArrays) -> Flow:
        """The traffic of each candidate, given its replicas ready (C,P,H) from the dynamics stage."""
        C, P, H = ready.shape
        K = self.K
        ready_hp = np.transpose(ready, (0, 2, 1))  # (C,H,P)
        eff = cand.tw[:, None, :] * np.maximum(ready_hp, 1e-3)  # (C,H,P)
        share = self.class_shares(eff) if self.tiered else self.shares(eff)  # (C,H,P), or (K,C,H,P)
        active = self.shed_active(ready, need)  # (C,H): shedding holds until the capacity the load needs is ready
        # Shedding acts at once and is planned again every tick, so it is for the load the median expects: a
        # class the median expects less than one request of in a step has nothing to shed there, whatever the
        # quantile planned for (capacity is bought for the quantile ahead of its start-up; a shed fraction is
        # not). Without this, a median of 0 made shedding free: the expected terms saw no request, and a
        # quantile past the fleet is late with or without shedding, so plans shed everything for nothing.
        floor = self.floor
        on = active[:, :, None] & self.expected[None]
        shed = np.where(on, np.clip(cand.shed, 0.0, 1.0)[:, None, :], floor[None, None, :])
        rejected = shed ** (1 + self.client_retries)  # (C,H,K)
        adm = self.lam[None] * (1.0 - rejected)[:, None, :, :]  # (C,2,H,K)
        # Per pool and class, the class axis leads: (K,C,2,H,P). The per-pool arrays (C,2,H,P) then
        # broadcast over whole contiguous blocks instead of an inner axis of K = 3 elements, which
        # numpy runs several times slower; every element is the same product either way.
        kshape = (K, C, 2, H, P)
        w = share[:, :, None, :, :] if self.tiered else share[None, :, None, :, :]
        pool_k = np.multiply(w, np.moveaxis(adm, 3, 0)[..., None], out=work.get("a", kshape))  # (K,C,2,H,P)
        # Fluid backlog per pool, served in priority order (cumulative over classes); the last
        # cumulative row is the pool's total (the same left-to-right sum as summing pool_k over K).
        cum_in = np.cumsum(pool_k, axis=0, out=pool_k)  # (K,C,2,H,P)
        pool_rps = cum_in[-1].copy()  # (C,2,H,P)
        return Flow(ready_hp=ready_hp, share=share, shed=shed, rejected=rejected, adm=adm, cum_in=cum_in,
                    pool_rps=pool_rps)
