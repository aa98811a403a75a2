"""What the MPC policy estimates for itself, tick by tick, from telemetry and its own memory.

All of it lives in the frozen `MpcState` the policy carries (never in the policy object):

- the fleet's demand history (router arrivals minus client retries, per class) for the
  forecaster, and the class mix (`update_history`);
- per pool (`MpcPoolMemory`, brought up to date by `account`): when each starting replica should
  be ready (from the targets actually applied: warm while a slot kept its weights — a drained
  replica's slot stays warm `warm_node_ttl_s` — else cold; replacements the fleet starts after a
  crash are taken as cold and counted as `unordered`, what the breaker reads as lost), the warm
  slots, the prompt/output mix, and the traffic's reuse (`reuse`: what an infinite cache would
  hit, and the working set the observed hit implies);
- whether the fleet carries the load it admits (`carried`, for the breaker).

It is the policy's and not the core's (controller/core/estimate.py) because it depends on the
policy's parameters and on the levers it pulled (a batch-cap change sets off a rolling restart
whose surge replicas are not losses). The correction factors are in corrections.py.

Must not: do I/O or read a clock; decide anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from controller.core.coupling import router_affinity
from controller.core.mpc import Plan
from controller.core.mpc_model import PlanModel, QueueingPrior
from controller.policies.common import current_target, value
from controller.policies.mpc.forecasting import Scoreboard
from controller.types import FleetObservation, FleetSpec, PolicyInput, PoolDecision, PoolObservation, PoolSpec

HISTORY_KEEP_S = 1800.0
# a rolling restart's next surge replica starts when the previous one is ready; this long past a
# cold start-up without one, the restart is taken as over
ROLLOUT_GAP_S = 120.0


@dataclass(frozen=True)
class MpcPoolMemory:
    etas: tuple[float, ...] = ()  # absolute times the starting replicas should be ready
    warm: tuple[float, ...] = ()  # times replicas were drained (their slots stay warm for a while)
    serving: int | None = None  # ready + starting after the last accounting
    target: int | None = None  # target in force at the last accounting
    log_k_ttft: float = 0.0
    log_k_tpot: float = 0.0
    err: float = 0.7  # EWMA of |log(observed / predicted)| with corrections (0.7 ≈ a factor of 2)
    burst: float = 0.0  # burst length, s (learned from p95 TPOT above what smooth arrivals explain)
    samples: int = 0
    inf_hit: float = 0.0
    prompt_tokens: float | None = None
    output_tokens: float | None = None
    recs: tuple[tuple[float, int], ...] = ()  # (t, desired replicas) for scale-down stabilisation
    caps: tuple[int, int] | None = None  # engine (max_num_seqs, max_num_batched_tokens) in force
    caps_changed_s: float = -math.inf
    unordered: int = 0  # replicas the fleet started this tick that nobody ordered (crash replacements)
    # old-cap replicas still to be replaced by the rolling restart a batch-cap change set off: the
    # fleet starts their surge replicas itself (one at a time, warm), and those are not losses
    rollout_left: int = 0
    rollout_seen_s: float = -math.inf  # the caps change or the latest surge replica seen


@dataclass(frozen=True)
class MpcState:
    t_hist: tuple[float, ...] = ()
    demand_hist: tuple[float, ...] = ()
    class_share: Mapping[str, float] = field(default_factory=dict)
    pools: Mapping[str, MpcPoolMemory] = field(default_factory=dict)
    plan: Plan | None = None
    plan_at_s: float | None = None
    last_s: float | None = None
    first_s: float | None = None
    shed_in_force: Mapping[str, float] = field(default_factory=dict)
    need_now: Mapping[str, int] = field(default_factory=dict)  # replicas the last plan's first step needed
    waiting: Mapping[str, float] = field(default_factory=dict)  # engine queue per pool last tick (feedback.py)
    forecast_board: Scoreboard = field(default_factory=Scoreboard)  # the forecasters' online scores


def ewma(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new


def standing_queue(waiting: float | None, ready: float) -> bool:
    """More than one request waiting per ready replica in the engines: a backlog, not arrivals. vLLM
    queues only what it cannot schedule, so at most one per replica is the step in between."""
    return (waiting or 0.0) > ready


def demand(obs: FleetObservation) -> tuple[float | None, dict[str, float]]:
    """Fleet demand (req/s, retries excluded) and the class mix; pool arrivals if the router is silent."""
    per: dict[str, float] = {}
    for c, co in obs.classes.items():
        a = value(co.arrival_rps)
        if a is None:
            continue
        # arrivals count every attempt; a shed request comes back as retries. What was
        # admitted is a floor (an admitted retry counts once there).
        per[c] = max(a - (value(co.retry_rps) or 0.0), value(co.admitted_rps) or 0.0, 0.0)
    total = sum(per.values())
    if per and total > 0:
        return total, {c: v / total for c, v in per.items()}
    if per:
        return 0.0, {}
    read = [value(p.arrival_rps) for p in obs.pools.values()]
    served = [s for s in read if s is not None]
    if served:
        return float(sum(served)), {}
    return None, {}


def update_history(state: MpcState, obs: FleetObservation, fleet: FleetSpec, now: float,
                   warmup_s: float) -> tuple[tuple[float, ...], tuple[float, ...], float, bool, dict[str, float]]:
    """The demand history and class mix with this tick's reading: (times, demand, first tick, still
    warming, class shares)."""
    demand_now, shares = demand(obs)
    t_hist, d_hist = state.t_hist, state.demand_hist
    first_s = state.first_s if state.first_s is not None else now
    # While warming the telemetry windows cover only the time since the first tick, so a reading
    # may read low: the history holds one reading, the highest so far (so a surge in the first
    # minute reaches the forecast), and starts for real once warm.
    warming = now - first_s < warmup_s
    if demand_now is not None and (not warming or not t_hist or demand_now > d_hist[-1]):
        keep = [(t, d) for t, d in zip(t_hist, d_hist, strict=True) if now - t < HISTORY_KEEP_S and t < now]
        if warming:
            keep = []
        t_hist = tuple(t for t, _ in keep) + (now,)
        d_hist = tuple(d for _, d in keep) + (demand_now,)
    class_share = dict(state.class_share)
    for c, s in shares.items():
        class_share[c] = ewma(class_share.get(c), s, 0.3)
    if not class_share:
        class_share = {c: 1.0 / len(fleet.slos) for c in fleet.slos} if fleet.slos else {"standard": 1.0}
    return t_hist, d_hist, first_s, warming, class_share


def account(m: MpcPoolMemory, spec: PoolSpec, po: PoolObservation | None, target: int, now: float,
            last_s: float | None, *, warm_ttl_s: float, step_s: float) -> MpcPoolMemory:
    """Bring the starting-replica ETAs and warm slots up to date with the target in force and telemetry."""
    ttl = warm_ttl_s
    warm = [t for t in m.warm if now - t < ttl]
    etas = sorted(m.etas)
    unordered = 0
    t_order = last_s if last_s is not None else now
    ready = value(po.replicas_ready) if po is not None else None
    starting = value(po.replicas_starting) if po is not None else None
    serving = m.serving
    if serving is None:
        serving = int(round((ready or 0) + (starting or 0))) if ready is not None else target
    if m.target is not None and target != m.target:
        if target > serving:  # replicas we ordered last tick: warm while warm slots last
            for _ in range(target - serving):
                if warm:
                    warm.pop()
                    etas.append(t_order + spec.startup_warm_s)
                else:
                    etas.append(t_order + spec.startup_cold_s)
        elif target < serving:  # starting ones are cancelled first (latest first), then ready ones drain
            cut = serving - target
            while cut and etas:
                etas.pop()
                cut -= 1
            warm.extend([t_order] * cut)
    rollout_left, rollout_seen_s = m.rollout_left, m.rollout_seen_s
    if ready is not None:  # scale-downs drain old-cap replicas first: never more left than serve
        rollout_left = min(rollout_left, int(round(ready)))
    if rollout_left and now - rollout_seen_s > spec.startup_cold_s + ROLLOUT_GAP_S:
        # no surge for longer than a start-up takes: the restart is over or never happened (the
        # decision was not applied: shadow mode, a freeze); later starts are crash replacements
        rollout_left = 0
    if starting is not None:
        n = int(round(starting))
        etas.sort()
        while len(etas) > n:  # the earliest became ready
            etas.pop(0)
        while len(etas) < n:
            if rollout_left > 0:
                # the rolling restart's surge replica (maxSurge 1): new caps, weights on the node.
                # Not a crash replacement: one surge among 3 replicas would read to the breaker
                # as a 33 % loss.
                etas.append(now + spec.startup_warm_s)
                rollout_left -= 1
                rollout_seen_s = now
            else:  # started by the fleet itself (a crash replacement): cold
                etas.append(now + spec.startup_cold_s)
                unordered += 1
    fixed = []
    for e in etas:
        if e <= now:  # overdue: it was a cold start after all
            e2 = e - spec.startup_warm_s + spec.startup_cold_s
            fixed.append(e2 if e2 > now else now + 0.5 * step_s)
        else:
            fixed.append(e)
    etas = sorted(fixed)
    serving_now = int(round(ready)) + len(etas) if ready is not None else target
    # the traffic mix (EWMA of windowed token rates per request)
    prompt, out = m.prompt_tokens, m.output_tokens
    if po is not None:
        arr, ptok, gtok = value(po.arrival_rps), value(po.prompt_tokens_rps), value(po.generation_tokens_rps)
        if arr is not None and arr > 0.05:
            if ptok is not None and ptok > 0:
                prompt = ewma(prompt, ptok / arr, 0.3)
            if gtok is not None and gtok > 0:
                out = ewma(out, max(gtok / arr, 1.0), 0.3)
    return replace(m, etas=tuple(etas), warm=tuple(warm[-64:]), serving=serving_now, target=target,
                   prompt_tokens=prompt, output_tokens=out, unordered=unordered if m.serving is not None else 0,
                   rollout_left=rollout_left, rollout_seen_s=rollout_seen_s)


def accounted(state: MpcState, inp: PolicyInput, prior: QueueingPrior, *, warm_ttl_s: float,
              step_s: float) -> tuple[dict[str, MpcPoolMemory], dict[str, int]]:
    """Per pool: the memory brought up to date with this tick's telemetry, and the target in force."""
    fleet, now = inp.fleet, inp.now_s
    mem: dict[str, MpcPoolMemory] = {}
    targets: dict[str, int] = {}
    for spec in fleet.pools:
        m0 = state.pools.get(spec.name)
        if m0 is None:  # first sight: corrections start from the seeded prior (1 without a profile)
            j = [p.name for p in fleet.pools].index(spec.name)
            m0 = MpcPoolMemory(caps=(spec.max_num_seqs, spec.max_num_batched_tokens),
                               log_k_ttft=math.log(prior.ttft_correction[j]),
                               log_k_tpot=math.log(prior.tpot_correction[j]))
        po = inp.observation.pools.get(spec.name)
        target, _ = current_target(inp, spec)
        targets[spec.name] = target
        mem[spec.name] = account(m0, spec, po, target, now, state.last_s, warm_ttl_s=warm_ttl_s, step_s=step_s)
    return mem, targets


