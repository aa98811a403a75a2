"""A policy that proposes what it is told and records what it saw."""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.types import PolicyInput, PolicyOutput, PoolDecision, Reason


@dataclass
class ScriptedPolicy:
    replicas: dict[str, int]
    name: str = "scripted"
    seen: list[PolicyInput] = field(default_factory=list)
    draws: list[float] = field(default_factory=list)

    def initial_state(self) -> int:
        return 0

    def decide(self, state: int, inp: PolicyInput, rng):
        self.seen.append(inp)
        self.draws.append(float(rng.random()))
        pools = {p: PoolDecision(replicas=n) for p, n in self.replicas.items()}
        reasons = tuple(Reason("scripted", f"told to run {n}", pool=p) for p, n in self.replicas.items())
        return state + 1, PolicyOutput(pools=pools, reasons=reasons, diagnostics={"calls": state + 1})
