"""The planner's search: a budgeted sequence of candidate batches, keeping the best plan found.

`Search` scores batches within the budget (a count of candidate × pool rows, or wall time
through an injected timer, see MpcConfig) and keeps the best candidate. The moves, run in
order by `solve`: replica sweeps pool by pool (`sweep_replicas`, templates from
trajectories.py), moves of capacity between two pools of a hop (`transfer_replicas`), the
share × delay grid (`delay_sweep`), cross-entropy refinement of the
continuous levers (`cross_entropy`), the slow batch-cap lever (`batch_caps`) and putting back
levers whose change does not pay (`settle`).

Must not: read the clock other than through the injected timer, draw randomness other than
from the Generator passed in, or do I/O.
"""

from __future__ import annotations

import math

import numpy as np

from controller.core.mpc.candidates import Candidates
from controller.core.mpc.problem import MpcConfig, Timer, first_reserve_s
from controller.core.mpc.score import Evaluator
from controller.core.mpc.trajectories import replica_templates
from controller.core.mpc.vectors import (
    apply_vec,
    continuous_bounds,
    delay_ladder,
    ladder_level,
    lever_order,
    to_vec,
)
from controller.levers import LEVERS

# the levers `settle` puts back one by one: the planned pool levers whose moves are priced (pw, cap, tw, standby)
SETTLE_FIELDS = tuple(lv.array for lv in LEVERS if lv.scope == "pool" and lv.threshold is not None and lv.array)


class Search:
    """The budget, the best candidate so far and its objective; `run` scores a batch within the budget."""

    def __init__(self, ev: Evaluator, cfg: MpcConfig, rng: np.random.Generator, timer: Timer | None,
                 started_s: float | None = None, reserve_s: float | None = None) -> None:
        self.ev, self.cfg, self.rng, self.timer = ev, cfg, rng, timer
        self.t0 = (started_s if started_s is not None else timer()) if timer is not None else 0.0
        self.reserve_s = first_reserve_s(cfg) if reserve_s is None else reserve_s
        self.best: Candidates | None = None
        self.best_J = math.inf
        self.exhausted = False
        self.cost = BatchCost()  # with a timer: what a batch of n candidates has cost
        self.last_end_s: float | None = None

    def deadline_s(self) -> float:
        """With a timer: when the search must stop (the budget less the reserve for what follows it)."""
        return self.t0 + self.cfg.time_budget_s - self.reserve_s

    def left(self) -> int:
        """Candidates the budget still allows: by count, or with a timer by the time left before the
        reserve at what batches have cost so far (unlimited until one has been timed), keeping room
        for `settle` (two batches of at most one row per lever and pool, plus three). A search
        the budget stops is marked `exhausted`."""
        if self.timer is not None:
            remaining = self.deadline_s() - self.timer()
            room = 0
            if remaining > 0:
                if not self.cost.known():
                    return 10**9
                if self.cost.identified():  # until then per-candidate costs carry the fixed one: too dear
                    remaining -= self.cost.seconds(len(SETTLE_FIELDS) * self.ev.P + 2) + self.cost.seconds(1)
                room = self.cost.fits(remaining)
        else:
            room = (self.cfg.max_evaluations - self.ev.evaluations * self.ev.P) // self.ev.P
        if room <= 0:
            self.exhausted = True
        return room

    def score(self, cands: Candidates) -> np.ndarray:
        """Score candidates regardless of the budget, and (with a timer) learn what a batch costs: from
        the end of the previous one, so building the candidates counts too."""
        if self.timer is None:
            return self.ev.score(cands)[0]
        if self.last_end_s is None:
            self.last_end_s = self.timer()
        J, _ = self.ev.score(cands)
        end = self.timer()
        self.cost.add(cands.n, end - self.last_end_s)
        self.last_end_s = end
        return J

    def run(self, cands: Candidates) -> np.ndarray:
        """Score a batch (truncated to the budget); keep the best; return the scores (inf where skipped)."""
        n = cands.n
        room = self.left()
        if room <= 0:
            self.exhausted = True
            return np.full(n, np.inf)
        if room < n:
            self.exhausted = True
            cands = cands.take(np.arange(room))
        J = self.score(cands)
        k = int(np.argmin(J))
        if J[k] < self.best_J:
            self.best_J = float(J[k])
            self.best = cands.take(np.array([k]))
        if len(J) < n:
            J = np.concatenate([J, np.full(n - len(J), np.inf)])
        return J


