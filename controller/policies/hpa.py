"""Kubernetes Horizontal Pod Autoscaler (autoscaling/v2) on one pool metric, per pool.

Source: the Kubernetes HPA documentation and controller (kubernetes/kubernetes
pkg/controller/podautoscaler: horizontal.go, replica_calculator.go; defaults in
pkg/apis/autoscaling/v2/defaults.go and the controller-manager flags), as
summarised in docs/TELEMETRY.md §7. What is reproduced:

- desired = ceil(current × metric / target), skipped while |metric/target − 1| ≤ 0.1
  (tolerance). Example: 4 replicas at 90 % GPU busy, target 50 % → ceil(4 × 1.8) = 8.
- the controller syncs every 15 s: `decide` may be ticked more often, and only
  re-evaluates when ≥ sync_period_s has passed since its last evaluation;
- stabilisation: scale-up window 0 s, scale-down window 300 s — the target never
  drops below the highest recommendation made in the last 300 s (the window starts
  seeded with the count in force, as the controller seeds it when it first sees an HPA);
- rate policies: scale up by at most max(4 pods, 100 %) per 15 s (the more
  permissive wins), scale down by at most 100 % per 15 s; min/max replicas;
- missing metrics: replicas of the target that report no metric are counted at
  the target value (100 % of target) when the metric says scale down and at 0
  when it says scale up; starting (pending) replicas count as 0 on a scale-up and
  are ignored otherwise; if counting them would flip the direction or land inside
  the tolerance, nothing changes; with no metric at all nothing changes.

Adaptation to pool-level signals (we see pool aggregates, not per-pod metrics):
"pods" = the replica target in force (the HPA's spec.replicas); pods with metrics
= replicas_ready; pending pods = replicas_starting; missing pods = the rest of
the target (target − ready − starting, or target − ready when the starting count
itself is unknown). The metric is the per-ready-replica average:
  - metric "gpu_util" (default): DCGM GPU utilisation of the pool, target 0.7 — the
    "HPA on GPU utilisation" most teams run;
  - metric "queue_per_replica": engine queue depth (vllm:num_requests_waiting) per
    ready replica, target 1 — the threshold the vLLM production-stack HPA tutorial
    uses (it scales on the waiting-request count with target 1); we apply it per
    replica (a Pods/AverageValue metric), which is how a per-pod metric is read.
Routing: least loaded (queue weight only), as behind a plain Service.
The HPA's minReplicas defaults to 1, so the floor is max(pool min, 1); a target
explicitly set to 0 is left alone, as the HPA does.

Pure: no I/O, no clock; does not import telemetry/actuation/api/runtime/gen,
grpc or prometheus clients.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from controller.policies.common import (
    LEAST_LOADED,
    Events,
    RoutingWeights,
    ScalingPolicy,
    ceil_replicas,
    change_reason,
    check_choice,
    check_positive,
    current_target,
    pool_decision,
    reason,
    record_event,
    replica_floor,
    routing_reason,
    scale_down_limit,
    scale_up_limit,
    stabilise,
    value,
)
from controller.types import PolicyInput, PolicyOutput, PoolDecision, PoolObservation, PoolSpec, Reason

HPA_METRICS = ("gpu_util", "queue_per_replica")
DEFAULT_TARGETS = {"gpu_util": 0.7, "queue_per_replica": 1.0}


@dataclass(frozen=True, slots=True)
class HpaPoolMemory:
    recommendations: Events = ()  # (t_s, unstabilised recommendation)
    up_events: Events = ()  # (t_s, replicas added)
    down_events: Events = ()  # (t_s, replicas removed)


@dataclass(frozen=True, slots=True)
class HpaState:
    last_sync_s: float | None = None
    pools: Mapping[str, HpaPoolMemory] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MetricProposal:
    """What the replica calculator concluded for one pool (the HPA's metricDesiredReplicas)."""

    replicas: int
    usage_ratio: float
    new_usage_ratio: float | None
    within_tolerance: bool
    ready: int
    unready: int
    missing: int


def calc_replicas(current: int, metric: float, target: float, ready: int, unready: int, missing: int,
                  tolerance: float) -> MetricProposal:
    """The HPA replica calculator for an average-per-pod metric (calcPlainMetricReplicas).

    `metric` is the average over the `ready` pods that report it. Examples (tolerance 0.1):
    current 4, 4 ready at 0.9 vs 0.5 → ceil(1.8 × 4) = 8; at 0.52 → ratio 1.04, held at 4;
    current 4, 2 ready at 0.2 vs 0.5, 2 missing → missing count at 0.5: ratio (0.4 + 1.0)/2.0
    = 0.7 → ceil(0.7 × 4) = 3 (not 1).
    """
    ratio = metric / target
    scale_up_with_unready = unready > 0 and ratio > 1.0
    if not scale_up_with_unready and missing == 0:
        if abs(1.0 - ratio) <= tolerance:
            return MetricProposal(current, ratio, None, True, ready, unready, missing)
        return MetricProposal(ceil_replicas(ratio * ready), ratio, None, False, ready, unready, missing)
    total = metric * ready
    n = ready + missing
    if ratio < 1.0:
        total += target * missing  # scale-down: missing pods count as exactly at target
    if scale_up_with_unready:
        n += unready  # scale-up: pending pods count as idle
    new_ratio = total / (target * n)
    flipped = (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio)
    if abs(1.0 - new_ratio) <= tolerance or flipped:
        return MetricProposal(current, ratio, new_ratio, not flipped, ready, unready, missing)
    proposed = ceil_replicas(new_ratio * n)
    if (new_ratio < 1.0 and proposed > current) or (new_ratio > 1.0 and proposed < current):
        return MetricProposal(current, ratio, new_ratio, False, ready, unready, missing)
    return MetricProposal(proposed, ratio, new_ratio, False, ready, unready, missing)


class HpaPolicy:
    """Kubernetes HPA with the autoscaling/v2 default behaviour, one HPA per pool."""

    name = "hpa"

    def __init__(self, *, metric: str = "gpu_util", target: float | None = None, tolerance: float = 0.1,
                 sync_period_s: float = 15.0, scale_up_stabilization_s: float = 0.0,
                 scale_down_stabilization_s: float = 300.0, scale_up_pods: int = 4,
                 scale_up_percent: float = 100.0, scale_up_period_s: float = 15.0,
                 scale_down_percent: float = 100.0, scale_down_period_s: float = 15.0,
                 routing: RoutingWeights = LEAST_LOADED) -> None:
        self.metric = check_choice("hpa.metric", metric, HPA_METRICS)
        self.target = check_positive("hpa.target", DEFAULT_TARGETS[metric] if target is None else target)
        self.tolerance = check_positive("hpa.tolerance", tolerance, allow_zero=True)
        self.sync_period_s = check_positive("hpa.sync_period_s", sync_period_s)
        self.up_window_s = check_positive("hpa.scale_up_stabilization_s", scale_up_stabilization_s, allow_zero=True)
        self.down_window_s = check_positive("hpa.scale_down_stabilization_s", scale_down_stabilization_s,
                                            allow_zero=True)
        self.up_policies = (ScalingPolicy("pods", check_positive("hpa.scale_up_pods", scale_up_pods),
                                          scale_up_period_s),
                            ScalingPolicy("percent", check_positive("hpa.scale_up_percent", scale_up_percent),
                                          scale_up_period_s))
        self.down_policies = (ScalingPolicy("percent", check_positive("hpa.scale_down_percent", scale_down_percent),
                                            scale_down_period_s),)
        self.routing = routing
        self._keep_s = max(self.up_window_s, self.down_window_s, scale_up_period_s, scale_down_period_s)

    def initial_state(self) -> HpaState:
        return HpaState()

    def decide(self, state: HpaState, inp: PolicyInput, rng: np.random.Generator) -> tuple[HpaState, PolicyOutput]:
        now = inp.now_s
        due = state.last_sync_s is None or now - state.last_sync_s >= self.sync_period_s - 1e-9
        pools: dict[str, PoolDecision] = {}
        reasons: list[Reason] = []
        diag: dict[str, Any] = {}
        memory = dict(state.pools)
        for spec in inp.fleet.pools:
            cur, source = current_target(inp, spec)
            rr = routing_reason(inp, spec.name, self.routing, self.name)
            if rr is not None:
                reasons.append(rr)
            if not due:
                pools[spec.name] = pool_decision(cur, self.routing)
                diag[spec.name] = {"replicas": cur, "evaluated": False}
                continue
            # As the HPA controller does when it first sees an HPA, the scale-down window starts
            # seeded with the count in force, so a (re)start never scales down at once.
            mem0 = memory.get(spec.name) or HpaPoolMemory(recommendations=((now, cur),))
            n, pool_reasons, pool_diag, mem = self._sync_pool(spec, inp.observation.pools.get(spec.name), cur, source,
                                                              mem0, now)
            memory[spec.name] = mem
            pools[spec.name] = pool_decision(n, self.routing)
            reasons.extend(pool_reasons)
            diag[spec.name] = pool_diag
        # not due implies a previous sync (due is True while last_sync_s is None)
        synced_s = state.last_sync_s if not due and state.last_sync_s is not None else now
        new_state = HpaState(last_sync_s=synced_s, pools=memory)
        next_sync = synced_s + self.sync_period_s
        return new_state, PolicyOutput(pools=pools, reasons=tuple(reasons),
                                       diagnostics={"pools": diag, "metric": self.metric, "target": self.target,
                                                    "synced": due, "next_sync_s": next_sync})

    def _metric(self, obs: PoolObservation | None, ready: float | None) -> tuple[float | None, str]:
        if obs is None:
            return None, "pool observation"
        if self.metric == "gpu_util":
            return value(obs.gpu_util_frac), "gpu_util_frac"
        waiting = value(obs.waiting)
        if waiting is None or ready is None or ready <= 0:
            return None, "waiting" if waiting is None else "replicas_ready"
        return waiting / ready, "waiting"

    def _sync_pool(self, spec: PoolSpec, obs: PoolObservation | None, cur: int, source: str,
                   mem: HpaPoolMemory, now: float) -> tuple[int, list[Reason], dict[str, Any], HpaPoolMemory]:
        floor = replica_floor(spec)
        hi = spec.max_replicas
        d: dict[str, Any] = {"current": cur, "min": floor, "max": hi, "evaluated": True}
        if cur == 0 and floor > 0 and source == "decision":
            d["replicas"] = 0
            return 0, [reason("scaling_disabled_zero", spec.name,
                              "target is scaled to zero: the HPA leaves it alone")], d, mem
        if cur > hi:
            d["replicas"] = hi
            return hi, [change_reason(spec.name, cur, hi, f"above maxReplicas {hi}"),
                        reason("clamped_max", spec.name, f"maxReplicas {hi}", max=hi)], d, mem
        if cur < floor:
            d["replicas"] = floor
            return floor, [change_reason(spec.name, cur, floor, f"below minReplicas {floor}"),
                           reason("clamped_min", spec.name, f"minReplicas {floor}", min=floor)], d, mem

        ready_v = value(obs.replicas_ready) if obs is not None else None
        metric, metric_name = self._metric(obs, ready_v)
        if ready_v is None or metric is None or ready_v <= 0:
            what = "replicas_ready" if ready_v is None or ready_v <= 0 else metric_name
            d.update(replicas=cur, missing=what)
            return cur, [reason("missing_data_hold", spec.name,
                                f"no usable {what}: holding {cur} (the HPA does not scale without metrics)",
                                signal=what, replicas=cur)], d, mem
        ready = int(round(ready_v))
        starting_v = value(obs.replicas_starting) if obs is not None else None
        others = max(0, cur - ready)
        if starting_v is None:
            unready, missing = 0, others  # unknown split: count them all as missing (the cautious reading)
        else:
            unready = min(others, int(round(starting_v)))
            missing = others - unready
        prop = calc_replicas(cur, metric, self.target, ready, unready, missing, self.tolerance)
        d.update(metric=metric, target=self.target, usage_ratio=prop.usage_ratio, new_usage_ratio=prop.new_usage_ratio,
                 within_tolerance=prop.within_tolerance, ready=ready, unready=unready, missing=missing,
                 proposal=prop.replicas)

        stab, recs = stabilise(mem.recommendations, now, prop.replicas, cur, self.up_window_s, self.down_window_s)
        d["stabilised"] = stab
        reasons: list[Reason] = []
        if prop.replicas < cur and stab > prop.replicas:
            reasons.append(reason("scale_down_stabilised", spec.name,
                                  f"recommendation {prop.replicas} held at {stab}: highest recommendation of the last "
                                  f"{self.down_window_s:g} s", proposal=prop.replicas, stabilised=stab,
                                  window_s=self.down_window_s))
        final = stab
        if stab > cur:
            limit = scale_up_limit(cur, mem.up_events, mem.down_events, self.up_policies, now)
            allowed = min(hi, limit)
            d["scale_up_limit"] = limit
            if stab > allowed:
                final = allowed
                code = "scale_up_limited" if limit < hi else "clamped_max"
                why = "scale-up policy: max(+4 pods, +100 %) per 15 s" if code == "scale_up_limited" else "maxReplicas"
                reasons.append(reason(code, spec.name, f"{stab} capped at {allowed} ({why})",
                                      wanted=stab, allowed=allowed))
        elif stab < cur:
            limit = scale_down_limit(cur, mem.up_events, mem.down_events, self.down_policies, now)
            allowed = max(floor, limit)
            d["scale_down_limit"] = limit
            if stab < allowed:
                final = allowed
                code = "scale_down_limited" if limit > floor else "clamped_min"
                reasons.append(reason(code, spec.name, f"{stab} raised to {allowed}", wanted=stab, allowed=allowed))
        up_events, down_events = mem.up_events, mem.down_events
        if final != cur:
            metric_desc = (f"{metric:.3g} vs target {self.target:g} ({self.metric}), "
                           f"ratio {prop.new_usage_ratio or prop.usage_ratio:.3g}")
            reasons.insert(0, change_reason(spec.name, cur, final, metric_desc, metric=metric, target=self.target,
                                            usage_ratio=prop.usage_ratio, proposal=prop.replicas))
        up_events = record_event(up_events, now, final - cur, self._keep_s)
        down_events = record_event(down_events, now, cur - final, self._keep_s)
        d["replicas"] = final
        return final, reasons, d, HpaPoolMemory(recommendations=recs, up_events=up_events, down_events=down_events)
