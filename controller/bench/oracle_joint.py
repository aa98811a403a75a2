"""The joint hindsight oracle: replicas per pool *and* each route group's split between its pools.

The plain oracle (controller/bench/oracle.py) schedules replicas pool by pool with the routing
fixed at the scenario's traffic weights. Where a route group is served by several first-hop pools
(two SKUs, a large and a small model tier, a mixed and a prefill pool), where the traffic goes is
itself a lever: carrying the base load on the pool with the lowest price per unit of work and the
peaks on the one that starts fastest can cost much less than the scenario's fixed split. This
oracle chooses both, per 60 s window, in one dynamic programme per route group; it is the
reference for the levers an online controller moves between pools (tier/SKU split; the P:D ratio
is the per-pool schedule of a disaggregated group's prefill and decode pools, whose demands are
weighed by their own part of each request's work, see `oracle.pool_demands`).

The programme, for the first-hop pools p = 1..n of one group (n ≥ 2):
  u_{p,k}  = the window's demand if p took all of the group's traffic, in p's replicas
             (its demand at share 1 over its profiled per-replica capacity, × margin);
  e_{p,k}  = the share of the window's group traffic p may take (1, or what the tier rule lets
             into a small tier: its eligible work over all of the group's, per window);
  a state is a replica vector m = (m_1..m_n); it carries window k when
             Σ_p min((m_p − f_{p,k}) / u_{p,k}, e_{p,k}) ≥ 1, f_{p,k} = replicas a scheduled fault takes away;
  cost     = Σ_k Σ_p m_{p,k} × window_s × price_p + starts_p × startup_cold_s_p × price_p
             + stops_p × drain_s_p × price_p (as the per-pool DP, per pool);
  the share p gets in window k is its term of that sum, normalised (every pool then runs at the
  same fraction of what it can carry within the SLO). The router splits each request among the
  pools its class may use, by weight (controller/sim/router.py), so a restricted pool's weight is
  its share over its eligible share and the unrestricted pools split the rest by their shares
  (`router_weights`; exact for one restricted tier, the tiers scenario's case).
The transition cost is a sum over pools, so the minimum over the previous state is taken one pool's
axis at a time (a min-plus product per axis): O(windows × states × Σ_p S_p), with S_p = the replica
counts pool p may take. Ties go to fewer replicas of the first pool. A grid larger than
MAX_STATES falls back to the per-pool schedule at the scenario's split (`JointTooLargeError`).

Same assumptions as the plain oracle (linear capacity in replicas, cold start-ups in the DP, the
window's mean or 20 s peak), plus: a pool's work per request is its own (`request_work_s` of its
model and SKU), so moving a request between SKUs moves that pool's cost of it. Must not: read
the wall clock or write files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from controller.sim.scenario import PoolSpecModel, Scenario

# The largest product of per-pool replica ranges one group's programme may have: three pools of
# up to ~58 replicas each (about 200k states × windows × axes stays under a second in numpy).
MAX_STATES = 200_000


class JointTooLargeError(ValueError):
    """The group's joint state grid exceeds MAX_STATES; the caller plans it pool by pool."""


@dataclass(frozen=True)
class GroupPlan:
    pools: tuple[str, ...]
    replicas: Mapping[str, tuple[int, ...]]  # per window
    shares: Mapping[str, tuple[float, ...]]  # per window, summing to 1 over the group's pools
    weights: Mapping[str, tuple[float, ...]]  # per window, the router weights that give those shares
    planned_cost_usd: float
    capped_windows: int  # windows no state could carry (every pool at its max)


def joint_groups(scenario: Scenario) -> list[tuple[PoolSpecModel, ...]]:
    """Route groups whose first hop (mixed or prefill pools) has two or more pools, in scenario order."""
    out: dict[str, list[PoolSpecModel]] = {}
    for p in scenario.pools:
        if p.role != "decode":
            out.setdefault(p.group, []).append(p)
    return [tuple(v) for v in out.values() if len(v) >= 2]


