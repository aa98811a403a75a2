"""Replica trajectories the search tries for one pool: what the load needs per step, and templates around it.

`need_per_step` is the smallest replica count per step that meets the tightest SLO under the
p90 load; `replica_templates` builds constant levels around the anchors (today's target, what
is serving, the need), hold-then-change and change-then-settle trajectories, and "need-ahead"
trajectories that order the next start-up window's need in time.

Must not: score plans or keep the best (search.py); read the clock or draw randomness.
"""

from __future__ import annotations

import math

import numpy as np

from controller.core.mpc.candidates import Candidates
from controller.core.mpc.score import Evaluator
from controller.core.mpc_model import LatencyQuery


def need_per_step(ev: Evaluator, base: Candidates, j: int) -> np.ndarray:
    """Smallest replica count of pool j per step that meets the tightest SLO under the p90 load.

    Replicas are taken as ready at once (what the load needs, not what is reachable) with the
    incumbent levers and today's hit rate; a pool whose p90 load is 0 needs its minimum.
    Example: 30 req/s at p90 and a replica sustaining 4.2 req/s within the SLO → 8.
    """
    p = ev.prob.pools[j]
    levels = np.arange(max(p.lo, 1), max(p.hi, 1) + 1, dtype=float)
    share = ev.traffic.shares(base.tw[0] * np.maximum(ev.dynamics.ready0 + ev.dynamics.pend0.sum(axis=1), 1.0))[j]
    floor = np.array([c.min_shed for c in ev.prob.classes])
    rejected = np.clip(floor, 0.0, 1.0) ** (1 + ev.cfg.client_retries)  # only what must be shed
    demand = (ev.traffic.lam[1] * (1.0 - rejected)[None, :]).sum(axis=1) * share  # (H,)
    active = ev.traffic.lam[1].sum(axis=0) > 0
    ttft_slo = float(ev.risk.slo_ttft[active].min()) if active.any() else math.inf
    tpot_slo = float(ev.risk.slo_tpot[active].min()) if active.any() else math.inf
    H = ev.H
    lam = demand[None, :] / levels[:, None]
    shape = lam.shape
    q = LatencyQuery(
        pool_index=np.full(lam.size, ev.latency.idx[j]), rps_per_replica=lam.ravel(),
        prompt_tokens=np.full(lam.size, ev.latency.P_tok[j]),
        output_tokens=np.full(lam.size, ev.latency.O_tok[j]),
        hit_rate=np.full(lam.size, ev.latency.hit0[j]), inflight_cap=np.full(lam.size, base.cap[0, j]),
        max_num_seqs=np.full(lam.size, base.mns[0, j]), max_num_batched_tokens=np.full(lam.size, base.mbt[0, j]))
    lat = ev.model.latency(q)
    ok = ((lat.ttft_p95_s.reshape(shape) <= ttft_slo) & (lat.tpot_p95_s.reshape(shape) <= tpot_slo)
          & (lat.utilisation.reshape(shape) < 0.97))
    need = np.full(H, p.hi + 1)  # hi + 1: even the pool's maximum is short this step
    for h in range(H):
        if demand[h] <= 0:
            need[h] = p.lo
            continue
        idx = np.flatnonzero(ok[:, h])
        if len(idx):
            need[h] = int(levels[idx[0]])
    res: np.ndarray = np.clip(need, p.lo, p.hi + 1)
    return res


def replica_templates(ev: Evaluator, base: Candidates, j: int, need: np.ndarray, span: int) -> np.ndarray:
    """Replica trajectories (L, H) for pool j: constant levels, hold-then-change, need-ahead."""
    p = ev.prob.pools[j]
    H = ev.H
    lo, hi = p.lo, p.hi
    if p.frozen or lo == hi:
        return np.full((1, H), min(max(p.target, lo), hi) if p.frozen else lo)
    cur = int(base.repl[0, j, 0])
    serving = p.ready + len(p.starting_eta_s)
    need = np.minimum(need, hi)
    centres = {cur, p.target, serving, int(need[0]), int(need.max()), int(need[: max(1, H // 3)].max())}
    levels: set[int] = set()
    for c in centres:
        for d in range(-span, span + 1):
            levels.add(min(max(c + d, lo), hi))
    levels_l = sorted(levels)
    rows = [np.full(H, lv) for lv in levels_l]
    # need-ahead: at each step, what the next start-up window will need (warm delay ahead)
    ahead = max(1, int(math.ceil(p.startup_warm_s / ev.dt)))
    na = np.array([need[h: min(H, h + ahead + 1)].max() for h in range(H)])
    rows.append(np.clip(na, lo, hi))
    cold_ahead = max(1, int(math.ceil(p.startup_cold_s / ev.dt)))
    nc = np.array([need[h: min(H, h + cold_ahead + 1)].max() for h in range(H)])
    rows.append(np.clip(nc, lo, hi))
    # hold today's target, then move to a level at step s
    for s in (2, 5):
        if s >= H:
            continue
        for lv in levels_l:
            if lv == cur:
                continue
            r = np.full(H, cur)
            r[s:] = lv
            rows.append(r)
    # change now, then settle at another level later (e.g. surge now, relax after it)
    for s in (4,):
        if s >= H:
            continue
        for lv in (int(need[0]), int(need.max())):
            for lv2 in (int(need[s:].max()), cur):
                r = np.full(H, min(max(lv, lo), hi))
                r[s:] = min(max(lv2, lo), hi)
                rows.append(r)
    arr = np.unique(np.array(rows, dtype=float), axis=0)
    return arr

