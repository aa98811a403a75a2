"""The MPC policy's feedback layer: a measured backlog raises a pool's replica floor within one tick,
whatever the planner's model predicts.

A plan is only as good as its model and forecast; a surge the forecaster has not seen yet, or a
replica slower than its figures, shows first in telemetry. This layer reads it there, the way
Knative's panic window does (a short-window measurement overrides the stable one, and no
scale-down happens while it lasts): per pool, every tick,

  breach   a standing queue (more requests waiting in the engines than replicas ready: vLLM queues
           only what it cannot schedule, so one per replica is the step in between; see
           `standing_queue`) while the pool's p95 TTFT or per-request TPOT is above the loosest SLO
           of the protected classes (critical, standard). The queue says the pool lacks capacity
           (not a long prompt); the p95 past even the standard SLO says the lack is hurting now,
           not a queue the engine works off within the SLO (long prompts keep a few waiting in
           steady state, and a burst's queue may be gone within the window).
  served   the rate the pool served over the last tick, by conservation of requests:
           served = arrivals − Δwaiting / Δt (the running batches are full while a queue stands,
           so their count does not change much); per ready replica, the capacity the pool shows
           at today's mix. Never below `MIN_SERVED_FRAC` of arrivals: one window's queue jump from
           a burst is not a collapse of service.
  floor    the replicas that serve today's arrivals and work off the backlog, as it will stand when
           a replica ordered now is up (it grows by arrivals − served through the start-up), within
           `BACKLOG_DRAIN_S`:
               floor = ceil((arrivals + (waiting + (arrivals − served) × startup) / drain) / per_replica)
           capped at max(2 × serving, serving + 4) per tick (the HPA's default scale-up policy,
           100 % or 4 pods: a far-saturated pool's windowed readings lag, the next tick measures again).
  shed     while the replicas ready cannot serve the arrivals, the deficit (arrivals − capacity of
           the ready replicas, req/s, summed over the breached pools) is a floor on the sheddable
           class's shed fraction until the floors' replicas are up: shedding the class that may be
           shed keeps the queue from growing for the classes that may not. Never standard or
           critical (that stays with the planner and the breaker's stages).

Example: 2 ready, 15 req/s arriving, 141 waiting, 22 a tick (15 s) ago → served 15 − 119/15 = 7.1
req/s, 3.6 per replica; cold start 20 s: backlog then 141 + 7.9 × 20 = 299, drained in 60 s = 5 req/s;
floor ceil((15 + 5) / 3.6) = 6, capped at max(4, 6) = 6. Deficit 15 − 7.1 = 7.9 req/s; with 10 req/s
of sheddable arriving, shed ≥ 0.79 of it.

The floors enter the planning problem as lower replica bounds (the planner then plans routing,
caps and admission around them) and the scale-down stabilisation holds them like any plan.

Must not: do I/O or read a clock; plan (the solver does) or shed beyond the sheddable class.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from controller.core.estimate import standing_queue
from controller.policies.common import value
from controller.policies.mpc.memory import MpcPoolMemory
from controller.types import FleetObservation, FleetSpec

# A backlog should be gone within one telemetry window once the capacity for it is up: a window's
# p95 still holds every request that waited in it, so a backlog lasting longer keeps the next
# window late too. 60 s is the bench's and the example config's window.
BACKLOG_DRAIN_S = 60.0
# The served rate is measured from one tick's queue change; a burst can add a window's worth of
# requests to the queue in one tick without service falling. Service never reads below this share
# of arrivals (the floor is then at most 1/0.25 = 4× the serving replicas, and capped per tick anyway).
MIN_SERVED_FRAC = 0.25
# The HPA's default scale-up policy: at most double, or four replicas more, per period.
STEP_UP_FACTOR = 2.0
STEP_UP_REPLICAS = 4
SHEDDABLE = "sheddable"
PROTECTED = ("critical", "standard")  # the classes a breach is judged by (the breaker protects the same)


@dataclass(frozen=True)
class PoolBreach:
    """One pool's measured backlog and the floor it sets."""

    floor: int
    arrivals_rps: float
    served_rps: float
    waiting: float


@dataclass(frozen=True)
class Feedback:
    """This tick's floors (pool → replicas), the sheddable shed floor, and what was measured."""

    floors: Mapping[str, int] = field(default_factory=dict)
    min_shed: Mapping[str, float] = field(default_factory=dict)
    breaches: Mapping[str, PoolBreach] = field(default_factory=dict)
    waiting: Mapping[str, float] = field(default_factory=dict)  # for the next tick's served rate


def measure(obs: FleetObservation, fleet: FleetSpec, mem: Mapping[str, MpcPoolMemory],
            last_waiting: Mapping[str, float], dt_s: float | None, class_share: Mapping[str, float],
            fleet_arrivals_rps: float | None) -> Feedback:
    """The floors and the shed floor this tick's telemetry calls for (see the module docstring)."""
    floors: dict[str, int] = {}
    breaches: dict[str, PoolBreach] = {}
    waiting_now: dict[str, float] = {}
    deficit = 0.0
    protected = [fleet.slos[c] for c in PROTECTED if c in fleet.slos] or list(fleet.slos.values())
    ttft_slo = max((s.ttft_s for s in protected), default=math.inf)
    tpot_slo = max((s.tpot_s for s in protected), default=math.inf)
    for spec in fleet.pools:
        po = obs.pools.get(spec.name)
        if po is None:
            continue
        ready, waiting, arr = value(po.replicas_ready), value(po.waiting), value(po.arrival_rps)
        if waiting is not None:
            waiting_now[spec.name] = waiting
        if ready is None or ready < 1 or waiting is None or arr is None or arr <= 0:
            continue
        if not standing_queue(waiting, ready):
            continue
        ttft, tpot = value(po.ttft_p95_s), value(po.request_tpot_p95_s)
        if not ((ttft is not None and ttft > ttft_slo) or (tpot is not None and tpot > tpot_slo)):
            continue
        before = last_waiting.get(spec.name)
        growth = (waiting - before) / dt_s if before is not None and dt_s and dt_s > 0 else 0.0
        served = max(arr - growth, MIN_SERVED_FRAC * arr)
        per_replica = served / ready
        m = mem.get(spec.name)
        serving = m.serving if m is not None and m.serving is not None else int(round(ready))
        startup = spec.startup_cold_s
        backlog_then = waiting + max(arr - served, 0.0) * startup
        need = (arr + backlog_then / BACKLOG_DRAIN_S) / max(per_replica, 1e-9)
        cap = max(math.ceil(STEP_UP_FACTOR * serving), serving + STEP_UP_REPLICAS)
        floor = min(math.ceil(need - 1e-9), cap, spec.max_replicas)
        short = max(arr - served, 0.0)
        deficit += short
        breaches[spec.name] = PoolBreach(floor=floor, arrivals_rps=arr, served_rps=served, waiting=waiting)
        if floor > serving:
            floors[spec.name] = floor
    min_shed: dict[str, float] = {}
    share = class_share.get(SHEDDABLE, 0.0)
    if deficit > 0 and share > 0 and fleet_arrivals_rps and fleet_arrivals_rps > 0 and SHEDDABLE in fleet.slos:
        min_shed[SHEDDABLE] = min(1.0, deficit / (share * fleet_arrivals_rps))
    return Feedback(floors=floors, min_shed=min_shed, breaches=breaches, waiting=waiting_now)


__all__ = ["BACKLOG_DRAIN_S", "Feedback", "PoolBreach", "measure"]
