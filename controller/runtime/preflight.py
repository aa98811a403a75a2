"""What `governor config validate` and `governor run` both check before anything starts, in one place.

`preflight(path)` loads the config (every field, the cross-field checks, and each pool's engine:
model and SKU from the catalogue or the config's `catalogue:` declarations, TP that divides the
heads and fits the memory), checks that the phases' timeouts × attempts fit the tick
(controller/config/tick_budget.py), then builds the configured policy with its `policy_params` on the
fleet, then checks what start-up would meet short of binding ports (`startup_problems`: the state
directory (its owner and permissions) and database, and every file and secret the config names:
token and password files, TLS material of every listener and client, kubeconfigs), and returns the Settings or raises
ConfigError listing every problem. `cmd_validate` is the
CLI handler; `governor run` calls `preflight` before it binds a port, so a file that validates
starts and one that does not is refused with the same message. Must not: open sockets, start
threads or write anything (the state database is opened read-only).
"""

from __future__ import annotations

import os
import sqlite3
import ssl
import stat
import sys
from pathlib import Path
from typing import Any

from controller.clock import budget_timer
from controller.config import ConfigError, Settings, load_settings
from controller.config.carriers import carriage_table
from controller.config.tick_budget import tick_budget_problems
from controller.policies.registry import build_policy
from controller.rpc.transport import load_tokens_file


def preflight(path: str | Path | None) -> Settings:
    """The validated Settings of `path`; ConfigError names each problem (file:line: field: what)."""
    settings = load_settings(path)
    source = str(path) if path is not None else "(no config file)"
    budget = tick_budget_problems(settings)  # every phase's deadline must fit inside the tick
    if budget:
        raise ConfigError([f"{source}: {p}" for p in budget], source)
    params = dict(settings.policy_params)
    problems = []
    if settings.policy == "mpc":
        params["engine_figures"] = {**{n: e.figures for n, e in settings.engines().items()},
                                    **dict(params.get("engine_figures") or {})}
        try:  # what the time budget counts: the daemon picks the clock (runtime/main.py), the policy gets a timer
            budget_timer(str(params.pop("budget_clock", "wall")))
        except ValueError as exc:
            problems.append(f"{source}: policy_params: {exc}")
    try:
        build_policy(settings.policy, settings.fleet_spec(), params)
    except (ValueError, TypeError) as exc:
        problems.append(f"{source}: policy {settings.policy!r} with policy_params: {exc}")
    problems += [f"{source}: {p}" for p in startup_problems(settings)]
    if problems:
        raise ConfigError(problems, source)
    return settings


def _readable(path: str | None, what: str) -> str | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            f.read(1)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        return f"{what}: cannot read {path!r}: {getattr(exc, 'strerror', None) or exc}"
    return None


def _secret_problem(path: str | None, what: str) -> str | None:
    """A file whose first line is a secret (token, password): readable and not empty, as the daemon reads it."""
    if path is None:
        return None
    unreadable = _readable(path, what)
    if unreadable:
        return unreadable
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        return f"{what}: cannot read {path!r} as text: {exc}"
    if not text.strip():
        return f"{what}: {path!r} is empty (its first line is the secret)"
    return None


def _ssl_why(exc: Exception) -> str:
    return getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def tls_problems(prefix: str, *, ca: str | None = None, cert: str | None = None, key: str | None = None,
                 ca_field: str = "ca") -> list[str]:
    """The TLS files of one listener or client, each readable and well-formed PEM as ssl will load them: the CA
    bundle as trust anchors, the certificate with its private key as a pair (a key that does not match is refused)."""
    out = [p for p in (_readable(path, f"{prefix}.{name}") for path, name in ((ca, ca_field), (cert, "cert"),
                                                                             (key, "key"))) if p]
    if out:
        return out
    if ca is not None:
        try:
            ssl.create_default_context(ssl.Purpose.SERVER_AUTH).load_verify_locations(cafile=ca)
        except (ssl.SSLError, OSError, ValueError) as exc:
            out.append(f"{prefix}.{ca_field}: {ca!r} is not a PEM CA bundle ({_ssl_why(exc)})")
    if cert is not None and key is not None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key)
        except (ssl.SSLError, OSError, ValueError) as exc:
            out.append(f"{prefix}.cert/key: {cert!r} and {key!r} are not a PEM certificate and its private key "
                       f"({_ssl_why(exc)})")
    return out


