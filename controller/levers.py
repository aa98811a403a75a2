"""The levers: every knob a decision turns, declared once.

A lever is one field of a decision (`PoolDecision` per pool, `ClassAdmission` per priority class,
`TenantLimits` per tenant, controller/types.py) with what travels with it: the protobuf field that carries it
on the wire (protos/governor/v1/control.proto), the components that carry it to the fleet, its bounds and the
value that means "no limit / leave unchanged", the smallest move that counts as a change, how fast
it acts, and how the MPC plans and explains it.

Everything that handles levers one by one iterates over `LEVERS` instead of naming them again:

- the wire: the Decision → RoutingPolicy / ScalingPlan mapping and its checks
  (controller/rpc/lever_wire.py, controller/rpc/command_rules.py, controller/actuation/grpc_actuator.py);
- the picker's settings store (controller/dataplane/policy_store.py);
- the simulator's control plane, in-process and over gRPC (controller/sim/control.py,
  controller/sim/control_plane.py, controller/sim/fleet.py);
- the MPC: the levers `fixed_levers` can hold (controller/core/mpc/problem.py), the candidate arrays
  the search moves and the change penalty (controller/core/mpc/vectors.py, score.py), and the
  reasons that explain a move (controller/policies/mpc/reasons.py).

Adding a lever touches this table, the decision field it names, the proto field it names, and the
code that implements its physics (what the picker and the simulator's router or fleet do with the
value, what the MPC predicts from it); tests/sim/test_lever_table.py adds a dummy lever through the
table alone and follows it from a decision into the simulated fleet.

`carriers` says which components carry a lever to the fleet, so a caller can ask which levers a
given set of actuators can move (`carried_by`) and which MPC groups no one of them carries (`held_groups`;
controller/config/carriers.py maps the configured actuators to carriers).

Must not: import anything from controller/ (this is a value table, below every layer that reads it).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

Scope = Literal["pool", "class", "tenant"]


class Carrier(StrEnum):
    """A component that carries levers to the fleet."""

    PICKER = "picker"  # `governor picker` (controller/dataplane): every RouterControl lever
    SIMULATOR = "simulator"  # the simulator's control plane (controller/sim/control.py, control_plane.py)
    AUTOSCALER = "autoscaler"  # a gRPC Autoscaler target (actuators.autoscaler.address): every PoolScaling lever
    KUBERNETES = "kubernetes"  # the Kubernetes adapter (controller/actuation/kube_actuator.py)
    KEDA = "keda"  # the KEDA external scaler (controller/actuation/keda.py): replica targets only
    # Membership routers (controller/actuation/routers/): they follow the ready replicas, and carry none of
    # the levers below: their policy, caps and limits are fixed at launch (docs/OPERATING.md, "Router adapters")
    VLLM_ROUTER = "vllm-router"
    SGLANG_ROUTER = "sglang-router"


class Speed(StrEnum):
    """How soon a lever acts once it is carried."""

    INSTANT = "instant"  # the router's next request
    STARTUP = "startup"  # a replica's start-up (warm or cold)
    RESTART = "restart"  # a rolling restart of every replica of the pool


# proto message of each lever's field → the control service that carries it
SERVICES = {"PoolRouting": "router", "ClassAdmission": "router", "TenantLimits": "router", "PoolScaling": "autoscaler"}

_ROUTER = frozenset({Carrier.PICKER, Carrier.SIMULATOR})
_SCALER = frozenset({Carrier.SIMULATOR, Carrier.AUTOSCALER, Carrier.KUBERNETES})


@dataclass(frozen=True, slots=True)
class Lever:
    """One lever. Values are checked against [lo, hi] (`unset` is always allowed)."""

    name: str
    scope: Scope  # "pool": a `PoolDecision` field; "class": a `ClassAdmission` one; "tenant": a `TenantLimits` one
    field: str  # the decision's attribute
    proto: str | None  # "Message.field" or "Message.sub.field" in control.proto (Message: PoolRouting,
    #                    ClassAdmission, TenantLimits, PoolScaling); None: not on the wire (yet): only the
    #                    in-process simulator carries it (a lever under development)
    carriers: frozenset[Carrier]
    kind: type  # int or float
    default: float  # the decision's default
    lo: float = 0.0
    hi: float = math.inf
    lo_open: bool = False  # the bound is `> lo`, not `>= lo` (a weight: 0 would be no share at all)
    unset: float | None = None  # the value that means "no limit" / "leave unchanged"
    unset_means: str = ""  # what `unset` means, for messages: "no cap", "unlimited", "unchanged"
    threshold: float | None = None  # the smallest move the MPC counts (and explains) as a change; None: its
    #                                 change is priced elsewhere (replicas per replica, batch caps as a restart)
    speed: Speed = Speed.INSTANT
    plan: str | None = None  # the `MpcConfig.fixed_levers` name that holds it; None: the MPC does not plan it
    array: str | None = None  # the MPC's candidate array (controller/core/mpc/candidates.py)
    reason: str | None = None  # the reason code the MPC explains a move with
    label: str = ""  # for people: "in-flight cap per replica"

    @property
    def service(self) -> str | None:
        """"router" or "autoscaler": the control service whose command carries it (None: not on the wire)."""
        return SERVICES[self.message] if self.message else None

    @property
    def message(self) -> str:
        """The proto message that carries it ("" when none does)."""
        return self.proto.split(".", 1)[0] if self.proto else ""

    @property
    def path(self) -> tuple[str, ...]:
        """The field's path inside its message: ("traffic_weight",) or ("weights", "prefix")."""
        return tuple(self.proto.split(".")[1:]) if self.proto else ()

    def show(self, v: float) -> str:
        """A value for people: 'none' for an unset cap, else %g."""
        if self.unset is not None and v == self.unset and self.unset_means == "no cap":
            return "none"
        return f"{v:g}"

    def problem(self, v: object) -> str | None:
        """Why `v` is not a valid value of this lever (None: it is). The text names the bound:
        'must be >= 0 (0 = no cap)', 'must be a finite number >= 0', 'is outside [0, 1]'."""
        if self.kind is int:
            ok = not isinstance(v, bool) and isinstance(v, int) and (v == self.unset or self.lo <= v <= self.hi)
            if ok:
                return None
            note = f" ({self.unset:g} = {self.unset_means})" if self.unset is not None else ""
            lo = int(self.lo) if self.unset is None or self.unset >= self.lo else int(self.unset)
            return f"must be >= {lo}{note}" if math.isinf(self.hi) else f"is outside [{lo}, {self.hi:g}]{note}"
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and \
            (self.lo < v if self.lo_open else self.lo <= v) and v <= self.hi
        if ok:
            return None
        ge = ">" if self.lo_open else ">="
        return f"must be a finite number {ge} {self.lo:g}" if math.isinf(self.hi) else \
            f"is outside {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}]"