def carried(obs: FleetObservation, fleet: FleetSpec, need_now: Mapping[str, int]) -> bool | None:
    """Does the fleet carry the load it admits, now? Every pool has the replicas the last plan said
    its first step needs ready, and no queue stands anywhere (engines: at most one waiting request
    per ready replica; router: nothing held). None when a reading is missing. The breaker then
    reads a p95 over its SLO as the past's (a 60 s window still holds the backlog drained)."""
    if not need_now:
        return None
    for spec in fleet.pools:
        po = obs.pools.get(spec.name)
        ready = value(po.replicas_ready) if po is not None else None
        waiting = value(po.waiting) if po is not None else None
        if ready is None or waiting is None or spec.name not in need_now:
            return None
        if ready < need_now[spec.name] or standing_queue(waiting, ready):
            return False
    return all((value(co.queue_depth) or 0.0) <= 0.0 for co in obs.classes.values())


def reuse(spec: PoolSpec, m: MpcPoolMemory, po: PoolObservation | None, pd: PoolDecision | None,
          prior: PlanModel, j: int, ready: float) -> tuple[float, float]:
    """(inf_hit, working set tokens) consistent with today's hit at today's affinity and replicas."""
    hit = value(po.hit_rate) if po is not None else None
    if m.inf_hit <= 0.01 or hit is None:
        return m.inf_hit, 0.0
    kv = float(prior.kv_tokens()[j])
    aff = float(router_affinity(np.array(pd.prefix_weight if pd else 3.0),
                         np.array((pd.queue_weight + pd.kv_weight) if pd else 4.0)))
    k_eff = kv * 0.8 * (aff * max(ready, 1.0) + 1.0 - aff)
    cover = (min(hit, m.inf_hit) / m.inf_hit) ** 2
    ws = k_eff * 0.5 if cover >= 0.97 else k_eff / max(cover, 0.02)
    return m.inf_hit, ws
