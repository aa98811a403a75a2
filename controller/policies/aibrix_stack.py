"""The AIBrix stack: prefix-cache routing + KPA (or APA) autoscaling + the GPU optimizer's SKU mix.

What an AIBrix deployment runs, each layer at its own defaults (nothing fitted to a trace).

Sources (public docs and code of vllm-project/aibrix; figures only, no code copied):
- Routing: the gateway's "prefix-cache" strategy (pkg/plugins/gateway/algorithms/
  prefix_cache.go): a pod whose cached prefix covers at least
  AIBRIX_PREFIX_CACHE_MATCH_THRESHOLD_PERCENT (default 50 %) of the prompt is preferred, and
  load decides otherwise. On our linear scorer (prefix × hit fraction − queue × normalised
  in-flight) prefix weight 2 and queue weight 1 put the break-even exactly there: a 50 % hit on
  the busiest replica (2 × 0.5 − 1 = 0) ties an idle replica with no hit; more wins, less loses.
  AIBrix's second guard (fall back to least-request when the running-request spread between
  pods exceeds an absolute count) has no counterpart: our queue term is min-max normalised.
- Autoscaling: AIBrix's KPA (docs "Metric-based Autoscaling"; pkg/controller/podautoscaler),
  the scorer-kpa baseline's decider with AIBrix's KPA defaults (stable window 180 s, panic
  window 60 s, panic threshold 2, scale rates 2, tolerance 0.1, 300 s scale-down
  stabilisation) on `kv_cache_usage_perc` with the docs' target 0.5 — reused from
  scorer_kpa.py, not re-implemented. `autoscaler="apa"` runs AIBrix's APA instead: the same
  decider without panic mode, on a 60 s window, with APA's fluctuation tolerances (up 0.1,
  down 0.2; pkg/controller/podautoscaler/scaler/apa.go `NewApaScalingContext`).
- SKU mix: the GPU optimizer (python/aibrix/aibrix/gpu_optimizer; docs "Heterogeneous GPU
  Inference" and "Optimizer-based Autoscaler"), after Melange (Griggs et al., "Mélange: Cost
  Efficient LLM Serving by Exploiting GPU Heterogeneity", 2024): from offline profiles of each
  GPU type's throughput at the SLO it picks the GPU counts that serve the observed request rate
  at least cost — min Σ price_g n_g subject to Σ throughput_g n_g ≥ rate (an integer program;
  we solve it exactly by enumeration for up to 3 pools per group, greedily by price per
  throughput beyond). Each deployment's PodAutoscaler then follows the optimizer's count with
  the KPA algorithm at target 1 (the docs' `vllm:deployment_replicas` metric source), so the
  recommendation goes through the KPA windows here too. The profile is the bench's
  `ReplicaCapacity.rps` (per-replica requests/s at the tightest SLO, the same profile the SLA
  planner gets), the price `usd_per_replica_hour`, the rate the route group's arrival rate
  averaged over `optimizer_window_s` (60 s), each pool between its min replicas and its max.
  Example: A100 5.12 $/h at 3 req/s, H100 12.29 $/h at 6.5 req/s, both at least 1, 20 req/s →
  5 × A100 + 1 × H100 (37.89 $/h) beats 3 + 2 (39.94 $/h) and 1 + 3 (41.99 $/h).
  The optimizer only acts on route groups with two or more pools (a GPU mix to choose); a pool
  alone in its group, or one without a capacity profile, is left to the KPA on KV usage.
- Traffic across pools of a group: the gateway picks among all pods of the model, whatever
  their GPU type, and its load guard moves work off busy pods; we weight each pool by its
  ready replicas × profiled per-replica throughput (`pod_share_weights` in common.py).
Missing data: the KPA layer's rules (scorer_kpa.py: hold without a fresh KV reading); the
optimizer keeps its last recommendation while no arrival rate is usable, and makes none before
its first one.

Pure: no I/O, no clock; does not import telemetry/actuation/api/runtime/gen, grpc or
prometheus clients.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from controller.perf.replica_capacity import ReplicaCapacity
from controller.policies.common import (
    RoutingWeights,
    Samples,
    ceil_replicas,
    check_choice,
    check_positive,
    current_target,
    pod_share_weights,
    push_sample,
    reason,
    replica_floor,
    route_groups,
    value,
    window_mean,
)
from controller.policies.kpa import KpaParams, KpaPoolMemory, bound_and_explain, first_sight, kpa_scale
from controller.policies.scorer_kpa import ScorerKpaPolicy, ScorerKpaState
from controller.types import PolicyInput, PolicyOutput, PoolSpec, Reason

# AIBrix prefix-cache routing on our scorer: break-even at a 50 % prefix match on the busiest replica.
AIBRIX_PREFIX_CACHE = RoutingWeights(prefix_weight=2.0, queue_weight=1.0, kv_weight=0.0)
AUTOSCALERS = ("kpa", "apa")
# Up to this many pools per route group the optimizer's integer program is enumerated exactly
# (64 replicas max per pool → at most 64² combinations per solve); beyond, greedy by price/throughput.
EXACT_POOLS = 3


def optimal_mix(pools: Sequence[tuple[str, float, float, int, int]], rate: float) -> dict[str, int]:
    """Cheapest replica counts serving `rate`: pools = (name, price per replica-hour, rps per replica, lo, hi).

    min Σ price·n subject to Σ rps·n ≥ rate, lo ≤ n ≤ hi; ties go to fewer replicas, then to the
    order given. When even every pool at its max cannot serve the rate, every pool gets its max.
    Example: (a, 5.12, 3, 1, 8), (h, 12.29, 6.5, 1, 8), rate 20 → {a: 5, h: 1} (37.89 $/h; 3 × a +
    2 × h costs 39.94, 1 × a + 3 × h 41.99).
    """
    if not pools:
        return {}
    if sum(p[2] * p[4] for p in pools) < rate:
        return {p[0]: p[4] for p in pools}
    best: tuple[float, int, dict[str, int]] | None = None
    if len(pools) <= EXACT_POOLS:
        head, last = pools[:-1], pools[-1]
        for counts in itertools.product(*(range(p[3], p[4] + 1) for p in head)):
            served = sum(p[2] * n for p, n in zip(head, counts, strict=True))
            need = max(last[3], ceil_replicas(max(0.0, rate - served) / last[2]))
            if need > last[4]:
                continue
            mix = {p[0]: n for p, n in zip(head, counts, strict=True)}
            mix[last[0]] = need
            cost = sum(p[1] * mix[p[0]] for p in pools)
            key = (round(cost, 9), sum(mix.values()))
            if best is None or key < (round(best[0], 9), best[1]):
                best = (cost, sum(mix.values()), mix)
        assert best is not None  # feasible: every pool at max serves the rate
        return best[2]
    mix = {p[0]: p[3] for p in pools}
    served = sum(p[2] * p[3] for p in pools)
    for p in sorted(pools, key=lambda p: (p[1] / p[2], p[0])):
        if served >= rate:
            break
        add = min(p[4] - mix[p[0]], ceil_replicas((rate - served) / p[2]))
        mix[p[0]] += add
        served += add * p[2]
    return mix


@dataclass(frozen=True, slots=True)
class OptimizerGroupMemory:
    arrivals: Samples = ()  # (t_s, group arrival rate)
    last_solve_s: float | None = None
    recommendation: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AibrixState:
    kpa: ScorerKpaState = field(default_factory=ScorerKpaState)
    groups: Mapping[str, OptimizerGroupMemory] = field(default_factory=dict)
    follow: Mapping[str, KpaPoolMemory] = field(default_factory=dict)  # KPA following the recommendation


class AibrixStackPolicy:
    """AIBrix: prefix-cache routing (2/1/0) + KPA/APA on KV usage + GPU-optimizer SKU mix per route group."""

    name = "aibrix-stack"

    def __init__(self, capacity: Mapping[str, ReplicaCapacity | Mapping[str, Any]] | None = None, *,
                 autoscaler: str = "kpa", target_kv_usage: float = 0.5, optimizer_interval_s: float = 60.0,
                 optimizer_window_s: float = 60.0, routing: RoutingWeights = AIBRIX_PREFIX_CACHE) -> None:
        self.autoscaler = check_choice("aibrix_stack.autoscaler", autoscaler, AUTOSCALERS)
        if self.autoscaler == "kpa":
            # AIBrix's KPA defaults are scorer-kpa's defaults (see scorer_kpa.py).
            self.inner = ScorerKpaPolicy(target_kv_usage=target_kv_usage, routing=routing)
        else:
            # APA: one 60 s window, no panic mode, tolerances up 0.1 / down 0.2. No panic: KV usage is at
            # most 1 per replica, so desired/ready ≤ 1/target; a threshold above that is never reached.
            target = check_positive("aibrix_stack.target_kv_usage", target_kv_usage)
            self.inner = ScorerKpaPolicy(target_kv_usage=target_kv_usage, stable_window_s=60.0, panic_window_s=60.0,
                                         panic_threshold=1.0 / target + 1.0, up_tolerance=0.1, down_tolerance=0.2,
                                         scale_down_stabilization_s=0.0, routing=routing)
        self.inner.name = self.name  # its routing reasons speak for this stack
        self.capacity: Mapping[str, ReplicaCapacity] = {str(k): ReplicaCapacity.of(v)
                                                        for k, v in (capacity or {}).items()}
        self.interval_s = check_positive("aibrix_stack.optimizer_interval_s", optimizer_interval_s)
        self.window_s = check_positive("aibrix_stack.optimizer_window_s", optimizer_window_s)
        # The PodAutoscaler following the optimizer: the KPA algorithm at target 1 replica per replica.
        p = self.inner.params
        self.follow_params = KpaParams(target=1.0, stable_window_s=p.stable_window_s, panic_window_s=p.panic_window_s,
                                       panic_threshold=p.panic_threshold, max_scale_up_rate=p.max_scale_up_rate,
                                       max_scale_down_rate=p.max_scale_down_rate)
        self.routing = routing

    def initial_state(self) -> AibrixState:
        return AibrixState(kpa=self.inner.initial_state())

    def _optimized_groups(self, inp: PolicyInput) -> dict[str, list[PoolSpec]]:
        return {g: ps for g, ps in route_groups(inp.fleet).items()
                if len(ps) >= 2 and all(p.name in self.capacity for p in ps)}

    def decide(self, state: AibrixState, inp: PolicyInput,
               rng: np.random.Generator) -> tuple[AibrixState, PolicyOutput]:
        now = inp.now_s
        kpa_state, inner = self.inner.decide(state.kpa, inp, rng)
        pools = dict(inner.pools)
        reasons = list(inner.reasons)
        groups = dict(state.groups)
        follow = dict(state.follow)
        opt_diag: dict[str, Any] = {}
        for g, specs in self._optimized_groups(inp).items():
            gm, g_diag, g_reasons = self._optimize(groups.get(g, OptimizerGroupMemory()), specs, inp, now)
            groups[g] = gm
            opt_diag[g] = g_diag
            reasons.extend(g_reasons)
            if not gm.recommendation:
                continue
            optimized = {s.name for s in specs}
            # the optimizer's pools are driven by the recommendation, not by KV usage
            reasons = [r for r in reasons if r.pool not in optimized or r.code == "routing_set"]
            for s in specs:
                n, fmem, f_reasons = self._follow(s, follow.get(s.name, KpaPoolMemory()), inp, now,
                                                  gm.recommendation[s.name])
                follow[s.name] = fmem
                reasons.extend(f_reasons)
                pools[s.name] = replace(pools[s.name], replicas=n)
        weights = pod_share_weights(inp, {k: c.rps for k, c in self.capacity.items()})
        pools = {k: replace(v, traffic_weight=weights[k]) for k, v in pools.items()}
        diag = {**inner.diagnostics, "optimizer": opt_diag, "autoscaler": self.autoscaler,
                "traffic_weight": weights}
        return (AibrixState(kpa=kpa_state, groups=groups, follow=follow),
                PolicyOutput(pools=pools, admission=inner.admission, reasons=tuple(reasons), diagnostics=diag))

    def _optimize(self, gm: OptimizerGroupMemory, specs: list[PoolSpec], inp: PolicyInput,
                  now: float) -> tuple[OptimizerGroupMemory, dict[str, Any], list[Reason]]:
        rates = [value(o.arrival_rps) if (o := inp.observation.pools.get(s.name)) is not None else None
                 for s in specs]
        if all(r is not None for r in rates):
            gm = replace(gm, arrivals=push_sample(gm.arrivals, now, float(sum(r for r in rates if r is not None)),
                                                  self.window_s))
        due = gm.last_solve_s is None or now - gm.last_solve_s >= self.interval_s - 1e-9
        rate = window_mean(gm.arrivals, now, self.window_s)
        d: dict[str, Any] = {"rate_rps": rate, "solved": False, "recommendation": dict(gm.recommendation)}
        if not due:
            return gm, d, []
        if rate is None:
            return gm, d, [reason("missing_data_hold", None, "GPU optimizer: no usable arrival rate in its window: "
                                  "keeping its last recommendation", signal="arrival_rps",
                                  pools=[s.name for s in specs])]
        table = [(s.name, s.usd_per_replica_hour, self.capacity[s.name].rps, replica_floor(s, allow_zero=True),
                  s.max_replicas)
                 for s in specs]
        mix = optimal_mix(table, rate)
        cost = sum(s.usd_per_replica_hour * mix[s.name] for s in specs)
        d.update(solved=True, recommendation=mix, usd_per_hour=cost)
        out: list[Reason] = []
        if dict(gm.recommendation) != mix:
            out.append(reason("sku_mix", None, f"GPU optimizer: {rate:.3g} req/s served cheapest by "
                              + ", ".join(f"{n} × {k}" for k, n in mix.items()) + f" ({cost:.2f} $/h)",
                              rate_rps=rate, mix=mix, usd_per_hour=cost))
        return replace(gm, last_solve_s=now, recommendation=mix), d, out

    def _follow(self, spec: PoolSpec, mem: KpaPoolMemory, inp: PolicyInput, now: float,
                recommended: int) -> tuple[int, KpaPoolMemory, list[Reason]]:
        """The deployment's KPA on the optimizer's recommended count (target 1 per replica)."""
        p = self.follow_params
        cur, _ = current_target(inp, spec)
        obs = inp.observation.pools.get(spec.name)
        ready_v = value(obs.replicas_ready) if obs is not None else None
        mem = replace(mem, samples=push_sample(mem.samples, now, float(recommended), p.stable_window_s))
        reasons: list[Reason] = []
        if ready_v is None and cur == 0:
            ready_v = 0.0  # a pool scaled to zero exports nothing: that is zero ready, not missing data
        if ready_v is None:
            return cur, mem, [reason("missing_data_hold", spec.name, f"no replicas_ready reading: holding {cur}",
                                     signal="replicas_ready", replicas=cur)]
        ready = int(round(ready_v))
        mem = first_sight(mem, now, ready)
        stable = window_mean(mem.samples, now, p.stable_window_s)
        panic = window_mean(mem.samples, now, p.panic_window_s)
        assert stable is not None and panic is not None  # the sample just pushed is in both windows
        res = kpa_scale(p, mem, now, spec.name, ready, cur, stable, panic)
        reasons.extend(res.reasons)
        # the optimizer needs no pool metrics, so its pools may go down to their min (AIBrix minReplicas)
        n = bound_and_explain(spec, cur, res.desired, replica_floor(spec, allow_zero=True),
                              f"GPU optimizer recommends {recommended} (stable avg {stable:.3g}, panic avg "
                              f"{panic:.3g})", {**res.info, "recommended": recommended}, reasons)
        return n, res.memory, reasons


__all__ = ["AIBRIX_PREFIX_CACHE", "AibrixStackPolicy", "optimal_mix"]