class BatchCost:
    """Seconds a search batch of n candidates costs, a + b·n, least squares over the batches timed so
    far (a: the fixed cost of a score call and of building its candidates; b: per candidate). Example:
    batches of 7 and 78 candidates at 3.5 and 18.6 ms → a = 2.0 ms, b = 0.21 ms; 60 ms left → 276
    candidates. With one batch size only, b = its mean cost per candidate and a = 0 (dear for large
    batches: the first one is then cut to what fits at that price, and the next fit has two sizes)."""

    def __init__(self) -> None:
        self.k = 0
        self.sn = self.st = self.snn = self.snt = 0.0

    def add(self, n: int, dt: float) -> None:
        self.k += 1
        self.sn += n
        self.st += dt
        self.snn += n * n
        self.snt += n * dt

    def known(self) -> bool:
        return self.k > 0 and self.st > 0

    def identified(self) -> bool:
        """Both terms fitted (batches of two sizes or more, a sane fit)."""
        return self._fit() is not None

    def _fit(self) -> tuple[float, float] | None:
        if self.k < 2:
            return None
        var = self.snn - self.sn * self.sn / self.k
        if var <= 1e-9:
            return None
        b = (self.snt - self.sn * self.st / self.k) / var
        a = (self.st - b * self.sn) / self.k
        return (a, b) if b > 0 and a >= 0 else None

    def _ab(self) -> tuple[float, float]:
        return self._fit() or (0.0, self.st / max(self.sn, 1.0))

    def seconds(self, n: int) -> float:
        a, b = self._ab()
        return a + b * n

    def fits(self, seconds: float) -> int:
        a, b = self._ab()
        return max(int((seconds - a) / b), 0) if b > 0 else 10**9


def sweep_replicas(s: Search, needs: list[np.ndarray], order: list[int]) -> None:
    """Each pool's replica templates in `order`, the other pools at the best plan (with a standby
    option when standby is cheaper than serving)."""
    ev = s.ev
    for j in order:
        if s.left() <= 0:
            return
        base = s.best
        assert base is not None
        tpl = replica_templates(ev, base, j, needs[j], s.cfg.replica_span)
        c = base.tile(len(tpl))
        c.repl = c.repl.copy()
        c.repl[:, j, :] = tpl
        # standby options ride along on the constant-level rows of this pool
        p = ev.prob.pools[j]
        if not p.frozen and p.hi > 0 and s.cfg.standby_cost_frac < 1.0 and "standby" not in s.cfg.fixed_levers:
            extra = base.tile(len(tpl))
            extra.repl = c.repl.copy()
            extra.standby = extra.standby.copy()
            extra.standby[:, j] = 1.0 if p.standby == 0 else 0.0
            c = Candidates.concat([c, extra])
        s.run(c)


# Transfer sizes tried per pair of pools: one or two replicas, then four, then all the pool may give
# (geometric, so a fleet of any size is covered in a few rows).
TRANSFER_STEPS = (1, 2, 4)