def _min_plus_axis(cost: np.ndarray, trans: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """new[..., j, ...] = min_i cost[..., i, ...] + trans[i, j] along `axis`; also the argmin i."""
    c = np.moveaxis(cost, axis, -1)[..., :, None] + trans  # [..., i, j]
    arg = np.argmin(c, axis=-2)  # first index on ties: fewer replicas before
    new = np.take_along_axis(c, arg[..., None, :], axis=-2)[..., 0, :]
    return np.moveaxis(new, -1, axis), np.moveaxis(arg, -1, axis)


def plan_group(specs: Sequence[PoolSpecModel], units: Sequence[np.ndarray], *, usd_per_s: Sequence[float],
               drain_s: Sequence[float], window_s: float, eligible: Sequence[float | np.ndarray] | None = None,
               extra: Sequence[np.ndarray] | None = None, floors: Sequence[int] | None = None) -> GroupPlan:
    """The cheapest replica vectors per window that carry the group's demand, with the shares that go with them.

    `units[p][k]` = u_{p,k} (replicas pool p would need for all of the group's window-k traffic, margin
    included; 0 = no traffic). Example: two pools, u = (4, 2) in every window (the second SKU does twice
    the work per replica), prices 1 and 3 per replica-window: carrying it all on the first costs 4, on the
    second 6, half and half 2 + 3 = 5 → 4 replicas of the first, shares (1, 0).
    """
    n = len(specs)
    if n < 1 or len(units) != n:
        raise ValueError("plan_group: one demand series per pool")
    n_windows = len(units[0])
    u = np.stack([np.asarray(x, dtype=np.float64) for x in units])  # [pool, window]
    if not np.all(np.isfinite(u)) or np.any(u < 0):
        raise ValueError("plan_group: demands must be finite and >= 0")
    e = np.ones((n, n_windows))
    if eligible is not None:
        e = np.stack([np.broadcast_to(np.asarray(x, dtype=np.float64), (n_windows,)) for x in eligible])
    e = np.clip(e, 0.0, 1.0)
    f = (np.stack([np.asarray(x, dtype=np.int64) for x in extra]) if extra is not None
         else np.zeros((n, n_windows), dtype=np.int64))
    lo = [int(x) for x in (floors if floors is not None else [s.min_replicas for s in specs])]
    # Each pool never needs more than what carries its eligible share of the peak window (plus faults).
    # (and never below the replicas it starts with: the first transition is from there)
    hi = [int(min(s.max_replicas, max(lo[i], s.replicas,
                                      math.ceil(float(np.max(u[i] * e[i], initial=0.0)) - 1e-9)
                                      + int(np.max(f[i], initial=0)))))
          for i, s in enumerate(specs)]
    sizes = [h + 1 for h in hi]
    if math.prod(sizes) > MAX_STATES:
        raise JointTooLargeError(f"joint grid {sizes} exceeds {MAX_STATES} states")
    grids = np.meshgrid(*[np.arange(sz) for sz in sizes], indexing="ij")
    window_cost = sum(g * window_s * usd_per_s[i] for i, g in enumerate(grids))
    trans = []
    for i, s in enumerate(specs):
        st = np.arange(sizes[i])
        up = np.maximum(st[None, :] - st[:, None], 0) * s.startup_cold_s
        down = np.maximum(st[:, None] - st[None, :], 0) * drain_s[i]
        trans.append((up + down) * usd_per_s[i])
    below_floor = np.zeros(tuple(sizes), dtype=bool)
    for i, g in enumerate(grids):
        below_floor |= g < lo[i]
    # windows that end before a cold start-up ordered at t = 0 could serve: the initial replicas at most
    early = [int(math.ceil(s.startup_cold_s / window_s)) for s in specs]
    initial = tuple(min(s.replicas, hi[i]) for i, s in enumerate(specs))

    def carried(k: int, m_grids: Sequence[np.ndarray]) -> np.ndarray:
        tot = np.zeros(tuple(sizes))
        for i, g in enumerate(m_grids):
            eff = np.maximum(g - f[i, k], 0).astype(np.float64)
            frac = np.where(u[i, k] > 0, eff / max(u[i, k], 1e-300), np.inf)
            tot = tot + np.minimum(frac, e[i, k])
        return tot

    cost = np.full(tuple(sizes), np.inf)
    cost[initial] = 0.0
    backs: list[list[np.ndarray]] = []
    capped = 0
    for k in range(n_windows):
        arg_k = []
        for ax in range(n):
            cost, arg = _min_plus_axis(cost, trans[ax], ax)
            arg_k.append(arg)
        backs.append(arg_k)
        ok = carried(k, grids) >= 1.0 - 1e-9
        if not np.any(ok & ~below_floor):
            capped += 1
            # nothing carries it: the most a state can carry wins (every pool at its max)
            ok = np.zeros_like(ok)
            ok[tuple(hi)] = True
        allowed = ok & ~below_floor
        for i, g in enumerate(grids):
            if k < early[i]:
                allowed &= g <= max(initial[i], lo[i])
        if not np.any(allowed):
            allowed = ~below_floor
        cost = np.where(allowed, cost + window_cost, np.inf)
    last = np.unravel_index(int(np.argmin(cost)), cost.shape)
    total = float(cost[last])
    path = np.empty((n_windows, n), dtype=np.int64)
    state: list[int] = [int(x) for x in last]
    for k in range(n_windows - 1, -1, -1):
        path[k] = state
        # undo the per-axis minimisations in reverse order
        for ax in range(n - 1, -1, -1):
            state[ax] = int(backs[k][ax][tuple(state)])
    reps = {s.name: tuple(int(x) for x in path[:, i]) for i, s in enumerate(specs)}
    shares: dict[str, list[float]] = {s.name: [] for s in specs}
    for k in range(n_windows):
        terms = []
        for i in range(n):
            eff = max(int(path[k, i]) - int(f[i, k]), 0)
            terms.append(float(min(eff / u[i, k], e[i, k])) if u[i, k] > 0 else (float(e[i, k]) if eff > 0 else 0.0))
        tot = sum(terms)
        for i, s in enumerate(specs):
            shares[s.name].append(terms[i] / tot if tot > 0 else 1.0 / n)
    weights: dict[str, list[float]] = {s.name: [] for s in specs}
    for k in range(n_windows):
        w = router_weights([shares[s.name][k] for s in specs], e[:, k].tolist())
        for i, s in enumerate(specs):
            weights[s.name].append(w[i])
    return GroupPlan(tuple(s.name for s in specs), reps, {k: tuple(v) for k, v in shares.items()},
                     {k: tuple(v) for k, v in weights.items()}, total, capped)


def router_weights(shares: Sequence[float], eligible: Sequence[float]) -> list[float]:
    """Router weights that give each pool its share of the group when a request is split by weight
    among the pools its class may use (controller/sim/router.py). A restricted pool (eligible e < 1)
    gets s / e; the unrestricted ones share what is left in proportion to their shares. Exact when one
    pool is restricted: with e = 0.5 and s = 0.3 the small tier gets 0.6 of the eligible half = 0.3 of
    all, the large one the other 0.7. Example: shares (0.7, 0.3), eligible (1, 0.5) → (0.4, 0.6)."""
    n = len(shares)
    w = [0.0] * n
    restricted = [i for i in range(n) if eligible[i] < 1.0 - 1e-9]
    free = [i for i in range(n) if i not in restricted]
    for i in restricted:
        w[i] = shares[i] / eligible[i] if eligible[i] > 0 else 0.0
    used = sum(w)
    if used > 1.0:  # several restricted tiers over-asked: scale them into the whole
        w = [x / used for x in w]
        used = 1.0
    rest = sum(shares[i] for i in free)
    for i in free:
        w[i] = (1.0 - used) * shares[i] / rest if rest > 0 else (1.0 - used) / len(free)
    return w


def share_points(shares: Sequence[float], *, window_s: float) -> tuple[tuple[float, float], ...]:
    """Per-window shares → (time, share) change points (a share changes at its window's start)."""
    out: list[tuple[float, float]] = []
    for k, s in enumerate(shares):
        if not out or abs(out[-1][1] - float(s)) > 1e-9:
            out.append((k * window_s, float(s)))
    return tuple(out)


__all__ = ["MAX_STATES", "GroupPlan", "JointTooLargeError", "joint_groups", "plan_group", "router_weights",
           "share_points"]
