"""Knative Pod Autoscaler (KPA) on in-flight requests per replica, per pool.

Source: Knative Serving's autoscaler (knative/serving pkg/autoscaler/scaling/
autoscaler.go, defaults in pkg/autoscaler/config/config.go) and the Knative docs
("Additional autoscaling configuration for Knative Pod Autoscaler"). Defaults
reproduced: container-concurrency-target-default 100 × target utilisation 0.7 →
70 in-flight requests per replica; stable window 60 s; panic window 10 % of it
(6 s); panic threshold 200 %; max scale-up rate 1000; max scale-down rate 2;
scale-down delay 0.

The decider, as Knative's `Scale`:
  ready   = max(1, ready replicas)
  desired_stable = ceil(stable_avg / target), desired_panic = ceil(panic_avg / target),
  both kept within [floor(ready / max_down_rate), ceil(max_up_rate × ready)];
  panic starts when desired_panic / ready ≥ 2.0 and is extended every tick that is
  still over the threshold; it ends once a full stable window has passed since the
  last over-threshold tick; while panicking the count is the larger of the two and
  never goes down (it holds the highest count reached in this panic).
  Example: 4 ready, 70 per replica target, stable avg 300, panic avg 700 →
  stable wants ceil(300/70) = 5, panic wants ceil(700/70) = 10, 10/4 = 2.5 ≥ 2 → panic, 10.
As Knative does when its autoscaler (re)starts, a pool first seen with more than
one ready replica starts in panic mode at that count, so it is not scaled down
before the windows hold real data.

Adaptation: Knative averages per-second buckets of concurrency reported by its
queue-proxies; here concurrency is the pool's running + waiting requests, one
sample per tick kept in the policy state, and the windows average the samples
whose time falls inside them (with 15 s ticks the 6 s panic window holds only the
newest sample). If one of running/waiting is missing the sample counts the other
(the missing part as 0) and is marked partial: partial data may scale up, never
down. With no usable sample in a window, or no ready count, the pool holds.
Knative's activator path (scale from zero while requests wait in the activator)
is not modelled: requests held at our router are not in the pool's signals, so
the floor is max(pool min, 1). Routing: least loaded (queue weight only).

Pure: no I/O, no clock; does not import telemetry/actuation/api/runtime/gen,
grpc or prometheus clients.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from controller.policies.common import (
    LEAST_LOADED,
    RoutingWeights,
    Samples,
    ceil_replicas,
    change_reason,
    check_positive,
    clamp,
    current_target,
    pool_decision,
    push_sample,
    reason,
    replica_floor,
    routing_reason,
    value,
    window_mean,
)
from controller.types import PolicyInput, PolicyOutput, PoolDecision, PoolSpec, Reason


@dataclass(frozen=True, slots=True)
class KpaParams:
    """Parameters of the KPA decider (shared by the Knative and the AIBrix-style policies)."""

    target: float  # metric per replica the autoscaler aims for
    stable_window_s: float = 60.0
    panic_window_s: float = 6.0
    panic_threshold: float = 2.0  # desired_panic / ready at which panic starts
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    up_tolerance: float = 0.0  # AIBrix: no stable-mode scale-up while metric/target ≤ 1 + up_tolerance
    down_tolerance: float = 0.0  # AIBrix: no stable-mode scale-down while metric/target ≥ 1 − down_tolerance

    def __post_init__(self) -> None:
        check_positive("target", self.target)
        check_positive("stable_window_s", self.stable_window_s)
        check_positive("panic_window_s", self.panic_window_s)
        if self.panic_window_s > self.stable_window_s:
            raise ValueError(f"panic_window_s ({self.panic_window_s}) must be <= "
                             f"stable_window_s ({self.stable_window_s})")
        check_positive("panic_threshold", self.panic_threshold)
        if check_positive("max_scale_up_rate", self.max_scale_up_rate) <= 1.0:
            raise ValueError(f"max_scale_up_rate must be > 1 (got {self.max_scale_up_rate})")
        if check_positive("max_scale_down_rate", self.max_scale_down_rate) <= 1.0:
            raise ValueError(f"max_scale_down_rate must be > 1 (got {self.max_scale_down_rate})")
        check_positive("up_tolerance", self.up_tolerance, allow_zero=True)
        check_positive("down_tolerance", self.down_tolerance, allow_zero=True)


@dataclass(frozen=True, slots=True)
class KpaPoolMemory:
    samples: Samples = ()  # (t_s, total metric of the pool)
    partial_s: tuple[float, ...] = ()  # times of samples built from partial data
    panic_since_s: float | None = None  # Knative's panicTime: last tick over the panic threshold
    max_panic_pods: int = 0
    seen: bool = False


@dataclass(frozen=True, slots=True)
class KpaDecision:
    desired: int
    memory: KpaPoolMemory
    reasons: tuple[Reason, ...]
    info: Mapping[str, Any]


def kpa_scale(p: KpaParams, mem: KpaPoolMemory, now_s: float, pool: str, ready: int, current: int,
              stable_value: float, panic_value: float) -> KpaDecision:
    """One KPA decision from the windowed averages (Knative's autoscaler.Scale, plus AIBrix's tolerance band)."""
    ready_f = max(1.0, float(ready))
    max_up = math.ceil(p.max_scale_up_rate * ready_f)
    max_down = math.floor(ready_f / p.max_scale_down_rate)
    dspc = ceil_replicas(stable_value / p.target)
    dppc = ceil_replicas(panic_value / p.target)
    stable_ratio = stable_value / (p.target * ready_f)
    in_band = False
    if (p.up_tolerance > 0 or p.down_tolerance > 0) and (
            (dspc > current and stable_ratio <= 1.0 + p.up_tolerance)
            or (dspc < current and stable_ratio >= 1.0 - p.down_tolerance)):
        dspc, in_band = current, True
    desired_stable = int(min(max(dspc, max_down), max_up))
    desired_panic = int(min(max(dppc, max_down), max_up))
    over = dppc / ready_f >= p.panic_threshold

    reasons: list[Reason] = []
    panic_since, max_panic = mem.panic_since_s, mem.max_panic_pods
    if panic_since is None and over:
        panic_since = now_s
        reasons.append(reason("panic_enter", pool,
                              f"panic: {dppc} replicas wanted over the {p.panic_window_s:g} s window "
                              f"is ≥ {p.panic_threshold:g} × {ready_f:g} ready", desired_panic=dppc, ready=ready_f))
    elif over:
        panic_since = now_s
    elif panic_since is not None and panic_since + p.stable_window_s < now_s:
        panic_since, max_panic = None, 0
        reasons.append(reason("panic_exit", pool, f"panic over: below the threshold for a full {p.stable_window_s:g} s "
                              "stable window"))

    desired = desired_stable
    if panic_since is not None:
        desired = max(desired, desired_panic)
        if desired > max_panic:
            max_panic = desired
        elif desired < max_panic:
            reasons.append(reason("panic_hold", pool, f"panicking: no scale-down below {max_panic} "
                                  f"(would be {desired})", wanted=desired, held=max_panic))
        desired = max_panic
    info = {"stable_value": stable_value, "panic_value": panic_value, "target": p.target, "ready": ready,
            "desired_stable": desired_stable, "desired_panic": desired_panic, "max_scale_up": max_up,
            "max_scale_down": max_down, "panicking": panic_since is not None, "max_panic_pods": max_panic,
            "stable_ratio": stable_ratio, "in_tolerance_band": in_band}
    return KpaDecision(desired, replace(mem, panic_since_s=panic_since, max_panic_pods=max_panic), tuple(reasons), info)


def first_sight(mem: KpaPoolMemory, now_s: float, ready: int) -> KpaPoolMemory:
    """Knative starts in panic at the ready count when it (re)starts with more than one pod."""
    if mem.seen:
        return mem
    if ready > 1:
        return replace(mem, seen=True, panic_since_s=now_s, max_panic_pods=ready)
    return replace(mem, seen=True)


@dataclass(frozen=True, slots=True)
class KpaState:
    pools: Mapping[str, KpaPoolMemory] = field(default_factory=dict)


def bound_and_explain(spec: PoolSpec, cur: int, desired: int, floor: int, why: str, data: Mapping[str, Any],
                      reasons: list[Reason]) -> int:
    """Clamp to [floor, max] and append the clamp and change reasons."""
    n, bound = clamp(desired, floor, spec.max_replicas)
    if bound is not None and n != cur:
        reasons.append(reason(f"clamped_{bound}", spec.name, f"{desired} kept within [{floor}, {spec.max_replicas}]",
                              wanted=desired, replicas=n))
    if n != cur:
        reasons.insert(0, change_reason(spec.name, cur, n, why, **data))
    return n


class KpaPolicy:
    """Knative KPA on pool concurrency (running + waiting requests), one autoscaler per pool."""

    name = "kpa"

    def __init__(self, *, target_concurrency: float | None = None, container_concurrency: float = 100.0,
                 target_utilization: float = 0.7, stable_window_s: float = 60.0, panic_window_pct: float = 10.0,
                 panic_threshold_pct: float = 200.0, max_scale_up_rate: float = 1000.0,
                 max_scale_down_rate: float = 2.0, routing: RoutingWeights = LEAST_LOADED) -> None:
        cc = check_positive("kpa.container_concurrency", container_concurrency)
        util = check_positive("kpa.target_utilization", target_utilization)
        if util > 1:
            raise ValueError(f"kpa.target_utilization must be in (0, 1] (got {target_utilization})")
        target = (cc * util if target_concurrency is None
                  else check_positive("kpa.target_concurrency", target_concurrency))
        pct = check_positive("kpa.panic_window_pct", panic_window_pct)
        if not 1.0 <= pct <= 100.0:
            raise ValueError(f"kpa.panic_window_pct must be in [1, 100] (got {panic_window_pct})")
        self.params = KpaParams(target=target, stable_window_s=check_positive("kpa.stable_window_s", stable_window_s),
                                panic_window_s=stable_window_s * pct / 100.0,
                                panic_threshold=check_positive("kpa.panic_threshold_pct", panic_threshold_pct) / 100.0,
                                max_scale_up_rate=max_scale_up_rate, max_scale_down_rate=max_scale_down_rate)
        self.routing = routing

    def initial_state(self) -> KpaState:
        return KpaState()

    def decide(self, state: KpaState, inp: PolicyInput, rng: np.random.Generator) -> tuple[KpaState, PolicyOutput]:
        now, p = inp.now_s, self.params
        pools: dict[str, PoolDecision] = {}
        reasons: list[Reason] = []
        diag: dict[str, Any] = {}
        memory = dict(state.pools)
        for spec in inp.fleet.pools:
            cur, _ = current_target(inp, spec)
            obs = inp.observation.pools.get(spec.name)
            mem = memory.get(spec.name, KpaPoolMemory())
            rr = routing_reason(inp, spec.name, self.routing, self.name)
            if rr is not None:
                reasons.append(rr)
            running = value(obs.running) if obs is not None else None
            waiting = value(obs.waiting) if obs is not None else None
            if running is not None or waiting is not None:
                partial = running is None or waiting is None
                mem = replace(mem,
                              samples=push_sample(mem.samples, now, (running or 0.0) + (waiting or 0.0),
                                                  p.stable_window_s),
                              partial_s=(tuple(t for t in mem.partial_s if t > now - p.stable_window_s)
                                         + ((now,) if partial else ())))
            ready_v = value(obs.replicas_ready) if obs is not None else None
            stable = window_mean(mem.samples, now, p.stable_window_s)
            panic = window_mean(mem.samples, now, p.panic_window_s)
            if ready_v is None or stable is None or panic is None:
                what = "replicas_ready" if ready_v is None else "running/waiting"
                reasons.append(reason("missing_data_hold", spec.name, f"no usable {what}: holding {cur}",
                                      signal=what, replicas=cur))
                memory[spec.name] = mem
                pools[spec.name] = pool_decision(cur, self.routing)
                diag[spec.name] = {"replicas": cur, "missing": what}
                continue
            ready = int(round(ready_v))
            mem = first_sight(mem, now, ready)
            res = kpa_scale(p, mem, now, spec.name, ready, cur, stable, panic)
            reasons.extend(res.reasons)
            desired = res.desired
            if desired < cur and any(t > now - p.stable_window_s for t in mem.partial_s):
                reasons.append(reason("partial_data_no_scale_down", spec.name,
                                      "running or waiting was missing within the stable window: "
                                      f"no scale-down to {desired}",
                                      wanted=desired, replicas=cur))
                desired = cur
            n = bound_and_explain(spec, cur, desired, replica_floor(spec), f"concurrency {stable:.3g} (stable), "
                                  f"{panic:.3g} (panic) vs {p.target:g} per replica", dict(res.info), reasons)
            memory[spec.name] = res.memory
            pools[spec.name] = pool_decision(n, self.routing)
            diag[spec.name] = {**res.info, "current": cur, "replicas": n}
        return KpaState(pools=memory), PolicyOutput(pools=pools, reasons=tuple(reasons),
                                                    diagnostics={"pools": diag, "target_concurrency": p.target,
                                                                 "stable_window_s": p.stable_window_s,
                                                                 "panic_window_s": p.panic_window_s})
