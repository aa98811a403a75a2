"""Policy names and construction from configuration: `build_policy(name, fleet, params)`.

The composition root (daemon, bench, tests) names a policy and passes its
parameters as a mapping (from YAML or code); this module checks the name and the
parameter names against the policy's constructor and the fleet (pool names, SLO
classes) and raises ValueError naming what is wrong and what is allowed — nothing
is half-built. It must not do I/O or import telemetry/actuation/api/runtime/gen,
grpc or prometheus clients.

Adding a policy: add its name to `PolicyName` in controller/names.py (the one
list the config, the command line and the bench read) and a line to
`_policy_classes()`; its constructor's keyword arguments become its parameters.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from controller.core.breaker import BreakerConfig, breaker_setting
from controller.core.estimate import EstimatorConfig
from controller.core.outliers import OutlierConfig, outlier_setting
from controller.names import POLICY_NAMES
from controller.perf.engine_figures import EngineFigures
from controller.policies.aibrix_stack import AibrixStackPolicy
from controller.policies.common import RoutingWeights
from controller.policies.dynamo_stack import DynamoStackPolicy
from controller.policies.hpa import HpaPolicy
from controller.policies.kpa import KpaPolicy
from controller.policies.llm_d_stack import LlmdStackPolicy
from controller.policies.mpc import MpcPolicy
from controller.policies.scorer_kpa import ScorerKpaPolicy
from controller.policies.sla_planner import SlaPlannerPolicy
from controller.policies.slo_feedback import SloFeedbackPolicy
from controller.policies.static import StaticPolicy
from controller.types import FleetSpec, Policy

__all__ = ["POLICY_NAMES", "breaker_for", "build_policy", "estimator_for", "figures_in", "outliers_for",
           "policy_params"]

# Parameters a policy's config carries that set up the controller around the policy rather than the policy:
# the cascading-failure breaker (`breaker`: true/false or BreakerConfig fields; the MPC's parameters have
# carried it since the breaker was built beside it), the value given when the config leaves it out.
# A policy without the entry runs under the default breaker.
# Slow-replica detection (`outliers`: true/false or OutlierConfig fields, controller/core/outliers.py) likewise:
# on for the MPC (decision 0035: more of the slow-replica cases keep critical, on held-out seeds too); a policy
# without the entry runs without it (the baselines stay as their projects publish them).
CONTROLLER_PARAMS: dict[str, dict[str, Any]] = {"mpc": {"breaker": True, "outliers": True}}


def breaker_for(name: str, params: Mapping[str, Any] | None = None) -> BreakerConfig | None:
    """The breaker the controller runs `name` under, from its parameters (`breaker`, where it has one)."""
    own = CONTROLLER_PARAMS.get(name, {})
    if "breaker" not in own:
        return BreakerConfig()
    given = (params or {}).get("breaker", own["breaker"])
    try:
        cfg = breaker_setting(given)
    except (TypeError, ValueError) as e:
        raise ValueError(f"policy {name}: {e}") from None
    # the MPC's breaker counts losses from the estimate's replica accounting (core/estimate.py)
    if cfg is not None and name == "mpc" and not (isinstance(given, Mapping) and "count_replacements" in given):
        cfg = replace(cfg, count_replacements=True)
    return cfg


def estimator_for(name: str, params: Mapping[str, Any] | None = None) -> EstimatorConfig:
    """How the controller's estimate stage accounts for replicas under `name` (the MPC's `warm_node_ttl_s`
    and `step_s`; the defaults for every other policy)."""
    if name != "mpc":
        return EstimatorConfig()
    p = params or {}
    return EstimatorConfig(warm_node_ttl_s=float(p.get("warm_node_ttl_s", 600.0)), step_s=float(p.get("step_s", 30.0)),
                           warmup_s=float(p.get("warmup_s", 60.0)))


def outliers_for(name: str, params: Mapping[str, Any] | None = None) -> OutlierConfig | None:
    """The slow-replica detection the controller runs `name` under (None: none), from its `outliers` parameter."""
    own = CONTROLLER_PARAMS.get(name, {})
    if "outliers" not in own:
        return None
    try:
        return outlier_setting((params or {}).get("outliers", own["outliers"]))
    except (TypeError, ValueError) as e:
        raise ValueError(f"policy {name}: {e}") from None


def figures_in(name: str, params: Mapping[str, Any] | None = None) -> dict[str, EngineFigures]:
    """The step-time figures by pool that `name`'s parameters set (the MPC's `engine_figures`; {} for a policy
    without them). The composition root hands them to the Controller too, whose slow-replica detection judges
    each pool's replicas on the figures the planner plans with. Call it after `build_policy` accepted the
    parameters (a bad entry raises ValueError naming the field)."""
    if name != "mpc":
        return {}
    return {str(k): EngineFigures.of(v) for k, v in dict((params or {}).get("engine_figures") or {}).items()}


def _policy_classes() -> dict[str, type]:
    return {
        "static": StaticPolicy,
        "hpa": HpaPolicy,
        "kpa": KpaPolicy,
        "sla-planner": SlaPlannerPolicy,
        "scorer-kpa": ScorerKpaPolicy,
        "slo-feedback": SloFeedbackPolicy,
        "llm-d-stack": LlmdStackPolicy,
        "aibrix-stack": AibrixStackPolicy,
        "dynamo-stack": DynamoStackPolicy,
        "mpc": MpcPolicy,
    }


def policy_params(name: str) -> dict[str, Any]:
    """The parameters a policy accepts and their defaults (inspect.Parameter.empty = required)."""
    cls = _lookup(name)
    sig = inspect.signature(cls.__init__)
    return {**{p.name: p.default for p in sig.parameters.values() if p.name != "self"},
            **CONTROLLER_PARAMS.get(name, {})}


def _lookup(name: str) -> type[Any]:
    classes = _policy_classes()
    if name not in POLICY_NAMES or name not in classes:
        raise ValueError(f"unknown policy {name!r}; valid policies: {', '.join(POLICY_NAMES)}")
    return classes[name]


def _check_pool_keys(name: str, param: str, given: Any, fleet: FleetSpec) -> None:
    _check_known_pools(name, param, given, fleet)
    pools = [p.name for p in fleet.pools]
    missing = [p for p in pools if p not in given]
    if missing:
        raise ValueError(f"policy {name}: {param} has no entry for pool(s) {missing}; fleet pools: {pools}")


def _check_known_pools(name: str, param: str, given: Any, fleet: FleetSpec) -> None:
    """`given` maps pools to values and names only pools of the fleet (some may be left out)."""
    if not isinstance(given, Mapping):
        raise ValueError(f"policy {name}: {param} must be a mapping pool -> value (got {type(given).__name__})")
    pools = [p.name for p in fleet.pools]
    unknown = sorted(set(map(str, given)) - set(pools))
    if unknown:
        raise ValueError(f"policy {name}: {param} names unknown pool(s) {unknown}; fleet pools: {pools}")


def build_policy(name: str, fleet: FleetSpec, params: Mapping[str, Any] | None = None) -> Policy:
    """Build the named policy for `fleet` from `params` (constructor keyword arguments).

    Raises ValueError for an unknown name, unknown or missing parameters, parameters
    that name pools or SLO classes the fleet does not have, and bad values.
    """
    params = dict(params or {})
    cls = _lookup(name)
    accepted = policy_params(name)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"policy {name}: unknown parameter(s) {unknown}; valid parameters: {sorted(accepted)}")
    required = [k for k, v in accepted.items() if v is inspect.Parameter.empty and k not in params]
    if required:
        raise ValueError(f"policy {name}: missing required parameter(s) {required}; "
                         f"valid parameters: {sorted(accepted)}")
    if "routing" in params and isinstance(params["routing"], Mapping):
        allowed = {"prefix_weight", "queue_weight", "kv_weight"}
        bad = sorted(set(params["routing"]) - allowed)
        if bad or set(params["routing"]) != allowed:
            raise ValueError(f"policy {name}: routing needs exactly {sorted(allowed)} "
                             f"(got {sorted(params['routing'])})")
        params["routing"] = RoutingWeights(**{k: float(v) for k, v in params["routing"].items()})
    if name == "static":
        _check_pool_keys(name, "replicas", params["replicas"], fleet)
    if name in ("sla-planner", "dynamo-stack"):
        _check_pool_keys(name, "capacity", params["capacity"], fleet)
    if name == "aibrix-stack" and params.get("capacity") is not None:
        _check_known_pools(name, "capacity", params["capacity"], fleet)
    slo_class = params.get("slo_class")
    if slo_class is not None and slo_class not in fleet.slos:
        raise ValueError(f"policy {name}: slo_class {slo_class!r} is not a fleet SLO class; "
                         f"classes: {sorted(fleet.slos)}")
    breaker_for(name, params)  # a bad controller parameter fails here too, by name
    outliers_for(name, params)
    for k in CONTROLLER_PARAMS.get(name, {}):
        params.pop(k, None)
    try:
        return cls(**params)
    except ValueError as e:
        raise ValueError(f"policy {name}: {e}") from None
    except TypeError as e:
        raise ValueError(f"policy {name}: bad parameters: {e}") from None
