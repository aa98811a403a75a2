"""The operator commands (`governor status|decisions|explain|override|mode`): PolicyService calls, printed.

Address: --api, else the config file's `api.listen`, else 127.0.0.1:50051. Token:
--token, else $GOVERNOR_API_TOKEN, else the config's `api.token` (or the file named
by `api.token_file`). TLS: when any --tls-* flag is given, or the config sets
`api.tls.cert` (the daemon serves TLS); --tls-ca verifies the daemon (else the
system's roots), --tls-cert/--tls-key answer a daemon that requires mTLS. The
config's `api:` section is read directly with PyYAML so these commands do not
depend on the daemon's config model. Output is a readable
table (rich) or JSON with --json. Every string the daemon sends back is printed escaped
(api/limits.printable: ESC, CR, NUL... as \x1b, \r, \x00), so stored text cannot drive the
terminal; JSON output escapes them by itself. Exit codes: 0 ok, 1 the call failed (cannot
reach the daemon, refused credentials, rejected request...), 2 bad arguments.

This module must not change anything except through the API.
"""

from __future__ import annotations

import argparse
import getpass
import json
import math
import os
import re
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import yaml
from google.protobuf.json_format import MessageToDict
from rich.console import Console
from rich.table import Table

from controller.api.limits import printable
from controller.clock import WallClock
from controller.gen.governor.v1 import policy_pb2, policy_pb2_grpc
from controller.rpc.transport import ClientTls, bearer_metadata, make_channel

DEFAULT_API = "127.0.0.1:50051"
TOKEN_ENV = "GOVERNOR_API_TOKEN"
CALL_TIMEOUT_S = 10.0

CLI_KIND: dict[str, policy_pb2.OverrideKind] = {
    "pin": policy_pb2.OVERRIDE_KIND_PIN_REPLICAS,
    "min": policy_pb2.OVERRIDE_KIND_MIN_REPLICAS,
    "max": policy_pb2.OVERRIDE_KIND_MAX_REPLICAS,
    "freeze": policy_pb2.OVERRIDE_KIND_FREEZE,
    "admission": policy_pb2.OVERRIDE_KIND_ADMISSION,
    "slo-ttft": policy_pb2.OVERRIDE_KIND_SLO_TTFT,
    "slo-tpot": policy_pb2.OVERRIDE_KIND_SLO_TPOT,
    "profile": policy_pb2.OVERRIDE_KIND_PROFILE,
    "reliability": policy_pb2.OVERRIDE_KIND_RELIABILITY,
    "tenant-rate": policy_pb2.OVERRIDE_KIND_TENANT_RATE_LIMIT,
    "tenant-inflight": policy_pb2.OVERRIDE_KIND_TENANT_MAX_INFLIGHT,
    "tenant-weight": policy_pb2.OVERRIDE_KIND_TENANT_WEIGHT,
    "step-admission": policy_pb2.OVERRIDE_KIND_STEP_ADMISSION,
}
CLI_MODE = {"active": policy_pb2.MODE_ACTIVE, "shadow": policy_pb2.MODE_SHADOW, "paused": policy_pb2.MODE_PAUSED}


class UsageError(ValueError):
    """A bad command-line value (exit 2)."""


# --------------------------------------------------------------------------- argument parsing helpers

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_ttl(text: str) -> float:
    """'900' → 900.0, '15m' → 900.0, '2h' → 7200.0, '1h30m' → 5400.0, '1d' → 86400.0."""
    s = str(text).strip().lower().replace(" ", "")
    if not s:
        raise UsageError("--ttl: empty; use seconds or a duration like 900, 15m, 2h")
    pos, total = 0, 0.0
    while pos < len(s):
        m = _DURATION_RE.match(s, pos)
        if m is None:
            raise UsageError(f"--ttl: cannot read {text!r}; use seconds or a duration like 900, 15m, 2h, 1h30m")
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if total <= 0:
        raise UsageError(f"--ttl: must be > 0 (got {text!r})")
    return total


