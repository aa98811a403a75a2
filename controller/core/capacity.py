"""Capacity that never comes: a pool whose new replicas stay pending past their start-up time.

The autoscaler reports replicas it asked for that have not started within the pool's cold start-up
time (no GPU to schedule on, a quota, an image that cannot be pulled) as `unavailable`
(controller/actuation/kube.py; the simulator's `Fleet.set_capacity`); they are not counted as
starting (core/estimate.py takes `starting` as reported), so the estimate does not wait for them.

`advance_capacity` then holds the pool at what it has (ready + starting) for a backoff: during the
hold the planner sees the pool's `max_replicas` lowered to that (`capped_fleet`), so it puts the
demand on the other pools of its route group (another SKU of the same model) and says so with the
reason `capacity_unavailable`. When the hold ends the cap lifts and the planner may ask the pool
again; if the replicas are still not coming the next hold is twice as long (up to
MAX_BACKOFF_S). The backoff starts at the pool's cold start-up time: asking again sooner could not
tell anything new (a replica needs that long to show it came). It resets once the pool runs more
ready replicas than it was held at: the capacity came.

Pure: the autoscaler's report and the time come in; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from controller.types import FleetSpec, PoolPhases, Reason

MAX_BACKOFF_S = 1800.0  # half an hour: a pool whose GPUs return is asked again within that


@dataclass(frozen=True, slots=True)
class CapacityHold:
    cap: int  # the pool's replicas are held at this (what it had ready and starting)
    until_s: float  # then the cap lifts and the pool may be asked again
    backoff_s: float
    unavailable: int  # replicas reported not coming when the hold began


@dataclass(frozen=True, slots=True)
class CapacityState:
    holds: Mapping[str, CapacityHold] = field(default_factory=dict)
    next_backoff_s: Mapping[str, float] = field(default_factory=dict)
    held_at: Mapping[str, int] = field(default_factory=dict)  # the last hold's cap, until the pool runs more


def advance_capacity(state: CapacityState, fleet: FleetSpec, fleet_state: Mapping[str, PoolPhases] | None,
                     now_s: float) -> tuple[CapacityState, tuple[Reason, ...]]:
    """Start, keep or end each pool's hold from the autoscaler's report; the reasons name each held pool."""
    holds = dict(state.holds)
    backoff = dict(state.next_backoff_s)
    held_at = dict(state.held_at)
    reasons: list[Reason] = []
    for spec in fleet.pools:
        ps = (fleet_state or {}).get(spec.name)
        stuck = int(getattr(ps, "unavailable", 0) or 0) if ps is not None else 0
        hold = holds.get(spec.name)
        if hold is not None and now_s >= hold.until_s:
            del holds[spec.name]  # retry: the planner may ask the pool again
            hold = None
        if hold is None and stuck > 0 and ps is not None:
            b = backoff.get(spec.name, spec.startup_cold_s)
            hold = CapacityHold(cap=int(ps.ready + ps.starting), until_s=now_s + b, backoff_s=b, unavailable=stuck)
            holds[spec.name] = hold
            backoff[spec.name] = min(2.0 * b, MAX_BACKOFF_S)
            held_at[spec.name] = hold.cap
        elif hold is None and ps is not None and stuck == 0 and ps.ready > held_at.get(spec.name, ps.ready):
            backoff.pop(spec.name, None)  # the capacity came: the next shortage starts afresh
            held_at.pop(spec.name, None)
        if hold is not None:
            others = [p.name for p in fleet.pools if p.group == spec.group and p.name != spec.name
                      and p.name not in holds]
            reasons.append(Reason(
                "capacity_unavailable",
                f"{spec.name}: {hold.unavailable} replica(s) asked for are not coming (pending past the "
                f"{spec.startup_cold_s:g} s start-up); held at {hold.cap} until t={hold.until_s:.0f} "
                f"(backoff {hold.backoff_s:g} s), demand goes to " + (", ".join(others) or "no other pool of its "
                                                                    "group"),
                pool=spec.name,
                data={"unavailable": hold.unavailable, "held_at": hold.cap, "retry_at_s": hold.until_s,
                      "backoff_s": hold.backoff_s, "elsewhere": others}))
    return CapacityState(holds, backoff, held_at), tuple(reasons)


def capped_fleet(fleet: FleetSpec, state: CapacityState) -> FleetSpec:
    """The fleet the planner sees: each held pool's max_replicas (and min_replicas) at most its hold's cap."""
    if not state.holds:
        return fleet
    pools = []
    for p in fleet.pools:
        h = state.holds.get(p.name)
        if h is not None:
            cap = max(0, h.cap)
            p = replace(p, max_replicas=min(p.max_replicas, cap), min_replicas=min(p.min_replicas, cap))
        pools.append(p)
    return replace(fleet, pools=tuple(pools))
