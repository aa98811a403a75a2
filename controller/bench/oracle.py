"""The hindsight oracle: the cheapest replica schedule per pool that meets the SLO, knowing the whole trace.

Also the demand model the static baseline is sized from. The oracle is the bench's
lower bound; it is not a policy anyone could run (it reads the future).

Demand. Each request of the workload is a unit of work on the pool(s) that serve
it, weighted by its estimated cost relative to the mix's mean
(`profile.request_work_s`: a 4,000-token prompt weighs about twice a 2,000-token
one), at its estimated send time: step 0 at its trace arrival, step k at
send(k − 1) + its estimated latency (p50 TTFT + (output − 1) × p50 TPOT at the
profiled capacity) + the think time. Demand in a window = Σ weights / window, in
"requests/s of the scenario's average mix", the unit the profiled capacity is in.
Route groups and traffic weights split it as the simulated router does.

Schedule (per pool, a dynamic programme over aligned windows of `window_s`, 60 s):
  need_k   = ceil(margin × demand_k / capacity_rps), at least max(min_replicas, 1),
             at most max_replicas (where the cap binds the SLO cannot be met);
  cost     = Σ_k m_k × window_s × price + starts × startup_cold_s × price
             + stops × drain_s × price, over m_k ≥ need_k, m_{-1} = the initial replicas;
  demand_k is the window's mean rate, or (burst window 20 s) the highest of its three
  20 s thirds, for traces whose load comes in sub-minute bursts; a scheduled fault adds
  the replicas it takes away to the need until their replacements are up
  (`fault_extra`: the oracle knows the scenario's faults as it knows its trace); the windows before a
  cold start-up ordered at t = 0 could serve only require what the initial replicas
  give. O(windows × replicas²) with numpy; ties go to fewer replicas.
Example: demand 3, 9, 3 req/s over three windows, 4 req/s per replica, cold start
300 s, window 60 s: need 1, 3, 1; dropping to 1 and starting 2 again would cost
2 × 300 s, keeping 3 costs 2 × 60 s, so the DP keeps 3 until the dip is longer than
five windows.

Replay: the schedule becomes a replica target over time; each added replica is
ordered `startup` + one tick before its window (warm start-up when a slot that a
replica left within the simulator's warm-node TTL is free, else cold), removals
happen at the window boundary (the simulator drains). A `SchedulePolicy` plays it
through the same Controller and simulator as every other policy (routing: the
scenario's router weights).

Search: one candidate schedule per (burst window 60 s / 20 s) × (margin 0.8 … 2.0);
a candidate planned at or above static peak provisioning's cost is replaced by the
static schedule itself. Sorted by planned cost, the nominal one (margin 1, per-minute
demand) is replayed first; if it meets the SLO the cheaper ones are bisected, else the
dearest (static) is replayed and, if that meets it, the ones in between are bisected.
Then the repair: the dearest DP schedule that missed below the cheapest that met (or, if
none met, the dearest DP schedule below static) gets replicas added in the windows where
its late requests were sent (`repair_schedule`), each ordered a start-up ahead, and is
replayed again, a bounded number of rounds (REPAIR_ROUNDS); a repaired schedule that meets
and is planned cheaper than the best so far wins. A schedule planned dearer than static is
kept only when static itself misses (then `dearer_than_static` says so).

The SLO the oracle must meet is the one the MPC is judged on (issue "The MPC planner":
≥ 99 % for critical and standard), measured as the bench table measures it, in *tasks*
(every step within its class's TTFT and TPOT SLO): `TASK_SLO_TARGETS`, critical 99 %,
standard 99 %, sheddable 95 % (the class meant to give way first). Only tasks that
started after the first cold start-up ordered at t = 0 could serve (max startup_cold_s +
one tick) are judged: before that the fleet is whatever the scenario starts with, under
any schedule (the shipped scenarios start at what their first minutes need, so this
leaves out little). The oracle is the cheapest replayed schedule that meets it, else the
one with the smallest worst-class shortfall, reported with slo_met = false.

Assumptions (why it is a near-lower bound, not an exact one): capacity is the
profiled per-replica rate at the tightest SLO on a 2-replica pool, taken as linear
in replicas (larger pools multiplex better: margins below 1 let the search find
that out); every start-up is charged as cold in the DP; demand inside a window is
uniform or its 20 s peak; the routing is the scenario's and fixed; only replica
counts are scheduled (no admission, batching or routing levers); the search is
over a finite candidate list with bisection, not every schedule; Poisson faults and
retries are not foreseen (scheduled faults are). Must not: read the
wall clock or write files.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from controller.bench.oracle_joint import JointTooLargeError, joint_groups, plan_group, share_points
from controller.bench.profile import PoolProfile, pool_model, request_work_s
from controller.bench.runner import Progress, RunResult, run_closed_loop
from controller.perf.catalogue import SKUS
from controller.policies.common import RoutingWeights
from controller.sim.fleet_lifecycle import WARM_NODE_TTL_S
from controller.sim.router import expected_pool_shares
from controller.sim.scenario import PoolSpecModel, Scenario
from controller.sim.workload import Workload
from controller.types import PRIORITY_CLASSES, PolicyInput, PolicyOutput, PoolDecision, Reason

WINDOW_S = 60.0
PEAK_WINDOW_S = 60.0  # static provisioning's sliding window for the peak rate
SLO_TARGET_FRAC = 0.95  # the per-request p95 criterion the capacity is profiled with (kept for callers)
# What the oracle must meet, per class, in *tasks* (every step within its TTFT and TPOT SLO), the
# bench table's measure: the bar the MPC is judged at (issue #6: ≥ 99 % for critical and standard);
# sheddable traffic is the first to give way, so 95 %.
TASK_SLO_TARGETS: Mapping[str, float] = MappingProxyType({"critical": 0.99, "standard": 0.99, "sheddable": 0.95})
REPAIR_ROUNDS = 6  # replays spent adding replicas where late requests happen
MARGINS: tuple[float, ...] = (0.8, 0.9, 1.0, 1.15, 1.3, 1.5, 1.75, 2.0)
# Demand per DP window: its mean (60 s), or the peak of its 20 s thirds for bursty traces.
BURST_WINDOWS_S: tuple[float, ...] = (60.0, 20.0)


# --------------------------------------------------------------------------- demand


@dataclass(frozen=True)
class PoolDemand:
    """Estimated send times (ascending) and weights (equivalent average-mix requests) of one pool's work."""

    pool: str
    send_s: np.ndarray
    weight: np.ndarray

    @property
    def total(self) -> float:
        return float(self.weight.sum())


