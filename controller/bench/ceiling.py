"""The capacity ceiling of a bench case: every pool at its maximum, the sheddable class shed.

`CeilingPolicy` runs each pool at `max_replicas` from the first tick, with the scenario's own router
weights and, where the fleet has a sheddable class, that whole class refused at the router. It is
a yardstick, not a policy anyone would run: it spends what the fleet's bounds allow and drops the
traffic the SLO bar does not count (the bar is critical and standard; `report.meets_bar`).

What it tells: a case the ceiling misses is out of reach of the two levers every online policy has
in hand, replica counts and admission, however early they are pulled; only the latency levers
(in-flight caps, engine batch caps, routing) are left, and those trade one class's wait for
another's. The verified static fleet and the oracle do not shed, so a case beyond max_replicas that
shedding makes servable reads "infeasible" by them alone; the ceiling is the reference that sees
it. Example (generated seed 1, case 39: a 70B pool held to 3 replicas, steady load, short outputs):
at 3 replicas with the sheddable half of the traffic refused, critical keeps 96.5 % (its 0.1 s
TPOT is lost to the prefill chunks of the other prompts), so no policy passes it with replicas or
shedding.

Before the first decision applies, and while replicas start (each pool's cold start-up), the
fleet is what the scenario starts with: the ceiling is judged, like every policy, on every task.

Pure: no I/O, no clock; its state is None. Its replay runs without the cascading-failure breaker
(`breaker=None`), as the oracle's schedule does: the yardstick is replayed as defined.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from controller.policies.common import RoutingWeights
from controller.sim.scenario import Scenario
from controller.types import ClassAdmission, PolicyInput, PolicyOutput, PoolDecision, Reason

CEILING = "ceiling"
SHEDDABLE = "sheddable"


class CeilingPolicy:
    """Every pool at its max_replicas; the sheddable class shed (see the module docstring)."""

    name = CEILING

    def __init__(self, routing: Mapping[str, RoutingWeights], weights: Mapping[str, float]) -> None:
        self.routing = dict(routing)
        self.weights = dict(weights)

    def initial_state(self) -> None:
        return None

    def decide(self, state: None, inp: PolicyInput, rng: np.random.Generator) -> tuple[None, PolicyOutput]:
        pools: dict[str, PoolDecision] = {}
        reasons: list[Reason] = []
        for spec in inp.fleet.pools:
            r = self.routing[spec.name]
            pools[spec.name] = PoolDecision(replicas=spec.max_replicas, prefix_weight=r.prefix_weight,
                                            queue_weight=r.queue_weight, kv_weight=r.kv_weight,
                                            traffic_weight=self.weights.get(spec.name, 1.0))
            reasons.append(Reason("ceiling", f"capacity ceiling: {spec.max_replicas} replicas (max_replicas)",
                                  pool=spec.name, data={"replicas": spec.max_replicas}))
        admission = {SHEDDABLE: ClassAdmission(shed_frac=1.0)} if SHEDDABLE in inp.fleet.slos else {}
        return state, PolicyOutput(pools=pools, admission=admission, reasons=tuple(reasons),
                                   diagnostics={"policy": CEILING})


def ceiling_policy(scenario: Scenario) -> CeilingPolicy:
    """The ceiling for `scenario`: the scenario's router scorer weights and traffic split for every pool."""
    r = scenario.router
    return CeilingPolicy({p.name: RoutingWeights(r.prefix_weight, r.queue_weight, r.kv_weight) for p in scenario.pools},
                         {p.name: p.traffic_weight for p in scenario.pools})


__all__ = ["CEILING", "CeilingPolicy", "ceiling_policy"]
