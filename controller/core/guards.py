"""Guardrails: applied after every policy, never bypassed (pure).

Order of application, each adjustment recorded as a Reason with a `guard_` code:

1. telemetry freeze: when every series is stale the last safe decision is held (the
   operator's overrides, pool bounds and step limits still apply to it);
2. missing data: a pool whose signals are missing or partial is never scaled down;
3. operator overrides: freeze (hold the pool), pin, min, max, forced admission;
4. the pool's min/max replicas;
5. max step up / down per tick;
6. scale-down stabilisation: the target never drops below the highest proposal
   of the last `scale_down_stabilization_s` (as the Kubernetes HPA does);
7. budget cap in $/hour: scale-ups are trimmed, most expensive pool first, until
   the fleet's hourly cost fits (scale-downs and pins are kept).

Two more, added for the MPC planner (both off by default, so other policies see no change):

- low model confidence (`min_confidence`): when the policy reports a confidence below it
  (PolicyOutput.confidence, 0..1), the last safe decision is held in the
  unsafe direction: no scale-down and the routing/batching levers in force are kept; a
  scale-up and admission (shedding) still pass, since they only add protection;
- drain before removal (`max_concurrent_drains`): a pool never has more than this many
  replicas draining at once; a scale-down that would exceed it waits for running streams
  to finish on the replicas already draining (a drain never cuts a streaming request; this
  bounds how much capacity and cache leave at once).

Removal itself is a drain on the actuator side (the simulator and adapters finish
running streams before a replica goes); guardrails only decide how many.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from controller.types import (
    ClassAdmission,
    FleetObservation,
    FleetSpec,
    Override,
    PoolDecision,
    PoolObservation,
    PoolSpec,
    Reason,
    TenantLimits,
)


@dataclass(frozen=True, slots=True)
class GuardConfig:
    max_step_up: int | None = None  # replicas added per pool per tick; None = unlimited
    max_step_down: int | None = None  # replicas removed per pool per tick; None = unlimited
    scale_down_stabilization_s: float = 0.0
    budget_usd_per_hour: float | None = None
    min_confidence: float = 0.0  # hold the last safe decision below this model confidence (0 = never)
    max_concurrent_drains: int | None = None  # replicas draining at once per pool; None = unlimited

    def __post_init__(self) -> None:
        if not (isinstance(self.min_confidence, (int, float)) and 0.0 <= self.min_confidence <= 1.0):
            raise ValueError(f"guards.min_confidence must be in [0, 1] (got {self.min_confidence!r})")
        if self.max_concurrent_drains is not None and (
                isinstance(self.max_concurrent_drains, bool) or not isinstance(self.max_concurrent_drains, int)
                or self.max_concurrent_drains < 1):
            raise ValueError(f"guards.max_concurrent_drains must be an integer >= 1 or None "
                             f"(got {self.max_concurrent_drains!r})")


@dataclass(frozen=True, slots=True)
class GuardState:
    # per pool: (time, proposed replicas) within the stabilisation window
    proposals: Mapping[str, tuple[tuple[float, int], ...]] = ()  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if not isinstance(self.proposals, Mapping):
            object.__setattr__(self, "proposals", {})


@dataclass(frozen=True, slots=True)
class GuardResult:
    pools: Mapping[str, PoolDecision]
    admission: Mapping[str, ClassAdmission]
    adjustments: tuple[Reason, ...]
    frozen: bool
    state: GuardState


def pool_telemetry_status(obs: PoolObservation | None) -> str:
    """ok | partial | missing | stale, from the signals scaling depends on."""
    if obs is None:
        return "missing"
    core = (obs.replicas_ready, obs.arrival_rps, obs.ttft_p95_s, obs.running, obs.waiting)
    statuses = [r.status.value for r in core]
    # No traffic in the window: a latency quantile of nothing is NaN, and that is not missing data.
    idle = obs.arrival_rps.ok and obs.arrival_rps.value <= 1e-9
    if idle and statuses[2] == "nan":
        statuses[2] = "ok"
    if all(s == "ok" for s in statuses):
        return "ok"
    if all(s == "stale" for s in statuses):
        return "stale"
    if all(s in ("missing", "nan", "stale") for s in statuses):
        return "missing"
    return "partial"


def _active(overrides: tuple[Override, ...], now_s: float) -> list[Override]:
    return [o for o in overrides if o.active(now_s)]


def apply_guards(
    *,
    now_s: float,
    fleet: FleetSpec,
    proposal: Mapping[str, PoolDecision],
    admission: Mapping[str, ClassAdmission],
    current: Mapping[str, PoolDecision] | None,
    observation: FleetObservation,
    overrides: tuple[Override, ...],
    config: GuardConfig,
    state: GuardState,
    confidence: float | None = None,
    current_admission: Mapping[str, ClassAdmission] | None = None,
) -> GuardResult:
    """The guarded decision. `current_admission` is the admission in force (held while frozen; None: the
    proposal's)."""
    adjustments: list[Reason] = []
    current = current or {}
    active = _active(overrides, now_s)
    unsure = (confidence is not None and config.min_confidence > 0 and confidence < config.min_confidence
              and bool(current))

    def adjust(pool: str, n: int, new_n: int, code: str, msg: str, **data: Any) -> int:
        """Pool's replicas n → new_n, with a reason when that changes them."""
        if new_n != n:
            adjustments.append(Reason(code, msg, pool=pool, data={"from": n, "to": new_n, **data}))
        return new_n

    # 1. everything stale: hold the last safe decision as a whole (replicas, levers and admission in
    # force), but the operator's overrides still apply: an operator reaching for pin, floor, ceiling,
    # freeze or forced admission is most likely to do so exactly when telemetry is down.
    if observation.all_stale and current:
        adjustments.append(Reason("guard_telemetry_frozen",
                                  "all telemetry is stale or missing: holding the last safe decision"))
        held = dict(current)
        for spec in fleet.pools:
            base = current.get(spec.name)
            if base is None:
                continue
            pool_ovr = [o for o in active if o.pool == spec.name]
            freeze = next((o for o in pool_ovr if o.kind == "freeze"), None)
            if freeze is not None:
                adjustments.append(Reason("guard_override_freeze",
                                          f"frozen by {freeze.author}: {freeze.reason or 'no reason given'}",
                                          pool=spec.name, data={"override_id": freeze.override_id}))
                continue
            n = _override_replicas(spec.name, base.replicas, pool_ovr, adjust)
            n = _bounded(spec, base.replicas, n, config, adjust)
            held[spec.name] = replace(base, replicas=n)
        in_force = dict(current_admission) if current_admission is not None else dict(admission)
        return GuardResult(held, _forced_admission(in_force, active, adjustments), tuple(adjustments), True, state)

    out: dict[str, PoolDecision] = {}
    proposals = dict(state.proposals)

    for spec in fleet.pools:
        name = spec.name
        base = current.get(name)
        want = proposal.get(name) or base or PoolDecision(replicas=spec.min_replicas)
        cur_n = base.replicas if base is not None else None
        n = want.replicas

        # 2. never scale down on missing or partial data.
        status = pool_telemetry_status(observation.pools.get(name))
        if cur_n is not None and n < cur_n and status != "ok":
            n = adjust(name, n, cur_n, "guard_missing_data_hold", f"telemetry {status}: not scaling down",
                       telemetry=status)

        # 2b. low model confidence: hold the last safe decision in the unsafe direction.
        if unsure and base is not None:
            if cur_n is not None and n < cur_n:
                n = adjust(name, n, cur_n, "guard_low_confidence_hold",
                           f"model confidence {confidence:.2f} < {config.min_confidence:g}: not scaling down",
                           confidence=confidence)
            levers = replace(base, replicas=want.replicas, warm_standby=max(want.warm_standby, base.warm_standby))
            if levers != want:
                adjustments.append(Reason("guard_low_confidence_hold",
                                          f"model confidence {confidence:.2f} < {config.min_confidence:g}: "
                                          "routing and batching levers held", pool=name,
                                          data={"confidence": confidence}))
                want = levers

        # 2c. drain before removal: at most max_concurrent_drains replicas leaving at once.
        if config.max_concurrent_drains is not None and cur_n is not None and n < cur_n:
            obs_p = observation.pools.get(name)
            draining = obs_p.replicas_draining.value if obs_p is not None and obs_p.replicas_draining.ok else 0.0
            room = max(0, config.max_concurrent_drains - int(round(draining)))
            if n < cur_n - room:
                n = adjust(name, n, cur_n - room, "guard_drain_in_progress",
                           f"{int(round(draining))} replica(s) still draining: at most "
                           f"{config.max_concurrent_drains} leave at once", draining=draining)

        # 3. overrides (freeze wins over everything for this pool).
        pool_ovr = [o for o in active if o.pool == name]
        if any(o.kind == "freeze" for o in pool_ovr) and base is not None:
            o = next(o for o in pool_ovr if o.kind == "freeze")
            adjustments.append(Reason("guard_override_freeze",
                                      f"frozen by {o.author}: {o.reason or 'no reason given'}",
                                      pool=name, data={"override_id": o.override_id}))
            out[name] = base
            proposals[name] = tuple(p for p in proposals.get(name, ())
                                    if now_s - p[0] < config.scale_down_stabilization_s)
            continue
        n = _override_replicas(name, n, pool_ovr, adjust)
        pinned = any(o.kind == "pin_replicas" for o in pool_ovr)

        # 4. pool bounds (a pin may not leave them either); 5. step limits (pins still step gradually).
        n = _bounded(spec, cur_n, n, config, adjust)

        # 6. scale-down stabilisation over the policy's proposals (not over pins).
        window = config.scale_down_stabilization_s
        hist = [p for p in proposals.get(name, ()) if now_s - p[0] < window] if window > 0 else []
        hist.append((now_s, n))
        proposals[name] = tuple(hist)
        if window > 0 and cur_n is not None and n < cur_n and not pinned:
            highest = max(v for _, v in hist)
            floor = min(cur_n, highest)
            if n < floor:
                n = adjust(name, n, floor, "guard_scale_down_stabilisation",
                           f"highest proposal in the last {window:g} s is {highest}", window_s=window)
        out[name] = replace(want, replicas=n)

    # 7. budget cap: trim scale-ups, most expensive replica first.
    if config.budget_usd_per_hour is not None:
        prices = {p.name: p.usd_per_replica_hour for p in fleet.pools}
        total = sum(prices[p] * d.replicas for p, d in out.items())
        if total > config.budget_usd_per_hour + 1e-9:
            for name in sorted(out, key=lambda p: -prices[p]):
                cur_n = current[name].replicas if name in current else fleet.pool(name).min_replicas
                extra = out[name].replicas - cur_n
                if extra <= 0 or prices[name] <= 0:
                    continue
                over = total - config.budget_usd_per_hour
                cut = min(extra, math.ceil(over / prices[name] - 1e-9))
                new_n = out[name].replicas - cut
                adjustments.append(Reason("guard_budget_cap",
                                          f"scale-up trimmed to stay within ${config.budget_usd_per_hour:g}/h",
                                          pool=name, data={"from": out[name].replicas, "to": new_n}))
                out[name] = replace(out[name], replicas=new_n)
                total -= cut * prices[name]
                if total <= config.budget_usd_per_hour + 1e-9:
                    break

    return GuardResult(out, _forced_admission(dict(admission), active, adjustments), tuple(adjustments), False,
                       GuardState(proposals))


def _override_replicas(name: str, n: int, pool_ovr: Sequence[Override], adjust: Callable[..., int]) -> int:
    """Step 3 without freeze: the pool's pin, floor and ceiling overrides applied to `n`."""
    for o in pool_ovr:
        v = int(round(o.value))
        if o.kind == "pin_replicas":
            n = adjust(name, n, v, "guard_override_pin", f"pinned to {v} by {o.author}",
                       override_id=o.override_id)
        elif o.kind == "min_replicas" and n < v:
            n = adjust(name, n, v, "guard_override_min", f"floor {v} set by {o.author}",
                       override_id=o.override_id)
        elif o.kind == "max_replicas" and n > v:
            n = adjust(name, n, v, "guard_override_max", f"ceiling {v} set by {o.author}",
                       override_id=o.override_id)
    return n


def _bounded(spec: PoolSpec, cur_n: int | None, n: int, config: GuardConfig, adjust: Callable[..., int]) -> int:
    """Steps 4 and 5: the pool's min/max replicas, then the per-tick step limits from `cur_n`."""
    name = spec.name
    if n < spec.min_replicas:
        n = adjust(name, n, spec.min_replicas, "guard_min_replicas",
                   f"raised to the pool minimum {spec.min_replicas}")
    if n > spec.max_replicas:
        n = adjust(name, n, spec.max_replicas, "guard_max_replicas",
                   f"capped at the pool maximum {spec.max_replicas}")
    if cur_n is not None:
        if config.max_step_up is not None and n > cur_n + config.max_step_up:
            n = adjust(name, n, cur_n + config.max_step_up, "guard_max_step_up",
                       f"at most +{config.max_step_up} per tick")
        if config.max_step_down is not None and n < cur_n - config.max_step_down:
            n = adjust(name, n, cur_n - config.max_step_down, "guard_max_step_down",
                       f"at most -{config.max_step_down} per tick")
    return n


def _forced_admission(adm: dict[str, ClassAdmission], active: Sequence[Override],
                      adjustments: list[Reason]) -> dict[str, ClassAdmission]:
    """The operator's forced admission levels over `adm`, each with a reason."""
    for o in active:
        if o.kind == "admission" and o.priority_class:
            prev = adm.get(o.priority_class, ClassAdmission())
            adm[o.priority_class] = replace(prev, shed_frac=min(1.0, max(0.0, o.value)))
            adjustments.append(Reason("guard_override_admission",
                                      f"{o.priority_class} shed fraction forced to {o.value:g} by {o.author}",
                                      data={"override_id": o.override_id, "class": o.priority_class}))
    return adm


# override kind → the TenantLimits field it sets (the lever table's tenant levers, controller/levers.py)
TENANT_OVERRIDES = {"tenant_rate_limit": "rate_limit_rps", "tenant_max_inflight": "max_inflight",
                    "tenant_weight": "weight"}


def forced_tenants(tenants: Mapping[str, TenantLimits], step_aware: bool | None, active: Sequence[Override]
                   ) -> tuple[dict[str, TenantLimits], bool | None, tuple[Reason, ...]]:
    """The operator's tenant limits and step admission over the policy's (`tenants`, `step_aware`), each with a
    reason; overrides apply in the order they were set (a later one wins). An override sets one limit of a tenant
    (its text) and keeps the tenant's other limits as the policy left them, else unlimited and weight 1: the
    router then has these limits for the tenant in place of its own while the override lasts."""
    out = dict(tenants)
    reasons: list[Reason] = []
    for o in active:
        fld = TENANT_OVERRIDES.get(o.kind)
        if fld is not None and o.text:
            prev = out.get(o.text, TenantLimits())
            v: float = float(o.value)
            if fld == "max_inflight":
                out[o.text] = replace(prev, max_inflight=int(round(o.value)))
            elif fld == "weight":
                out[o.text] = replace(prev, weight=v)
            else:
                out[o.text] = replace(prev, rate_limit_rps=v)
            reasons.append(Reason("guard_override_tenant", f"tenant {o.text} {fld} forced to {v:g} by {o.author}",
                                  data={"override_id": o.override_id, "tenant": o.text, "field": fld}))
        elif o.kind == "step_admission" and o.text in ("aware", "blind"):
            step_aware = o.text == "aware"
            reasons.append(Reason("guard_override_step_admission", f"step admission forced {o.text} by {o.author}",
                                  data={"override_id": o.override_id}))
    return out, step_aware, tuple(reasons)


def override_bounds(spec: PoolSpec, overrides: Sequence[Override], now_s: float) -> tuple[int, int, bool]:
    """(lo, hi, frozen): the replica range the operator's active overrides leave a pool, within its
    min/max. A pin sets both ends; a floor or ceiling moves one without crossing the other. The
    planner plans inside this range and the breaker's floors stay inside it; `guard` applies the
    same overrides to the final count, with a reason each. Example: min 1, max 8, floor 3 and
    ceiling 2 → (3, 3, False)."""
    lo, hi = spec.min_replicas, spec.max_replicas
    frozen = False
    for o in overrides:
        if o.pool != spec.name or not o.active(now_s):
            continue
        v = int(round(o.value))
        if o.kind == "pin_replicas":
            lo = hi = min(max(v, spec.min_replicas), spec.max_replicas)
        elif o.kind == "min_replicas":
            lo = max(lo, min(v, hi))
        elif o.kind == "max_replicas":
            hi = max(min(hi, v), lo)
        elif o.kind == "freeze":
            frozen = True
    return lo, hi, frozen
