"""Apply a controller Decision to an in-process simulated Fleet (the bench's actuator).

Maps each PoolDecision to `Fleet.set_pool_routing` + `Fleet.set_pool_target`
(engine caps of 0 mean "leave unchanged"), its slow replicas to `Fleet.set_ejected` and
`Fleet.replace_replicas`, each ClassAdmission to `Fleet.set_admission` and the decision's
step_aware to `Fleet.set_step_aware`. Everything is validated before anything is applied, so a
bad decision (unknown pool or class, value out of range) raises ValueError and leaves the fleet
as it was.

Must not: decide anything, read the wall clock, or talk to the network (the live
simulator's gRPC adapter lives in control_plane.py).
"""

from __future__ import annotations

from typing import Any

from controller.levers import Lever, Speed, admission_levers, check_levers, routing_levers, target_levers
from controller.sim.fleet import Fleet
from controller.types import PRIORITY_CLASSES, ClassAdmission, Decision


def _values(levers: tuple[Lever, ...], d: object) -> dict[str, Any]:
    """The decision's value of each lever, as the lever's kind; a target lever's "unchanged" value (0) as None."""
    out: dict[str, Any] = {}
    for lv in levers:
        v = lv.kind(getattr(d, lv.field))
        out[lv.name] = None if lv.speed is not Speed.INSTANT and lv.unset is not None and v == lv.unset else v
    return out


def apply_decision(fleet: Fleet, decision: Decision) -> None:
    """Validate the whole decision, then apply it: every lever of the table (controller/levers.py)."""
    _validate(fleet, decision)
    for name, d in decision.pools.items():
        fleet.set_pool_routing(name, **_values(routing_levers(), d))
        fleet.set_pool_target(name, **_values(target_levers(), d))
        fleet.set_ejected(name, d.ejected)  # slow replicas (not levers: per replica, controller/core/outliers.py)
        if d.replace:
            fleet.replace_replicas(name, d.replace)
    # Every class, as the gRPC actuator sends it: a class the decision leaves out gets the default
    # (no limit), so a policy can release shedding (Controller.step drops default entries).
    for cls in PRIORITY_CLASSES:
        fleet.set_admission(cls, **_values(admission_levers(), decision.admission.get(cls, ClassAdmission())))
    # step-aware admission: the decision's, or the scenario's own when it says nothing (as the picker keeps its flag).
    # Tenant limits are the picker's only (the lever table's carriers): the simulated router has no tenant limits.
    fleet.set_step_aware(decision.step_aware)


def _validate(fleet: Fleet, decision: Decision) -> None:
    where = f"decision {decision.decision_id!r}"
    for name, d in decision.pools.items():
        if name not in fleet.pools:
            raise ValueError(f"{where}: unknown pool {name!r}; pools are {sorted(fleet.pools)}")
        p = fleet.pools[name]
        check_levers(f"{where}: pools[{name!r}]", routing_levers(), _values(routing_levers(), d))
        fleet._check_target(p, **_values(target_levers(), d))
    for cls, a in decision.admission.items():
        if cls not in PRIORITY_CLASSES:
            raise ValueError(f"{where}: unknown priority class {cls!r}; allowed: {list(PRIORITY_CLASSES)}")
        fleet._check_admission(cls, _values(admission_levers(), a))