def transfer_replicas(s: Search) -> None:
    """Move serving capacity between two pools of a hop in one move: m replicas fewer on one, about
    the capacity they carried more on the other (±1), on the best plan; traffic follows, the weights
    being per replica. The pool-by-pool sweeps cannot find this: taking replicas off the dearer pool
    alone overloads it, adding them to the cheaper one alone only adds cost. A pool's capacity per
    replica is its share of the traffic over the replicas that share needs (`ev.need`, p90); pairs
    are every pool with the hop's cheapest per unit of capacity, both ways (the cheap pool may be the
    slow one to start). Example: A100 pool needs 6 for half the load, H100 pool 3 for the other half
    → one H100 replica carries two A100 replicas' worth: moving 1 off the H100 pool tries +1, +2, +3 A100."""
    ev = s.ev
    if s.best is None or ev.need is None or s.left() <= 0:
        return
    pools = ev.prob.pools
    need = np.maximum(ev.need.mean(axis=1), 1e-9)
    per_replica = np.where(ev.share_now > 0, ev.share_now / need, 0.0)  # share of the traffic one replica carries
    # the step from which a replica ordered now serves (warm where a warm slot is free, else cold)
    ready_step = [math.ceil((p.startup_warm_s if p.warm_slots > 0 else p.startup_cold_s) / ev.dt) for p in pools]
    parts: list[tuple[int, Candidates]] = []
    for _, m in ev.traffic.hop_masks:
        idx = [j for j in np.flatnonzero(m) if not pools[j].frozen and pools[j].lo < pools[j].hi]
        if len(idx) < 2 or not all(per_replica[j] > 0 for j in idx):
            continue
        cheap = min(idx, key=lambda j: (pools[j].usd_per_hour / per_replica[j], j))
        for other in idx:
            if other == cheap:
                continue
            for src, dst in ((other, cheap), (cheap, other)):
                base = s.best
                give = int(np.max(base.repl[0, src]) - pools[src].lo)
                steps = sorted({x for x in (*TRANSFER_STEPS, give) if 1 <= x <= give})
                for k in steps:
                    carried = k * per_replica[src] / per_replica[dst]
                    for add in {max(math.ceil(carried) + d, 0) for d in (-1, 0, 1)}:
                        c = base.tile(1)
                        c.repl = c.repl.copy()
                        # the source gives its replicas up once the destination's are serving
                        at = min(ready_step[dst], ev.H - 1)
                        c.repl[0, src, at:] = np.clip(c.repl[0, src, at:] - k, pools[src].lo, pools[src].hi)
                        c.repl[0, dst] = np.clip(c.repl[0, dst] + add, pools[dst].lo, pools[dst].hi)
                        parts.append((k, c))
    if parts:
        # at most a quarter of the budget left, the smallest transfers first: on a large fleet the
        # pairs are many, and the later moves (delay grid, cross-entropy) need their share
        parts.sort(key=lambda x: x[0])
        room = max(s.left() // 4, 1)
        s.run(Candidates.concat([c for _, c in parts[:room]]))


def cross_entropy(s: Search, shed: bool = True) -> None:
    """Cross-entropy refinement of the continuous levers around the best plan (population
    `ce_population`, `ce_iterations` rounds), then each lever alone at its bounds and middle.
    `shed` False: the delay level stays (a part of the fleet cannot move what loads every pool)."""
    ev, cfg, rng = s.ev, s.cfg, s.rng
    lo, hi, names = continuous_bounds(ev.prob, ev.cfg)
    if not shed:
        keep = [i for i, (kind, _) in enumerate(names) if kind != "delay"]
        lo, hi, names = lo[keep], hi[keep], [names[i] for i in keep]
    if not names:
        return
    span = np.maximum(hi - lo, 1e-9)
    assert s.best is not None
    mean = np.clip(to_vec(s.best, names), lo, hi)
    std = 0.35 * span
    n = cfg.ce_population
    n_elite = max(2, int(round(cfg.ce_elite_frac * n)))
    for _ in range(cfg.ce_iterations):
        if s.left() <= 0:
            return
        base = s.best
        X = mean[None] + std[None] * rng.standard_normal((n, len(names)))
        # structured probes: each lever alone at its bounds (the quadrant moves a human would try)
        X = np.clip(X, lo, hi)
        X[0] = mean
        J = s.run(apply_vec(base, X, names, ev.prob.classes))
        order = np.argsort(J, kind="stable")[:n_elite]
        elite = X[order]
        if not np.isfinite(J[order]).all():
            break
        mean = elite.mean(axis=0)
        std = np.maximum(elite.std(axis=0), 0.02 * span)
    # coordinate probes from the best: each lever at its bounds and middle
    if s.left() > 0 and s.best is not None:
        b = to_vec(s.best, names)
        probes = []
        for col in range(len(names)):
            for v in (lo[col], hi[col], 0.5 * (lo[col] + hi[col])):
                x = b.copy()
                x[col] = v
                probes.append(x)
        s.run(apply_vec(s.best, np.array(probes), names, ev.prob.classes))


def delay_sweep(s: Search) -> None:
    """Structured enumeration of the share and delay levers together: the delay ladder at quarter
    steps × a few in-flight caps applied to every pool (none, 128 … 32 per replica), on the best
    plan. Capping the batch (share) and queueing/shedding (delay) substitute for each other under
    pressure, so they are searched jointly; the cross-entropy step then refines per pool."""
    if s.best is None or s.left() <= 0 or not s.ev.prob.classes:
        return
    levels = np.arange(0.0, len(s.ev.prob.classes) + 1e-9, 0.25)
    caps = [None, 128.0, 96.0, 64.0, 48.0, 32.0]
    parts = []
    for cap in caps:
        c = s.best.tile(len(levels))
        c.shed = lever_order(delay_ladder(levels, s.ev.prob.classes))
        if cap is not None:
            c.cap = c.cap.copy()
            for j, p in enumerate(s.ev.prob.pools):
                if p.frozen or p.levers_fixed:
                    continue
                top = float(p.max_inflight_cap) if p.max_inflight_cap else float(p.max_num_seqs)
                c.cap[:, j] = min(cap, top)
        parts.append(c)
    s.run(Candidates.concat(parts))
    _split_follows_delay(s, levels)


# Steps of a pool's traffic weight tried with each delay level (`_split_follows_delay`): a fifth less, a
# quarter more (the inverse of each other, so the pair brackets the split in force evenly on a log scale)
SPLIT_STEPS = (0.8, 1.25)


def _split_follows_delay(s: Search, levels: np.ndarray) -> None:
    """The delay ladder with each pool's traffic weight a step down and up, on the best plan (pools of a
    hop shared with others, whose levers are free). Shedding changes the load each pool is sent, so the
    split balanced for the load before it is not balanced after it: shedding a class alone, the pool
    that served it within its SLOs is left with capacity to spare while its neighbour stays short, and
    the plan without shedding looks better than it is. Example: two pools at 2:1 capacity, far past
    both, split 1:2 so the larger serves its share on time; shedding the sheddable class pays only
    with the larger pool's share raised to take standard traffic in its place. Tried only while the
    best plan has requests timing out (one scored row to find out)."""
    ev = s.ev
    if s.best is None or s.left() <= 0 or "traffic_split" in s.cfg.fixed_levers:
        return
    # only far past capacity: where the best plan leaves requests timing out in some pool's backlog (within
    # the client's timeout every pool drains what it is sent, and the split's balance is the sweeps' job)
    counted = ev.evaluations
    _, info = ev.score(s.best, detail=True)
    ev.evaluations = counted  # a look at the plan already scored, not a candidate: not charged to the budget
    if info is None or not float(np.max(info["timed_out_frac_p50"])) > 0.0:
        return
    _, _, names = continuous_bounds(ev.prob, ev.cfg)
    cols = [j for kind, j in names if kind == "tw"]
    if not cols:
        return
    # whole classes shed (what moves the balance), and the best plan's own level
    wanted = np.unique(np.concatenate([levels[np.isclose(levels, np.round(levels))], [ladder_level(s.best.shed[0])]]))
    shed = lever_order(delay_ladder(wanted, ev.prob.classes))
    parts = []
    for j in cols:
        for f in SPLIT_STEPS:
            c = s.best.tile(len(wanted))
            c.shed = shed.copy()
            c.tw = c.tw.copy()
            c.tw[:, j] = np.clip(c.tw[:, j] * f, 0.0, 1.0)
            parts.append(c)
    # at most a quarter of the budget left (a large fleet has many pools; the later moves need their share)
    rows = Candidates.concat(parts)
    s.run(rows.take(np.arange(min(rows.n, max(s.left() // 4, 1)))))


def batch_caps(s: Search, needs: list[np.ndarray] | None = None) -> None:
    """The slow lever: engine batch caps, tried on the best plan; adopted only for a clear gain
    (`batch_cap_gain`), since each change is a rolling restart and the model is not exact. A pool's
    memory ceiling (`max_batched_tokens`) bars raises above it; lowering stays open.
    Once a pool's caps change, its replicas are swept again under them: the replicas the best
    plan bought under the old caps are not what the new caps need (a smaller batch budget changes
    each replica's capacity)."""
    ev = s.ev
    if "batch_caps" in s.cfg.fixed_levers:
        return
    for j, p in enumerate(ev.prob.pools):
        if not p.batch_review or p.frozen or s.left() <= 0 or s.best is None:
            continue
        opts = [o for o in s.cfg.batch_token_options if o >= p.max_num_seqs and o != p.max_num_batched_tokens
                and (p.max_batched_tokens is None or o <= max(p.max_batched_tokens, p.max_num_batched_tokens))]
        if not opts:
            continue
        c = s.best.tile(len(opts))
        c.mbt = c.mbt.copy()
        c.mbt[:, j] = np.array(opts, dtype=float)
        J, _ = ev.score(c)
        k = int(np.argmin(J))
        if J[k] < s.best_J * (1.0 - s.cfg.batch_cap_gain):
            s.best_J = float(J[k])
            s.best = c.take(np.array([k]))
            if needs is not None:  # a few dozen rows for one pool: not budgeted, like settle
                tpl = replica_templates(ev, s.best, j, needs[j], s.cfg.replica_span)
                c2 = s.best.tile(len(tpl))
                c2.repl = c2.repl.copy()
                c2.repl[:, j, :] = tpl
                J2, _ = ev.score(c2)
                k2 = int(np.argmin(J2))
                if J2[k2] < s.best_J:
                    s.best_J, s.best = float(J2[k2]), c2.take(np.array([k2]))


def settle(s: Search, tolerance: float = 0.003, pools: bool = True, shed: bool = True) -> None:
    """Put back every lever whose change does not pay: each continuous lever of the best plan is
    reset to the value in force (shedding: to what is in force, or to none) if that alone costs
    less than `tolerance` of the objective; the accepted resets are then checked together (one
    batch of single resets + one row for their combination). Levers thus move only when they
    matter, and the explanation names only levers pulled for a reason. Not budgeted (a few rows).
    `pools` / `shed` False: leave the pools' levers / the shed fractions as they are."""
    ev = s.ev
    if s.best is None:
        return
    cur, best = ev.cur, s.best
    trials: list[Candidates] = []
    for j, p in enumerate(ev.prob.pools):
        if p.frozen or not pools:
            continue
        for field_ in SETTLE_FIELDS:
            b = float(getattr(cur, field_)[0, j])
            if field_ == "cap" and p.max_inflight_cap:
                b = min(b, float(p.max_inflight_cap))
            if field_ == "pw" and p.max_prefix_weight is not None:
                b = min(b, float(p.max_prefix_weight))
            if getattr(best, field_)[0, j] == b:
                continue
            c = best.tile(1)
            arr = getattr(c, field_).copy()
            arr[0, j] = b
            setattr(c, field_, arr)
            trials.append(c)
    lo = np.array([c.min_shed for c in ev.prob.classes])
    hi = np.array([max(c.max_shed, c.min_shed) for c in ev.prob.classes])
    for back in (lever_order(np.clip(cur.shed, lo, hi)), lever_order(lo[None, :].copy())):
        if shed and not np.allclose(back, best.shed):
            c = best.tile(1)
            c.shed = back.copy()
            trials.append(c)
    if not trials:
        return
    J, _ = ev.score(Candidates.concat(trials))
    ok = [t for t, v in zip(trials, J, strict=True) if v <= s.best_J * (1.0 + tolerance)]
    if not ok:
        return
    combo = best.tile(1)
    for t in ok:  # merge every accepted reset into one plan
        for field_ in ("pw", "cap", "tw", "standby", "shed"):
            diff = getattr(t, field_) != getattr(best, field_)
            arr = getattr(combo, field_).copy()
            arr[diff] = getattr(t, field_)[diff]
            setattr(combo, field_, arr)
    combo.shed = lever_order(combo.shed)
    Jc, _ = ev.score(combo)
    if Jc[0] <= s.best_J * (1.0 + tolerance):
        s.best, s.best_J = combo, min(float(Jc[0]), s.best_J)
    else:
        k = int(np.argmin(J))
        if J[k] <= s.best_J * (1.0 + tolerance):
            s.best, s.best_J = trials[k], min(float(J[k]), s.best_J)