def estimate_send_times(workload: Workload, e2e_s: np.ndarray) -> np.ndarray:
    """Send time per request: step 0 at its arrival, step k after step k − 1's estimated latency + think time."""
    send = np.array(workload.trace.arrival_s, dtype=np.float64)
    nxt = workload.next_step_index()
    step = workload.step
    if len(step) == 0:
        return send
    for s in range(int(step.max())):
        cur = np.flatnonzero((step == s) & (nxt >= 0))
        if len(cur) == 0:
            continue
        send[nxt[cur]] = send[cur] + e2e_s[cur] + workload.think_time_s
    return send


def pool_shares(scenario: Scenario, workload: Workload, *, full_share: bool = False) -> dict[str, np.ndarray]:
    """Per pool, the expected share (0..1) of each request it serves, as the router splits traffic
    (route groups, tier rules and traffic weights: controller/sim/router.py `expected_pool_shares`).

    `full_share`: as if each pool took every request of its group and hop that its tier rule lets
    it serve (the joint oracle's unit)."""
    return expected_pool_shares(scenario, workload, full_share=full_share)


def pool_demands(scenario: Scenario, workload: Workload, profiles: Mapping[str, PoolProfile],
                 work_s: Mapping[str, np.ndarray] | None = None, *, full_share: bool = False) -> dict[str, PoolDemand]:
    """Each pool's demand: estimated send times and cost-weighted shares of the workload's requests.

    A request weighs on a pool by that pool's work for it (its model and SKU), relative to the
    mix's mean; a prefill or decode pool counts only its own phase of the work (`request_work_s`
    part), so a mix moving to longer prompts raises the prefill pool's demand, not the decode
    pool's. `work_s` (whole-request work, per pool) is used for mixed pools only.
    `full_share`: every pool's demand as if it took all of its group's traffic (`pool_shares`)."""
    out_tokens = np.asarray(workload.trace.output_tokens, dtype=np.float64)
    ttft = float(np.mean([p.ttft_p50_at_capacity_s for p in profiles.values()]))
    tpot = float(np.mean([p.tpot_p50_at_capacity_s for p in profiles.values()]))
    send = estimate_send_times(workload, ttft + np.maximum(out_tokens - 1, 0) * tpot)
    order = np.argsort(send, kind="stable")
    shares = pool_shares(scenario, workload, full_share=full_share)
    out: dict[str, PoolDemand] = {}
    for spec in scenario.pools:
        w = work_s.get(spec.name) if work_s and spec.role == "mixed" else None
        if w is None:
            w = request_work_s(pool_model(spec), workload.trace.prompt_tokens, workload.trace.output_tokens,
                               max_num_batched_tokens=spec.engine.max_num_batched_tokens,
                               part="both" if spec.role == "mixed" else spec.role)
        mean = float(np.mean(w)) if len(w) else 0.0
        weight = (w / mean if mean > 0 else np.ones_like(w)) * shares[spec.name]
        out[spec.name] = PoolDemand(spec.name, send[order], weight[order])
    return out


