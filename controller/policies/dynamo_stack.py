"""The NVIDIA Dynamo stack: KV-aware router cost + SLA planner (prefill and decode apart) + load shedding.

What a Dynamo deployment runs, each layer at its documented defaults (nothing fitted to a trace).

Sources (ai-dynamo/dynamo docs; figures only, no code copied):
- Router ("Router Design", "Routing Concepts", frontend configuration reference): per worker,
  cost = overlap_score_weight × prefill_blocks + decode_blocks, where prefill_blocks are the
  prompt blocks the worker would have to compute (prompt − cached overlap) and decode_blocks
  its active KV blocks; the lowest cost wins. Defaults: `--router-kv-overlap-score-weight` 1.0,
  `--router-temperature` 0.0 (deterministic: the best worker, no softmax sampling).
  On our router (score = prefix × hit fraction − queue × normalised in-flight − kv × KV usage,
  highest wins), divide the cost by the worker's KV capacity in blocks and flip its sign:
  −cost / capacity = w × (prompt / capacity) × hit fraction − KV usage − w × prompt / capacity,
  and the last term is the same for every worker. So kv weight 1, prefix weight
  w × (mean prompt tokens / KV capacity tokens of a replica), queue weight 0 reproduce
  Dynamo's choice for a request of the mean prompt length. Example: Llama-3-8B on an A100
  holds ≈ 452k KV tokens (controller.perf's engine table); with 1,200-token prompts the prefix
  weight is 1 × 1,200 / 452,464 ≈ 0.0027 — Dynamo weighs a whole prompt's overlap like 0.27 %
  of a replica's KV, i.e. it mostly balances active blocks and uses the overlap to break near
  ties, as its formula says. The mean prompt is read each tick (prompt tokens/s ÷ requests/s of
  the pool), the KV capacity from the pool's engine (model × SKU × TP; `kv_capacity_tokens`
  overrides it per pool). Not reproduced: Dynamo counts the blocks of requests it has routed
  but the engine still queues; our KV usage counts allocated blocks only, so while engines
  queue our router is less load-averse than Dynamo's; and per-request prompt lengths (we use
  the pool's mean).
- Planner: the SLA planner baseline (sla_planner.py, Dynamo's planner with its defaults:
  180 s adjustment interval, load predictor, correction factors, prefill and decode pools sized
  separately from their own loads) — reused, not re-implemented.
- Load-based shedding: the planner baseline's (sheddable rejected while a decode/mixed pool's
  KV usage is ≥ 0.9; see sla_planner.py for how that relates to Dynamo's busy thresholds).
- Traffic across pools of a group: Dynamo's router picks among workers of the model whatever
  their pool, and its active-block term sends a worker work as fast as it drains it; we weight
  each pool by its ready replicas × profiled per-replica throughput (`pod_share_weights`).

Pure: no I/O, no clock; does not import telemetry/actuation/api/runtime/gen, grpc or
prometheus clients. The KV capacity comes from the packaged engine table (no file is read).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from controller.perf.engines import Catalogue, EngineError, resolve_engine
from controller.perf.replica_capacity import ReplicaCapacity
from controller.policies.common import (
    RoutingWeights,
    check_positive,
    pod_share_weights,
    reason,
    routing_reason,
    value,
)
from controller.policies.sla_planner import KV_AWARE, PlannerState, SlaPlannerPolicy
from controller.types import PolicyInput, PolicyOutput, PoolDecision, PoolSpec, Reason

DEFAULT_OVERLAP_SCORE_WEIGHT = 1.0  # --router-kv-overlap-score-weight
DEFAULT_ROUTER_TEMPERATURE = 0.0  # --router-temperature: 0 = always the lowest-cost worker


def kv_capacity_tokens(spec: PoolSpec) -> float:
    """KV-cache tokens one replica of the pool holds (the engine table's figure at 90 % GPU memory)."""
    engine = resolve_engine(Catalogue.builtin(), spec.model, spec.sku, int(spec.gpus_per_replica))
    return float(engine.physics[-1])  # PhysicsRow ends with the KV capacity in tokens (controller/perf/physics_gen.py)


def dynamo_weights(overlap_score_weight: float, mean_prompt_tokens: float | None,
                   capacity_tokens: float) -> RoutingWeights:
    """Our scorer weights for Dynamo's cost (see the module docstring); no prompt known → overlap unused.

    Example: weight 1, 1,200-token prompts, 452,464 KV tokens → prefix 0.00265, queue 0, kv 1.
    """
    prefix = 0.0
    if mean_prompt_tokens is not None and mean_prompt_tokens > 0 and capacity_tokens > 0:
        prefix = overlap_score_weight * mean_prompt_tokens / capacity_tokens
    return RoutingWeights(prefix_weight=prefix, queue_weight=0.0, kv_weight=1.0)


@dataclass(frozen=True, slots=True)
class DynamoState:
    planner: PlannerState = field(default_factory=PlannerState)
    mean_prompt: Mapping[str, float] = field(default_factory=dict)  # last usable mean prompt tokens per pool
    kv_tokens: Mapping[str, float] = field(default_factory=dict)  # resolved once per pool


class DynamoStackPolicy:
    """Dynamo: KV-aware router cost on our scorer + SLA planner (P and D apart) + sheddable load shedding."""

    name = "dynamo-stack"

    def __init__(self, capacity: Mapping[str, ReplicaCapacity | Mapping[str, Any]], *,
                 overlap_score_weight: float = DEFAULT_OVERLAP_SCORE_WEIGHT,
                 router_temperature: float = DEFAULT_ROUTER_TEMPERATURE,
                 kv_capacity_tokens: Mapping[str, float] | None = None, adjustment_interval_s: float = 180.0,
                 shed_kv_threshold: float = 0.9) -> None:
        self.overlap_w = check_positive("dynamo_stack.overlap_score_weight", overlap_score_weight, allow_zero=True)
        temp = check_positive("dynamo_stack.router_temperature", router_temperature, allow_zero=True)
        if temp != 0.0:
            raise ValueError("dynamo_stack.router_temperature: only 0 (Dynamo's default, deterministic) can be "
                             "reproduced; our router has no softmax sampling over workers")
        self.temperature = temp
        self.kv_override = {str(k): check_positive(f"dynamo_stack.kv_capacity_tokens[{k}]", v)
                            for k, v in (kv_capacity_tokens or {}).items()}
        self.planner = SlaPlannerPolicy(capacity, adjustment_interval_s=adjustment_interval_s,
                                        shed_kv_threshold=shed_kv_threshold, routing=KV_AWARE)

    def initial_state(self) -> DynamoState:
        return DynamoState(planner=self.planner.initial_state())

    def decide(self, state: DynamoState, inp: PolicyInput,
               rng: np.random.Generator) -> tuple[DynamoState, PolicyOutput]:
        p_state, inner = self.planner.decide(state.planner, inp, rng)
        # the planner's own routing reasons describe its weights, not the router's: replaced below
        reasons: list[Reason] = [r for r in inner.reasons if r.code != "routing_set"]
        prompts = dict(state.mean_prompt)
        kv_tokens = dict(state.kv_tokens)
        weights = pod_share_weights(inp, {k: c.rps for k, c in self.planner.capacity.items()})
        pools: dict[str, PoolDecision] = {}
        routing_diag: dict[str, Any] = {}
        for spec in inp.fleet.pools:
            obs = inp.observation.pools.get(spec.name)
            if obs is not None:
                rps, ptok = value(obs.arrival_rps), value(obs.prompt_tokens_rps)
                if rps is not None and ptok is not None and rps > 0:
                    prompts[spec.name] = ptok / rps
            if spec.name not in kv_tokens:
                cap = self.kv_override.get(spec.name)
                if cap is None:
                    try:
                        cap = kv_capacity_tokens(spec)
                    except EngineError as exc:
                        reasons.append(reason("missing_data_hold", spec.name, f"no KV capacity for {spec.model} on "
                                              f"{spec.sku}: routing on KV usage alone ({exc})",
                                              signal="kv_capacity_tokens"))
                        cap = 0.0
                kv_tokens[spec.name] = cap
            rw = dynamo_weights(self.overlap_w, prompts.get(spec.name), kv_tokens[spec.name])
            rr = routing_reason(inp, spec.name, rw, self.name)
            if rr is not None:
                reasons.append(rr)
            pools[spec.name] = replace(inner.pools[spec.name], prefix_weight=rw.prefix_weight,
                                       queue_weight=rw.queue_weight, kv_weight=rw.kv_weight,
                                       traffic_weight=weights[spec.name])
            routing_diag[spec.name] = {**rw.as_dict(), "mean_prompt_tokens": prompts.get(spec.name),
                                       "kv_capacity_tokens": kv_tokens[spec.name]}
        diag = {**inner.diagnostics, "router": routing_diag, "overlap_score_weight": self.overlap_w,
                "router_temperature": self.temperature}
        return (DynamoState(planner=p_state, mean_prompt=prompts, kv_tokens=kv_tokens),
                PolicyOutput(pools=pools, admission=inner.admission, reasons=tuple(reasons), diagnostics=diag))


__all__ = ["DynamoStackPolicy", "dynamo_weights", "kv_capacity_tokens"]
