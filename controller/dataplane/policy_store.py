"""The picker's policy: the routing and admission settings in force, and RouterControl's command rules.

`PolicyStore` applies `governor.v1.RoutingPolicy` commands with the semantics of
protos/governor/v1/control.proto, with the rules it shares with the simulator's control plane
(controller/rpc/command_rules.py):

- a generation lower than the last applied → STALE_GENERATION; the same generation
  with the same decision_id → REPLAY (nothing re-applied), with another id → STALE;
- the whole command is validated first (unknown or repeated pool or class, a value
  out of range → INVALID naming the field; nothing applied);
- a pool the command leaves out keeps its settings; a class it leaves out gets no limits;
- tenant limits (`TenantLimits`) the command names replace the picker's own for those tenants; a tenant it
  leaves out has the picker's own limits (its `--tenant` flags), whatever an earlier command said; step
  awareness is the command's when it sets it, else the picker's own (`--step-blind`);
- when `valid_until_unix_s` passes with no newer command, the picker's own defaults
  (`PickerDefaults`) are in force again (`settings(now)` reports `fallback`).

Pure: time comes in as arguments (Unix seconds); it must not read the clock or do I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from controller.dataplane.task_book import TenantSettings
from controller.gen.governor.v1 import control_pb2 as pb
from controller.rpc import lever_wire
from controller.rpc.command_rules import CommandInvalidError, check_meta, validate_routing
from controller.types import PRIORITY_CLASSES

# The simulator's router defaults (scenario RouterSpec): a full prefix hit on the busiest
# replica (3 - 2 = 1) beats an idle replica without it (0); a half hit does not.
DEFAULT_PREFIX_WEIGHT = 3.0
DEFAULT_QUEUE_WEIGHT = 2.0
DEFAULT_KV_WEIGHT = 2.0


@dataclass(frozen=True)
class PoolSettings:
    traffic_weight: float = 1.0  # share of its route group's traffic, relative to the group's others
    inflight_cap: int = 0  # per replica; 0 = no cap; critical requests pass it
    prefix_weight: float = DEFAULT_PREFIX_WEIGHT
    queue_weight: float = DEFAULT_QUEUE_WEIGHT
    kv_weight: float = DEFAULT_KV_WEIGHT
    # endpoints (host:port) Governor ejected as slow: no new requests while another endpoint is left
    ejected: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ClassSettings:
    rate_limit_rps: float = 0.0  # 0 = unlimited
    queue_budget: int = -1  # requests of the class held at once; -1 = unlimited
    shed_frac: float = 0.0  # of arrivals rejected at once (429)


@dataclass(frozen=True)
class Settings:
    pools: Mapping[str, PoolSettings]
    admission: Mapping[str, ClassSettings] = field(default_factory=dict)
    # tenant → limits; "*" applies to every tenant not named (tasks.py); none: no tenant limits
    tenants: Mapping[str, TenantSettings] = field(default_factory=dict)
    # under pressure, refuse or hold new tasks' first steps before later steps of tasks under way (picker.py)
    step_aware: bool = True

    def admission_of(self, cls: str) -> ClassSettings:
        return self.admission.get(cls, ClassSettings())

    def tenant_limits(self, tenant: str) -> TenantSettings:
        return self.tenants.get(tenant) or self.tenants.get("*") or TenantSettings()


@dataclass(frozen=True)
class Applied:
    """What `settings(now)` returns: the settings in force and where they come from."""

    settings: Settings
    generation: int
    decision_id: str
    valid_until_unix_s: float
    fallback: bool  # the last command expired (or none came yet): the picker's defaults are in force


class PolicyStore:
    """The picker's defaults, the last applied RoutingPolicy, and the generation rules between them."""

    def __init__(self, defaults: Settings) -> None:
        self.defaults = defaults
        self.generation = 0
        self.decision_id = ""
        self.valid_until_unix_s = -math.inf
        self.meta: pb.CommandMeta | None = None
        self._commanded: Settings | None = None

    def settings(self, now_unix_s: float) -> Applied:
        live = self._commanded is not None and now_unix_s < self.valid_until_unix_s
        s = self._commanded if live and self._commanded is not None else self.defaults
        return Applied(s, self.generation, self.decision_id, self.valid_until_unix_s, fallback=not live)

    def apply(self, msg: pb.RoutingPolicy, now_unix_s: float) -> pb.Ack:
        try:
            ack = check_meta(msg, self.generation, self.decision_id, now_unix_s)
            if ack is not None:
                return ack
            validate_routing(msg, self.defaults.pools, known_as="this picker routes")
        except CommandInvalidError as exc:
            return pb.Ack(status=pb.ACK_STATUS_INVALID, applied_generation=self.generation, message=str(exc))
        m = msg.meta
        # Pools left out keep what is in force (the commanded settings while live, else the defaults).
        base = self.settings(now_unix_s).settings
        pools = dict(base.pools)
        for p in msg.pools:
            pools[p.pool] = replace(pools[p.pool], **lever_wire.values(p, "PoolRouting"),
                                    ejected=frozenset(p.ejected_replicas))
        admission = {a.priority_class: ClassSettings(**lever_wire.values(a, "ClassAdmission")) for a in msg.admission}
        # the command's tenants over the picker's own (an earlier command's do not carry over: each command says
        # the tenant limits it wants in full, as it does the classes')
        tenants = dict(self.defaults.tenants)
        for t in msg.tenants:
            tenants[t.tenant] = TenantSettings(**_tenant_fields(t))
        step_aware = msg.step_aware if msg.HasField("step_aware") else self.defaults.step_aware
        self._commanded = Settings(pools, admission, tenants=tenants, step_aware=step_aware)
        self.generation = m.generation
        self.decision_id = m.decision_id
        self.valid_until_unix_s = m.valid_until_unix_s
        self.meta = pb.CommandMeta()
        self.meta.CopyFrom(m)
        return pb.Ack(status=pb.ACK_STATUS_APPLIED, applied_generation=self.generation,
                      message=f"applied {m.decision_id}")

    def to_message(self, now_unix_s: float) -> pb.RoutingPolicy:
        """GetRoutingPolicy: the settings in force with the last command's meta (in the past after a fallback)."""
        a = self.settings(now_unix_s)
        out = pb.RoutingPolicy()
        if self.meta is not None:
            out.meta.CopyFrom(self.meta)
        for name, s in a.settings.pools.items():
            out.pools.append(lever_wire.build("PoolRouting", {"pool": name, "ejected_replicas": sorted(s.ejected)}, s))
        for cls in PRIORITY_CLASSES:
            c = a.settings.admission_of(cls)
            out.admission.append(lever_wire.build("ClassAdmission", {"priority_class": cls}, c))
        for name, t in sorted(a.settings.tenants.items()):
            out.tenants.append(lever_wire.build("TenantLimits", {"tenant": name}, t))
        out.step_aware = a.settings.step_aware
        return out



def _tenant_fields(t: pb.TenantLimits) -> dict[str, Any]:
    """A TenantLimits' levers by their field (TenantSettings' names: rate_limit_rps, max_inflight, weight)."""
    return {lv.field: lever_wire.get(t, lv) for lv in lever_wire.wire_levers("TenantLimits")}
