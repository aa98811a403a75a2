"""One list per concept: the names the config, the command line, the API, the registry and the bench share.

Each list is a `Literal` type (what the config's fields and the type checker use) and the tuple of its
values (what code iterates and error messages print), so a name added here is accepted everywhere at
once and `tests/test_names.py` checks that every reader agrees with it:

- `POLICY_NAMES`: every policy `build_policy` builds (controller/policies/registry.py maps each to
  its class), the config's `policy`, `governor run --policy` and `governor bench policies
  --policies`; `GOVERNOR_POLICIES` are Governor's own, the rest the published baselines the bench
  compares them with;
- `PROFILES`: the objective's profiles (controller/core/objective.py weights each), the config's
  `profile`, the `profile` override and `governor mode`'s profile, `bench policies --profile`;
- `ENGINE_KINDS`: the inference engines a pool may run (each has its series in
  controller/metrics/names.py, its batch-cap flags in controller/actuation/kube.py and its exposition
  in the simulator); `TARGET_KINDS` adds the other exporters a scrape target may be (DCGM, the
  router).
- A tenant's name (`tenant_problem`): the picker's fairness id (controller/dataplane/task_book.py), the
  RoutingPolicy's tenant limits (controller/rpc/command_rules.py) and the tenant overrides
  (controller/api/store.py) accept the same names; `ALL_TENANTS` ("*") names every tenant not named.

A leaf: the standard library only (the command line imports it to build its help), no I/O.
"""

from __future__ import annotations

import re
from typing import Literal, get_args

PolicyName = Literal["static", "hpa", "kpa", "sla-planner", "scorer-kpa", "slo-feedback", "llm-d-stack",
                     "aibrix-stack", "dynamo-stack", "mpc"]
POLICY_NAMES: tuple[str, ...] = get_args(PolicyName)

GOVERNOR_POLICIES: tuple[str, ...] = ("slo-feedback", "mpc")
"""Governor's own policies; every other name in POLICY_NAMES is a baseline (bench reports rank them apart)."""

ProfileName = Literal["cost", "balanced", "latency", "throughput"]
PROFILES: tuple[str, ...] = get_args(ProfileName)

EngineKind = Literal["vllm", "sglang"]
ENGINE_KINDS: tuple[str, ...] = get_args(EngineKind)

TargetKind = Literal[EngineKind, "dcgm", "router"]
TARGET_KINDS: tuple[str, ...] = get_args(TargetKind)
"""What a scrape target exports: an engine's /metrics, a DCGM exporter's or the router's."""

MAX_ID_BYTES = 128
"""Longest task or tenant id (bytes): a UUID is 36, a tenant name a DNS label (63); 128 leaves room for prefixes."""
ID_RE = re.compile(r"[A-Za-z0-9._~:/@+=\-]{1,128}")
ID_CHARS = "A-Z a-z 0-9 . _ ~ : / @ + = -"
ALL_TENANTS = "*"


def tenant_problem(name: str, *, wildcard: bool = True) -> str | None:
    """Why `name` is not a tenant name (None: it is): 1..MAX_ID_BYTES bytes of ID_CHARS, or "*" when `wildcard`."""
    if wildcard and name == ALL_TENANTS:
        return None
    if not name:
        return "must be non-empty" + (' (or "*" for every tenant not named)' if wildcard else "")
    n = len(name.encode("utf-8", "surrogatepass"))
    if n > MAX_ID_BYTES:
        return f"{n} bytes, at most {MAX_ID_BYTES}"
    if not ID_RE.fullmatch(name):
        return f"{name[:40]!r} has characters outside {ID_CHARS}"
    return None