def kubeconfig_problems(prefix: str, kubeconfig: str | None, context: str | None = None) -> list[str]:
    """What the official client meets when the daemon configures it: the kubeconfig file (parsed, its context
    there), or, without one, the pod's service account (the token and CA files of an in-cluster pod)."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        if kubeconfig:
            unreadable = _readable(kubeconfig, f"{prefix}.kubeconfig")
            if unreadable:
                return [unreadable]
            config.load_kube_config(config_file=kubeconfig, context=context,
                                    client_configuration=client.Configuration(), persist_config=False)
        else:
            config.load_incluster_config(client_configuration=client.Configuration())
    except (ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
        if kubeconfig:
            return [f"{prefix}.kubeconfig: {kubeconfig!r} cannot configure the Kubernetes client: {exc}"]
        return [f"{prefix}.kubeconfig: null means the pod's service account, and there is none here ({exc}); "
                "outside a pod name a kubeconfig file"]
    return []


def _private_dir_problem(d: Path, what: str) -> str | None:
    """The daemon makes the state directory and its database private to its own user at start (0700 / 0600):
    it can only do that to what it owns (or as root)."""
    try:
        st = d.stat()
    except OSError:
        return None
    me = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077 and st.st_uid != me and me != 0:
        private = "0700" if d.is_dir() else "0600"
        return (f"state_dir: {str(d)!r} is mode {mode:04o} and owned by uid {st.st_uid}, not by this user (uid {me}): "
                f"the daemon makes {what} private ({private}) at start and cannot; chown it to the daemon's user or "
                "chmod it yourself")
    return None


def state_problems(state_dir: str) -> list[str]:
    """The state directory must be (or be creatable as) a writable directory, and a state database in it a
    valid one. Read-only: nothing is created."""
    if "\x00" in state_dir:
        return [f"state_dir: {state_dir!r} is not a usable path (it holds a NUL character)"]
    d = Path(state_dir)
    if d.exists() and not d.is_dir():
        return [f"state_dir: {state_dir!r} is not a directory"]
    probe = d
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        return [f"state_dir: {str(probe)!r} is not a writable directory, so the state cannot be kept there"]
    loose = _private_dir_problem(d, "the directory") if d.exists() else None
    if loose:
        return [loose]
    problems = [f"state_dir: {str(d / name)!r} exists and is not writable by this user (uid {os.geteuid()})"
                for name in ("history.jsonl", "models", "governor.db-wal", "governor.db-shm")
                if (d / name).exists() and not os.access(d / name, os.W_OK)]
    db = d / "governor.db"
    if not db.exists():
        return problems
    if not db.is_file():
        return [f"state_dir: {str(db)!r} is not a file"]
    if not os.access(db, os.R_OK | os.W_OK):
        return [f"state_dir: {str(db)!r} is not readable and writable by this user (uid {os.geteuid()})"]
    loose = _private_dir_problem(db, "the state database")
    if loose:
        return [loose]
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1.0)
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return [f"state_dir: {db} is not a valid state database ({exc})"]
    missing = {"meta", "overrides", "audit", "decisions"} - tables
    if tables and missing:
        return [f"state_dir: {db} is not a valid state database (no table(s) {sorted(missing)})"]
    return problems


def startup_problems(s: Any) -> list[str]:
    """Every problem `governor run` would meet after the config parses, except binding ports."""
    try:
        out = state_problems(s.state_dir)
    except ValueError as exc:  # a NUL in the path
        out = [f"state_dir: {s.state_dir!r} is not a usable path ({exc})"]
    try:
        s.api.resolved_token()
    except ConfigError as exc:
        out.extend(exc.problems)
    for path, what in ((s.api.tokens_file, "api.tokens_file"), (s.actuators.keda.token_file,
                                                                "actuators.keda.token_file")):
        if path is not None and (what == "api.tokens_file" or s.actuators.keda.enabled):
            try:
                load_tokens_file(path, what)
            except ValueError as exc:
                out.append(str(exc))
    out.extend(file_problems(s))
    return out


def file_problems(s: Any) -> list[str]:
    """Every file and secret the config names that the daemon would read at start, each checked as it will be
    read: secrets readable and not empty, TLS material well-formed (certificate and key a pair), kubeconfigs
    loadable. Only what the configuration uses: a file under a disabled section is not read by `run` either."""
    out: list[str] = []
    prom = s.telemetry.prometheus
    if s.telemetry.source == "prometheus":
        out += [p for p in (_secret_problem(prom.bearer_token_file, "telemetry.prometheus.bearer_token_file"),
                            _secret_problem(prom.basic_auth.password_file if prom.basic_auth else None,
                                            "telemetry.prometheus.basic_auth.password_file")) if p]
        out += tls_problems("telemetry.prometheus.tls", ca=prom.tls.ca, cert=prom.tls.cert, key=prom.tls.key)
    out += tls_problems("api.tls", ca=s.api.tls.client_ca, cert=s.api.tls.cert, key=s.api.tls.key,
                        ca_field="client_ca")
    if s.actuators.keda.enabled:
        k = s.actuators.keda.tls
        out += tls_problems("actuators.keda.tls", ca=k.client_ca, cert=k.cert, key=k.key, ca_field="client_ca")
    for which in ("router", "autoscaler"):
        a = getattr(s.actuators, which)
        if a.address is not None:
            out += tls_problems(f"actuators.{which}.tls", ca=a.tls.ca, cert=a.tls.cert, key=a.tls.key)
    if s.otel.endpoint and s.otel.endpoint.startswith("https://"):
        out += tls_problems("otel.tls", ca=s.otel.tls.ca, cert=s.otel.tls.cert, key=s.otel.tls.key)
    kube = s.actuators.kubernetes
    if kube.enabled:
        out += kubeconfig_problems("actuators.kubernetes", kube.kubeconfig, kube.context)
    le = s.leader_election
    if le.enabled:
        out += kubeconfig_problems("leader_election", le.kubeconfig)
    return out


def cmd_validate(args) -> int:
    """`governor config validate FILE`: exit 0 with a one-line summary, or 2 with every problem on stderr."""
    try:
        settings = preflight(args.file)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    engines = ", ".join(f"{name}={e.key} ({e.source})" for name, e in settings.engines().items())
    print(f"{args.file}: ok: {settings.summary()}; engines: {engines}")
    print(carriage_table(settings))
    return 0
