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

What each policy estimates for itself from its own memory (the MPC's replica ETAs, warm slots,
demand history, reuse and corrections: controller/policies/mpc/memory.py) stays with the policy:
it depends on the policy's parameters and on the levers it pulled.

Must not: do I/O, read a clock (time is `now_s`), or import an edge; it never invents a reading the
telemetry or the autoscaler did not give.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from controller.types import Decision, FleetObservation, PoolObservation, PoolPhases, PoolSpec, Reading


@dataclass(frozen=True, slots=True)
class Estimate:
    """The fleet as the controller takes it at `at_s`."""

    at_s: float
    observation: FleetObservation  # telemetry with the autoscaler's replica phases merged in
    scaled_to_zero: tuple[str, ...] = ()  # pools read as 0 ready because the autoscaler reports no replica


def estimate(previous: Estimate | None, observation: FleetObservation,
             fleet_state: Mapping[str, PoolPhases] | None, now_s: float) -> Estimate:
    """Merge the autoscaler's replica phases (`fleet_state`, per pool; None or empty when unknown)
    into `observation`. `previous` is the last tick's estimate (None on the first tick); the merge
    itself needs no memory.

    Example: the autoscaler reports pool a with 0 ready, 0 starting, 0 draining and the telemetry
    has no `replicas_ready` for it → a reads 0 ready, 0 starting, 0 draining; with 1 starting instead
    → `replicas_ready` stays missing and `replicas_starting` reads 1.
    """
    del previous  # the merge is stateless; the slot is here for estimator state that is fleet-wide
    if not fleet_state:
        return Estimate(at_s=now_s, observation=observation)
    pools = dict(observation.pools)
    zero: list[str] = []
    for name, ps in fleet_state.items():
        p = pools.get(name) or PoolObservation(pool=name)
        p = replace(p, replicas_starting=Reading(float(ps.starting)), replicas_draining=Reading(float(ps.draining)))
        if not p.replicas_ready.ok and ps.ready == 0 and ps.starting == 0 and ps.draining == 0:
            p = replace(p, replicas_ready=Reading(0.0))
            zero.append(name)
        pools[name] = p
    return Estimate(at_s=now_s, observation=replace(observation, pools=pools), scaled_to_zero=tuple(zero))


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
