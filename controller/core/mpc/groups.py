"""Searching a large fleet route group by route group, coordinated only through what couples the groups.

Why it is exact: pools of different route groups never share traffic (a group's share of each class
is given, see traffic.py), so a candidate that changes only one group's pools changes the fleet's
objective only through (1) the sums over pools that the objective takes: cost, change penalties and
each class's share-weighted late probability (score.py, risk.py); (2) whether shedding applies,
which holds while any route group is short (`Traffic.shed_active`). The shed fractions themselves
load every pool, so they are moved by fleet-wide moves only. A `PartEvaluator` scores candidates of
one group's pools with the rest of the fleet's sums at its best plan (`Others`): the objective is the
fleet's, but a candidate costs its group's pools, not the fleet's. Each move of the complete search
(replica sweeps, transfers, cross-entropy on the continuous levers, batch caps, settle) then runs per
group against the others' best (one group after another, each seeing the others' latest plan), and
the moves that change the shed fractions run fleet-wide; after each round the whole fleet's plan is
scored by the fleet's evaluator, which stays the judge (a round that did not improve it is undone).

Cost: each round scores Σ_groups (candidates × the group's pools) rows, so with route groups of a
bounded size the search grows linearly with the pools; a fleet-wide move scores a fixed number of
candidates × every pool, linear too. The complete search scores (candidates ∝ pools) × pools.

The budget (time or rows, see MpcConfig) is split across the moves in proportion to what each is
expected to cost, and what a move leaves is passed on to the next.

`plan_groups(problem, config)` says which parts a fleet is searched in ([]: one search);
`search_groups(search, needs, groups)` runs the moves. Deterministic for a given rng.

Must not: read the clock other than through the injected timer, draw randomness other than from the
Generator passed in, or do I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from controller.core.mpc.candidates import CAND_FIELDS, Candidates
from controller.core.mpc.latency import PoolLatencies
from controller.core.mpc.problem import MpcConfig, PlanProblem
from controller.core.mpc.risk import Risk, sum_pools
from controller.core.mpc.score import Evaluator, Others
from controller.core.mpc.search import (
    BatchCost,
    Search,
    batch_caps,
    cross_entropy,
    delay_sweep,
    settle,
    sweep_replicas,
    transfer_replicas,
)
from controller.core.mpc.tails import TPOT_TAIL_SIGMA, TTFT_TAIL_SIGMA, lognormal_exceed, lognormal_exceed_into
from controller.core.mpc.traffic import Traffic
from controller.core.mpc_model import compiled_kernel

POOL_FIELDS = tuple(f for f in CAND_FIELDS if f != "shed")  # the candidate arrays with a pool axis

# Rows each move is expected to score, per pool of what it moves (the complete search's own counts on
# the bench's fleets): a replica sweep ~45 templates a pool plus transfers; cross-entropy 4 × 48 plus
# three probes per lever; the delay grid 78 fleet rows.
_SWEEP_ROWS_PER_POOL = 50
_DELAY_ROWS = 78


def plan_groups(prob: PlanProblem, cfg: MpcConfig) -> list[list[int]]:
    """The parts the fleet is searched in, as pool indices: one per route group, ordered by what the
    group spends now (price × replicas, the largest first, so a tight budget serves it first; name on
    ties). [] = one search over the whole fleet: group search off, fewer pools than
    `group_search_min_pools`, or a single route group.
    Example: 12 pools in groups chat (3 H100 × 4) and code (9 A100 × 1) → [[chat's], [code's]]."""
    if not cfg.group_search or len(prob.pools) < cfg.group_search_min_pools:
        return []
    by: dict[str, list[int]] = {}
    for j, p in enumerate(prob.pools):
        by.setdefault(p.group, []).append(j)
    if len(by) < 2:
        return []
    spend = {g: sum(prob.pools[j].usd_per_hour * max(prob.pools[j].target, prob.pools[j].ready) for j in idx)
             for g, idx in by.items()}
    return [by[g] for g in sorted(by, key=lambda g: (-spend[g], g))]


def columns(c: Candidates, idx: np.ndarray) -> Candidates:
    """The candidates restricted to the pools `idx` (the shed fractions are the fleet's)."""
    return Candidates(*(getattr(c, f)[:, idx] if f in POOL_FIELDS else getattr(c, f).copy() for f in CAND_FIELDS))


def put_columns(full: Candidates, part: Candidates, idx: np.ndarray) -> Candidates:
    """A copy of the fleet's candidate (one row) with the pools `idx` taken from `part` (one row)."""
    out = full.take(np.array([0]))
    for f in POOL_FIELDS:
        getattr(out, f)[:, idx] = getattr(part, f)
    return out


class _PartTraffic(Traffic):
    """The traffic of one part: its route groups keep their share of the fleet's traffic, and shedding
    applies while the part or the rest of the fleet is short."""

    def __init__(self, prob: PlanProblem, H: int, step_s: float, client_retries: int, gshare: np.ndarray) -> None:
        super().__init__(prob, H, step_s, client_retries)
        self.gshare = gshare
        self.others_short: np.ndarray | None = None

    def shed_active(self, ready: np.ndarray, need: np.ndarray | None) -> np.ndarray:
        short = super().shed_active(ready, need)
        if need is None or self.others_short is None:
            return short
        out: np.ndarray = short | self.others_short[None, :]
        return out


class _PartRisk(Risk):
    """Late shares of one part, with the rest's share-weighted sums added before the per-class combination."""

    def __init__(self, prob: PlanProblem, traffic: Traffic, compiled: bool, fleet_decode: bool) -> None:
        super().__init__(prob, traffic, compiled)
        self.fleet_decode = fleet_decode
        self.others: Others | None = None
        self.own: tuple[np.ndarray, np.ndarray] | None = None  # the last batch's own sums (for `part`)
        self.own_lost: tuple[np.ndarray, np.ndarray] | None = None  # its own timed-out sums (None: none)

    def lost_share(self, pl: PoolLatencies, share: np.ndarray) -> np.ndarray | None:
        """The fleet's timed-out share: this part's sums with the rest's added before the hops combine (as
        `late_share`), None when neither has a request timing out."""
        own = self.lost_sums(pl, share)
        self.own_lost = None if own is None else (own[0].copy(), own[1].copy())
        o = self.others
        rest = None if o is None or o.lost_first is None or o.lost_decode is None else (o.lost_first, o.lost_decode)
        if own is None and rest is None:
            return None
        if own is None:
            assert rest is not None
            return self.combine_lost(rest[0][None], rest[1][None], self.fleet_decode)  # broadcasts over candidates
        f, d = own
        if rest is not None:
            f = f + rest[0][None]
            d = d + rest[1][None]
        return self.combine_lost(f, d, self.fleet_decode)

    def late_share(self, pl: PoolLatencies, share: np.ndarray) -> np.ndarray:
        f, d = self.sums(pl, share)
        self.own = (f, d)
        if self.others is not None:
            f = f + self.others.late_first[None]
            d = d + self.others.late_decode[None]
        v = 1.0 - (1.0 - f) * (1.0 - d) if self.fleet_decode else 1.0 - (1.0 - f)
        out: np.ndarray = np.clip(v, 0.0, 1.0)
        return out

    def sums(self, pl: PoolLatencies, share: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(C,2,H,K) Σ share × late probability over this part's first-hop pools, and over its decode
        pools: `Risk.late_share` before it combines the hops (the same model; see there)."""
        t50, t95, tpot50, tpot95, scratch = pl.t50, pl.t95, pl.tpot50, pl.tpot95, pl.scratch
        pf = lognormal_exceed_into(t50, t95, self.slo_ttft_k, TTFT_TAIL_SIGMA, z=t50, scratch=scratch, own=True)
        pt = lognormal_exceed_into(tpot50, tpot95, self.slo_tpot_k, TPOT_TAIL_SIGMA, z=t95, scratch=scratch)
        tmax = pl.lat.tpot_max_s
        K = pf.shape[0]
        kern = compiled_kernel() if self.compiled else None
        if kern is not None and K >= 2 and share.ndim == 3:
            # the compiled combination without a decode hop is the clipped sum over the pools it is given:
            # once with the first hop's shares, once with the decode hop's (each pool then as "mixed")
            p_c = (np.zeros(pl.shape) if tmax is None else
                   lognormal_exceed(tpot50, tpot95, np.minimum(np.reshape(tmax, pl.shape), 1e6), TPOT_TAIL_SIGMA))
            p_c = np.ascontiguousarray(p_c, dtype=float)
            consts = np.array([float(tmax is not None), 0.0])
            out_shape = (share.shape[0], 2, share.shape[1], K)
            first = np.empty(out_shape)
            kern.combine_rows(pf, pt, p_c, pl.timed_out, np.ascontiguousarray(share * self.first_hop, dtype=float),
                              self.hops, consts, first)
            dec = np.zeros(out_shape)
            if self.decode_hop.any():
                hops = self.hops.copy()
                hops[:, 0] = 0.0
                kern.combine_rows(pf, pt, p_c, pl.timed_out,
                                  np.ascontiguousarray(share * self.decode_hop, dtype=float), hops, consts, dec)
            return first, dec
        if tmax is not None:
            p_c = lognormal_exceed(tpot50, tpot95, np.minimum(np.reshape(tmax, pl.shape), 1e6), TPOT_TAIL_SIGMA)
            pt -= p_c[None]
            pt /= np.maximum(1.0 - p_c, 1e-12)[None]
            np.clip(pt, 0.0, 1.0, out=pt)
        if pl.timed_out.any():
            pf[pl.timed_out] = 1.0
        w_share = share[:, :, None, :, :] if share.ndim == 4 else share[None, :, None, :, :]
        mixed = pf + pt - pf * pt
        first_v = np.where(self.prefill_pool, pf, mixed) if self.prefill_pool.any() else mixed
        f = np.ascontiguousarray(np.moveaxis(sum_pools(w_share * self.first_hop * first_v), 0, -1))
        if not self.decode_hop.any():
            return f, np.zeros_like(f)
        d = np.ascontiguousarray(np.moveaxis(sum_pools(w_share * self.decode_hop * mixed), 0, -1))
        return f, d


class PartEvaluator(Evaluator):
    """Scores candidates of the pools `idx` of a fleet (its route groups whole) with the rest of the
    fleet at its best plan (`set_others`): the fleet's objective at the cost of the part's pools."""

    def __init__(self, full: Evaluator, idx: Sequence[int]) -> None:
        prob = full.prob
        sub = PlanProblem(pools=tuple(prob.pools[j] for j in idx), classes=prob.classes, weights=prob.weights,
                          group_share=prob.group_share)
        compiled = full.dynamics.compiled
        super().__init__(sub, full.model, full.cfg, compiled=compiled, steps=full.H)
        self.idx = np.array(idx, dtype=np.intp)
        ft = full.traffic
        gshare = np.array([ft.gshare[ft.groups.index(g)] for g in self.traffic.groups])
        self.part_traffic = _PartTraffic(sub, self.H, self.dt, full.cfg.client_retries, gshare)
        self.part_risk = _PartRisk(sub, self.part_traffic, compiled, bool(ft.decode_hop.any()))
        self.traffic, self.risk = self.part_traffic, self.part_risk
        self.share_now = self.traffic.shares(self.cur.tw * self.traffic.ready_step0)[0]
        self.cpr_min = full.cpr_min  # the floor is the fleet's cheapest pool
        self.need = None if full.need is None else full.need[self.idx]

    def set_others(self, others: Others | None) -> None:
        self.others = others
        self.part_risk.others = others
        self.part_traffic.others_short = None if others is None else others.short

    def part(self, c: Candidates) -> Others:
        """This part's own sums for its candidate c (one row), as the others of the other parts."""
        saved = self.others
        # the rest's short steps and late sums stay (they set this part's load), its cost and change go
        self.set_others(replace(saved, cost_usd=0.0, change_usd=0.0) if saved is not None else
                        Others(0.0, 0.0, np.zeros((2, self.H, self.K)), np.zeros((2, self.H, self.K)),
                               np.zeros(self.H, dtype=bool)))
        self.score(c)
        self.set_others(saved)
        assert self.last_cost_change is not None and self.part_risk.own is not None and self.need is not None
        cost, change = self.last_cost_change
        own_f, own_d = self.part_risk.own
        ready = self.dynamics.run(c.repl, c.standby)[0][0]  # (P,H)
        short = np.zeros(self.H, dtype=bool)
        for m in self.traffic.group_masks:
            short |= ready[m].sum(axis=0) < self.need[m].sum(axis=0) - 1e-9
        lost = self.part_risk.own_lost
        return Others(cost_usd=float(cost[0]), change_usd=float(change[0]),
                      late_first=own_f[0].copy(), late_decode=own_d[0].copy(), short=short,
                      lost_first=None if lost is None else lost[0][0].copy(),
                      lost_decode=None if lost is None else lost[1][0].copy())


def others_of(parts: Sequence[Others], g: int) -> Others:
    """The sums of every part but g."""
    rest = [p for k, p in enumerate(parts) if k != g]
    first = parts[g].late_first
    lost = [(p.lost_first, p.lost_decode) for p in rest if p.lost_first is not None and p.lost_decode is not None]
    return Others(cost_usd=float(sum(p.cost_usd for p in rest)), change_usd=float(sum(p.change_usd for p in rest)),
                  late_first=sum((p.late_first for p in rest), np.zeros_like(first)),
                  late_decode=sum((p.late_decode for p in rest), np.zeros_like(first)),
                  lost_first=sum((f for f, _ in lost), np.zeros_like(first)) if lost else None,
                  lost_decode=sum((d for _, d in lost), np.zeros_like(first)) if lost else None,
                  short=np.logical_or.reduce([p.short for p in rest]) if rest else np.zeros(len(parts[g].short), bool))


class _Slice(Search):
    """A Search within a slice of the tick's budget: until `deadline` (with a timer) or `rows`
    candidate × pool rows of its evaluator (without)."""

    def __init__(self, ev: Evaluator, parent: Search, cost: BatchCost, deadline_s: float, rows: int) -> None:
        super().__init__(ev, parent.cfg, parent.rng, parent.timer, parent.t0)
        self.cost = cost
        self._deadline_s, self._rows, self._ev0 = deadline_s, rows, ev.evaluations

    def deadline_s(self) -> float:
        return self._deadline_s

    def left(self) -> int:
        """What the slice allows: like `Search.left`, without its room for `settle`, which each group's
        last move runs within its own slice and the tick's reserve covers."""
        if self.timer is not None:
            remaining = self._deadline_s - self.timer()
            room = 10**9 if remaining > 0 and not self.cost.known() else (
                self.cost.fits(remaining) if remaining > 0 else 0)
            if room <= 0:
                self.exhausted = True
            return room
        room = (self._rows - (self.ev.evaluations - self._ev0) * self.ev.P) // self.ev.P
        if room <= 0:
            self.exhausted = True
        return room


Move = Callable[[Search], None]


class _Run:
    """The grouped search's state: the fleet's search (its best is the judge's), the parts' evaluators
    and sums, and the budget left."""

    def __init__(self, s: Search, needs: list[np.ndarray], groups: list[list[int]]) -> None:
        self.s = s
        self.evs = [PartEvaluator(s.ev, idx) for idx in groups]
        self.needs = [[needs[j] for j in idx] for idx in groups]
        self.costs = {id(e): BatchCost() for e in [s.ev, *self.evs]}
        self.exhausted = False
        self.parts: list[Others] = []
        self.current_J = s.best_J  # the fleet's objective of its plan as the group moves leave it
        self.refresh()

    def refresh(self) -> None:
        """Every part's sums at the fleet's best (after a fleet-wide move, or a round undone)."""
        best = self.s.best
        assert best is not None
        self.parts = []
        for e in self.evs:
            e.set_others(None)
            self.parts.append(e.part(columns(best, e.idx)))
        # Whether shedding applies changes the pools' load only where the plan sheds beyond the floors:
        # then once more, with the others' short steps
        sheds = not np.allclose(np.clip(best.shed[0], 0.0, 1.0), self.s.ev.traffic.floor)
        if sheds and any(p.short.any() for p in self.parts):
            first = list(self.parts)
            self.parts = []
            for g, e in enumerate(self.evs):
                e.set_others(others_of(first, g))
                self.parts.append(e.part(columns(best, e.idx)))

    def rows_used(self) -> int:
        return self.s.ev.evaluations * self.s.ev.P + sum(e.evaluations * e.P for e in self.evs)

    def slice(self, ev: Evaluator, share: float) -> _Slice:
        """A search on `ev` with `share` of the budget left (from now)."""
        s = self.s
        if s.timer is not None:
            now = s.timer()
            deadline, rows = now + max(s.deadline_s() - now, 0.0) * share, 0
        else:
            deadline, rows = 0.0, int(max(s.cfg.max_evaluations - self.rows_used(), 0) * share)
        return _Slice(ev, s, self.costs[id(ev)], deadline, rows)

    def fleet_move(self, move: Move, share: float) -> None:
        sl = self.slice(self.s.ev, share)
        sl.best, sl.best_J = self.s.best, self.s.best_J
        move(sl)
        self.exhausted |= sl.exhausted
        if sl.best_J < self.s.best_J:
            self.s.best, self.s.best_J = sl.best, sl.best_J
            self.refresh()
        self.current_J = self.s.best_J

    def group_move(self, g: int, move: Callable[[Search, list[np.ndarray]], None], share: float) -> None:
        """One group's move against the others' latest plan. It starts from the fleet's objective of the
        plan as it stands (the part scores it the same, but for the order of floating-point sums)."""
        e = self.evs[g]
        e.set_others(others_of(self.parts, g))
        sl = self.slice(e, share)
        assert self.s.best is not None
        sl.best, sl.best_J = columns(self.s.best, e.idx), self.current_J
        move(sl, self.needs[g])
        self.exhausted |= sl.exhausted
        if sl.best is not None and sl.best_J < self.current_J * (1.0 - 1e-12):
            self.s.best = put_columns(self.s.best, sl.best, e.idx)
            self.current_J = sl.best_J
            self.parts[g] = e.part(sl.best)

    def judge(self, before: tuple[Candidates, float]) -> None:
        """Score the fleet's plan after a round of group moves with the fleet's evaluator; undo the
        round if it did not improve (the parts' scores are exact but for when shedding applies)."""
        assert self.s.best is not None
        j_fleet = float(self.s.ev.score(self.s.best)[0][0])
        if j_fleet <= before[1]:
            self.s.best_J = j_fleet
        else:
            self.s.best, self.s.best_J = before
            self.refresh()
        self.current_J = self.s.best_J


def _sweep(sl: Search, needs: list[np.ndarray]) -> None:
    pools = sl.ev.prob.pools
    order = sorted(range(len(pools)), key=lambda j: -pools[j].usd_per_hour)
    sweep_replicas(sl, needs, order)
    transfer_replicas(sl)


def _levers(sl: Search, needs: list[np.ndarray]) -> None:
    cross_entropy(sl, shed=False)


def _finish(sl: Search, needs: list[np.ndarray]) -> None:
    """The slow batch-cap lever, then settle: each only within the group's slice (unlike in the
    complete search, where they are not budgeted: on a large fleet their rows add up)."""
    if sl.left() > 0:
        batch_caps(sl, needs)
    if sl.left() > 0:
        settle(sl, shed=False)


def _settle_shed(sl: Search) -> None:
    settle(sl, pools=False)


def search_groups(s: Search, needs: list[np.ndarray], groups: list[list[int]]) -> int:
    """The complete search's moves, in its order, group by group (module docstring); `s.best` and
    `s.best_J` end at the best plan found, scored by the fleet's evaluator. Returns the candidates
    the parts scored, in fleet candidates (rows × the part's pools / the fleet's pools)."""
    run = _Run(s, needs, groups)
    sizes = [len(g) for g in groups]
    P = s.ev.P
    sweep_rows = [_SWEEP_ROWS_PER_POOL * n * n for n in sizes]
    ce_rows = [(s.cfg.ce_iterations * s.cfg.ce_population + 9 * n) * n for n in sizes]
    # (expected rows, what runs): the fleet-wide moves and each group's, in the complete search's order
    fleet: list[tuple[float, Move]] = [(float(_DELAY_ROWS * P), delay_sweep)]
    plan: list[tuple[float, int, Callable[..., None]]] = [(r, -1, m) for r, m in fleet]  # -1: fleet-wide
    # (no delay grid between the sweep and the cross-entropy: the groups' cross-entropy leaves the
    # shed fractions where they are, so the grid after it sees what it would)
    plan += [(float(r), g, _sweep) for g, r in enumerate(sweep_rows)]
    plan += [(float(r), g, _levers) for g, r in enumerate(ce_rows)]
    plan += [(float(r), g, _sweep) for g, r in enumerate(sweep_rows)]
    plan += [(r, -1, m) for r, m in fleet]
    plan += [(float((8 * n + 3) * n), g, _finish) for g, n in enumerate(sizes)]  # caps, settle's resets
    plan += [(4.0 * P, -1, _settle_shed)]
    left = sum(x[0] for x in plan)
    before: tuple[Candidates, float] | None = None
    for rows, g, move in plan:
        share = rows / left if left > 0 else 1.0
        left -= rows
        if g < 0:
            if before is not None:
                run.judge(before)
                before = None
            run.fleet_move(move, share)
        else:
            if before is None:
                assert s.best is not None
                before = (s.best, s.best_J)
            run.group_move(g, move, share)
    if before is not None:
        run.judge(before)
    s.exhausted |= run.exhausted
    return int(round(sum(e.evaluations * e.P for e in run.evs) / P))
