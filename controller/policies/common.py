"""Shared pieces of the baseline policies: readings, bounds, windows, rate limits, reasons.

The baselines (static, HPA, KPA, SLA planner, scorer+KPA, SLO feedback) differ in
what they measure and how they turn it into a replica count, but they share the
plumbing: reading a value only when it can be trusted, finding the replica target
in force, clamping to a pool's bounds, sliding-window averages over a sample
history kept in the policy state, the Kubernetes HPA's stabilisation window and
scale-rate policies, and machine-readable reasons.

Everything here is pure: time arrives as a number (`now_s`), histories are tuples
that callers replace rather than mutate. This module must not do I/O, read the
clock, or import telemetry/actuation/api/runtime/gen, grpc or prometheus clients.

Reason codes used by the policies (Reason.code):
  scale_up / scale_down          the replica target changes (data: the numbers used)
  routing_set                    the router scorer weights change
  missing_data_hold              a signal the policy needs is missing/NaN/stale: hold
  partial_data_no_scale_down     some inputs missing: scale-ups allowed, scale-downs not
  scale_down_stabilised          a lower recommendation is held back by the stabilisation window
  scale_up_limited / scale_down_limited   a scale-rate policy bound the change
  clamped_min / clamped_max      the pool's replica bounds bound the change
  scaling_disabled_zero          HPA: a target scaled to zero is left alone
  panic_enter / panic_exit / panic_hold   KPA panic mode transitions / no scale-down while panicking
  forecast_scale                 SLA planner: replicas from the load forecast
  shed_sheddable / shed_release  SLA planner: load shedding of the sheddable class starts / stops
  slo_breach / queue_breach / queue_growth_predicted / scale_up_pending_startup / idle
                                 SLO feedback cases
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.core.estimate import target_in_force
from controller.perf.replica_capacity import check_positive
from controller.types import FleetSpec, PolicyInput, PoolDecision, PoolSpec, Reading, Reason, SloSpec

Sample = tuple[float, float]  # (t_s, value)
Samples = tuple[Sample, ...]
Event = tuple[float, int]  # (t_s, replicas changed)
Events = tuple[Event, ...]

# Rounding guard for ceil(): 4 × 1.75 must give 7, not 8 because of float error.
_CEIL_EPS = 1e-9


def ceil_replicas(x: float) -> int:
    """ceil() that ignores float noise: ceil_replicas(7.000000000001) == 7, ceil_replicas(7.2) == 8."""
    if not math.isfinite(x):
        raise ValueError(f"replica count must be finite (got {x})")
    return max(0, math.ceil(x - _CEIL_EPS))


def value(r: Reading) -> float | None:
    """The reading's value when it can be trusted (status OK and finite), else None."""
    if r.ok and math.isfinite(r.value):
        return float(r.value)
    return None


def describe(r: Reading) -> str:
    return f"{r.value:g}" if value(r) is not None else r.status.value


# --------------------------------------------------------------------------- routing


@dataclass(frozen=True, slots=True)
class RoutingWeights:
    """Router scorer weights a policy sets on every pool it controls."""

    prefix_weight: float
    queue_weight: float
    kv_weight: float

    def __post_init__(self) -> None:
        for f in ("prefix_weight", "queue_weight", "kv_weight"):
            v = getattr(self, f)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{f} must be a finite number >= 0 (got {v})")
        if self.prefix_weight + self.queue_weight + self.kv_weight <= 0:
            raise ValueError("at least one routing weight must be > 0")

    def as_dict(self) -> dict[str, float]:
        return {"prefix_weight": self.prefix_weight, "queue_weight": self.queue_weight, "kv_weight": self.kv_weight}


# Least-loaded: score on queue depth only, ignore cache affinity. The closest our
# scorer router gets to round-robin for identical replicas (see static.py).
LEAST_LOADED = RoutingWeights(prefix_weight=0.0, queue_weight=1.0, kv_weight=0.0)
# llm-d's default scorer profile (prefix-cache 3, queue 2, KV-cache utilisation 2).
SCORER_DEFAULT = RoutingWeights(prefix_weight=3.0, queue_weight=2.0, kv_weight=2.0)


