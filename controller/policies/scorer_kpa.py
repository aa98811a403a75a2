"""llm-d / AIBrix style: scorer-weighted routing plus a KPA-style autoscaler on KV-cache usage.

Sources:
- Routing: the llm-d inference scheduler's default scorer profile — prefix-cache
  scorer weight 3, queue scorer 2, KV-cache-utilisation scorer 2 — which maps one
  to one onto our router's prefix/queue/kv weights.
- Autoscaling: AIBrix's KPA strategy (vllm-project/aibrix, docs "Metric-based
  Autoscaling" and pkg/controller/podautoscaler): a Knative-style stable/panic
  decider with AIBrix's defaults — stable (observe) window 180 s, panic window
  60 s, panic threshold 2.0, max scale-up rate 2, max scale-down rate 2, scale-up
  and scale-down tolerance 0.1, scale-down stabilisation (cooldown) window 300 s,
  scale-up window 0 s. Target: KV-cache usage 0.5 per replica, the value of
  AIBrix's KPA sample on `gpu_cache_usage_perc` (now `kv_cache_usage_perc`).

The KPA decider is the one in kpa.py (Knative's algorithm, which AIBrix ports),
fed with the pool's total KV usage (mean usage × ready replicas, i.e. the sum over
replicas) averaged over the windows. Example: 4 ready at 0.8 mean usage, target
0.5 → ceil(3.2 / 0.5) = 7, capped by the scale-up rate at ceil(2 × 4) = 8 → 7;
at 0.52 the ratio 1.04 is inside the 10 % tolerance → no change.
Then the highest recommendation of the last 300 s bounds any scale-down (HPA-style
stabilisation; the window starts seeded with the count in force), then the pool bounds. As in
Knative, a pool first seen with more than one ready replica starts in panic mode at that count.
Missing data: without a fresh KV-usage sample and ready count this tick, the pool
holds (no decision on data older than the tick). Floor: max(pool min, 1).

Pure: no I/O, no clock; does not import telemetry/actuation/api/runtime/gen,
grpc or prometheus clients.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from controller.policies.common import (
    SCORER_DEFAULT,
    Events,
    RoutingWeights,
    check_positive,
    current_target,
    pool_decision,
    push_sample,
    reason,
    replica_floor,
    routing_reason,
    stabilise,
    value,
    window_mean,
)
from controller.policies.kpa import KpaParams, KpaPoolMemory, bound_and_explain, first_sight, kpa_scale
from controller.types import PolicyInput, PolicyOutput, PoolDecision, Reason


@dataclass(frozen=True, slots=True)
class ScorerKpaPoolMemory:
    kpa: KpaPoolMemory = field(default_factory=KpaPoolMemory)
    recommendations: Events = ()


@dataclass(frozen=True, slots=True)
class ScorerKpaState:
    pools: Mapping[str, ScorerKpaPoolMemory] = field(default_factory=dict)


class ScorerKpaPolicy:
    """Scorer routing (prefix 3, queue 2, kv 2) + AIBrix-style KPA on KV-cache usage."""

    name = "scorer-kpa"

    def __init__(self, *, target_kv_usage: float = 0.5, stable_window_s: float = 180.0, panic_window_s: float = 60.0,
                 panic_threshold: float = 2.0, max_scale_up_rate: float = 2.0, max_scale_down_rate: float = 2.0,
                 up_tolerance: float = 0.1, down_tolerance: float = 0.1, scale_down_stabilization_s: float = 300.0,
                 scale_up_stabilization_s: float = 0.0, routing: RoutingWeights = SCORER_DEFAULT) -> None:
        target = check_positive("scorer_kpa.target_kv_usage", target_kv_usage)
        if target > 1:
            raise ValueError(f"scorer_kpa.target_kv_usage must be in (0, 1] (got {target_kv_usage})")
        self.params = KpaParams(target=target, stable_window_s=stable_window_s, panic_window_s=panic_window_s,
                                panic_threshold=panic_threshold, max_scale_up_rate=max_scale_up_rate,
                                max_scale_down_rate=max_scale_down_rate, up_tolerance=up_tolerance,
                                down_tolerance=down_tolerance)
        self.down_window_s = check_positive("scorer_kpa.scale_down_stabilization_s", scale_down_stabilization_s,
                                            allow_zero=True)
        self.up_window_s = check_positive("scorer_kpa.scale_up_stabilization_s", scale_up_stabilization_s,
                                          allow_zero=True)
        self.routing = routing

    def initial_state(self) -> ScorerKpaState:
        return ScorerKpaState()

    def decide(self, state: ScorerKpaState, inp: PolicyInput,
               rng: np.random.Generator) -> tuple[ScorerKpaState, PolicyOutput]:
        now, p = inp.now_s, self.params
        pools: dict[str, PoolDecision] = {}
        reasons: list[Reason] = []
        diag: dict[str, Any] = {}
        memory = dict(state.pools)
        for spec in inp.fleet.pools:
            cur, _ = current_target(inp, spec)
            obs = inp.observation.pools.get(spec.name)
            mem = memory.get(spec.name) or ScorerKpaPoolMemory(recommendations=((now, cur),))
            rr = routing_reason(inp, spec.name, self.routing, self.name)
            if rr is not None:
                reasons.append(rr)
            kv = value(obs.kv_usage_frac) if obs is not None else None
            ready_v = value(obs.replicas_ready) if obs is not None else None
            if kv is None or ready_v is None:
                what = "kv_usage_frac" if kv is None else "replicas_ready"
                reasons.append(reason("missing_data_hold", spec.name, f"no usable {what}: holding {cur}",
                                      signal=what, replicas=cur))
                memory[spec.name] = mem
                pools[spec.name] = pool_decision(cur, self.routing)
                diag[spec.name] = {"replicas": cur, "missing": what}
                continue
            ready = int(round(ready_v))
            kmem = replace(mem.kpa, samples=push_sample(mem.kpa.samples, now, kv * ready, p.stable_window_s))
            kmem = first_sight(kmem, now, ready)
            stable = window_mean(kmem.samples, now, p.stable_window_s)
            panic = window_mean(kmem.samples, now, p.panic_window_s)
            assert stable is not None and panic is not None  # the sample just pushed is in both windows
            res = kpa_scale(p, kmem, now, spec.name, ready, cur, stable, panic)
            reasons.extend(res.reasons)
            stab, recs = stabilise(mem.recommendations, now, res.desired, cur, self.up_window_s, self.down_window_s)
            if res.desired < cur and stab > res.desired:
                reasons.append(reason("scale_down_stabilised", spec.name,
                                      f"recommendation {res.desired} held at {stab}: highest of the last "
                                      f"{self.down_window_s:g} s", proposal=res.desired, stabilised=stab))
            n = bound_and_explain(spec, cur, stab, replica_floor(spec),
                                  f"KV usage {kv:.3g} × {ready} ready (stable avg {stable:.3g}, panic avg {panic:.3g}) "
                                  f"vs {p.target:g} per replica", {**res.info, "kv_usage_frac": kv}, reasons)
            memory[spec.name] = ScorerKpaPoolMemory(kpa=res.memory, recommendations=recs)
            pools[spec.name] = pool_decision(n, self.routing)
            diag[spec.name] = {**res.info, "kv_usage_frac": kv, "current": cur, "stabilised": stab, "replicas": n}
        return ScorerKpaState(pools=memory), PolicyOutput(
            pools=pools, reasons=tuple(reasons),
            diagnostics={"pools": diag, "target_kv_usage": p.target, "routing": self.routing.as_dict(),
                         "stable_window_s": p.stable_window_s, "panic_window_s": p.panic_window_s})