# Order: the MPC's `fixed_levers` names follow the order of their first lever here.
LEVERS: tuple[Lever, ...] = (
    Lever("replicas", "pool", "replicas", "PoolScaling.replicas", _SCALER | {Carrier.KEDA}, int, 0,
          speed=Speed.STARTUP, array="repl", label="replicas"),
    Lever("prefix_weight", "pool", "prefix_weight", "PoolRouting.weights.prefix", _ROUTER, float, 3.0,
          threshold=0.25, plan="affinity", array="pw", reason="lever_avoid", label="cache-affinity weight"),
    Lever("queue_weight", "pool", "queue_weight", "PoolRouting.weights.queue", _ROUTER, float, 2.0,
          label="queue-depth weight"),
    Lever("kv_weight", "pool", "kv_weight", "PoolRouting.weights.kv_usage", _ROUTER, float, 2.0,
          label="KV-usage weight"),
    Lever("inflight_cap", "pool", "inflight_cap", "PoolRouting.inflight_cap", _ROUTER, int, 0, unset=0,
          unset_means="no cap", threshold=0.5, plan="inflight_cap", array="cap", reason="lever_share",
          label="in-flight cap per replica"),
    Lever("traffic_weight", "pool", "traffic_weight", "PoolRouting.traffic_weight", _ROUTER, float, 1.0,
          threshold=0.02, plan="traffic_split", array="tw", reason="lever_move", label="traffic weight"),
    Lever("warm_standby", "pool", "warm_standby", "PoolScaling.warm_standby", _SCALER, int, 0,
          threshold=0.0, speed=Speed.STARTUP, plan="standby", array="standby", reason="lever_standby",
          label="warm standby"),
    Lever("max_num_seqs", "pool", "max_num_seqs", "PoolScaling.max_num_seqs", _SCALER, int, 0, lo=1,
          unset=0, unset_means="unchanged", speed=Speed.RESTART, plan="batch_caps", array="mns",
          label="engine batch cap max_num_seqs"),
    Lever("max_num_batched_tokens", "pool", "max_num_batched_tokens", "PoolScaling.max_num_batched_tokens",
          _SCALER, int, 0, lo=1, unset=0, unset_means="unchanged", speed=Speed.RESTART, plan="batch_caps",
          array="mbt", label="engine batch cap max_num_batched_tokens"),
    Lever("shed_frac", "class", "shed_frac", "ClassAdmission.shed_fraction", _ROUTER, float, 0.0, hi=1.0,
          plan="admission", array="shed", reason="lever_delay", label="shed fraction"),
    Lever("rate_limit_rps", "class", "rate_limit_rps", "ClassAdmission.rate_limit_rps", _ROUTER, float, 0.0,
          unset=0.0, unset_means="unlimited", label="rate limit (req/s)"),
    Lever("queue_budget", "class", "queue_budget", "ClassAdmission.queue_budget", _ROUTER, int, -1, lo=0,
          unset=-1, unset_means="unlimited", label="requests held at the router"),
    # Per tenant (the picker's tenants, controller/dataplane/task_book.py); the simulator's router has no tenants.
    Lever("tenant_rate_limit_rps", "tenant", "rate_limit_rps", "TenantLimits.rate_limit_rps",
          frozenset({Carrier.PICKER}), float, 0.0, unset=0.0, unset_means="unlimited",
          label="tenant rate limit (req/s)"),
    Lever("tenant_max_inflight", "tenant", "max_inflight", "TenantLimits.max_inflight", frozenset({Carrier.PICKER}),
          int, 0, unset=0, unset_means="unlimited", label="tenant requests in flight"),
    Lever("tenant_weight", "tenant", "weight", "TenantLimits.weight", frozenset({Carrier.PICKER}), float, 1.0,
          lo_open=True, label="tenant fair-share weight"),
)


