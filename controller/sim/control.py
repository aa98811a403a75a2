"""Apply a controller Decision to an in-process simulated Fleet (the bench's actuator).

Maps each PoolDecision to `Fleet.set_pool_routing` + `Fleet.set_pool_target`
(engine caps of 0 mean "leave unchanged") and each ClassAdmission to
`Fleet.set_admission`. Everything is validated before anything is applied, so a
bad decision (unknown pool or class, value out of range) raises ValueError and
leaves the fleet as it was.

Must not: decide anything, read the wall clock, or talk to the network (the live
simulator's gRPC adapter lives in control_plane.py).
"""

from __future__ import annotations

import math

from controller.sim.fleet import Fleet
from controller.types import PRIORITY_CLASSES, ClassAdmission, Decision


def apply_decision(fleet: Fleet, decision: Decision) -> None:
    """Validate the whole decision, then apply it."""
    _validate(fleet, decision)
    for name, d in decision.pools.items():
        fleet.set_pool_routing(name, traffic_weight=d.traffic_weight, inflight_cap=int(d.inflight_cap),
                               prefix_weight=d.prefix_weight, queue_weight=d.queue_weight, kv_weight=d.kv_weight)
        fleet.set_pool_target(name, replicas=int(d.replicas), warm_standby=int(d.warm_standby),
                              max_num_seqs=int(d.max_num_seqs) or None,
                              max_num_batched_tokens=int(d.max_num_batched_tokens) or None)
    # Every class, as the gRPC actuator sends it: a class the decision leaves out gets the default
    # (no limit), so a policy can release shedding (Controller.step drops default entries).
    for cls in PRIORITY_CLASSES:
        a = decision.admission.get(cls, ClassAdmission())
        fleet.set_admission(cls, rate_limit_rps=a.rate_limit_rps, queue_budget=int(a.queue_budget),
                            shed_frac=a.shed_frac)


def _validate(fleet: Fleet, decision: Decision) -> None:
    where = f"decision {decision.decision_id!r}"
    for name, d in decision.pools.items():
        if name not in fleet.pools:
            raise ValueError(f"{where}: unknown pool {name!r}; pools are {sorted(fleet.pools)}")
        p = fleet.pools[name]
        for field_name in ("traffic_weight", "prefix_weight", "queue_weight", "kv_weight"):
            v = getattr(d, field_name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{where}: pools[{name!r}].{field_name} = {v!r} must be a finite number >= 0")
        if d.inflight_cap < 0:
            raise ValueError(f"{where}: pools[{name!r}].inflight_cap = {d.inflight_cap} must be >= 0 (0 = no cap)")
        fleet._check_target(p, int(d.replicas), int(d.warm_standby), int(d.max_num_seqs) or None,
                            int(d.max_num_batched_tokens) or None)
    for cls, a in decision.admission.items():
        if cls not in PRIORITY_CLASSES:
            raise ValueError(f"{where}: unknown priority class {cls!r}; allowed: {list(PRIORITY_CLASSES)}")
        fleet._check_admission(cls, a.rate_limit_rps, int(a.queue_budget), a.shed_frac)