def route_groups(fleet: FleetSpec) -> dict[str, list[PoolSpec]]:
    """The fleet's pools by route group (pools that can serve the same traffic), in fleet order."""
    groups: dict[str, list[PoolSpec]] = {}
    for p in fleet.pools:
        groups.setdefault(p.group, []).append(p)
    return groups


def pod_share_weights(inp: PolicyInput, per_replica_rps: Mapping[str, float] | None = None) -> dict[str, float]:
    """Per pool, the router traffic weight a load-aware pod-level picker gives it.

    The llm-d EPP, the AIBrix gateway and the Dynamo router all pick among *pods* (workers) of a
    model, whatever pool (variant, GPU type) they belong to, and their load terms (queue, active
    blocks, running requests) send each pod work as fast as it drains it. Our router first draws
    a pool by traffic_weight, then scores its replicas, so each pool gets its ready replicas ×
    its per-replica throughput (`per_replica_rps`, e.g. the profiled `ReplicaCapacity.rps`; a
    pool without one counts 1 per replica). Example: A100 pool 2 ready at 5 req/s, H100 pool 2
    ready at 10 req/s → 1/3 and 2/3. Pools alone in their group keep weight 1; a group with no
    ready replica (or no reading) keeps equal weights.
    """
    out: dict[str, float] = {}
    rates = per_replica_rps or {}
    for pools in route_groups(inp.fleet).values():
        share: dict[str, float] = {}
        for p in pools:
            obs = inp.observation.pools.get(p.name)
            r = value(obs.replicas_ready) if obs is not None else None
            share[p.name] = max(0.0, r) * rates.get(p.name, 1.0) if r is not None else 0.0
        total = sum(share.values())
        for p in pools:
            out[p.name] = 1.0 if len(pools) == 1 or total <= 0 else share[p.name] / total
    return out


def pool_decision(replicas: int, routing: RoutingWeights) -> PoolDecision:
    """A PoolDecision with the replica count and routing a baseline controls; all else default."""
    return PoolDecision(replicas=int(replicas), prefix_weight=routing.prefix_weight,
                        queue_weight=routing.queue_weight, kv_weight=routing.kv_weight)


def routing_reason(inp: PolicyInput, pool: str, routing: RoutingWeights, policy: str) -> Reason | None:
    """A `routing_set` reason when the weights in force differ from the policy's (or nothing is in force)."""
    cur = inp.current.pools.get(pool) if inp.current is not None else None
    if cur is not None and (cur.prefix_weight, cur.queue_weight, cur.kv_weight) == (
            routing.prefix_weight, routing.queue_weight, routing.kv_weight):
        return None
    return reason("routing_set", pool, f"{policy} routing: prefix {routing.prefix_weight:g}, "
                  f"queue {routing.queue_weight:g}, kv {routing.kv_weight:g}", **routing.as_dict())


# --------------------------------------------------------------------------- replicas and bounds


def replica_floor(spec: PoolSpec, allow_zero: bool = False) -> int:
    """Lowest count a baseline may choose: the pool's min, raised to 1 unless scale-to-zero is allowed.

    A pool at zero replicas has no engine metrics, so none of the baselines could
    see demand to scale back up from (the requests wait at the router, outside the
    pool's signals); the Kubernetes HPA's minReplicas also defaults to 1.
    """
    lo = spec.min_replicas if allow_zero else max(spec.min_replicas, 1)
    return min(lo, spec.max_replicas)


def clamp(n: int, lo: int, hi: int) -> tuple[int, str | None]:
    """Clamp n into [lo, hi]; also say which bound bound it ("min", "max" or None)."""
    if n < lo:
        return lo, "min"
    if n > hi:
        return hi, "max"
    return n, None


