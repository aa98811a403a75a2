"""The picker's policy: the routing and admission settings in force, and RouterControl's command rules.

`PolicyStore` applies `governor.v1.RoutingPolicy` commands with the semantics of
protos/governor/v1/control.proto, as the simulator's control plane does:

- a generation lower than the last applied → STALE_GENERATION; the same generation
  with the same decision_id → REPLAY (nothing re-applied), with another id → STALE;
- the whole command is validated first (unknown or repeated pool or class, a value
  out of range → INVALID naming the field; nothing applied);
- a pool the command leaves out keeps its settings; a class it leaves out gets no limits;
- when `valid_until_unix_s` passes with no newer command, the picker's own defaults
  (`PickerDefaults`) are in force again (`settings(now)` reports `fallback`).

Pure: time comes in as arguments (Unix seconds); it must not read the clock or do I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from controller.gen.governor.v1 import control_pb2 as pb
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


@dataclass(frozen=True)
class ClassSettings:
    rate_limit_rps: float = 0.0  # 0 = unlimited
    queue_budget: int = -1  # requests of the class held at once; -1 = unlimited
    shed_fraction: float = 0.0  # of arrivals rejected at once (429)


@dataclass(frozen=True)
class Settings:
    pools: Mapping[str, PoolSettings]
    admission: Mapping[str, ClassSettings] = field(default_factory=dict)

    def admission_of(self, cls: str) -> ClassSettings:
        return self.admission.get(cls, ClassSettings())


@dataclass(frozen=True)
class Applied:
    """What `settings(now)` returns: the settings in force and where they come from."""

    settings: Settings
    generation: int
    decision_id: str
    valid_until_unix_s: float
    fallback: bool  # the last command expired (or none came yet): the picker's defaults are in force


class CommandInvalidError(ValueError):
    """A command failed validation; the message names the field and the allowed range."""


def _finite_nonneg(x: float) -> bool:
    return math.isfinite(x) and x >= 0


def validate(msg: pb.RoutingPolicy, pools: Mapping[str, object], now_unix_s: float) -> None:
    """Raise CommandInvalidError naming the first bad field of a RoutingPolicy."""
    if not msg.HasField("meta"):
        raise CommandInvalidError("meta: missing (every command carries decision_id, generation, valid_until_unix_s)")
    m = msg.meta
    if not m.decision_id:
        raise CommandInvalidError("meta.decision_id: must be non-empty")
    if m.generation < 1:
        raise CommandInvalidError(f"meta.generation: {m.generation} must be >= 1")
    if not math.isfinite(m.valid_until_unix_s) or m.valid_until_unix_s <= now_unix_s:
        raise CommandInvalidError(f"meta.valid_until_unix_s: {m.valid_until_unix_s!r} must be a Unix time after "
                                  f"now ({now_unix_s:.3f})")
    seen: set[str] = set()
    for i, p in enumerate(msg.pools):
        where = f"pools[{i}]"
        if p.pool not in pools:
            raise CommandInvalidError(f"{where}.pool: unknown pool {p.pool!r}; this picker routes {sorted(pools)}")
        if p.pool in seen:
            raise CommandInvalidError(f"{where}.pool: pool {p.pool!r} appears more than once")
        seen.add(p.pool)
        if not _finite_nonneg(p.traffic_weight):
            raise CommandInvalidError(f"{where}.traffic_weight: {p.traffic_weight!r} must be a finite number >= 0")
        if p.inflight_cap < 0:
            raise CommandInvalidError(f"{where}.inflight_cap: {p.inflight_cap} must be >= 0 (0 = no cap)")
        if p.HasField("weights"):
            for fname in ("prefix", "queue", "kv_usage"):
                v = getattr(p.weights, fname)
                if not _finite_nonneg(v):
                    raise CommandInvalidError(f"{where}.weights.{fname}: {v!r} must be a finite number >= 0")
    classes: set[str] = set()
    for j, a in enumerate(msg.admission):
        where = f"admission[{j}]"
        if a.priority_class not in PRIORITY_CLASSES:
            raise CommandInvalidError(f"{where}.priority_class: unknown class {a.priority_class!r}; "
                                      f"allowed: {list(PRIORITY_CLASSES)}")
        if a.priority_class in classes:
            raise CommandInvalidError(f"{where}.priority_class: class {a.priority_class!r} appears more than once")
        classes.add(a.priority_class)
        if not _finite_nonneg(a.rate_limit_rps):
            raise CommandInvalidError(f"{where}.rate_limit_rps: {a.rate_limit_rps!r} must be a finite number >= 0")
        if a.queue_budget < -1:
            raise CommandInvalidError(f"{where}.queue_budget: {a.queue_budget} must be >= -1 (-1 = unlimited)")
        if not (math.isfinite(a.shed_fraction) and 0.0 <= a.shed_fraction <= 1.0):
            raise CommandInvalidError(f"{where}.shed_fraction: {a.shed_fraction!r} is outside [0, 1]")


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
        m = msg.meta
        if msg.HasField("meta") and m.generation >= 1 and m.decision_id:
            if m.generation < self.generation:
                return pb.Ack(status=pb.ACK_STATUS_STALE_GENERATION, applied_generation=self.generation,
                              message=f"generation {m.generation} is older than the applied generation "
                                      f"{self.generation}")
            if m.generation == self.generation:
                if m.decision_id == self.decision_id:
                    return pb.Ack(status=pb.ACK_STATUS_REPLAY, applied_generation=self.generation,
                                  message=f"generation {m.generation} ({m.decision_id}) already applied")
                return pb.Ack(status=pb.ACK_STATUS_STALE_GENERATION, applied_generation=self.generation,
                              message=f"generation {m.generation} was already applied as decision "
                                      f"{self.decision_id!r}, not {m.decision_id!r}")
        try:
            validate(msg, self.defaults.pools, now_unix_s)
        except CommandInvalidError as exc:
            return pb.Ack(status=pb.ACK_STATUS_INVALID, applied_generation=self.generation, message=str(exc))
        # Pools left out keep what is in force (the commanded settings while live, else the defaults).
        base = self.settings(now_unix_s).settings
        pools = dict(base.pools)
        for p in msg.pools:
            s = replace(pools[p.pool], traffic_weight=p.traffic_weight, inflight_cap=p.inflight_cap)
            if p.HasField("weights"):
                s = replace(s, prefix_weight=p.weights.prefix, queue_weight=p.weights.queue,
                            kv_weight=p.weights.kv_usage)
            pools[p.pool] = s
        admission = {a.priority_class: ClassSettings(a.rate_limit_rps, a.queue_budget, a.shed_fraction)
                     for a in msg.admission}
        self._commanded = Settings(pools, admission)
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
            out.pools.add(pool=name, traffic_weight=s.traffic_weight, inflight_cap=s.inflight_cap,
                          weights=pb.ScorerWeights(prefix=s.prefix_weight, queue=s.queue_weight,
                                                   kv_usage=s.kv_weight))
        for cls in PRIORITY_CLASSES:
            c = a.settings.admission_of(cls)
            out.admission.add(priority_class=cls, rate_limit_rps=c.rate_limit_rps, queue_budget=c.queue_budget,
                              shed_fraction=c.shed_fraction)
        return out
