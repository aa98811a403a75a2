"""The estimate stage: what the controller takes the fleet to be this tick, from telemetry and the autoscaler.

`estimate(previous, observation, fleet_state, now_s)` is called by `Controller.step` before any
policy runs, for every policy, so the daemon, the bench and the tests feed the policies the same
view. It is the one place the autoscaler's fleet state (replicas per phase, which no engine
exports) joins the telemetry:

- every pool the autoscaler reports gets its `replicas_starting` and `replicas_draining`;
- scale from zero: a pool the autoscaler reports with no replica at all (none ready, starting or
  draining) has no engine to export metrics, so a missing `replicas_ready` reads 0 (scaled to zero,
  not a broken scrape: Prometheus alone cannot tell the two apart; docs/OPERATING.md §8). Without
  it a fleet scaled to zero reads all stale and the controller freezes at zero;
- a pool the autoscaler says has replicas keeps a missing reading missing (its engines should be
  exporting: that is a telemetry problem the guards hold on, not an empty pool).

Then, once a tick and for every policy (`account_fleet`, called by `Controller.step` after the
paused check), the replica accounting the breaker and the policies read in `PolicyInput.estimate`
(`FleetEstimate`, controller/types.py), per pool (`PoolAccount`):

- when each starting replica should be ready, from the targets actually in force: warm while a
  slot kept its weights (a drained replica's slot stays warm `warm_node_ttl_s`), else cold;
  replacements the fleet starts by itself after a crash are taken as cold and counted as
  `unordered` (the breaker's replica losses, `BreakerConfig.count_replacements`);
- a rolling restart a batch-cap change set off (the caps the policy decided last tick,
  `FleetEstimate.decided_caps`): its surge replicas are expected, warm, and are not losses;
- the warm slots, the prompt/output mix (while the telemetry windows warm, `warmup_s`, corrected for the
  requests in flight where they began: `_token_mix`);
- whether the fleet carries the load it admits (`carried`: the replicas the policy said last tick
  each pool needs, `PolicyOutput.needs`, are ready and no queue stands);

and, fleet-wide, the demand (router arrivals minus client retries), its history for the forecasters
and the class mix (`demand`, with `warmup_s`: while the telemetry windows are still filling the
history holds only the highest reading).

What a policy learns for itself (the MPC's forecast scores, reuse, correction factors:
controller/policies/mpc/memory.py, corrections.py) stays with it.

Must not: do I/O, read a clock (time is `now_s`), or import an edge; it never invents a reading the
telemetry or the autoscaler did not give.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from controller.types import (
    Decision,
    FleetEstimate,
    FleetObservation,
    FleetSpec,
    PoolAccount,
    PoolDecision,
    PoolObservation,
    PoolPhases,
    PoolSpec,
    Reading,
    TaskProfile,
)

# a rolling restart's next surge replica starts when the previous one is ready; this long past a
# cold start-up without one, the restart is taken as over
ROLLOUT_GAP_S = 120.0
HISTORY_KEEP_S = 1800.0  # the demand history the forecasters see


Estimate = FleetEstimate  # the stage's value (controller/types.py: it crosses into the policies)


@dataclass(frozen=True, slots=True)
class EstimatorConfig:
    """How the replica accounting reads the fleet (the MPC's `warm_node_ttl_s` and `step_s` set it)."""

    warm_node_ttl_s: float = 600.0  # a drained replica's slot stays warm (weights on the node) this long
    step_s: float = 30.0  # an overdue start-up is expected within half of this
    warmup_s: float = 60.0  # the telemetry windows are full this long after the first tick


DEFAULT_ESTIMATOR = EstimatorConfig()


def estimate(previous: Estimate | None, observation: FleetObservation,
             fleet_state: Mapping[str, PoolPhases] | None, now_s: float,
             tasks: TaskProfile | None = None) -> Estimate:
    """Merge the autoscaler's replica phases (`fleet_state`, per pool; None or empty when unknown)
    into `observation`. `previous` is the last tick's estimate (None on the first tick); the merge
    itself needs no memory. `tasks`, the data plane's measured task profile, is carried as given (an empty
    profile, nothing labelled, is None: the planner then weighs steps as it would without one).

    Example: the autoscaler reports pool a with 0 ready, 0 starting, 0 draining and the telemetry
    has no `replicas_ready` for it → a reads 0 ready, 0 starting, 0 draining; with 1 starting instead
    → `replicas_ready` stays missing and `replicas_starting` reads 1.
    """
    del previous  # the merge is stateless; the slot is here for estimator state that is fleet-wide
    tasks = tasks if tasks is not None and not tasks.empty else None
    if not fleet_state:
        return Estimate(at_s=now_s, observation=observation, tasks=tasks)
    pools = dict(observation.pools)
    zero: list[str] = []
    for name, ps in fleet_state.items():
        p = pools.get(name) or PoolObservation(pool=name)
        p = replace(p, replicas_starting=Reading(float(ps.starting)), replicas_draining=Reading(float(ps.draining)))
        if not p.replicas_ready.ok and ps.ready == 0 and ps.starting == 0 and ps.draining == 0:
            p = replace(p, replicas_ready=Reading(0.0))
            zero.append(name)
        pools[name] = p
    return Estimate(at_s=now_s, observation=replace(observation, pools=pools), scaled_to_zero=tuple(zero),
                    tasks=tasks)


def target_in_force(current: Decision | None, observation: FleetObservation, spec: PoolSpec) -> tuple[int, str]:
    """The replica target in force for a pool, and where it came from.

    In order: the decision in force; else what the fleet runs (ready + starting);
    else the pool's minimum. Example: no decision yet, 3 ready and 1 starting → (4, "observed").
    """
    if current is not None and spec.name in current.pools:
        return int(current.pools[spec.name].replicas), "decision"
    obs = observation.pools.get(spec.name)
    if obs is not None:
        ready, starting = obs.replicas_ready, obs.replicas_starting
        if ready.ok and math.isfinite(ready.value):
            s = float(starting.value) if starting.ok and math.isfinite(starting.value) else 0.0
            return int(round(float(ready.value) + s)), "observed"
    return spec.min_replicas, "pool_min"


# --------------------------------------------------------------------------- the replica accounting


def _value(r: Reading) -> float | None:
    return float(r.value) if r.ok and math.isfinite(r.value) else None


def _ewma(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new


def standing_queue(waiting: float | None, ready: float) -> bool:
    """More than one request waiting per ready replica in the engines: a backlog, not arrivals. vLLM
    queues only what it cannot schedule, so at most one per replica is the step in between."""
    return (waiting or 0.0) > ready


def carried(obs: FleetObservation, fleet: FleetSpec, need_now: Mapping[str, int]) -> bool | None:
    """Does the fleet carry the load it admits, now? Every pool has the replicas the policy said last tick
    its load needs ready, and no queue stands anywhere (engines: at most one waiting request per ready
    replica; router: nothing held). None when a reading is missing or no need is known. The breaker then
    reads a p95 over its SLO as the past's (a 60 s window still holds the backlog drained)."""
    if not need_now:
        return None
    for spec in fleet.pools:
        po = obs.pools.get(spec.name)
        ready = _value(po.replicas_ready) if po is not None else None
        waiting = _value(po.waiting) if po is not None else None
        if ready is None or waiting is None or spec.name not in need_now:
            return None
        if ready < need_now[spec.name] or standing_queue(waiting, ready):
            return False
    return all((_value(co.queue_depth) or 0.0) <= 0.0 for co in obs.classes.values())


def decided_caps(fleet: FleetSpec, pools: Mapping[str, PoolDecision]) -> dict[str, tuple[int, int]]:
    """The engine batch caps a decision sets per pool (0 = unchanged: the pool's own)."""
    return {s.name: (int(pools[s.name].max_num_seqs) or s.max_num_seqs,
                     int(pools[s.name].max_num_batched_tokens) or s.max_num_batched_tokens)
            for s in fleet.pools if s.name in pools}


def account(a: PoolAccount, spec: PoolSpec, po: PoolObservation | None, target: int, now: float,
            last_s: float | None, *, warm_ttl_s: float, step_s: float,
            window_start_s: float | None = None) -> PoolAccount:
    """Bring the starting-replica ETAs and warm slots up to date with the target in force and telemetry.
    `window_start_s`: while the telemetry windows warm, when they began (the first tick); None once full."""
    ttl = warm_ttl_s
    warm = [t for t in a.warm if now - t < ttl]
    etas = sorted(a.etas)
    unordered = 0
    t_order = last_s if last_s is not None else now
    ready = _value(po.replicas_ready) if po is not None else None
    starting = _value(po.replicas_starting) if po is not None else None
    serving = a.serving
    if serving is None:
        serving = int(round((ready or 0) + (starting or 0))) if ready is not None else target
    if a.target is not None and target != a.target:
        if target > serving:  # replicas ordered last tick: warm while warm slots last
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
    rollout_left, rollout_seen_s = a.rollout_left, a.rollout_seen_s
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
    prompt, out, first = _token_mix(a, po, now, window_start_s)
    return replace(a, etas=tuple(etas), warm=tuple(warm[-64:]), serving=serving_now, target=target,
                   prompt_tokens=prompt, output_tokens=out, first_in_flight=first,
                   unordered=unordered if a.serving is not None else 0,
                   rollout_left=rollout_left, rollout_seen_s=rollout_seen_s)


def _token_mix(a: PoolAccount, po: PoolObservation | None, now: float,
               window_start_s: float | None) -> tuple[float | None, float | None, tuple[float, float] | None]:
    """The pool's mix (prompt, output tokens per request: an EWMA of windowed token rates per arrival) and the
    requests in flight where the windows began.

    A full window has requests in flight at both of its ends, which balance on average. A warming one began
    with the telemetry: it counts the tokens of the requests in flight at its first sample but not their
    arrivals, so tokens per arrival read high by about those requests / the arrivals in the window (a fleet
    starting at its peak: 200 streams in flight, 7 arrivals in the first 15 s → 5,800 output tokens a
    request for 250; planned on, a fleet carrying 50 req/s looked full at 20 and shed critical traffic, and
    the EWMA kept it above 2x for three minutes, decision 0034). So while warming the arrivals are counted
    with the work of the requests in flight at each end: a running request half done (its remaining half
    in the window at the start, its first half at the end), a waiting one not started: output tokens over
    arrivals + ½ running₀ + waiting₀ − ½ running − waiting, prompt tokens (counted at prefill) over
    arrivals + waiting₀ − waiting, where that is over twice the arrivals; below, or with the in-flight counts
    unknown, the window is read as it is."""
    prompt, out, first = a.prompt_tokens, a.output_tokens, a.first_in_flight
    if po is None:
        return prompt, out, first
    run, wait = _value(po.running), _value(po.waiting)
    in_flight = (run, wait or 0.0) if run is not None else None
    if window_start_s is not None and now <= window_start_s:  # the first tick: where the windows begin
        first = in_flight
    arr, ptok, gtok = _value(po.arrival_rps), _value(po.prompt_tokens_rps), _value(po.generation_tokens_rps)
    if arr is None or arr <= 0.05:
        return prompt, out, first
    f_prompt = f_out = 1.0  # requests the window's tokens belong to, per arrival (a full window: 1)
    if window_start_s is not None:
        span = now - window_start_s
        n = arr * span
        known = span > 0 and first is not None and in_flight is not None
        r0, w0 = first if first is not None and known else (0.0, 0.0)
        r1, w1 = in_flight if in_flight is not None and known else (0.0, 0.0)
        f_out = (n + 0.5 * r0 + w0 - 0.5 * r1 - w1) / n if known else 1.0  # unknown: read as it is
        f_prompt = (n + w0 - w1) / n if known else 1.0
        # Corrected only where the requests in flight at the start carry more of the window's work than its
        # arrivals do (more than 2x): the half done is a coarse guess (a running request is anywhere from
        # just started to nearly done), worth making where the bias it removes is larger than its own error.
        # Below, the window is read as it is, as a full one is (held-out seeds 2 and 3 lost a case each
        # with the correction applied throughout: decision 0034).
        f_out = f_out if f_out > 2.0 else 1.0
        f_prompt = f_prompt if f_prompt > 2.0 else 1.0
    if ptok is not None and ptok > 0:
        prompt = _ewma(prompt, ptok / (arr * f_prompt), 0.3)
    if gtok is not None and gtok > 0:
        out = _ewma(out, max(gtok / (arr * f_out), 1.0), 0.3)
    return prompt, out, first


def account_fleet(est: FleetEstimate, previous: FleetEstimate | None, fleet: FleetSpec, current: Decision | None,
                  config: EstimatorConfig) -> FleetEstimate:
    """`est` (this tick's merged telemetry) with the replica accounting brought up to date from `previous`
    (the last tick's estimate, with what was decided then) and whether the fleet carries its load.

    A batch-cap change decided last tick sets off a rolling restart of every replica serving then: its
    surge replicas are expected (warm), not counted as losses. Example: 3 serving, caps 256/8192 → 128/8192
    decided at t → at t + 15 s the restart has 3 replicas left to replace."""
    now = est.at_s
    last_s = previous.at_s if previous is not None else None
    before = previous.pools if previous is not None else {}
    caps_now = previous.decided_caps if previous is not None else {}
    first_s = previous.first_s if previous is not None and previous.first_s is not None else now
    window_start = first_s if now - first_s < config.warmup_s else None  # warming, as `_with_history` reads it
    pools: dict[str, PoolAccount] = {}
    for spec in fleet.pools:
        a = before.get(spec.name) or PoolAccount(caps=(spec.max_num_seqs, spec.max_num_batched_tokens))
        new_caps = caps_now.get(spec.name)
        if new_caps is not None and new_caps != (a.caps or (spec.max_num_seqs, spec.max_num_batched_tokens)):
            # every replica serving when the caps changed restarts with the new ones (the fleet rolls them)
            a = replace(a, rollout_left=a.serving if a.serving is not None else int(before_target(current, spec)),
                        rollout_seen_s=last_s if last_s is not None else now)
        if new_caps is not None:
            a = replace(a, caps=new_caps)
        target, _ = target_in_force(current, est.observation, spec)
        pools[spec.name] = account(a, spec, est.observation.pools.get(spec.name), target, now, last_s,
                                   warm_ttl_s=config.warm_node_ttl_s, step_s=config.step_s, window_start_s=window_start)
    needs = previous.needs if previous is not None else {}
    return _with_history(replace(est, pools=pools, carried=carried(est.observation, fleet, needs)), previous,
                         fleet, config.warmup_s)


def demand(obs: FleetObservation) -> tuple[float | None, dict[str, float]]:
    """Fleet demand (req/s, retries excluded) and the class mix; pool arrivals if the router is silent."""
    per: dict[str, float] = {}
    for c, co in obs.classes.items():
        a = _value(co.arrival_rps)
        if a is None:
            continue
        # arrivals count every attempt; a shed request comes back as retries. What was
        # admitted is a floor (an admitted retry counts once there).
        per[c] = max(a - (_value(co.retry_rps) or 0.0), _value(co.admitted_rps) or 0.0, 0.0)
    total = sum(per.values())
    if per and total > 0:
        return total, {c: v / total for c, v in per.items()}
    if per:
        return 0.0, {}
    read = [_value(p.arrival_rps) for p in obs.pools.values()]
    served = [s for s in read if s is not None]
    if served:
        return float(sum(served)), {}
    return None, {}


def _with_history(est: FleetEstimate, previous: FleetEstimate | None, fleet: FleetSpec,
                  warmup_s: float) -> FleetEstimate:
    """`est` with the demand history and class mix brought up to this tick's reading."""
    now = est.at_s
    demand_now, shares = demand(est.observation)
    t_hist = previous.t_hist if previous is not None else ()
    d_hist = previous.demand_hist if previous is not None else ()
    first_s = previous.first_s if previous is not None and previous.first_s is not None else now
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
    class_share = dict(previous.class_share) if previous is not None else {}
    for c, s in shares.items():
        class_share[c] = _ewma(class_share.get(c), s, 0.3)
    if not class_share:
        class_share = {c: 1.0 / len(fleet.slos) for c in fleet.slos} if fleet.slos else {"standard": 1.0}
    return replace(est, demand_rps=demand_now, t_hist=t_hist, demand_hist=d_hist, class_share=class_share,
                   first_s=first_s, warming=warming)


def before_target(current: Decision | None, spec: PoolSpec) -> int:
    """The replicas the decision in force sets for a pool (its minimum without one)."""
    return int(current.pools[spec.name].replicas) if current is not None and spec.name in current.pools \
        else spec.min_replicas