def current_target(inp: PolicyInput, spec: PoolSpec) -> tuple[int, str]:
    """The replica target in force for a pool, and where it came from (`target_in_force`)."""
    return target_in_force(inp.current, inp.observation, spec)


def tightest_slo(fleet: FleetSpec, priority_class: str | None = None) -> SloSpec | None:
    """The SLO of `priority_class`, or the tightest of all classes (min TTFT, min TPOT)."""
    if priority_class is not None:
        if priority_class not in fleet.slos:
            raise ValueError(f"SLO class {priority_class!r} is not in the fleet (have {sorted(fleet.slos)})")
        return fleet.slos[priority_class]
    if not fleet.slos:
        return None
    return SloSpec(ttft_s=min(s.ttft_s for s in fleet.slos.values()),
                   tpot_s=min(s.tpot_s for s in fleet.slos.values()))


# --------------------------------------------------------------------------- reasons


def reason(code: str, pool: str | None, message: str, **data: Any) -> Reason:
    return Reason(code=code, message=message, pool=pool, data=dict(data))


def change_reason(pool: str, before: int, after: int, why: str, **data: Any) -> Reason:
    """scale_up / scale_down with the numbers used."""
    code = "scale_up" if after > before else "scale_down"
    return reason(code, pool, f"{before}→{after}: {why}", before=before, after=after, **data)


# --------------------------------------------------------------------------- sample windows


def push_sample(samples: Samples, t_s: float, v: float, keep_s: float) -> Samples:
    """Append (t_s, v) and drop samples older than keep_s (a new tuple; the old one is untouched)."""
    cutoff = t_s - keep_s
    kept = tuple(s for s in samples if s[0] > cutoff and s[0] < t_s)
    return kept + ((t_s, v),)


def window_values(samples: Samples, now_s: float, window_s: float) -> list[float]:
    """Values of samples taken in (now_s - window_s, now_s]."""
    lo = now_s - window_s
    return [v for t, v in samples if lo < t <= now_s]


def window_mean(samples: Samples, now_s: float, window_s: float) -> float | None:
    """Mean of the samples in the window, None when the window holds none.

    Samples are taken once per tick, so with regular ticks the plain mean equals the
    time-weighted mean. Example: ticks every 15 s, values 40, 60, 80, 100 at 15, 30,
    45, 60 s; a 60 s window at 60 s averages all four → 70; a 6 s window → 100.
    """
    vs = window_values(samples, now_s, window_s)
    return sum(vs) / len(vs) if vs else None


def slope_per_s(samples: Samples, now_s: float, window_s: float, min_span_s: float = 0.0) -> float | None:
    """Least-squares slope (value per second) of the samples in the window; None with < 2 samples
    or when they span less than `min_span_s` (a trend read off a few seconds is noise).

    Example: waiting 0, 10, 20 at t = 0, 15, 30 → 0.667 requests/s.
    """
    pts = [(t, v) for t, v in samples if now_s - window_s < t <= now_s]
    if len(pts) < 2 or pts[-1][0] - pts[0][0] < min_span_s:
        return None
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mv = sum(v for _, v in pts) / n
    den = sum((t - mt) ** 2 for t, _ in pts)
    if den <= 0:
        return None
    return sum((t - mt) * (v - mv) for t, v in pts) / den


# --------------------------------------------------------------------------- HPA stabilisation and rate limits


