"""What `governor config validate` and `governor run` both check before anything starts, in one place.

`preflight(path)` loads the config (every field, the cross-field checks, and each pool's engine:
model and SKU from the catalogue or the config's `catalogue:` declarations, TP that divides the
heads and fits the memory), checks that the phases' timeouts × attempts fit the tick
(controller/config/tick_budget.py), then builds the configured policy with its `policy_params` on the
fleet, then checks what start-up would meet short of binding ports (`startup_problems`: the state
directory and database, token and TLS files), and returns the Settings or raises
ConfigError listing every problem. `cmd_validate` is the
CLI handler; `governor run` calls `preflight` before it binds a port, so a file that validates
starts and one that does not is refused with the same message. Must not: open sockets, start
threads or write anything (the state database is opened read-only).
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

from controller.config import ConfigError, Settings, load_settings
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
    if settings.policy == "mpc":
        params["engine_figures"] = {**{n: e.figures for n, e in settings.engines().items()},
                                    **dict(params.get("engine_figures") or {})}
    problems = []
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
    db = d / "governor.db"
    if not db.exists():
        return []
    if not db.is_file():
        return [f"state_dir: {str(db)!r} is not a file"]
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
    return []


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
    files = [(s.api.tls.cert, "api.tls.cert"), (s.api.tls.key, "api.tls.key"),
             (s.api.tls.client_ca, "api.tls.client_ca")]
    if s.actuators.keda.enabled:
        k = s.actuators.keda.tls
        files += [(k.cert, "actuators.keda.tls.cert"), (k.key, "actuators.keda.tls.key"),
                  (k.client_ca, "actuators.keda.tls.client_ca")]
    for which in ("router", "autoscaler"):
        t = getattr(s.actuators, which).tls
        files += [(t.ca, f"actuators.{which}.tls.ca"), (t.cert, f"actuators.{which}.tls.cert"),
                  (t.key, f"actuators.{which}.tls.key")]
    out.extend(p for p in (_readable(path, what) for path, what in files) if p)
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
    return 0
