"""Static peak provisioning: a fixed replica count per pool, cache-blind load balancing.

What most teams run: size each pool for the trace's peak once (the bench computes
that count) and leave it. No telemetry is read, so missing data cannot hurt it.

Routing. Kubernetes Services and most gateways balance round-robin, which ignores
both cache contents and load. Our router has no round-robin mode: it scores each
replica on prefix match, queue depth and KV usage. The nearest setting is
prefix 0, queue 1, kv 0 — "least loaded" (join-the-shortest-queue): like
round-robin it spreads requests evenly over identical replicas and throws away
cache affinity (the thing round-robin loses), but it is slightly kinder under
bursts than true round-robin, because it avoids a replica whose queue is already
long. So this baseline is, if anything, a little flattered.

Source: common practice (no single published algorithm); Kubernetes Service
load balancing for the routing. Pure: no I/O, no clock; does not import
telemetry/actuation/api/runtime/gen, grpc or prometheus clients.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from controller.policies.common import (
    LEAST_LOADED,
    RoutingWeights,
    change_reason,
    clamp,
    current_target,
    pool_decision,
    reason,
    routing_reason,
)
from controller.types import PolicyInput, PolicyOutput, PoolDecision, Reason


class StaticPolicy:
    """Replicas fixed at `replicas[pool]` (clamped to the pool's bounds); least-loaded routing."""

    name = "static"

    def __init__(self, replicas: Mapping[str, int], routing: RoutingWeights = LEAST_LOADED) -> None:
        if not isinstance(replicas, Mapping) or not replicas:
            raise ValueError("static: replicas must be a non-empty mapping pool -> replica count")
        fixed: dict[str, int] = {}
        for pool, n in replicas.items():
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or int(n) < 0:
                raise ValueError(f"static: replicas[{pool!r}] must be an integer >= 0 (got {n!r})")
            fixed[str(pool)] = int(n)
        self.replicas: Mapping[str, int] = fixed
        self.routing = routing

    def initial_state(self) -> None:
        return None

    def decide(self, state: None, inp: PolicyInput, rng: np.random.Generator) -> tuple[None, PolicyOutput]:
        pools: dict[str, PoolDecision] = {}
        reasons: list[Reason] = []
        diag: dict[str, Any] = {}
        for spec in inp.fleet.pools:
            cur, source = current_target(inp, spec)
            if spec.name not in self.replicas:
                pools[spec.name] = pool_decision(cur, self.routing)
                reasons.append(reason("not_configured", spec.name,
                                      f"no static count configured for {spec.name}: holding {cur}", replicas=cur))
                diag[spec.name] = {"configured": None, "current": cur, "replicas": cur}
                continue
            want = self.replicas[spec.name]
            n, bound = clamp(want, spec.min_replicas, spec.max_replicas)
            if bound is not None:
                reasons.append(reason(f"clamped_{bound}", spec.name,
                                      f"configured {want} is outside [{spec.min_replicas}, {spec.max_replicas}]: "
                                      f"using {n}",
                                      configured=want, replicas=n))
            if n != cur or source != "decision":
                reasons.append(change_reason(spec.name, cur, n, "static peak provisioning", configured=want)
                               if n != cur else reason("static_target", spec.name, f"static target {n}", replicas=n))
            rr = routing_reason(inp, spec.name, self.routing, self.name)
            if rr is not None:
                reasons.append(rr)
            pools[spec.name] = pool_decision(n, self.routing)
            diag[spec.name] = {"configured": want, "current": cur, "replicas": n}
        return state, PolicyOutput(pools=pools, reasons=tuple(reasons),
                                   diagnostics={"pools": diag, "routing": self.routing.as_dict()})