def stabilise(recommendations: Events, now_s: float, desired: int, current: int,
              up_window_s: float, down_window_s: float) -> tuple[int, Events]:
    """Kubernetes HPA stabilisation (autoscaling/v2 behavior), as in the HPA controller.

    The result stays between the *lowest* recommendation of the scale-up window and
    the *highest* recommendation of the scale-down window (both windows include the
    new one); the unstabilised recommendation is recorded. Example with the default
    windows (up 0 s, down 300 s), current 10: recommendations 10 at t=0, 6 at t=60,
    4 at t=120 → at t=120 the result is max(10, 6, 4) = 10; at t=301 the t=0 entry
    has left the window → max(6, 4) = 6.
    """
    up_cut = now_s - up_window_s
    down_cut = now_s - down_window_s
    up_rec = desired
    down_rec = desired
    for t, n in recommendations:
        if t > up_cut:
            up_rec = min(up_rec, n)
        if t > down_cut:
            down_rec = max(down_rec, n)
    out = current
    if out < up_rec:
        out = up_rec
    if out > down_rec:
        out = down_rec
    keep = max(up_window_s, down_window_s)
    kept = tuple((t, n) for t, n in recommendations if t > now_s - keep)
    return out, kept + ((now_s, desired),)


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """One HPA scaling policy: at most `value` pods (kind "pods") or percent (kind "percent") per period."""

    kind: str
    value: float
    period_s: float

    def __post_init__(self) -> None:
        if self.kind not in ("pods", "percent"):
            raise ValueError(f"scaling policy kind must be 'pods' or 'percent' (got {self.kind!r})")
        if not (math.isfinite(self.value) and self.value > 0):
            raise ValueError(f"scaling policy value must be > 0 (got {self.value})")
        if not (math.isfinite(self.period_s) and self.period_s > 0):
            raise ValueError(f"scaling policy period_s must be > 0 (got {self.period_s})")


def _change_in_period(events: Events, now_s: float, period_s: float) -> int:
    cut = now_s - period_s
    return sum(n for t, n in events if t > cut)


def scale_up_limit(current: int, up_events: Events, down_events: Events, policies: Iterable[ScalingPolicy],
                   now_s: float, select: str = "max") -> int:
    """Highest count the HPA scale-up policies allow now.

    Each policy is measured from the replica count at the start of its period; with
    select "max" the most permissive policy wins. Default policies (4 pods or 100 %
    per 15 s), current 2 and no recent scale-up: max(2 + 4, ceil(2 × 2)) = 6.
    """
    best: int | None = None
    for p in policies:
        start = (current - _change_in_period(up_events, now_s, p.period_s)
                 + _change_in_period(down_events, now_s, p.period_s))
        proposed = start + int(p.value) if p.kind == "pods" else math.ceil(start * (1 + p.value / 100.0) - _CEIL_EPS)
        best = proposed if best is None else (max(best, proposed) if select == "max" else min(best, proposed))
    return max(current, best) if best is not None else current


def scale_down_limit(current: int, up_events: Events, down_events: Events, policies: Iterable[ScalingPolicy],
                     now_s: float, select: str = "max") -> int:
    """Lowest count the HPA scale-down policies allow now.

    Default policy (100 % per 15 s): start × (1 - 1.0) = 0, i.e. no limit but the pool minimum.
    """
    best: int | None = None
    for p in policies:
        start = (current - _change_in_period(up_events, now_s, p.period_s)
                 + _change_in_period(down_events, now_s, p.period_s))
        proposed = start - int(p.value) if p.kind == "pods" else int(start * (1 - p.value / 100.0))
        best = proposed if best is None else (min(best, proposed) if select == "max" else max(best, proposed))
    return min(current, best) if best is not None else current


def record_event(events: Events, now_s: float, change: int, keep_s: float) -> Events:
    """Record a scale event (positive count) and forget those older than keep_s."""
    kept = tuple((t, n) for t, n in events if t > now_s - keep_s)
    return kept + ((now_s, change),) if change > 0 else kept


# --------------------------------------------------------------------------- parameter checks


def check_frac(name: str, v: float, *, lo_open: bool = True) -> float:
    f = check_positive(name, v, allow_zero=not lo_open)
    if f > 1:
        raise ValueError(f"{name} must be in {'(0' if lo_open else '[0'}, 1] (got {v!r})")
    return f


def check_choice(name: str, v: str, choices: Iterable[str]) -> str:
    cs = tuple(choices)
    if v not in cs:
        raise ValueError(f"{name} must be one of {list(cs)} (got {v!r})")
    return v
