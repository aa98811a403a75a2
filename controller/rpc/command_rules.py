"""RouterControl's command rules, shared by the picker (controller/dataplane) and the simulator's control plane.

Both obey protos/governor/v1/control.proto the same way, so both call these:

- `check_meta`: the CommandMeta (decision_id, generation >= 1) and the generation order:
  lower than the applied → STALE_GENERATION; the same with the same decision_id → REPLAY;
  the same with another id → STALE_GENERATION; then the validity deadline (after now);
- `each_pool` / `validate_routing`: the body of a RoutingPolicy, field by field (pools, classes, tenants).

A bad field raises `CommandInvalidError` naming it; the caller turns that into an INVALID ack.
The wording arguments keep each service's messages as its clients know them.

Must not: read the clock (now comes in), apply anything, log, or import the controller, the plant or the picker.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Iterator
from typing import Any

from controller.gen.governor.v1 import control_pb2 as pb
from controller.names import tenant_problem
from controller.rpc.lever_wire import get, wire_levers
from controller.types import PRIORITY_CLASSES

# Lengths a command's strings may have. A pool name is a Kubernetes name (a DNS-1123 subdomain: at most 253
# characters); an id or issuer ("governor/<hostname>", a decision id) fits in 256. Longer ones are refused, and an
# error quotes at most SHOW_CHARS of a value, so a rejected megabyte never comes back in the answer.
MAX_POOL_CHARS = 253
MAX_ID_CHARS = 256
SHOW_CHARS = 64
# Tenants one RoutingPolicy may name: well above the tenants a router keeps apart (the picker's --max-tenants,
# 64 by default), so that a command stays a bounded message whatever its issuer sends.
MAX_COMMAND_TENANTS = 1024


def show(value: str) -> str:
    """`value` quoted for an error message, cut to SHOW_CHARS characters (its length said) when longer."""
    if len(value) <= SHOW_CHARS:
        return repr(value)
    return f"{value[:SHOW_CHARS]!r}… ({len(value)} characters)"


class CommandInvalidError(ValueError):
    """A command failed validation; the message names the field, the bad value and the allowed range."""


def finite_nonneg(x: float) -> bool:
    return math.isfinite(x) and x >= 0


def check_meta(msg: Any, applied_generation: int, applied_decision_id: str, now_unix_s: float, *,
               replay_note: str = "") -> pb.Ack | None:
    """The Ack a command's meta settles (STALE_GENERATION, REPLAY), or None to go on.

    Raises CommandInvalidError for a missing or bad meta or a deadline not after `now_unix_s`.
    `replay_note` is appended to the REPLAY message.
    """
    if not msg.HasField("meta"):
        raise CommandInvalidError("meta: missing (every command carries decision_id, generation, valid_until_unix_s)")
    m = msg.meta
    if not m.decision_id:
        raise CommandInvalidError("meta.decision_id: must be non-empty")
    for fname in ("decision_id", "issuer"):
        v = getattr(m, fname)
        if len(v) > MAX_ID_CHARS:
            raise CommandInvalidError(f"meta.{fname}: {len(v)} characters, at most {MAX_ID_CHARS}")
    if m.generation < 1:
        raise CommandInvalidError(f"meta.generation: {m.generation} must be >= 1")
    if m.generation < applied_generation:
        return pb.Ack(status=pb.ACK_STATUS_STALE_GENERATION, applied_generation=applied_generation,
                      message=f"generation {m.generation} is older than the applied generation {applied_generation}")
    if m.generation == applied_generation:
        if m.decision_id == applied_decision_id:
            return pb.Ack(status=pb.ACK_STATUS_REPLAY, applied_generation=applied_generation,
                          message=f"generation {m.generation} ({m.decision_id}) already applied{replay_note}")
        return pb.Ack(status=pb.ACK_STATUS_STALE_GENERATION, applied_generation=applied_generation,
                      message=f"generation {m.generation} was already applied as decision {show(applied_decision_id)}, "
                              f"not {show(m.decision_id)}")
    if not math.isfinite(m.valid_until_unix_s) or m.valid_until_unix_s <= now_unix_s:
        raise CommandInvalidError(f"meta.valid_until_unix_s: {m.valid_until_unix_s!r} must be a Unix time after "
                                  f"now ({now_unix_s:.3f})")
    return None


def each_pool(entries: Iterable[Any], pools: Collection[str], *,
              known_as: str = "pools are") -> Iterator[tuple[str, Any]]:
    """(field path, entry) per pool entry of a command, refusing unknown and repeated pools.

    `known_as` leads the list of known pools in the unknown-pool message. More entries than `pools` has is
    refused at once (each pool appears at most once), before any entry is read.
    """
    entries = list(entries)
    if len(entries) > len(pools):
        raise CommandInvalidError(f"pools: {len(entries)} entries for {len(pools)} pools ({sorted(pools)[:8]}); "
                                  "each pool appears at most once")
    seen: set[str] = set()
    for i, p in enumerate(entries):
        where = f"pools[{i}]"
        if len(p.pool) > MAX_POOL_CHARS:
            raise CommandInvalidError(f"{where}.pool: {len(p.pool)} characters, at most {MAX_POOL_CHARS}")
        if p.pool not in pools:
            raise CommandInvalidError(f"{where}.pool: unknown pool {show(p.pool)}; {known_as} {sorted(pools)}")
        if p.pool in seen:
            raise CommandInvalidError(f"{where}.pool: pool {show(p.pool)} appears more than once")
        seen.add(p.pool)
        yield where, p


# replica names in a command (PoolRouting.ejected_replicas, PoolScaling.replace_replicas): a pod name or
# host:port (a DNS-1123 name is at most 253 characters) and no more of them than a pool can have replicas
MAX_REPLICA_NAMES = 4096
MAX_REPLICA_NAME_CHARS = 253


def check_replica_names(names: Iterable[str], where: str) -> None:
    """Raise CommandInvalidError naming the first bad replica name of `names` (empty, too long, not printable,
    repeated) or too many of them."""
    seen: set[str] = set()
    for i, n in enumerate(names):
        if i >= MAX_REPLICA_NAMES:
            raise CommandInvalidError(f"{where}: more than {MAX_REPLICA_NAMES} replicas")
        if not n or len(n) > MAX_REPLICA_NAME_CHARS or not n.isprintable() or n.strip() != n:
            raise CommandInvalidError(f"{where}[{i}]: {show(n)} is not a replica name (1-{MAX_REPLICA_NAME_CHARS} "
                                      "printable characters, no surrounding spaces)")
        if n in seen:
            raise CommandInvalidError(f"{where}[{i}]: {show(n)} appears more than once")
        seen.add(n)


def validate_routing(msg: pb.RoutingPolicy, pools: Collection[str], *, known_as: str = "pools are",
                     rate_limit_note: str = "") -> None:
    """Raise CommandInvalidError naming the first bad field of a RoutingPolicy's pools and admission.

    `rate_limit_note` is appended to the rate_limit_rps message.
    """
    for where, p in each_pool(msg.pools, pools, known_as=known_as):
        _check_levers(p, "PoolRouting", where, "")
        check_replica_names(p.ejected_replicas, f"{where}.ejected_replicas")
    if len(msg.admission) > len(PRIORITY_CLASSES):
        raise CommandInvalidError(f"admission: {len(msg.admission)} entries, but there are {len(PRIORITY_CLASSES)} "
                                  f"classes {list(PRIORITY_CLASSES)}; each appears at most once")
    seen: set[str] = set()
    for j, a in enumerate(msg.admission):
        where = f"admission[{j}]"
        if a.priority_class not in PRIORITY_CLASSES:
            raise CommandInvalidError(f"{where}.priority_class: unknown class {show(a.priority_class)}; "
                                      f"allowed: {list(PRIORITY_CLASSES)}")
        if a.priority_class in seen:
            raise CommandInvalidError(f"{where}.priority_class: class {show(a.priority_class)} appears more than "
                                      "once")
        seen.add(a.priority_class)
        _check_levers(a, "ClassAdmission", where, rate_limit_note)
    if len(msg.tenants) > MAX_COMMAND_TENANTS:
        raise CommandInvalidError(f"tenants: {len(msg.tenants)} entries, at most {MAX_COMMAND_TENANTS}")
    named: set[str] = set()
    for k, t in enumerate(msg.tenants):
        where = f"tenants[{k}]"
        bad = tenant_problem(t.tenant)
        if bad is not None:
            raise CommandInvalidError(f"{where}.tenant: {bad}")
        if t.tenant in named:
            raise CommandInvalidError(f"{where}.tenant: tenant {show(t.tenant)} appears more than once")
        named.add(t.tenant)
        _check_levers(t, "TenantLimits", where, "")


def _check_levers(msg: Any, message: str, where: str, unset_note: str) -> None:
    """Each lever `msg` carries against its bounds (controller/levers.py), in the message's field order;
    `unset_note` is appended where a float lever's 0 means "no limit"."""
    for lv in wire_levers(message):
        v = get(msg, lv)
        if v is None:
            continue
        bad = lv.problem(v)
        if bad is not None:
            note = unset_note if lv.kind is float and lv.unset is not None else ""
            raise CommandInvalidError(f"{where}.{'.'.join(lv.path)}: {v!r} {bad}{note}")
