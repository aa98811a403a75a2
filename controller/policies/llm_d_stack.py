"""The llm-d stack: inference-scheduler scoring + a WVA-style saturation autoscaler + GAIE flow control.

What operators deploy when they follow llm-d's "well-lit paths": each layer with its own
defaults, tuned alone (none of it is fitted to a trace here).

Sources (public docs and code; figures only, no code copied):
- Routing: the llm-d inference scheduler (llm-d/llm-d-inference-scheduler; guides
  "intelligent-inference-scheduling" and "precise-prefix-cache-aware" in llm-d/llm-d). Its
  default profile scores prefix-cache hits with weight 3, the queue scorer with 2 and the
  KV-cache-utilisation scorer with 2 (`SCORER_DEFAULT` in common.py, the same the scorer-kpa
  baseline uses). The *precise* prefix scorer reads the engines' KV events, so it knows each
  replica's cache exactly; our router's prefix term matches each replica's actual cache, which
  is what "precise" means (llm-d's approximate scorer would predict it from past routing).
- Autoscaling: the Workload Variant Autoscaler's saturation analyzer
  (llm-d-incubation/workload-variant-autoscaler, docs/saturation-analyzer.md and
  docs/capacity-scaling-config.md). Defaults: a replica is saturated at KV-cache usage
  ≥ kvCacheThreshold 0.80 or queue length ≥ queueLengthThreshold 5; over the non-saturated
  replicas of all variants of a model, spare KV = 0.80 − usage and spare queue = 5 − queue are
  averaged; scale up when the average spare KV < kvSpareTrigger 0.1 or the average spare queue
  < queueSpareTrigger 3 — by one replica of the *cheapest* variant (readyReplicas + 1); scale
  down only when removing one replica, its load spread over the rest, still leaves spare ≥ both
  triggers and at least 2 non-saturated replicas exist — one replica of the *most expensive*
  variant (readyReplicas − 1). Metrics are the peak over the last minute (the collector's
  `max_over_time[1m]`); while any variant of the model has replicas starting, no further
  scale-up is ordered (its cascade guard) and the targets in force are kept.
  Example: 4 ready at KV 0.75, queue 1 → spare KV 0.05 < 0.1 → scale up to 5.
- Flow control: the Gateway API Inference Extension's saturation detector
  (kubernetes-sigs/gateway-api-inference-extension, pkg/epp/saturationdetector/config.go):
  a pod has capacity while its waiting queue < 5 (DefaultQueueDepthThreshold) and its KV usage
  < 0.8 (DefaultKVCacheUtilThreshold), and a pod whose metrics are stale has none; the pool is
  saturated when no pod has capacity. Under saturation GAIE rejects sheddable requests and holds
  the others in priority order until a pod has room.

Mapping onto the levers the simulator has (and what has no counterpart):
- scorer weights → the router's prefix/queue/kv weights (3/2/2), one to one;
- WVA replica decisions → the pools' replica targets (one pool = one variant, its cost =
  usd_per_replica_hour); we see pool aggregates, not pods, so every replica of a pool is taken
  to be at the pool's mean KV usage and its waiting requests / ready replica — a pool is
  saturated or not as a whole. The WVA's optional model-based optimizer (its step 2) is not
  reproduced: saturation-only is its default mode. We evaluate once per `interval_s` (60 s: the
  docs we found give no default reconcile period, so we use the minute its metric peaks cover);
  the HPA/KEDA that applies WVA's desired replicas in a cluster adds nothing here (it follows the
  recommendation with target 1);
- GAIE shedding → the sheddable class's admission (shed fraction 1 while any route group is
  saturated — our admission is per class, GAIE's per InferencePool); priority queueing → a
  router in-flight cap on the saturated group's pools of (running per ready replica + the
  queue threshold 5): standard and sheddable requests beyond it wait at the router, critical
  first; the simulator lets critical pass the cap, as GAIE does (controller/sim/router.py);
- pod-level picking across variants → each pool's traffic weight is its ready replicas × its
  per-replica throughput (`pod_share_weights` in common.py): the EPP's queue and KV scorers send
  a pod work as fast as it drains it, while our router draws a pool first. The throughput is the
  bench's profiled `capacity` when given (used for nothing else: the WVA needs no profile),
  else every replica counts the same.
Missing data: a pool without a usable KV or queue reading holds its target and blocks the
group's scale-downs (WVA does not act on what it cannot see); for flow control it counts as
saturated, as GAIE counts a pod with stale metrics.

Pure: no I/O, no clock; does not import telemetry/actuation/api/runtime/gen, grpc or
prometheus clients.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from controller.perf.replica_capacity import ReplicaCapacity
from controller.policies.common import (
    SCORER_DEFAULT,
    RoutingWeights,
    Samples,
    change_reason,
    check_frac,
    check_positive,
    clamp,
    current_target,
    pod_share_weights,
    push_sample,
    reason,
    replica_floor,
    route_groups,
    routing_reason,
    value,
    window_values,
)
from controller.types import ClassAdmission, PolicyInput, PolicyOutput, PoolDecision, PoolSpec, Reason

SHED_CLASS = "sheddable"  # GAIE sheds the Sheddable criticality (negative priority) under saturation


@dataclass(frozen=True, slots=True)
class LlmdPoolMemory:
    kv: Samples = ()  # (t_s, mean KV usage)
    queue: Samples = ()  # (t_s, waiting requests per ready replica)


@dataclass(frozen=True, slots=True)
class LlmdState:
    last_eval_s: float | None = None
    pools: Mapping[str, LlmdPoolMemory] = field(default_factory=dict)
    shedding: bool = False


@dataclass(frozen=True, slots=True)
class VariantReading:
    """One pool (WVA variant) as the saturation analyzer sees it."""

    spec: PoolSpec
    ready: int
    kv: float  # peak mean KV usage over the last minute
    queue: float  # peak waiting per ready replica over the last minute


class LlmdStackPolicy:
    """llm-d: scorer routing 3/2/2 + WVA saturation autoscaling + GAIE saturation flow control."""

    name = "llm-d-stack"

    def __init__(self, capacity: Mapping[str, ReplicaCapacity | Mapping[str, Any]] | None = None, *,
                 kv_cache_threshold: float = 0.8, queue_length_threshold: float = 5.0,
                 kv_spare_trigger: float = 0.1, queue_spare_trigger: float = 3.0, interval_s: float = 60.0,
                 metric_window_s: float = 60.0, fc_queue_depth_threshold: float = 5.0,
                 fc_kv_cache_util_threshold: float = 0.8, routing: RoutingWeights = SCORER_DEFAULT) -> None:
        self.kv_thr = check_frac("llm_d_stack.kv_cache_threshold", kv_cache_threshold)
        self.q_thr = check_positive("llm_d_stack.queue_length_threshold", queue_length_threshold)
        self.kv_trig = check_frac("llm_d_stack.kv_spare_trigger", kv_spare_trigger)
        self.q_trig = check_positive("llm_d_stack.queue_spare_trigger", queue_spare_trigger)
        if self.kv_trig >= self.kv_thr or self.q_trig >= self.q_thr:
            raise ValueError("llm_d_stack: spare triggers must be below their saturation thresholds "
                             f"(kv {kv_spare_trigger} vs {kv_cache_threshold}, "
                             f"queue {queue_spare_trigger} vs {queue_length_threshold})")
        self.interval_s = check_positive("llm_d_stack.interval_s", interval_s)
        self.window_s = check_positive("llm_d_stack.metric_window_s", metric_window_s)
        self.fc_q = check_positive("llm_d_stack.fc_queue_depth_threshold", fc_queue_depth_threshold)
        self.fc_kv = check_frac("llm_d_stack.fc_kv_cache_util_threshold", fc_kv_cache_util_threshold)
        self.routing = routing
        self.pod_rps = {str(k): ReplicaCapacity.of(v).rps for k, v in (capacity or {}).items()}

    def initial_state(self) -> LlmdState:
        return LlmdState()

    # ----------------------------------------------------------------- per tick

    def decide(self, state: LlmdState, inp: PolicyInput, rng: np.random.Generator) -> tuple[LlmdState, PolicyOutput]:
        now = inp.now_s
        due = state.last_eval_s is None or now - state.last_eval_s >= self.interval_s - 1e-9
        memory = dict(state.pools)
        reasons: list[Reason] = []
        diag: dict[str, Any] = {"pools": {}, "groups": {}, "evaluated": due}
        current: dict[str, int] = {}
        for spec in inp.fleet.pools:
            current[spec.name] = current_target(inp, spec)[0]
            memory[spec.name] = self._sample(memory.get(spec.name, LlmdPoolMemory()), inp, spec.name, now)
        targets = dict(current)
        if due:
            for group, pools in route_groups(inp.fleet).items():
                g_targets, g_reasons, g_diag = self._wva_group(pools, memory, inp, current, now)
                targets.update(g_targets)
                reasons.extend(g_reasons)
                diag["groups"][group] = g_diag

        saturated, fc_diag = self._saturated_groups(inp)
        diag["flow_control"] = fc_diag
        weights = pod_share_weights(inp, self.pod_rps)
        pools_out: dict[str, PoolDecision] = {}
        for spec in inp.fleet.pools:
            rr = routing_reason(inp, spec.name, self.routing, self.name)
            if rr is not None:
                reasons.append(rr)
            cap = 0
            if spec.group in saturated:
                cap = self._flow_cap(inp, spec.name)
            pools_out[spec.name] = PoolDecision(
                replicas=targets[spec.name], inflight_cap=cap, traffic_weight=weights[spec.name],
                prefix_weight=self.routing.prefix_weight, queue_weight=self.routing.queue_weight,
                kv_weight=self.routing.kv_weight)
            diag["pools"][spec.name] = {"current": current[spec.name], "replicas": targets[spec.name],
                                        "inflight_cap": cap, "traffic_weight": weights[spec.name]}
        shedding = bool(saturated)
        if shedding and not state.shedding:
            reasons.append(reason("shed_sheddable", None, f"flow control: route group(s) {sorted(saturated)} "
                                  f"saturated (no replica below queue {self.fc_q:g} and KV {self.fc_kv:g}): "
                                  f"rejecting {SHED_CLASS}, holding the rest in priority order",
                                  groups=sorted(saturated)))
        elif state.shedding and not shedding:
            reasons.append(reason("shed_release", None, f"flow control: no group saturated: admitting {SHED_CLASS}"))
        admission = {SHED_CLASS: ClassAdmission(shed_frac=1.0)} if shedding else {}
        new_state = LlmdState(last_eval_s=now if due else state.last_eval_s, pools=memory, shedding=shedding)
        return new_state, PolicyOutput(pools=pools_out, admission=admission, reasons=tuple(reasons), diagnostics=diag)

    def _sample(self, mem: LlmdPoolMemory, inp: PolicyInput, pool: str, now: float) -> LlmdPoolMemory:
        obs = inp.observation.pools.get(pool)
        if obs is None:
            return mem
        kv, waiting, ready = value(obs.kv_usage_frac), value(obs.waiting), value(obs.replicas_ready)
        keep = self.window_s
        if kv is not None:
            mem = replace(mem, kv=push_sample(mem.kv, now, kv, keep))
        if waiting is not None and ready is not None and ready > 0:
            mem = replace(mem, queue=push_sample(mem.queue, now, waiting / ready, keep))
        return mem

    # ----------------------------------------------------------------- WVA saturation analyzer

    def _reading(self, spec: PoolSpec, mem: LlmdPoolMemory, inp: PolicyInput, now: float) -> VariantReading | None:
        obs = inp.observation.pools.get(spec.name)
        ready_v = value(obs.replicas_ready) if obs is not None else None
        kvs = window_values(mem.kv, now, self.window_s)
        qs = window_values(mem.queue, now, self.window_s)
        if ready_v is None or obs is None or value(obs.kv_usage_frac) is None:
            return None
        ready = int(round(ready_v))
        if ready > 0 and (not kvs or not qs):
            return None
        return VariantReading(spec, ready, max(kvs) if kvs else 0.0, max(qs) if qs else 0.0)

    def _wva_group(self, pools: list[PoolSpec], memory: Mapping[str, LlmdPoolMemory], inp: PolicyInput,
                   current: Mapping[str, int], now: float) -> tuple[dict[str, int], list[Reason], dict[str, Any]]:
        targets = {p.name: current[p.name] for p in pools}
        reasons: list[Reason] = []
        readings: list[VariantReading] = []
        missing: list[str] = []
        for p in pools:
            r = self._reading(p, memory.get(p.name, LlmdPoolMemory()), inp, now)
            if r is None:
                missing.append(p.name)
                reasons.append(reason("missing_data_hold", p.name, f"no usable KV usage / queue / ready reading: "
                                      f"holding {current[p.name]}", signal="kv_usage_frac,waiting,replicas_ready",
                                      replicas=current[p.name]))
            else:
                readings.append(r)
        # Pool bounds first: a target outside [floor, max] is brought inside (as any controller would).
        for p in pools:
            floor = replica_floor(p)
            n, bound = clamp(targets[p.name], floor, p.max_replicas)
            if bound is not None:
                reasons.append(change_reason(p.name, targets[p.name], n, f"outside the pool bounds [{floor}, "
                                             f"{p.max_replicas}]"))
                targets[p.name] = n
        pending = [r.spec.name for r in readings if self._starting(inp, r.spec.name, current[r.spec.name], r.ready)]
        non_sat = [r for r in readings if r.ready > 0 and r.kv < self.kv_thr and r.queue < self.q_thr]
        n_ns = sum(r.ready for r in non_sat)
        d: dict[str, Any] = {"missing": missing, "pending": pending, "non_saturated_replicas": n_ns,
                             "readings": {r.spec.name: {"ready": r.ready, "kv_peak": r.kv, "queue_peak": r.queue}
                                          for r in readings}}
        if not readings:
            return targets, reasons, d
        if n_ns > 0:
            spare_kv = sum(r.ready * (self.kv_thr - r.kv) for r in non_sat) / n_ns
            spare_q = sum(r.ready * (self.q_thr - r.queue) for r in non_sat) / n_ns
        else:
            spare_kv, spare_q = 0.0, 0.0  # every replica saturated: no spare capacity at all
        scale_up = spare_kv < self.kv_trig or spare_q < self.q_trig
        d.update(avg_spare_kv=spare_kv, avg_spare_queue=spare_q, scale_up=scale_up)
        if pending:
            # WVA keeps the desired replicas in force while they come up and orders no more (cascade guard).
            d["action"] = "wait_pending"
            if scale_up:
                reasons.append(reason("scale_up_pending_startup", None, f"saturation needs capacity but "
                                      f"{', '.join(pending)} still has replicas starting: waiting for them",
                                      pools=pending))
            return targets, reasons, d
        if scale_up:
            cands = [r for r in readings if targets[r.spec.name] < r.spec.max_replicas]
            if not cands:
                d["action"] = "at_max"
                return targets, reasons, d
            pick = min(cands, key=lambda r: (r.spec.usd_per_replica_hour, r.spec.name))
            before = targets[pick.spec.name]
            after = max(before, min(pick.ready + 1, pick.spec.max_replicas))
            if after != before:
                targets[pick.spec.name] = after
                reasons.append(change_reason(pick.spec.name, before, after,
                                             f"WVA saturation: spare KV {spare_kv:.3g} (trigger {self.kv_trig:g}), "
                                             f"spare queue {spare_q:.3g} (trigger {self.q_trig:g}); cheapest variant "
                                             "+1", avg_spare_kv=spare_kv, avg_spare_queue=spare_q))
            d["action"] = f"scale_up:{pick.spec.name}"
            return targets, reasons, d
        if missing or n_ns < 2:
            d["action"] = "hold"
            if missing:
                reasons.append(reason("partial_data_no_scale_down", None, f"no reading for {', '.join(missing)}: "
                                      "no scale-down", pools=missing))
            return targets, reasons, d
        total_kv = sum(r.ready * r.kv for r in non_sat)
        total_q = sum(r.ready * r.queue for r in non_sat)
        rest_kv = self.kv_thr - total_kv / (n_ns - 1)
        rest_q = self.q_thr - total_q / (n_ns - 1)
        safe = rest_kv >= self.kv_trig and rest_q >= self.q_trig
        d.update(spare_kv_after_removal=rest_kv, spare_queue_after_removal=rest_q, scale_down_safe=safe)
        if not safe:
            d["action"] = "hold"
            return targets, reasons, d
        cands = [r for r in readings
                 if r.ready > replica_floor(r.spec) and targets[r.spec.name] > replica_floor(r.spec)]
        if not cands:
            d["action"] = "at_min"
            return targets, reasons, d
        pick = max(cands, key=lambda r: (r.spec.usd_per_replica_hour, r.spec.name))
        before = targets[pick.spec.name]
        after = max(replica_floor(pick.spec), min(before, pick.ready - 1))
        if after != before:
            targets[pick.spec.name] = after
            reasons.append(change_reason(pick.spec.name, before, after,
                                         f"WVA: one replica fewer still leaves spare KV {rest_kv:.3g} and queue "
                                         f"{rest_q:.3g}; most expensive variant −1", spare_kv_after=rest_kv,
                                         spare_queue_after=rest_q))
        d["action"] = f"scale_down:{pick.spec.name}"
        return targets, reasons, d

    @staticmethod
    def _starting(inp: PolicyInput, pool: str, target: int, ready: int) -> bool:
        """Replicas on their way: the starting count when it is known, else target above ready."""
        obs = inp.observation.pools.get(pool)
        starting = value(obs.replicas_starting) if obs is not None else None
        return starting > 0 if starting is not None else target > ready

    # ----------------------------------------------------------------- GAIE flow control

    def _pool_has_capacity(self, inp: PolicyInput, pool: str) -> bool:
        obs = inp.observation.pools.get(pool)
        if obs is None:
            return False
        ready, kv, waiting = value(obs.replicas_ready), value(obs.kv_usage_frac), value(obs.waiting)
        if ready is None or ready <= 0 or kv is None or waiting is None:
            return False  # no pod, or stale metrics: GAIE counts such a pod as having no capacity
        return waiting / ready < self.fc_q and kv < self.fc_kv

    def _saturated_groups(self, inp: PolicyInput) -> tuple[set[str], dict[str, Any]]:
        out: set[str] = set()
        d: dict[str, Any] = {}
        for group, pools in route_groups(inp.fleet).items():
            has = {p.name: self._pool_has_capacity(inp, p.name) for p in pools}
            d[group] = has
            if not any(has.values()):
                out.add(group)
        return out, d

    def _flow_cap(self, inp: PolicyInput, pool: str) -> int:
        """In-flight cap per replica while saturated: what runs now plus the detector's queue threshold."""
        obs = inp.observation.pools.get(pool)
        running = value(obs.running) if obs is not None else None
        ready = value(obs.replicas_ready) if obs is not None else None
        per = running / ready if running is not None and ready is not None and ready > 0 else 0.0
        return max(1, math.ceil(per - 1e-9) + math.ceil(self.fc_q - 1e-9))
