"""PolicyService: the operator's gRPC API to a running daemon (status, decisions, explain, overrides, mode, audit).

Requests are validated in full before anything changes; an invalid one gets
INVALID_ARGUMENT naming the field (e.g. "override.ttl_s: must be > 0 ...") and
leaves the store untouched. Overrides, mode changes and the audit trail live in
the StateStore; the daemon is reached only through the DaemonHandle protocol
(the runtime implements it). Authenticated by named bearer tokens and/or mTLS
(transport.Authenticator): SetOverride, DeleteOverride and SetMode need the write
role, and the authenticated identity goes into the audit trail beside the declared
author. gRPC health and reflection are on and exempt from auth. Requests are
bounded (api/limits.py): size, string lengths, control characters, active overrides.

This module must not decide anything about the fleet: it records operator intent
and tells the daemon that something changed.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn, Protocol

import grpc
from grpc_health.v1 import health

from controller import __version__
from controller.api.limits import MAX_AUDIT_LIMIT, MAX_AUTHOR, MAX_NAME, MAX_REASON, MAX_REQUEST_BYTES, text_problem
from controller.api.store import DecisionRow, InvalidRequestError, StateStore, StoreError
from controller.clock import Clock
from controller.gen.governor.v1 import policy_pb2, policy_pb2_grpc
from controller.rpc.transport import (
    Authenticator,
    AuthInterceptor,
    TlsConfig,
    TokenEntry,
    add_health_and_reflection,
    bind,
    check_listen_safe,
    current_caller,
    server_options,
)
from controller.types import Mode, Override

log = logging.getLogger(__name__)

SERVICE_NAME = policy_pb2.DESCRIPTOR.services_by_name["PolicyService"].full_name  # "governor.v1.PolicyService"

DEFAULT_DECISIONS_LIMIT = 20
DEFAULT_AUDIT_LIMIT = 50
MAX_LIST_LIMIT = 1000
WRITE_METHODS = frozenset({"SetOverride", "DeleteOverride", "SetMode"})
MAX_ERROR_CHARS = 1000  # an error message is a sentence: never the size of what it complains about

MODE_TO_PROTO: Mapping[str, policy_pb2.Mode] = {
    Mode.ACTIVE.value: policy_pb2.MODE_ACTIVE,
    Mode.SHADOW.value: policy_pb2.MODE_SHADOW,
    Mode.PAUSED.value: policy_pb2.MODE_PAUSED,
}
PROTO_TO_MODE: Mapping[policy_pb2.Mode, Mode] = {v: Mode(k) for k, v in MODE_TO_PROTO.items()}

KIND_TO_PROTO: Mapping[str, policy_pb2.OverrideKind] = {
    "pin_replicas": policy_pb2.OVERRIDE_KIND_PIN_REPLICAS,
    "min_replicas": policy_pb2.OVERRIDE_KIND_MIN_REPLICAS,
    "max_replicas": policy_pb2.OVERRIDE_KIND_MAX_REPLICAS,
    "freeze": policy_pb2.OVERRIDE_KIND_FREEZE,
    "admission": policy_pb2.OVERRIDE_KIND_ADMISSION,
    "slo_ttft": policy_pb2.OVERRIDE_KIND_SLO_TTFT,
    "slo_tpot": policy_pb2.OVERRIDE_KIND_SLO_TPOT,
    "profile": policy_pb2.OVERRIDE_KIND_PROFILE,
    "reliability": policy_pb2.OVERRIDE_KIND_RELIABILITY,
    "tenant_rate_limit": policy_pb2.OVERRIDE_KIND_TENANT_RATE_LIMIT,
    "tenant_max_inflight": policy_pb2.OVERRIDE_KIND_TENANT_MAX_INFLIGHT,
    "tenant_weight": policy_pb2.OVERRIDE_KIND_TENANT_WEIGHT,
    "step_admission": policy_pb2.OVERRIDE_KIND_STEP_ADMISSION,
}
PROTO_TO_KIND: Mapping[policy_pb2.OverrideKind, str] = {v: k for k, v in KIND_TO_PROTO.items()}


# --------------------------------------------------------------------------- what the daemon exposes


@dataclass(frozen=True, slots=True)
class ComponentStatus:
    name: str  # e.g. "telemetry:prometheus", "actuator:router"
    healthy: bool
    detail: str = ""
    last_ok_s: float = 0.0  # Unix seconds of the last success (0 = never)


@dataclass(frozen=True, slots=True)
class PoolStatusView:
    pool: str
    replicas_desired: int
    replicas_ready: int
    ttft_p95_s: float = math.nan  # NaN = unknown
    slo_ttft_s: float = math.nan
    hit_rate: float = math.nan
    telemetry: str = "missing"  # ok | partial | missing | stale
    gpu_mem_used_frac: float = math.nan  # DCGM FB used share of the fullest GPU; NaN = not read


@dataclass(frozen=True, slots=True)
class StatusView:
    mode: Mode | str
    profile: str
    policy: str
    last_tick_s: float  # Unix seconds (0 = no tick yet)
    last_decision_id: str
    generation: int
    components: tuple[ComponentStatus, ...] = ()
    pools: tuple[PoolStatusView, ...] = ()
    telemetry_frozen: bool = False
    details: tuple[tuple[str, str], ...] = ()  # further state: models, breaker, ...
    version: str = __version__


class DaemonHandle(Protocol):
    """What the API needs from the running daemon. Implemented by the runtime; every method is called from
    gRPC worker threads, so it must be thread-safe and quick."""

    def status(self) -> StatusView: ...

    def set_mode(self, mode: Mode, author: str, reason: str) -> None:
        """Switch mode now (raise ValueError to refuse, with a message for the operator). The server persists
        the new mode in the store (with an audit entry) after this returns."""
        ...

    def pool_names(self) -> Collection[str]:
        """The pools the fleet has, to validate overrides."""
        ...

    def on_overrides_changed(self) -> None:
        """An override was set or deleted: re-read `store.active_overrides(now)` (e.g. tick early)."""
        ...

    def write_refusal(self) -> str | None:
        """Why this daemon may not take writes now (a follower under leader election names the leader),
        or None when it may."""
        ...


# --------------------------------------------------------------------------- conversions


def _finite_or_zero(v: float) -> float:
    return v if v is not None and math.isfinite(v) else 0.0


def override_to_proto(o: Override) -> policy_pb2.Override:
    return policy_pb2.Override(
        id=o.override_id, kind=KIND_TO_PROTO.get(o.kind, policy_pb2.OVERRIDE_KIND_UNSPECIFIED), pool=o.pool,
        priority_class=o.priority_class, value=o.value, text=o.text, ttl_s=_finite_or_zero(o.expires_s - o.created_s),
        author=o.author, reason=o.reason, created_unix_s=o.created_s, expires_unix_s=_finite_or_zero(o.expires_s),
    )


def decision_summary(row: DecisionRow) -> policy_pb2.DecisionSummary:
    return policy_pb2.DecisionSummary(decision_id=row.decision_id, generation=row.generation, at_unix_s=row.at_s,
                                      mode=row.mode, summary=row.summary, outcome=row.outcome)


def status_to_proto(s: StatusView) -> policy_pb2.Status:
    mode = s.mode.value if isinstance(s.mode, Mode) else str(s.mode)
    return policy_pb2.Status(
        mode=MODE_TO_PROTO.get(mode, policy_pb2.MODE_UNSPECIFIED), profile=s.profile,
        last_tick_unix_s=_finite_or_zero(s.last_tick_s), last_decision_id=s.last_decision_id, generation=s.generation,
        components=[policy_pb2.ComponentHealth(name=c.name, healthy=c.healthy, detail=c.detail,
                                               last_ok_unix_s=_finite_or_zero(c.last_ok_s)) for c in s.components],
        pools=[policy_pb2.PoolStatus(pool=p.pool, replicas_desired=p.replicas_desired, replicas_ready=p.replicas_ready,
                                     ttft_p95_s=_finite_or_zero(p.ttft_p95_s), slo_ttft_s=_finite_or_zero(p.slo_ttft_s),
                                     hit_rate=_finite_or_zero(p.hit_rate), telemetry=p.telemetry,
                                     gpu_mem_used_frac=_finite_or_zero(p.gpu_mem_used_frac)) for p in s.pools],
        version=s.version, policy=s.policy, telemetry_frozen=s.telemetry_frozen,
        details=[policy_pb2.StatusDetail(name=k, value=v) for k, v in s.details],
    )


# --------------------------------------------------------------------------- explanation text

_SECTIONS: tuple[tuple[str, str], ...] = (
    ("inputs", "Inputs (what was observed)"),
    ("telemetry", "Telemetry status"),
    ("policy", "Policy"),
    ("pools", "Decision per pool"),
    ("admission", "Admission"),
    ("tenants", "Tenant limits at the router"),
    ("step_aware", "Step-aware admission at the router"),
    ("reasons", "Reasons"),
    ("diagnostics", "Predictions and constraints"),
    ("guard_adjustments", "Guardrail adjustments"),
    ("overrides", "Overrides applied"),
)
_HEADER_KEYS = frozenset({"decision_id", "generation", "at_s", "valid_until_s", "mode", "summary", "outcome",
                          "explanation", "changed", "frozen"})


def _fmt_scalar(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    if v == "":
        return "-"
    return str(v)


def _fmt_time(t: Any) -> str:
    try:
        return datetime.fromtimestamp(float(t), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError, OverflowError, OSError):
        return _fmt_scalar(t)


def _render(value: Any, indent: int, out: list[str]) -> None:
    pad = "  " * indent
    if isinstance(value, Mapping):
        if not value:
            out.append(pad + "(none)")
        for k, v in value.items():
            if isinstance(v, (Mapping, list)) and v:
                if (isinstance(v, Mapping) and len(v) <= 12
                        and all(not isinstance(x, (Mapping, list)) for x in v.values())):
                    out.append(f"{pad}{k}: " + ", ".join(f"{kk}={_fmt_scalar(vv)}" for kk, vv in v.items()))
                else:
                    out.append(f"{pad}{k}:")
                    _render(v, indent + 1, out)
            else:
                out.append(f"{pad}{k}: {_fmt_scalar(v) if not isinstance(v, (Mapping, list)) else '(none)'}")
    elif isinstance(value, list):
        if not value:
            out.append(pad + "(none)")
        for item in value:
            if isinstance(item, Mapping) and "code" in item and "message" in item:
                # a Reason: "[pool] code: message"
                where = f"[{item['pool']}] " if item.get("pool") else ""
                out.append(f"{pad}- {where}{item['code']}: {item['message']}")
            elif isinstance(item, Mapping) and "kind" in item and ("override_id" in item or "id" in item):
                oid = item.get("override_id") or item.get("id")
                target = item.get("pool") or item.get("priority_class") or ""
                what = item.get("text") or _fmt_scalar(item.get("value"))
                out.append(f"{pad}- {oid} {item['kind']}{'(' + target + ')' if target else ''} = {what}"
                           f" by {item.get('author') or '?'}" + (f": {item['reason']}" if item.get("reason") else ""))
            elif isinstance(item, (Mapping, list)):
                out.append(pad + "-")
                _render(item, indent + 1, out)
            else:
                out.append(f"{pad}- {_fmt_scalar(item)}")
    else:
        out.append(pad + _fmt_scalar(value))


def render_explanation(record: Mapping[str, Any]) -> str:
    """A readable account of a stored decision record; renders whichever known sections are present, then the rest."""
    lines = [f"Decision {record.get('decision_id', '?')} (generation {record.get('generation', '?')})"]
    lines.append(f"  at {_fmt_time(record.get('at_s'))}, mode {record.get('mode') or '?'}, "
                 f"outcome {record.get('outcome') or 'n/a'}")
    if record.get("valid_until_s") is not None:
        lines.append(f"  valid until {_fmt_time(record['valid_until_s'])}")
    if record.get("frozen"):
        lines.append("  telemetry frozen: the last safe decision was held")
    if record.get("summary"):
        lines.append(f"  summary: {record['summary']}")
    if record.get("explanation"):
        lines += ["", "Account"] + ["  " + ln for ln in str(record["explanation"]).splitlines()]
    done = set(_HEADER_KEYS)
    sections = list(_SECTIONS) + [(k, k.replace("_", " ").capitalize()) for k in record if k not in _HEADER_KEYS
                                  and k not in {s for s, _ in _SECTIONS}]
    for key, title in sections:
        if key in done or key not in record:
            continue
        done.add(key)
        value = record[key]
        if value is None or value == {} or value == []:
            if key in ("guard_adjustments", "overrides"):
                lines += ["", title, "  (none)"]
            continue
        lines += ["", title]
        if isinstance(value, (Mapping, list)):
            _render(value, 1, lines)
        else:
            lines.append("  " + _fmt_scalar(value))
    return "\n".join(lines)


# --------------------------------------------------------------------------- the service


def _invalid(context: grpc.ServicerContext, field_name: str, message: str) -> NoReturn:
    text = f"{field_name}: {message}"
    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                  text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "...")


def _check_text(context: grpc.ServicerContext, field_name: str, value: str, max_len: int) -> None:
    problem = text_problem(value, max_len)
    if problem is not None:
        _invalid(context, field_name, problem)


def _require_leader(handle: DaemonHandle, context: grpc.ServicerContext) -> None:
    refusal = handle.write_refusal()
    if refusal is not None:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal)


@contextmanager
def _store_errors(context: grpc.ServicerContext) -> Iterator[None]:
    """A write the state store could not make (nothing was applied): FAILED_PRECONDITION when this replica may not
    write the shared state (it no longer leads), UNAVAILABLE when the store cannot be written now."""
    from controller.api.kube_store import FencedError

    try:
        yield
    except FencedError as exc:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"state: {exc}; nothing was changed")
    except StoreError as exc:
        context.abort(grpc.StatusCode.UNAVAILABLE, f"state: cannot write it now ({exc}); nothing was changed")


def _limit(context: grpc.ServicerContext, value: int, default: int, most: int = MAX_LIST_LIMIT) -> int:
    if value == 0:
        return default
    if not 1 <= value <= most:
        _invalid(context, "limit", f"must be in 1..{most} (0 = default {default}) (got {value})")
    return value


class _ReadCache:
    """The list answers of the store, kept while the store has not been written (`StateStore.version`) and until
    the time an answer stops being true (an active override's expiry). Dashboards and scripts poll the same few
    lists, and building them from SQLite is most of a list call's own work (docs/RELIABILITY.md, "Load").
    Thread-safe; at most MAX_KEYS answers (keys carry client-chosen limits and times)."""

    MAX_KEYS = 64

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._answers: dict[tuple, tuple[int, float, Any]] = {}

    def get(self, key: tuple, now_s: float, build: Callable[[], tuple[Any, float]]) -> Any:
        """The cached answer for `key`, or `build()` → (answer, valid until, in clock seconds) stored."""
        version = self._store.version
        with self._lock:
            hit = self._answers.get(key)
        if hit is not None and hit[0] == version and now_s < hit[1]:
            return hit[2]
        answer, valid_until_s = build()
        with self._lock:
            if len(self._answers) >= self.MAX_KEYS:
                self._answers.clear()
            # a write that landed while building leaves `version` newer than the answer: the next call rebuilds
            self._answers[key] = (version, valid_until_s, answer)
        return answer


class _PolicyService(policy_pb2_grpc.PolicyServiceServicer):
    def __init__(self, handle: DaemonHandle, store: StateStore, clock: Clock) -> None:
        self._handle = handle
        self._store = store
        self._clock = clock
        self._cache = _ReadCache(store)

    def GetStatus(self, request: policy_pb2.GetStatusRequest,  # noqa: N802 - gRPC method name
                  context: grpc.ServicerContext) -> policy_pb2.Status:
        return status_to_proto(self._handle.status())

    def ListDecisions(self, request: policy_pb2.ListDecisionsRequest,  # noqa: N802 - gRPC method name
                      context: grpc.ServicerContext) -> policy_pb2.ListDecisionsResponse:
        limit = _limit(context, request.limit, DEFAULT_DECISIONS_LIMIT)
        _check_text(context, "pool", request.pool, MAX_NAME)
        if not math.isfinite(request.since_unix_s) or request.since_unix_s < 0:
            _invalid(context, "since_unix_s", f"must be >= 0 (0 = no lower bound) (got {request.since_unix_s})")
        def build() -> tuple[policy_pb2.ListDecisionsResponse, float]:
            rows = self._store.list_decisions(limit=limit, since_s=request.since_unix_s, pool=request.pool)
            return policy_pb2.ListDecisionsResponse(decisions=[decision_summary(r) for r in rows]), math.inf

        return self._cache.get(("decisions", limit, request.since_unix_s, request.pool), self._clock.now_s(), build)

    def ExplainDecision(self, request: policy_pb2.ExplainDecisionRequest,  # noqa: N802 - gRPC method name
                        context: grpc.ServicerContext) -> policy_pb2.Explanation:
        if not request.decision_id:
            _invalid(context, "decision_id", "is required")
        _check_text(context, "decision_id", request.decision_id, MAX_NAME)
        record = self._store.get_decision(request.decision_id)
        row = self._store.get_decision_row(request.decision_id)
        if record is None or row is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"decision {request.decision_id!r} is not recorded "
                          f"(only the last {self._store.max_decisions} decisions are kept)")
        return policy_pb2.Explanation(decision=decision_summary(row), text=render_explanation(record),
                                      json=json.dumps(record, indent=2))

    def SetOverride(self, request: policy_pb2.SetOverrideRequest,  # noqa: N802 - gRPC method name
                    context: grpc.ServicerContext) -> policy_pb2.Override:
        _require_leader(self._handle, context)
        if not request.HasField("override"):
            _invalid(context, "override", "is required")
        o = request.override
        kind = PROTO_TO_KIND.get(o.kind)
        if kind is None:
            got = policy_pb2.OverrideKind.Name(o.kind) if o.kind in policy_pb2.OverrideKind.values() else o.kind
            _invalid(context, "override.kind",
                     f"must be one of {', '.join(policy_pb2.OverrideKind.keys()[1:])} (got {got})")
        now_s = self._clock.now_s()
        try:
            with _store_errors(context):
                stored = self._store.add_override(kind, ttl_s=o.ttl_s, author=o.author, now_s=now_s, value=o.value,
                                                  pool=o.pool, priority_class=o.priority_class, text=o.text,
                                                  reason=o.reason, known_pools=set(self._handle.pool_names()),
                                                  caller=current_caller().identity)
        except InvalidRequestError as exc:
            # "override" itself (too many active) or one of its fields
            _invalid(context, "override" if exc.field == "override" else f"override.{exc.field}", exc.reason)
        self._notify_overrides()
        return override_to_proto(stored)

    def _notify_overrides(self) -> None:
        try:
            self._handle.on_overrides_changed()
        except Exception:  # logged: the override is stored; the daemon reads it on its next tick anyway
            log.exception("on_overrides_changed failed")

    def ListOverrides(self, request: policy_pb2.ListOverridesRequest,  # noqa: N802 - gRPC method name
                      context: grpc.ServicerContext) -> policy_pb2.ListOverridesResponse:
        now_s = self._clock.now_s()
        if self._store.expiry_due(now_s):  # audited when first seen expired, tick or not
            self._store.expire_overrides(now_s)

        def build() -> tuple[policy_pb2.ListOverridesResponse, float]:
            overrides = self._store.list_overrides(now_s, include_expired=request.include_expired)
            # the active list changes when the first of them expires; the full list only by a write
            until = math.inf if request.include_expired else min((o.expires_s for o in overrides), default=math.inf)
            return policy_pb2.ListOverridesResponse(overrides=[override_to_proto(o) for o in overrides]), until

        return self._cache.get(("overrides", request.include_expired), now_s, build)

    def DeleteOverride(self, request: policy_pb2.DeleteOverrideRequest,  # noqa: N802 - gRPC method name
                       context: grpc.ServicerContext) -> policy_pb2.DeleteOverrideResponse:
        _require_leader(self._handle, context)
        if not request.id:
            _invalid(context, "id", "is required")
        _check_text(context, "id", request.id, MAX_NAME)
        _check_text(context, "author", request.author, MAX_AUTHOR)
        if not request.author.strip():
            _invalid(context, "author", "is required: who deletes this override")
        try:
            with _store_errors(context):
                deleted = self._store.delete_override(request.id, author=request.author, now_s=self._clock.now_s(),
                                                      caller=current_caller().identity)
        except InvalidRequestError as exc:
            _invalid(context, exc.field, exc.reason)
        if deleted:
            self._notify_overrides()
        return policy_pb2.DeleteOverrideResponse(deleted=deleted)

    def SetMode(self, request: policy_pb2.SetModeRequest,  # noqa: N802 - gRPC method name
                context: grpc.ServicerContext) -> policy_pb2.SetModeResponse:
        _require_leader(self._handle, context)
        mode = PROTO_TO_MODE.get(request.mode)
        if mode is None:
            _invalid(context, "mode", f"must be MODE_ACTIVE, MODE_SHADOW or MODE_PAUSED (got {request.mode})")
        # bounded and clean before the daemon or the audit trail sees them
        _check_text(context, "author", request.author, MAX_AUTHOR)
        _check_text(context, "reason", request.reason, MAX_REASON)
        if not request.author.strip():
            _invalid(context, "author", "is required: who changes the mode")
        previous = self._handle.status().mode
        try:
            self._handle.set_mode(mode, request.author, request.reason)
        except ValueError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"mode: the daemon refused {mode.value}: {exc}")
        try:
            with _store_errors(context):  # not persisted (or, under leader election, not replicated): undone
                self._store.set_mode(mode, author=request.author.strip(), reason=request.reason,
                                     now_s=self._clock.now_s(), caller=current_caller().identity)
        except BaseException:
            self._handle.set_mode(previous if isinstance(previous, Mode) else Mode(str(previous)), "governor",
                                  "the state store refused the change")
            raise
        prev = previous.value if isinstance(previous, Mode) else str(previous)
        return policy_pb2.SetModeResponse(previous=MODE_TO_PROTO.get(prev, policy_pb2.MODE_UNSPECIFIED),
                                          mode=MODE_TO_PROTO[mode.value])

    def ListAudit(self, request: policy_pb2.ListAuditRequest,  # noqa: N802 - gRPC method name
                  context: grpc.ServicerContext) -> policy_pb2.ListAuditResponse:
        limit = _limit(context, request.limit, DEFAULT_AUDIT_LIMIT, MAX_AUDIT_LIMIT)

        def build() -> tuple[policy_pb2.ListAuditResponse, float]:
            return policy_pb2.ListAuditResponse(entries=[
                policy_pb2.AuditEntry(at_unix_s=e.at_s, author=e.author, action=e.action, detail=e.detail,
                                      caller=e.caller)
                for e in self._store.list_audit(limit)
            ]), math.inf

        return self._cache.get(("audit", limit), self._clock.now_s(), build)


class PolicyServer:
    """The PolicyService gRPC server. Construction checks the listen address (InsecureListenError for a
    non-loopback address with neither a token nor mTLS); `start()` binds and returns the port.

    `token` is the single legacy token (name "api-token", write role); `tokens` the named ones of
    api.tokens_file. With mTLS, a certificate whose CN or SAN is in `cert_roles` gets that role, any other
    verified one `cert_role`."""

    def __init__(self, handle: DaemonHandle, store: StateStore, listen: str, *, token: str | None,
                 tls: TlsConfig | None = None, clock: Clock, max_workers: int = 8,
                 tokens: tuple[TokenEntry, ...] = (), cert_roles: Mapping[str, str] | None = None,
                 cert_role: str = "write") -> None:
        self.handle = handle
        self.store = store
        self.listen = listen
        self.token = token or None  # "" means no token
        self.tls = tls
        self.clock = clock
        self.max_workers = max_workers
        entries = ((TokenEntry("api-token", self.token, "write"),) if self.token else ()) + tuple(tokens)
        self.authenticator = Authenticator(entries, mtls=tls is not None and tls.mutual, cert_roles=cert_roles,
                                           cert_role=cert_role)
        check_listen_safe(listen, self.token or ("tokens" if tokens else None), tls)
        self._server: grpc.Server | None = None
        self._health: health.HealthServicer | None = None
        self.port: int | None = None

    def start(self) -> int:
        if self._server is not None:
            raise RuntimeError("PolicyServer already started")
        interceptors: list[grpc.ServerInterceptor] = [AuthInterceptor(self.authenticator, WRITE_METHODS)]
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="policy-api"),
                             interceptors=interceptors, options=server_options(MAX_REQUEST_BYTES))
        policy_pb2_grpc.add_PolicyServiceServicer_to_server(_PolicyService(self.handle, self.store, self.clock), server)
        self._health = add_health_and_reflection(server, SERVICE_NAME)
        port = bind(server, self.listen, self.tls, "PolicyService")
        server.start()
        self._server = server
        self.port = port
        return port

    def stop(self, grace_s: float = 1.0) -> None:
        if self._health is not None:
            self._health.enter_graceful_shutdown()
        if self._server is not None:
            self._server.stop(grace_s).wait()
            self._server = None
