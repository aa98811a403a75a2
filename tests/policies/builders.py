"""Small builders that make PolicyInput rows concisely, and a closed-loop driver.

obs_row(ready=4, gpu_util_frac=0.9, ttft_p95_s=None) → a PoolObservation where a
number is an OK reading, None is MISSING, and the string "nan"/"stale" gives a
NaN/stale reading. `drive` feeds each output back as the decision in force, the
way Controller.step does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from controller.types import (
    MISSING,
    Decision,
    FleetObservation,
    FleetSpec,
    PolicyInput,
    PolicyOutput,
    PoolDecision,
    PoolObservation,
    PoolSpec,
    Reading,
    SignalStatus,
    SloSpec,
)

SLOS = {"critical": SloSpec(ttft_s=2.0, tpot_s=0.1), "standard": SloSpec(ttft_s=5.0, tpot_s=0.15),
        "sheddable": SloSpec(ttft_s=10.0, tpot_s=0.3)}

_ALIASES = {"ready": "replicas_ready", "starting": "replicas_starting", "gpu": "gpu_util_frac", "kv": "kv_usage_frac",
            "ttft": "ttft_p95_s", "tpot": "tpot_p95_s", "rps": "arrival_rps", "prompt": "prompt_tokens_rps",
            "gen": "generation_tokens_rps"}


def spec(name: str = "p", **kw: Any) -> PoolSpec:
    base: dict[str, Any] = dict(model="llama-3-8b", sku="a100-80gb", min_replicas=1, max_replicas=64,
                                startup_warm_s=30.0)
    base.update(kw)
    return PoolSpec(name=name, **base)


def fleet(*specs: PoolSpec, slos: Mapping[str, SloSpec] | None = None) -> FleetSpec:
    return FleetSpec(pools=tuple(specs) or (spec(),), slos=dict(SLOS if slos is None else slos))


def reading(v: Any) -> Reading:
    if isinstance(v, Reading):
        return v
    if v is None:
        return MISSING
    if v == "nan":
        return Reading(math.nan, SignalStatus.NAN)
    if v == "stale":
        return Reading(1.0, SignalStatus.STALE, age_s=600.0)
    return Reading(float(v))


def obs_row(pool: str = "p", **values: Any) -> PoolObservation:
    fields: dict[str, Any] = {_ALIASES.get(k, k): (v if k == "replicas" else reading(v)) for k, v in values.items()}
    return PoolObservation(pool=pool, **fields)


def decision(replicas: Mapping[str, int] | Mapping[str, PoolDecision], at_s: float = 0.0) -> Decision:
    pools = {p: (v if isinstance(v, PoolDecision) else PoolDecision(replicas=int(v))) for p, v in replicas.items()}
    return Decision(decision_id="d-test", generation=1, at_s=at_s, valid_until_s=at_s + 120.0, pools=pools)


def inp(now_s: float, pools: Mapping[str, Mapping[str, Any]] | None = None, *, fl: FleetSpec | None = None,
        current: Mapping[str, int] | Decision | None = None, tick_s: float = 15.0) -> PolicyInput:
    """pools: {pool: {signal: value}}; current: {pool: replicas} (or a Decision), None = nothing in force."""
    fl = fl or fleet()
    pools = pools or {}
    obs = FleetObservation(at_s=now_s, pools={p: obs_row(p, **v) for p, v in pools.items()})
    cur = current if isinstance(current, Decision) or current is None else decision(current, now_s)
    return PolicyInput(now_s=now_s, observation=obs, fleet=fl, current=cur, tick_s=tick_s)


def decide(policy, state, i: PolicyInput):
    return policy.decide(state, i, np.random.default_rng(0))


def drive(policy, fl: FleetSpec, steps: Sequence[tuple[float, Mapping[str, Mapping[str, Any]]]],
          start: Mapping[str, int] | None = None, state: Any = None) -> list[PolicyOutput]:
    """Run the policy over (now_s, pools) steps, feeding each decision back as the one in force."""
    state = policy.initial_state() if state is None else state
    current: Decision | None = decision(start) if start is not None else None
    outs = []
    for now_s, pools in steps:
        i = inp(now_s, pools, fl=fl, current=current)
        state, out = decide(policy, state, i)
        outs.append(out)
        current = Decision(decision_id=f"d-{len(outs)}", generation=len(outs), at_s=now_s,
                           valid_until_s=now_s + 120, pools=dict(out.pools), admission=dict(out.admission))
    return outs


def codes(out: PolicyOutput, pool: str | None = "p") -> list[str]:
    return [r.code for r in out.reasons if pool is None or r.pool == pool]
