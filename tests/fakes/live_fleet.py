"""A fake Fleet with only the control surface the live gRPC servicers use; it records every call.

It enforces the contract's ranges the way the real Fleet does (ValueError naming
the field) and can be told to reject one pool, to exercise the rollback path.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.sim.scenario import Scenario, parse_scenario

SCENARIO_YAML = """\
name: fake-live
trace: {path: unused.jsonl}
pools:
  - {name: big, model: llama-3-70b, sku: h100-80gb, tp: 4, replicas: 2, min_replicas: 1, max_replicas: 8}
  - {name: small, model: llama-3-8b, sku: a100-80gb, replicas: 3, max_replicas: 16, traffic_weight: 0.5}
router:
  prefix_weight: 3.0
  admission:
    sheddable: {rate_limit_rps: 10.0, queue_budget: 50, shed_frac: 0.0}
"""


def fake_scenario() -> Scenario:
    return parse_scenario(SCENARIO_YAML, source="fake-live.yaml")


@dataclass(frozen=True)
class FakePoolState:
    pool: str
    target_replicas: int
    ready: int
    starting: int
    draining: int
    standby: int
    max_num_seqs: int
    max_num_batched_tokens: int
    unavailable: int = 0


class FakeFleet:
    def __init__(self, scenario: Scenario | None = None) -> None:
        self.scenario = scenario or fake_scenario()
        self.now_s = 0.0
        self.calls: list[tuple] = []
        self.resets = 0
        self.reject_pool: str | None = None  # set_pool_target / set_pool_routing raise for this pool
        self.targets = {p.name: p.replicas for p in self.scenario.pools}
        self.seqs = {p.name: p.engine.max_num_seqs for p in self.scenario.pools}
        self.tokens = {p.name: p.engine.max_num_batched_tokens for p in self.scenario.pools}

    def _pool(self, pool: str):
        try:
            return self.scenario.pool(pool)
        except KeyError:
            raise ValueError(f"pool: unknown pool {pool!r}") from None

    def set_pool_routing(self, pool: str, **kw) -> None:
        self._pool(pool)
        if pool == self.reject_pool:
            raise ValueError(f"pool {pool!r}: rejected by the fake")
        self.calls.append(("routing", pool, kw))

    def set_ejected(self, pool: str, replicas: list[str]) -> None:
        self._pool(pool)
        self.calls.append(("ejected", pool, list(replicas)))

    def replace_replicas(self, pool: str, replicas: list[str]) -> list[str]:
        self._pool(pool)
        self.calls.append(("replace", pool, list(replicas)))
        return list(replicas)

    def set_admission(self, priority_class: str, **kw) -> None:
        self.calls.append(("admission", priority_class, kw))

    def set_step_aware(self, step_aware: bool | None) -> None:
        self.step_aware = step_aware  # kept apart from `calls`: the routing tests compare those exactly

    def set_pool_target(self, pool: str, *, replicas: int, warm_standby: int | None = None,
                        max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None) -> None:
        spec = self._pool(pool)
        if pool == self.reject_pool:
            raise ValueError(f"pool {pool!r}: rejected by the fake")
        if not spec.min_replicas <= replicas <= spec.max_replicas:
            raise ValueError(f"replicas: {replicas} out of range")
        self.calls.append(("target", pool, {"replicas": replicas, "warm_standby": warm_standby,
                                            "max_num_seqs": max_num_seqs,
                                            "max_num_batched_tokens": max_num_batched_tokens}))
        self.targets[pool] = replicas
        if max_num_seqs is not None:
            self.seqs[pool] = max_num_seqs
        if max_num_batched_tokens is not None:
            self.tokens[pool] = max_num_batched_tokens

    def reset_controls(self) -> None:
        self.resets += 1
        self.calls.append(("reset",))
        self.targets = {p.name: p.replicas for p in self.scenario.pools}

    def pool_states(self) -> dict[str, FakePoolState]:
        return {p: FakePoolState(p, n, n, 0, 0, 0, self.seqs[p], self.tokens[p]) for p, n in self.targets.items()}

    def replica_phases(self) -> list[tuple[str, str, str, float]]:
        return [("big-r0", "big", "ready", 0.0), ("small-r3", "small", "starting", 12.5)]

    def target_calls(self) -> list[tuple]:
        return [c for c in self.calls if c[0] == "target"]
