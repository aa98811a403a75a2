"""What `governor config validate` and `governor run` both check before anything starts, in one place.

`preflight(path)` loads the config (every field, the cross-field checks, and each pool's engine:
model and SKU from the catalogue or the config's `catalogue:` declarations, TP that divides the
heads and fits the memory), checks that the phases' timeouts × attempts fit the tick
(controller/tick_budget.py), then builds the configured policy with its `policy_params` on the
fleet, and returns the Settings or raises ConfigError listing every problem. `cmd_validate` is the
CLI handler; `governor run` calls `preflight` before it binds a port, so a file that validates
starts and one that does not is refused with the same message. Must not: open sockets, start
threads or write anything.
"""

from __future__ import annotations

import sys
from pathlib import Path

from controller.config import ConfigError, Settings, load_settings
from controller.policies.registry import build_policy
from controller.tick_budget import tick_budget_problems


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
    try:
        build_policy(settings.policy, settings.fleet_spec(), params)
    except (ValueError, TypeError) as exc:
        raise ConfigError([f"{source}: policy {settings.policy!r} with policy_params: {exc}"], source) from None
    return settings


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
