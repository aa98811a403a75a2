"""build_policy: names, parameters and fleet checks, with errors that say what is allowed."""

from __future__ import annotations

from typing import Any

import pytest

from controller.policies import POLICY_NAMES, ReplicaCapacity, build_policy, policy_params
from controller.policies.hpa import HpaPolicy
from tests.policies.builders import decide, fleet, inp, spec

FL = fleet(spec("a"), spec("b"))
MINIMAL: dict[str, dict[str, Any]] = {
    "static": {"replicas": {"a": 2, "b": 3}},
    "hpa": {},
    "kpa": {},
    "sla-planner": {"capacity": {"a": ReplicaCapacity(rps=4.0), "b": {"rps": 2.0}}},
    "scorer-kpa": {},
    "slo-feedback": {},
    "llm-d-stack": {},
    "aibrix-stack": {"capacity": {"a": ReplicaCapacity(rps=4.0), "b": {"rps": 2.0}}},
    "dynamo-stack": {"capacity": {"a": ReplicaCapacity(rps=4.0), "b": {"rps": 2.0}}},
    "mpc": {},
}


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_name_builds_and_decides(name):
    pol = build_policy(name, FL, MINIMAL[name])
    assert pol.name == name
    _, out = decide(pol, pol.initial_state(), inp(0.0, {"a": dict(ready=2), "b": dict(ready=3)}, fl=FL,
                                                  current={"a": 2, "b": 3}))
    assert set(out.pools) == {"a", "b"}


# label, name, params, message fragment
ERROR_ROWS = [
    ("unknown policy lists the valid ones", "mpc2", {}, "valid policies: static, hpa, kpa, sla-planner"),
    ("unknown parameter lists the valid ones", "hpa", {"targte": 0.5},
     "unknown parameter(s) ['targte']; valid parameters"),
    ("missing required parameter", "static", {}, "missing required parameter(s) ['replicas']"),
    ("static: unknown pool", "static", {"replicas": {"a": 1, "b": 1, "c": 1}}, "unknown pool(s) ['c']"),
    ("static: a pool without a count", "static", {"replicas": {"a": 1}}, "no entry for pool(s) ['b']"),
    ("sla_planner: a pool without capacity", "sla-planner", {"capacity": {"a": {"rps": 1.0}}},
     "no entry for pool(s) ['b']"),
    ("sla_planner: bad capacity field", "sla-planner", {"capacity": {"a": {"rps": 1.0}, "b": {"qps": 1}}},
     "unknown field(s) ['qps']"),
    ("unknown SLO class", "slo-feedback", {"slo_class": "gold"}, "slo_class 'gold' is not a fleet SLO class"),
    ("bad value is named", "hpa", {"target": -1}, "policy hpa: hpa.target must be"),
    ("bad choice is named", "sla-planner", {"capacity": MINIMAL["sla-planner"]["capacity"], "forecaster": "arima"},
     "forecaster must be one of ['holt', 'constant']"),
    ("routing needs all three weights", "kpa", {"routing": {"prefix_weight": 1}}, "routing needs exactly"),
]


@pytest.mark.parametrize("label,name,params,fragment", ERROR_ROWS, ids=[r[0] for r in ERROR_ROWS])
def test_build_policy_errors(label, name, params, fragment):
    with pytest.raises(ValueError) as e:
        build_policy(name, FL, params)
    assert fragment in str(e.value), (label, str(e.value))


def test_params_pass_through_and_routing_mapping_is_accepted():
    pol = build_policy("hpa", FL, {"metric": "queue_per_replica", "target": 3,
                                   "routing": {"prefix_weight": 0, "queue_weight": 2, "kv_weight": 1}})
    assert isinstance(pol, HpaPolicy)
    assert pol.metric == "queue_per_replica" and pol.target == 3.0
    assert pol.routing.queue_weight == 2.0


def test_policy_params_lists_constructor_keywords():
    assert {"metric", "target", "tolerance", "sync_period_s"} <= set(policy_params("hpa"))