# `PoolDecision` fields that are not levers: commands about named replicas, not a pool's setting (slow
# replicas, controller/core/outliers.py): the router sends no new request to `ejected`, the autoscaler
# replaces `replace`. They carry no bounds or default to plan around; the simulator's control plane
# and the actuators map them by name.
REPLICA_COMMANDS = ("ejected", "replace")


def levers(scope: Scope | None = None, service: str | None = None) -> Iterator[Lever]:
    """The levers of one scope and/or one control service, in table order."""
    for lv in LEVERS:
        if (scope is None or lv.scope == scope) and (service is None or lv.service == service):
            yield lv


def lever(name: str) -> Lever:
    for lv in LEVERS:
        if lv.name == name:
            return lv
    raise KeyError(f"unknown lever {name!r}; levers are {[lv.name for lv in LEVERS]}")


def carried_by(carriers: Collection[str]) -> tuple[Lever, ...]:
    """The levers at least one of `carriers` carries (e.g. ("kubernetes",): replicas, standby, batch caps)."""
    return tuple(lv for lv in LEVERS if any(c in lv.carriers for c in carriers))


def plan_groups() -> tuple[str, ...]:
    """The names `MpcConfig.fixed_levers` accepts: each planned lever group once, in table order."""
    out: list[str] = []
    for lv in LEVERS:
        if lv.plan is not None and lv.plan not in out:
            out.append(lv.plan)
    return tuple(out)


def held_groups(carriers: Collection[str]) -> tuple[str, ...]:
    """The `MpcConfig.fixed_levers` groups none of whose levers any of `carriers` carries, in table order:
    what the MPC must hold at what is in force rather than count on (KEDA alone: every group; replicas are
    not a group and are always planned). No carrier at all (decisions only recorded): nothing is held, so
    the record shows what a fleet carrying every lever would be told."""
    if not carriers:
        return ()
    carried = {lv.plan for lv in carried_by(carriers)}
    return tuple(g for g in plan_groups() if g not in carried)


def routing_levers() -> tuple[Lever, ...]:
    """The pool levers that act at once: the router's settings of a pool (traffic split, cap, scorer)."""
    return tuple(lv for lv in LEVERS if lv.scope == "pool" and lv.speed is Speed.INSTANT)


def target_levers() -> tuple[Lever, ...]:
    """The pool levers the autoscaler carries out over a start-up or a restart (replicas, standby, batch caps)."""
    return tuple(lv for lv in LEVERS if lv.scope == "pool" and lv.speed is not Speed.INSTANT)


def admission_levers() -> tuple[Lever, ...]:
    """The per-class levers (admission at the router)."""
    return tuple(lv for lv in LEVERS if lv.scope == "class")


def tenant_levers() -> tuple[Lever, ...]:
    """The per-tenant levers (a tenant's limits at the router)."""
    return tuple(lv for lv in LEVERS if lv.scope == "tenant")


def check_levers(where: str, allowed: Collection[Lever], values: Mapping[str, object]) -> None:
    """Raise ValueError naming the first value of `values` (by lever name) that is not one of `allowed`
    or is out of its lever's bounds: "set_pool_routing('a'): inflight_cap = -1 must be >= 0 (0 = no cap)"."""
    by_name = {lv.name: lv for lv in allowed}
    for name, v in values.items():
        lv = by_name.get(name)
        if lv is None:
            raise ValueError(f"{where}: {name!r} is not one of its levers {sorted(by_name)}")
        bad = lv.problem(v)
        if bad is not None:
            raise ValueError(f"{where}: {name} = {v!r} {bad}")