def parse_since(text: str | None, now_s: float) -> float:
    """Unix seconds ('1700000000'), or HH:MM local time today (yesterday if that is still in the future)."""
    if text is None or str(text).strip() == "":
        return 0.0
    s = str(text).strip()
    m = re.fullmatch(r"(\d{1,2}):(\d{2})", s)
    if m:
        hour, minute = int(m.group(1)), int(m.group(2))
        if hour > 23 or minute > 59:
            raise UsageError(f"--since: {text!r} is not a time of day (HH:MM, 00:00..23:59)")
        now = datetime.fromtimestamp(now_s)
        at = now.replace(hour=hour, minute=minute, second=0, microsecond=0).timestamp()
        return at - 86400.0 if at > now_s else at
    try:
        value = float(s)
    except ValueError:
        raise UsageError(f"--since: cannot read {text!r}; use Unix seconds or HH:MM") from None
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"--since: must be >= 0 (got {text!r})")
    return value


# --------------------------------------------------------------------------- connection


def _config_api_section(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise UsageError(f"--config: cannot read {path!r}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise UsageError(f"--config: {path!r} is not valid YAML: {exc}") from exc
    api = data.get("api") if isinstance(data, dict) else None
    if api is None:
        return {}
    if not isinstance(api, dict):
        raise UsageError(f"--config: {path!r}: 'api' must be a mapping")
    return api


def _connect_address(listen: str) -> str:
    """A listen address as something to connect to: 0.0.0.0 / [::] mean this host."""
    for wildcard, local in (("0.0.0.0:", "127.0.0.1:"), ("[::]:", "[::1]:"), (":", "127.0.0.1:")):
        if listen.startswith(wildcard):
            return local + listen[len(wildcard):]
    return listen


def resolve_target(args: argparse.Namespace) -> tuple[str, str | None]:
    """(address, token) from the arguments, the environment and the config file, in that order."""
    api = _config_api_section(getattr(args, "config", None))
    address = getattr(args, "api", None) or (str(api["listen"]) if api.get("listen") else None) or DEFAULT_API
    token = getattr(args, "token", None) or os.environ.get(TOKEN_ENV) or api.get("token")
    if not token and api.get("token_file"):
        try:
            token = Path(str(api["token_file"])).read_text().strip()
        except OSError as exc:
            raise UsageError(f"--config: api.token_file {api['token_file']!r}: {exc.strerror or exc}") from exc
    return _connect_address(address), (str(token) if token else None)


def resolve_tls(args: argparse.Namespace) -> ClientTls | None:
    """TLS settings for the channel, or None for plaintext (see the module docstring for the rules)."""
    ca, cert, key = (getattr(args, f"tls_{k}", None) for k in ("ca", "cert", "key"))
    server_name = getattr(args, "tls_server_name", None)
    if (cert is None) != (key is None):
        raise UsageError("--tls-cert and --tls-key must be given together (the client certificate for mTLS)")
    tls_section = _config_api_section(getattr(args, "config", None)).get("tls") or {}
    server_tls = isinstance(tls_section, dict) and bool(tls_section.get("cert"))
    if not (ca or cert or server_name or server_tls):
        return None
    for flag, path in (("--tls-ca", ca), ("--tls-cert", cert), ("--tls-key", key)):
        if path is not None and not Path(path).is_file():
            raise UsageError(f"{flag}: no such file {path!r}")
    return ClientTls(ca_file=ca, cert_file=cert, key_file=key, server_name=server_name)


def _call(args: argparse.Namespace, rpc: Callable[[policy_pb2_grpc.PolicyServiceStub, tuple], Any]) -> Any:
    address, token = resolve_target(args)
    tls = resolve_tls(args)
    metadata = bearer_metadata(token)
    try:
        channel = make_channel(address, tls)
    except ValueError as exc:  # an unreadable certificate or key file
        raise UsageError(str(exc)) from None
    with channel:
        stub = policy_pb2_grpc.PolicyServiceStub(channel)
        try:
            return rpc(stub, metadata)
        except grpc.RpcError as exc:
            raise _ApiError(address, exc, bool(token), tls is not None) from None


class _ApiError(Exception):
    def __init__(self, address: str, exc: grpc.RpcError, had_token: bool, used_tls: bool = False) -> None:
        self.address = address
        self.used_tls = used_tls
        self.code = exc.code()
        self.details = printable(exc.details() or "")
        self.had_token = had_token
        super().__init__(self.message())

    def message(self) -> str:
        if self.code == grpc.StatusCode.UNAUTHENTICATED:
            hint = ("the token was refused; check --token / $GOVERNOR_API_TOKEN" if self.had_token
                    else f"no token was sent; pass --token, set ${TOKEN_ENV}, or --config with api.token")
            return f"not authorized by the Governor API at {self.address}: {hint}"
        if self.code == grpc.StatusCode.UNAVAILABLE:
            tls_hint = ("; over TLS, check --tls-ca (the CA that signed the daemon's certificate) and, if the "
                        "daemon requires mTLS, --tls-cert/--tls-key" if self.used_tls else
                        "; if the daemon serves TLS, pass --tls-ca (or --config with api.tls)")
            return (f"cannot reach the Governor API at {self.address} ({self.details}); is the daemon running? "
                    f"Use --api HOST:PORT or --config to point at it{tls_hint}")
        if self.code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"the Governor API at {self.address} did not answer within {CALL_TIMEOUT_S:g} s"
        if self.code == grpc.StatusCode.INVALID_ARGUMENT:
            return f"rejected: {self.details}"
        if self.code == grpc.StatusCode.NOT_FOUND:
            return f"not found: {self.details}"
        return f"the Governor API at {self.address} answered {self.code.name}: {self.details}"


def _run(args: argparse.Namespace, body: Callable[[Console], int]) -> int:
    # Piped output (files, grep, tests) gets wide tables rather than rows folded at 80 columns.
    width = None if sys.stdout.isatty() else 200
    console = Console(file=sys.stdout, highlight=False, soft_wrap=False, width=width, markup=False)
    try:
        return body(console)
    except UsageError as exc:
        print(f"governor: {exc}", file=sys.stderr)
        return 2
    except _ApiError as exc:
        print(f"governor: {exc}", file=sys.stderr)
        return 1


def _p(text: str) -> str:
    """A string from the daemon, safe to print (see the module docstring)."""
    return printable(text)


def _print_json(msg: Any) -> None:
    data = MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def _author(args: argparse.Namespace) -> str:
    if getattr(args, "author", None):
        return args.author
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (OSError, KeyError):
        return "unknown"


def _when(t: float, now_s: float) -> str:
    if not t:
        return "never"
    ago = now_s - t
    local = datetime.fromtimestamp(t)
    stamp = local.strftime("%H:%M:%S") if abs(ago) < 86400 else local.strftime("%Y-%m-%d %H:%M")
    if ago >= 0:
        return f"{stamp} ({_duration(ago)} ago)"
    return f"{stamp} (in {_duration(-ago)})"


def _duration(s: float) -> str:
    s = max(0.0, s)
    if s < 90:
        return f"{s:.0f}s"
    if s < 5400:
        return f"{s / 60:.0f}m"
    if s < 172800:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def _mode_name(mode: int) -> str:
    return policy_pb2.Mode.Name(mode).removeprefix("MODE_").lower() if mode in policy_pb2.Mode.values() else str(mode)


def _kind_name(kind: int) -> str:
    return (policy_pb2.OverrideKind.Name(kind).removeprefix("OVERRIDE_KIND_").lower()
            if kind in policy_pb2.OverrideKind.values() else str(kind))


def _count(n: int) -> str:
    return str(n) if n >= 0 else "-"  # negative = unknown


def _num(v: float, fmt: str = "{:.3g}") -> str:
    return fmt.format(v) if v else "-"


# --------------------------------------------------------------------------- commands


def cmd_status(args: argparse.Namespace) -> int:
    def body(console: Console) -> int:
        st = _call(args, lambda stub, md: stub.GetStatus(policy_pb2.GetStatusRequest(), timeout=CALL_TIMEOUT_S,
                                                         metadata=md))
        if args.json:
            _print_json(st)
            return 0
        now_s = WallClock().now_s()
        console.print(f"mode: {_mode_name(st.mode)}   profile: {_p(st.profile) or '-'}   "
                      f"policy: {_p(st.policy) or '-'}   version: {_p(st.version) or '-'}")
        console.print(f"generation: {st.generation}   last decision: {_p(st.last_decision_id) or '-'}   "
                      f"last tick: {_when(st.last_tick_unix_s, now_s)}")
        if st.telemetry_frozen:
            console.print("telemetry FROZEN: every signal is stale; the last safe decision is held")
        if st.components:
            t = Table(title="components", title_justify="left")
            for col in ("component", "health", "detail", "last ok"):
                t.add_column(col, overflow="fold")
            for c in st.components:
                t.add_row(_p(c.name), "ok" if c.healthy else "FAILING", _p(c.detail), _when(c.last_ok_unix_s, now_s))
            console.print(t)
        if st.pools:
            t = Table(title="pools", title_justify="left")
            for col in ("pool", "desired", "ready", "TTFT p95 (s)", "SLO TTFT (s)", "hit rate", "FB used",
                        "telemetry"):
                t.add_column(col, overflow="fold")
            for p in st.pools:
                t.add_row(_p(p.pool), _count(p.replicas_desired), _count(p.replicas_ready), _num(p.ttft_p95_s),
                          _num(p.slo_ttft_s), f"{p.hit_rate:.0%}" if p.hit_rate else "-",
                          f"{p.gpu_mem_used_frac:.0%}" if p.gpu_mem_used_frac else "-", _p(p.telemetry) or "-")
            console.print(t)
        if st.details:
            t = Table(title="details", title_justify="left")
            t.add_column("name")
            t.add_column("value", overflow="fold")
            for d in st.details:
                t.add_row(_p(d.name), _p(d.value))
            console.print(t)
        return 0
    return _run(args, body)


def cmd_decisions(args: argparse.Namespace) -> int:
    def body(console: Console) -> int:
        now_s = WallClock().now_s()
        req = policy_pb2.ListDecisionsRequest(limit=args.limit,
                                              since_unix_s=parse_since(getattr(args, "since", None), now_s),
                                              pool=getattr(args, "pool", "") or "")
        resp = _call(args, lambda stub, md: stub.ListDecisions(req, timeout=CALL_TIMEOUT_S, metadata=md))
        if args.json:
            _print_json(resp)
            return 0
        if not resp.decisions:
            console.print("no decisions recorded" + (" for that filter" if req.pool or req.since_unix_s else ""))
            return 0
        t = Table()
        for col in ("decision", "gen", "at", "mode", "outcome", "summary"):
            t.add_column(col, overflow="fold")
        for d in resp.decisions:
            t.add_row(_p(d.decision_id), str(d.generation), _when(d.at_unix_s, now_s), _p(d.mode), _p(d.outcome),
                      _p(d.summary))
        console.print(t)
        return 0
    return _run(args, body)


def cmd_explain(args: argparse.Namespace) -> int:
    def body(console: Console) -> int:
        req = policy_pb2.ExplainDecisionRequest(decision_id=args.decision_id)
        resp = _call(args, lambda stub, md: stub.ExplainDecision(req, timeout=CALL_TIMEOUT_S, metadata=md))
        if args.json:
            sys.stdout.write(resp.json + "\n")
            return 0
        sys.stdout.write(printable(resp.text, keep_newlines=True) + "\n")
        return 0
    return _run(args, body)


def _override_request(args: argparse.Namespace) -> policy_pb2.Override:
    kind = args.kind
    o = policy_pb2.Override(kind=CLI_KIND[kind], pool=args.pool or "", priority_class=args.priority_class or "",
                            ttl_s=parse_ttl(args.ttl), author=_author(args), reason=args.reason or "")
    tenant = getattr(args, "tenant", "") or ""
    if kind.startswith("tenant-"):
        if not tenant:
            raise UsageError(f"--tenant: required for a {kind} override (a tenant's name, or * for every tenant "
                             "not named)")
        o.text = tenant
    elif tenant:
        raise UsageError(f"--tenant: not used by a {kind} override")
    if kind == "profile":
        if not args.value:
            raise UsageError("--value: the profile name is required (cost, balanced, latency or throughput)")
        o.text = str(args.value)
    elif kind == "step-admission":
        if args.value not in ("aware", "blind"):
            raise UsageError(f"--value: aware or blind for a step-admission override (got {args.value!r})")
        o.text = str(args.value)
    elif kind != "freeze":
        if args.value is None:
            raise UsageError(f"--value: required for a {kind} override")
        try:
            o.value = float(args.value)
        except ValueError:
            raise UsageError(f"--value: must be a number for a {kind} override (got {args.value!r})") from None
    return o


def cmd_override_set(args: argparse.Namespace) -> int:
    def body(console: Console) -> int:
        req = policy_pb2.SetOverrideRequest(override=_override_request(args))
        o = _call(args, lambda stub, md: stub.SetOverride(req, timeout=CALL_TIMEOUT_S, metadata=md))
        if args.json:
            _print_json(o)
            return 0
        now_s = WallClock().now_s()
        console.print(f"override {_p(o.id)} set: {_describe(o)}, expires {_when(o.expires_unix_s, now_s)}")
        return 0
    return _run(args, body)


def _describe(o: policy_pb2.Override) -> str:
    kind = _kind_name(o.kind)
    target = _p(o.pool or o.priority_class)
    if kind.startswith("tenant_"):
        target = _p(o.text)
    what = _p(o.text) if kind in ("profile", "step_admission") else ("" if kind == "freeze" else f"{o.value:g}")
    return f"{kind}" + (f"({target})" if target else "") + (f" = {what}" if what else "")


def cmd_override_list(args: argparse.Namespace) -> int:
    def body(console: Console) -> int:
        req = policy_pb2.ListOverridesRequest(include_expired=bool(getattr(args, "all", False)))
        resp = _call(args, lambda stub, md: stub.ListOverrides(req, timeout=CALL_TIMEOUT_S, metadata=md))
        if args.json:
            _print_json(resp)
            return 0
        if not resp.overrides:
            console.print("no overrides" + ("" if req.include_expired else " active"))
            return 0
        now_s = WallClock().now_s()
        t = Table()
        for col in ("id", "override", "expires", "author", "reason"):
            t.add_column(col, overflow="fold")
        for o in resp.overrides:
            expires = _when(o.expires_unix_s, now_s) + (" EXPIRED" if o.expires_unix_s <= now_s else "")
            t.add_row(_p(o.id), _describe(o), expires, _p(o.author), _p(o.reason))
        console.print(t)
        return 0
    return _run(args, body)


def cmd_override_delete(args: argparse.Namespace) -> int:
    def body(console: Console) -> int:
        req = policy_pb2.DeleteOverrideRequest(id=args.override_id, author=_author(args))
        resp = _call(args, lambda stub, md: stub.DeleteOverride(req, timeout=CALL_TIMEOUT_S, metadata=md))
        if args.json:
            _print_json(resp)
            return 0 if resp.deleted else 1
        if resp.deleted:
            console.print(f"override {_p(args.override_id)} deleted")
            return 0
        print(f"governor: no override {args.override_id!r} (already deleted or expired and purged?)", file=sys.stderr)
        return 1
    return _run(args, body)


def cmd_mode(args: argparse.Namespace) -> int:
    def body(console: Console) -> int:
        req = policy_pb2.SetModeRequest(mode=CLI_MODE[args.mode], author=_author(args), reason=args.reason or "")
        resp = _call(args, lambda stub, md: stub.SetMode(req, timeout=CALL_TIMEOUT_S, metadata=md))
        if args.json:
            _print_json(resp)
            return 0
        console.print(f"mode: {_mode_name(resp.previous)} → {_mode_name(resp.mode)}")
        return 0
    return _run(args, body)