def window_rates(d: PoolDemand, window_s: float, n_windows: int) -> np.ndarray:
    """Mean demand (equivalent req/s) in each aligned window [k × window_s, (k + 1) × window_s)."""
    k = np.minimum((d.send_s // window_s).astype(np.int64), n_windows - 1)
    return np.bincount(k, weights=d.weight, minlength=n_windows)[:n_windows] / window_s


def peak_rate(d: PoolDemand, window_s: float = PEAK_WINDOW_S) -> float:
    """Highest demand over any sliding window [t, t + window_s) (equivalent req/s).

    Example: weights 1 at t = 0, 10, 20, 70 s with a 60 s window → 3 / 60 = 0.05.
    """
    if len(d.send_s) == 0:
        return 0.0
    csum = np.concatenate([[0.0], np.cumsum(d.weight)])
    end = np.searchsorted(d.send_s, d.send_s + window_s, side="left")
    start = np.arange(len(d.send_s))
    return float(np.max(csum[end] - csum[start])) / window_s


def replica_floor(spec: PoolSpecModel) -> int:
    return min(max(spec.min_replicas, 1), spec.max_replicas)


def static_replicas(scenario: Scenario, demands: Mapping[str, PoolDemand], profiles: Mapping[str, PoolProfile],
                    window_s: float = PEAK_WINDOW_S) -> dict[str, int]:
    """Static peak provisioning: ceil(peak sliding-window demand / per-replica capacity), within the pool's bounds.

    Example: a 60 s peak of 17.2 req/s and 4.4 req/s per replica → ceil(3.9) = 4.
    """
    out = {}
    for spec in scenario.pools:
        need = math.ceil(peak_rate(demands[spec.name], window_s) / profiles[spec.name].capacity.rps - 1e-9)
        out[spec.name] = int(min(max(need, replica_floor(spec)), spec.max_replicas))
    return out


# --------------------------------------------------------------------------- the DP


def usd_per_replica_s(spec: PoolSpecModel) -> float:
    price = spec.usd_per_gpu_hour if spec.usd_per_gpu_hour is not None else SKUS[spec.sku].usd_per_gpu_hour
    return price * spec.tp / 3600.0


@dataclass(frozen=True)
class PoolPlan:
    pool: str
    replicas: tuple[int, ...]  # per window
    need: tuple[int, ...]  # the lower bound per window
    planned_cost_usd: float
    capped_windows: int  # windows whose need exceeded max_replicas
    shares: tuple[float, ...] = ()  # per window, the pool's share of its group (joint oracle); () = the scenario's
    weights: tuple[float, ...] = ()  # per window, the router weight that gives that share (tier rules)


def plan_cost(replicas: Sequence[int], initial: int, *, window_s: float, usd_per_s: float, startup_s: float,
              drain_s: float) -> float:
    """The DP's cost model for a given schedule (used to compare with static provisioning)."""
    m = np.asarray(replicas, dtype=np.float64)
    prev = np.concatenate([[float(initial)], m[:-1]])
    starts = np.maximum(m - prev, 0).sum()
    stops = np.maximum(prev - m, 0).sum()
    return float((m.sum() * window_s + starts * startup_s + stops * drain_s) * usd_per_s)


def fault_extra(scenario: Scenario, pool: str, n_windows: int, *, window_s: float, tick_s: float) -> np.ndarray:
    """Replicas the scheduled faults of `pool` take away, per window (the oracle knows them in advance).

    crash / preempt of `count` replicas at at_s: the fleet starts replacements at once (cold:
    the crash takes the node's copy of the weights), so `count` replicas are missing from at_s
    until startup_cold_s + one tick later. slow (×factor for duration_s): each hit replica
    serves 1/factor of its rate, ceil(count × (1 − 1/factor)) replicas' worth is missing.
    Poisson faults (rate_per_hour) are random draws and are not foreseen.
    Example: 3 replicas crash at 1,640 s, cold start 300 s, 60 s windows → +3 in windows 27–32.
    """
    spec = scenario.pool(pool)
    extra = np.zeros(n_windows, dtype=np.int64)
    for f in scenario.faults:
        if f.pool != pool or f.at_s is None:
            continue
        if f.kind in ("crash", "preempt"):
            lost, end = f.count, f.at_s + spec.startup_cold_s + tick_s
        else:
            lost, end = math.ceil(f.count * (1.0 - 1.0 / f.factor)), f.at_s + f.duration_s
        first = int(f.at_s // window_s)
        last = min(n_windows - 1, int(math.ceil(end / window_s)) - 1)
        if first <= last:
            extra[first:last + 1] += lost
    return extra


def plan_pool(spec: PoolSpecModel, rates_rps: np.ndarray, capacity_rps: float, *, margin: float = 1.0,
              window_s: float = WINDOW_S, drain_s: float = 5.0, extra: np.ndarray | None = None) -> PoolPlan:
    """The cheapest schedule (replicas per window) with m_k ≥ need_k under the cost model above.

    `extra` (per window) is added to the need: replicas a scheduled fault takes away.
    """
    if not (capacity_rps > 0 and math.isfinite(capacity_rps)):
        raise ValueError(f"pool {spec.name}: capacity must be a finite number > 0 (got {capacity_rps})")
    lo_floor, hi = replica_floor(spec), spec.max_replicas
    initial = spec.replicas
    raw = np.ceil(margin * np.asarray(rates_rps, dtype=np.float64) / capacity_rps - 1e-9).astype(np.int64)
    if extra is not None:
        raw = raw + np.asarray(extra, dtype=np.int64)
    need = np.clip(np.maximum(raw, lo_floor), lo_floor, hi)
    capped = int(np.sum(raw > hi))
    # Windows that end before a cold start-up ordered at t = 0 could serve: only what is there already.
    early = int(math.ceil(spec.startup_cold_s / window_s))
    need[:early] = np.minimum(need[:early], max(initial, lo_floor))
    usd_s = usd_per_replica_s(spec)
    states = np.arange(hi + 1)
    up = np.maximum(states[None, :] - states[:, None], 0) * spec.startup_cold_s  # [prev, next]
    down = np.maximum(states[:, None] - states[None, :], 0) * drain_s
    trans = (up + down) * usd_s
    cost = np.full(hi + 1, np.inf)
    cost[min(initial, hi)] = 0.0
    back = np.zeros((len(need), hi + 1), dtype=np.int64)
    for k, n in enumerate(need):
        total = cost[:, None] + trans  # [prev, next]
        best_prev = np.argmin(total, axis=0)  # first index on ties: fewer replicas before
        new = total[best_prev, states] + states * window_s * usd_s
        new[: int(n)] = np.inf
        back[k] = best_prev
        cost = new
    m = np.empty(len(need), dtype=np.int64)
    last = int(np.argmin(cost))
    total_cost = float(cost[last])
    for k in range(len(need) - 1, -1, -1):
        m[k] = last
        last = int(back[k, last])
    return PoolPlan(spec.name, tuple(int(x) for x in m), tuple(int(x) for x in need), total_cost, capped)


# --------------------------------------------------------------------------- schedule → targets over time


def schedule_targets(spec: PoolSpecModel, replicas: Sequence[int], *, window_s: float,
                     tick_s: float) -> tuple[tuple[float, int], ...]:
    """Turn replicas-per-window into (time, target) change points, ordering each new replica early enough.

    A replica added at boundary k (time k × window_s) is ordered startup + tick_s before it:
    warm start-up if a slot a replica left within the warm-node TTL is free then, else cold.
    """
    m = [int(x) for x in replicas]
    starts: list[tuple[float, float]] = []  # (order time, boundary)
    warm_slots: list[tuple[float, float]] = []  # (vacated at, warm until)
    prev = spec.replicas
    for k, n in enumerate(m):
        t_k = k * window_s
        if n < prev:
            warm_slots.extend([(t_k, t_k + WARM_NODE_TTL_S)] * (prev - n))
        elif n > prev:
            for _ in range(n - prev):
                t_warm = t_k - spec.startup_warm_s - tick_s
                slot = next((s for s in warm_slots if s[0] <= t_warm <= s[1]), None)
                if slot is not None:
                    warm_slots.remove(slot)
                    starts.append((max(0.0, t_warm), t_k))
                else:
                    starts.append((max(0.0, t_k - spec.startup_cold_s - tick_s), t_k))
        prev = n
    points = sorted({0.0, *(k * window_s for k in range(len(m))), *(s for s, _ in starts)})
    out: list[tuple[float, int]] = []
    for t in points:
        k = min(int(t // window_s), len(m) - 1)
        target = m[k] + sum(1 for s, b in starts if s <= t < b)
        if not out or out[-1][1] != target:
            out.append((float(t), int(target)))
    return tuple(out)


def schedule_routing(scenario: Scenario) -> dict[str, RoutingWeights]:
    """The router weights a replayed schedule runs with: the scenario's own, for every pool."""
    return {p.name: RoutingWeights(scenario.router.prefix_weight, scenario.router.queue_weight,
                                   scenario.router.kv_weight) for p in scenario.pools}


def slo_check_from_s(scenario: Scenario, tick_s: float) -> float:
    """From when tasks are held against a schedule: before the first cold start-up ordered at t = 0
    could serve, the fleet is what the scenario starts with, whatever the schedule. The shipped
    scenarios start at the replicas their first minutes need, so this excludes little."""
    return max(p.startup_cold_s for p in scenario.pools) + tick_s


class SchedulePolicy:
    """Follows a precomputed replica schedule per pool (the oracle's replay). Pure; state is None.
    Its replays run without the cascading-failure breaker (`breaker=None`): the schedule is the yardstick,
    replayed as found."""

    name = "oracle"

    def __init__(self, targets: Mapping[str, Sequence[tuple[float, int]]],
                 routing: Mapping[str, RoutingWeights],
                 weights: Mapping[str, Sequence[tuple[float, float]]] | None = None) -> None:
        self.targets = {p: tuple((float(t), int(n)) for t, n in pts) for p, pts in targets.items()}
        self.routing = dict(routing)
        # (time, traffic weight) change points per pool (the joint oracle's split); absent: the scenario's
        self.weights = {p: tuple((float(t), float(w)) for t, w in pts) for p, pts in (weights or {}).items()}

    def initial_state(self) -> None:
        return None

    def target_at(self, pool: str, now_s: float) -> int:
        pts = self.targets[pool]
        times = [t for t, _ in pts]
        i = int(np.searchsorted(times, now_s, side="right")) - 1
        return pts[max(i, 0)][1]

    def weight_at(self, pool: str, now_s: float, default: float) -> float:
        pts = self.weights.get(pool)
        if not pts:
            return default
        i = int(np.searchsorted([t for t, _ in pts], now_s, side="right")) - 1
        return pts[max(i, 0)][1]

    def decide(self, state: None, inp: PolicyInput, rng: np.random.Generator) -> tuple[None, PolicyOutput]:
        pools = {}
        reasons = []
        for spec in inp.fleet.pools:
            if spec.name not in self.targets:
                continue
            n = self.target_at(spec.name, inp.now_s)
            r = self.routing[spec.name]
            pools[spec.name] = PoolDecision(replicas=n, prefix_weight=r.prefix_weight, queue_weight=r.queue_weight,
                                            kv_weight=r.kv_weight,
                                            traffic_weight=self.weight_at(spec.name, inp.now_s, 1.0))
            reasons.append(Reason("oracle_schedule", f"hindsight schedule: {n} replicas", pool=spec.name,
                                  data={"replicas": n}))
        return state, PolicyOutput(pools=pools, reasons=tuple(reasons), diagnostics={"policy": "oracle"})


# --------------------------------------------------------------------------- search + replay


@dataclass(frozen=True)
class Candidate:
    planned_cost_usd: float
    margin: float
    burst_window_s: float
    fallback_static: bool
    plans: Mapping[str, PoolPlan]
    repaired: int = 0  # repair rounds applied to the DP schedule


@dataclass(frozen=True)
class OracleResult:
    run: RunResult
    candidate: Candidate
    slo_met: bool
    static_planned_cost_usd: float
    tried: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)  # per replay: margin, attainment, cost

    @property
    def margin(self) -> float:
        return self.candidate.margin

    @property
    def plans(self) -> Mapping[str, PoolPlan]:
        return self.candidate.plans


def request_slo_ok(run: RunResult, target: float = SLO_TARGET_FRAC) -> tuple[bool, float]:
    """(every class ≥ target, the worst class's figure), over the requests the oracle is judged on."""
    att = run.extra.get("request_slo_attainment_checked", run.request_slo_attainment)
    vals = [v for v in att.values() if v is not None and math.isfinite(v)]
    worst = min(vals) if vals else 0.0
    return worst >= target, worst


def task_slo_ok(run: RunResult, targets: Mapping[str, float] = TASK_SLO_TARGETS) -> tuple[bool, float]:
    """(every class meets its task target, the worst shortfall: min over classes of attainment − target).

    Over the tasks the oracle is judged on (started after `slo_check_from_s`). Example: critical
    99.4 %, standard 98.7 %, sheddable 97 % against 99 / 99 / 95 → (False, −0.003).
    """
    att = run.extra.get("task_slo_attainment_checked") or run.summary.get("slo_attainment", {})
    gaps = [float(att[c]) - tgt for c, tgt in targets.items()
            if att.get(c) is not None and math.isfinite(float(att[c]))]
    worst = min(gaps) if gaps else -1.0
    return worst >= -1e-12, worst


def repair_schedule(scenario: Scenario, replicas: Mapping[str, Sequence[int]], run: RunResult, *,
                    window_s: float, targets: Mapping[str, float] = TASK_SLO_TARGETS) -> dict[str, tuple[int, ...]]:
    """Add replicas in the windows where the replay's late requests were sent.

    Only classes that miss their target count, and only the windows with the most late
    requests that together hold twice the misses to put right (a class at 98.5 % against
    99 % must lose a third of its misses). Window k with b_k late out of s_k sent requests
    gets + max(1, ceil(m_k × b_k / s_k)) replicas (within max_replicas), and so does the window
    before it when b_k is at least 5 % of s_k (its queue started building there). Each pool of
    the scenario gets the same treatment (the late request's pool is not recorded; one pool in
    every shipped scenario but the demo). `schedule_targets` then orders each added replica a
    start-up ahead of its window. Example: 6 replicas, 40 late of 400 sent in window 14 →
    7 in window 13 (10 % ≥ 5 %) and 7 in window 14.
    """
    att = run.extra.get("task_slo_attainment_checked") or {}
    missing = [k for k, c in enumerate(PRIORITY_CLASSES)
               if c in targets and att.get(c) is not None and float(att[c]) < targets[c]]
    late = run.extra.get("late_requests")
    out = {n: tuple(int(x) for x in r) for n, r in replicas.items()}
    if late is None or not missing:
        return out
    mask = np.isin(late["late_prio"], missing)
    n_windows = len(next(iter(out.values())))
    if n_windows == 0:
        return out
    late_k = np.minimum((late["late_sent_s"][mask] // window_s).astype(np.int64), n_windows - 1)
    bad = np.bincount(late_k, minlength=n_windows)[:n_windows]
    # Late requests to put right: a class at 98.5 % against 99 % must lose a third of its misses.
    # Cover twice that, busiest windows first (the others are often noise spread thinly).
    need = 0.0
    for k in missing:
        c = PRIORITY_CLASSES[k]
        a = float(att[c])
        need += float(np.sum(late["late_prio"][mask] == k)) * min(1.0, (targets[c] - a) / max(1.0 - a, 1e-9))
    order = np.argsort(-bad, kind="stable")
    covered = np.cumsum(bad[order])
    n_pick = int(np.searchsorted(covered, min(2.0 * need, float(covered[-1])) - 1e-9)) + 1
    chosen = np.zeros(n_windows, dtype=bool)
    chosen[order[:n_pick]] = True
    bad = np.where(chosen, bad, 0)
    sent = np.bincount(np.minimum((late["sent_s"] // window_s).astype(np.int64), n_windows - 1),
                       minlength=n_windows)[:n_windows]
    frac = np.where(sent > 0, bad / np.maximum(sent, 1), 0.0)
    for name, reps in out.items():
        spec = scenario.pool(name)
        m = np.asarray(reps, dtype=np.int64)
        add = np.zeros(n_windows, dtype=np.int64)
        for w in np.flatnonzero(bad > 0):
            inc = max(1, int(math.ceil(m[w] * frac[w])))
            add[w] = max(add[w], inc)
            if w > 0 and frac[w] >= 0.05:
                add[w - 1] = max(add[w - 1], inc)
        out[name] = tuple(int(x) for x in np.minimum(m + add, spec.max_replicas))
    return out


def burst_rates(d: PoolDemand, window_s: float, burst_window_s: float, n_windows: int) -> np.ndarray:
    """Per DP window, the highest rate of its aligned sub-windows of `burst_window_s` (= the mean when equal).

    Example: 60 s windows, 20 s sub-windows at 30, 6 and 3 req/s → 30 (the mean would be 13).
    """
    sub = max(1, int(round(window_s / burst_window_s)))
    return window_rates(d, window_s / sub, n_windows * sub).reshape(n_windows, sub).max(axis=1)


def plan_all(scenario: Scenario, demands: Mapping[str, PoolDemand], profiles: Mapping[str, PoolProfile], *,
             margin: float, window_s: float, n_windows: int, burst_window_s: float | None = None,
             tick_s: float = 15.0, full_demands: Mapping[str, PoolDemand] | None = None,
             all_demands: Mapping[str, PoolDemand] | None = None) -> dict[str, PoolPlan]:
    """Every pool's schedule at `margin`. With `full_demands` (each pool's demand at share 1: every
    request its tier rule lets it serve), the first-hop pools of a route group with two or more of
    them are planned jointly with their split (controller/bench/oracle_joint.py); `all_demands`
    (the same without the tier rule; default: `full_demands`) gives each window's eligible share.
    A group too large for the joint grid keeps the scenario's split."""
    plans: dict[str, PoolPlan] = {}
    if full_demands is not None:
        for group in joint_groups(scenario):
            units, extras, prices, drains, eligible = [], [], [], [], []
            for spec in group:
                prof = profiles[spec.name]
                bw = burst_window_s or window_s
                rates = burst_rates((all_demands or full_demands)[spec.name], window_s, bw, n_windows)
                mine = burst_rates(full_demands[spec.name], window_s, bw, n_windows)
                eligible.append(np.where(rates > 0, np.minimum(mine / np.maximum(rates, 1e-300), 1.0), 1.0))
                units.append(margin * rates / prof.capacity.rps)
                extras.append(fault_extra(scenario, spec.name, n_windows, window_s=window_s, tick_s=tick_s))
                prices.append(usd_per_replica_s(spec))
                drains.append(drain_estimate_s(prof))
            try:
                gp = plan_group(group, units, usd_per_s=prices, drain_s=drains, window_s=window_s, extra=extras,
                                eligible=eligible)
            except JointTooLargeError:
                continue
            for spec in group:
                reps = gp.replicas[spec.name]
                need = tuple(int(x) for x in np.ceil(np.asarray(units[group.index(spec)])
                                                     * np.asarray(gp.shares[spec.name]) - 1e-9))
                plans[spec.name] = PoolPlan(spec.name, reps, need, plan_cost(
                    reps, spec.replicas, window_s=window_s, usd_per_s=usd_per_replica_s(spec),
                    startup_s=spec.startup_cold_s, drain_s=drain_estimate_s(profiles[spec.name])),
                    gp.capped_windows, gp.shares[spec.name], gp.weights[spec.name])
    for spec in scenario.pools:
        if spec.name in plans:
            continue
        prof = profiles[spec.name]
        rates = burst_rates(demands[spec.name], window_s, burst_window_s or window_s, n_windows)
        extra = fault_extra(scenario, spec.name, n_windows, window_s=window_s, tick_s=tick_s)
        plans[spec.name] = plan_pool(spec, rates, prof.capacity.rps, margin=margin, window_s=window_s,
                                     drain_s=drain_estimate_s(prof), extra=extra)
    return plans


def drain_estimate_s(prof: PoolProfile) -> float:
    """How long a removed replica keeps serving: one mean request at the profiled capacity."""
    return prof.ttft_p50_at_capacity_s + prof.mean_output_tokens * prof.tpot_p50_at_capacity_s


def candidates(scenario: Scenario, demands: Mapping[str, PoolDemand], profiles: Mapping[str, PoolProfile], *,
               window_s: float, n_windows: int, margins: Sequence[float], burst_windows_s: Sequence[float],
               static: Mapping[str, int], static_cost: float, tick_s: float = 15.0,
               full_demands: Mapping[str, PoolDemand] | None = None,
               all_demands: Mapping[str, PoolDemand] | None = None) -> list[Candidate]:
    """Every (burst window, margin) schedule, cheapest planned first; none planned dearer than static."""
    out: list[Candidate] = []
    seen: set[tuple] = set()
    static_plans = None
    for bw in burst_windows_s:
        for m in margins:
            plans = plan_all(scenario, demands, profiles, margin=m, window_s=window_s, n_windows=n_windows,
                             burst_window_s=bw, tick_s=tick_s, full_demands=full_demands, all_demands=all_demands)
            planned = sum(p.planned_cost_usd for p in plans.values())
            if planned >= static_cost:
                if static_plans is None:
                    static_plans = {n: PoolPlan(n, (static[n],) * n_windows, p.need, static_cost, p.capped_windows)
                                    for n, p in plans.items()}
                    out.append(Candidate(static_cost, m, bw, True, static_plans))
                continue
            key = tuple((p.replicas, p.shares) for p in plans.values())
            if key in seen:
                continue
            seen.add(key)
            out.append(Candidate(planned, m, bw, False, plans))
    if static_plans is None:  # every schedule is cheaper than static: static is still the last resort
        plans = {s.name: PoolPlan(s.name, (static[s.name],) * n_windows, (), static_cost, 0) for s in scenario.pools}
        out.append(Candidate(static_cost, max(margins), min(burst_windows_s), True, plans))
    out.sort(key=lambda c: (c.planned_cost_usd, c.fallback_static, c.margin, -c.burst_window_s))
    return out


def run_oracle(scenario: Scenario, *, workload: Workload, profiles: Mapping[str, PoolProfile],
               demands: Mapping[str, PoolDemand], seed: int, tick_s: float = 15.0, window_s: float = WINDOW_S,
               margins: Sequence[float] = MARGINS, burst_windows_s: Sequence[float] = BURST_WINDOWS_S,
               targets: Mapping[str, float] = TASK_SLO_TARGETS, max_replays: int | None = None,
               repair_rounds: int = REPAIR_ROUNDS, static: Mapping[str, int] | None = None,
               progress: Callable[[str], Progress | None] | None = None,
               full_demands: Mapping[str, PoolDemand] | None = None,
               all_demands: Mapping[str, PoolDemand] | None = None, label: str = "oracle") -> OracleResult:
    """Plan candidate schedules, replay, repair and bisect; return the cheapest replayed schedule that meets the SLO.

    1. Bisect the DP candidates (sorted by planned cost) on "meets the task targets": the
       nominal one (margin 1, per-minute demand) first; if it meets, bisect the cheaper ones;
       else replay the dearest (static provisioning) and bisect between (attainment grows with
       capacity, nearly monotonically).
    2. Repair: from the dearest DP candidate seen to miss below the cheapest that meets (if
       none meets, the dearest DP candidate below static's cost), add replicas where the replay's
       late requests were sent (`repair_schedule`) and replay, up to `repair_rounds` times; a repaired schedule that
       meets and is planned cheaper than the best so far replaces it.
    3. Never dearer than static: a schedule planned at or above static's cost is not kept if the
       static schedule meets the targets (static is then the oracle).
    `static` is the static provisioning to compare with (default: `static_replicas`, the
    profiled peak size; the bench passes the size it verified by replay).
    `max_replays` bounds the bisection's replays (repairs have their own bound). If nothing
    meets, the schedule with the smallest worst-class shortfall is returned with slo_met = false.
    `full_demands` (`pool_demands(..., full_share=True)`) makes it the joint oracle: the split of
    each multi-pool route group is scheduled with the replicas (`plan_all`; `all_demands`, the same
    without tier rules, bounds each pool's share by what its rule lets in) and replayed as traffic
    weights; `label` names the replays ("oracle-joint").
    """
    if max_replays is not None and max_replays < 1:
        raise ValueError(f"max_replays must be >= 1 (got {max_replays})")
    if repair_rounds < 0:
        raise ValueError(f"repair_rounds must be >= 0 (got {repair_rounds})")
    last_send = max((float(d.send_s[-1]) for d in demands.values() if len(d.send_s)), default=0.0)
    n_windows = int(last_send // window_s) + 2  # the last window with traffic, plus one to drain
    static = dict(static) if static is not None else static_replicas(scenario, demands, profiles)

    def pool_planned(name: str, reps: Sequence[int]) -> float:
        s = scenario.pool(name)
        return plan_cost(list(reps), s.replicas, window_s=window_s, usd_per_s=usd_per_replica_s(s),
                         startup_s=s.startup_cold_s, drain_s=drain_estimate_s(profiles[name]))

    def planned(reps: Mapping[str, Sequence[int]]) -> float:
        return sum(pool_planned(s.name, reps[s.name]) for s in scenario.pools)

    static_cost = planned({s.name: [static[s.name]] * n_windows for s in scenario.pools})
    cands = candidates(scenario, demands, profiles, window_s=window_s, n_windows=n_windows, margins=margins,
                       burst_windows_s=burst_windows_s, static=static, static_cost=static_cost, tick_s=tick_s,
                       full_demands=full_demands, all_demands=all_demands)
    routing = schedule_routing(scenario)
    check_from_s = slo_check_from_s(scenario, tick_s)
    tried: list[dict[str, Any]] = []
    run_label = label

    def play(c: Candidate, what: str) -> tuple[bool, float, RunResult]:
        targets_t = {n: schedule_targets(scenario.pool(n), p.replicas, window_s=window_s, tick_s=tick_s)
                     for n, p in c.plans.items()}
        weights = {n: share_points(p.weights or p.shares, window_s=window_s) for n, p in c.plans.items() if p.shares}
        policy = SchedulePolicy(targets_t, routing, weights)
        policy.name = run_label
        run = run_closed_loop(scenario, policy, seed=seed, tick_s=tick_s, breaker=None,
                              workload=workload, label=run_label, slo_check_from_s=check_from_s,
                              progress=progress(what) if progress else None)
        ok, worst = task_slo_ok(run, targets)
        tried.append({"label": what, "margin": c.margin, "burst_window_s": c.burst_window_s,
                      "fallback_static": c.fallback_static, "repaired": c.repaired,
                      "planned_cost_usd": c.planned_cost_usd, "cost_usd": run.summary.get("cost_usd"),
                      "task_slo_attainment": dict(run.extra.get("task_slo_attainment_checked") or {}),
                      "worst_class_shortfall": worst, "slo_met": ok})
        return ok, worst, run

    results: dict[int, tuple[bool, float, RunResult]] = {}

    def replay(i: int) -> bool:
        if i not in results:
            c = cands[i]
            what = f"{run_label} static" if c.fallback_static else f"{run_label} ×{c.margin:g}/{c.burst_window_s:g}s"
            results[i] = play(c, what)
        return results[i][0]

    budget = max_replays if max_replays is not None else len(cands)
    start = next((i for i, c in enumerate(cands) if c.margin == 1.0 and c.burst_window_s == window_s
                  and not c.fallback_static), 0)
    lo, hi = -1, None  # invariant: lo misses (or is -1), hi meets
    if replay(start):
        hi = start
    else:
        lo = start
        last = len(cands) - 1
        if last > start and len(results) < budget and replay(last):
            hi = last
    while hi is not None and hi - lo > 1 and len(results) < budget:
        mid = (lo + hi) // 2
        if replay(mid):
            hi = mid
        else:
            lo = mid
    # (candidate, ok, worst, run) of everything replayed so far
    played: list[tuple[Candidate, bool, float, RunResult]] = [(cands[i], *results[i]) for i in sorted(results)]

    def best_meeting() -> tuple[Candidate, bool, float, RunResult] | None:
        ok = [x for x in played if x[1]]
        return min(ok, key=lambda x: (x[0].planned_cost_usd, x[0].fallback_static)) if ok else None

    # Repair: start from the dearest schedule that misses yet is planned cheaper than the best that
    # meets; when nothing meets (static misses too), from the dearest DP schedule below static's
    # cost (it follows the load, so repairing it stays cheaper than repairing static).
    best = best_meeting()
    if best is None:
        dp = [i for i, c in enumerate(cands) if not c.fallback_static]
        if dp and dp[-1] not in results:
            replay(dp[-1])
            played.append((cands[dp[-1]], *results[dp[-1]]))
        best = best_meeting()
    missing = [x for x in played if not x[1] and not x[0].fallback_static
               and (best is None or x[0].planned_cost_usd < best[0].planned_cost_usd)]
    if missing:
        base = max(missing, key=lambda x: x[0].planned_cost_usd)
        cur_c, cur_run = base[0], base[3]
        for r in range(repair_rounds):
            reps = repair_schedule(scenario, {n: p.replicas for n, p in cur_c.plans.items()}, cur_run,
                                   window_s=window_s, targets=targets)
            if all(reps[n] == p.replicas for n, p in cur_c.plans.items()):
                break  # nothing to add (at max_replicas everywhere it is late)
            cost = planned(reps)
            best = best_meeting()
            if best is not None and cost >= best[0].planned_cost_usd:
                break  # dearer than a schedule known to meet: stop
            plans = {n: replace(p, replicas=reps[n], planned_cost_usd=pool_planned(n, reps[n]))
                     for n, p in cur_c.plans.items()}
            cur_c = replace(cur_c, planned_cost_usd=cost, plans=plans, repaired=r + 1)
            ok, worst, cur_run = play(cur_c, f"{run_label} repair {r + 1}")
            played.append((cur_c, ok, worst, cur_run))
            if ok:
                break
    best = best_meeting()
    if best is not None and best[0].planned_cost_usd >= static_cost and not best[0].fallback_static:
        stat = next((x for x in played if x[0].fallback_static and x[1]), None)
        if stat is not None:
            best = stat
    if best is None:
        best = max(played, key=lambda x: (x[2], -x[0].planned_cost_usd))
    c, ok, worst, run = best
    extra = {k: v for k, v in run.extra.items() if k != "late_requests"}
    extra.update({"margin": c.margin, "burst_window_s": c.burst_window_s, "slo_met": ok, "repaired": c.repaired,
                  "worst_class_shortfall": worst, "slo_targets": dict(targets), "fallback_static": c.fallback_static,
                  "planned_cost_usd": c.planned_cost_usd, "static_planned_cost_usd": static_cost,
                  "dearer_than_static": c.planned_cost_usd > static_cost + 1e-9, "window_s": window_s,
                  "candidates": len(cands), "replays": len(tried), "tried": tried,
                  "schedule": {n: list(p.replicas) for n, p in c.plans.items()},
                  "split": {n: [round(float(x), 4) for x in p.shares] for n, p in c.plans.items() if p.shares},
                  "capped_windows": {n: p.capped_windows for n, p in c.plans.items()}})
    return OracleResult(run=replace(run, extra=extra), candidate=c, slo_met=ok, static_planned_cost_usd=static_cost,
                        tried=tuple(tried))
