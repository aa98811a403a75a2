"""An SLA planner in the style of NVIDIA Dynamo's: forecast the next interval's load, size each pool for it.

Source: NVIDIA Dynamo's SLA-based planner (ai-dynamo/dynamo docs "SLA-based
Planner" / "Planner Design"; defaults in components/planner/src/dynamo/planner/
defaults.py), its KV router ("Router Design": cost = overlap weight × new prefill
blocks + active decode blocks, overlap weight 1) and its request rejection
("busy" thresholds on KV-block usage). What is reproduced:

- Every `adjustment_interval_s` (Dynamo default 180 s; the policy may be ticked more
  often and gathers samples in between) the planner takes the interval's average
  load (requests/s, prompt tokens/s, generated tokens/s) per pool, appends it to a
  history of at most 50 intervals (Dynamo's load_prediction_window_size) and
  forecasts the next interval.
- Forecaster: Dynamo ships constant, ARIMA (its default) and Prophet predictors.
  We ship "constant" (next = last interval) and "holt" (default): Holt's linear
  trend method, which is the exponential-smoothing form of ARIMA(0,2,2), with its
  two smoothing constants fitted on the history by least one-step-ahead squared
  error over a fixed grid (deterministic). Example: loads 10, 12, 14, 16 → ≈ 18.
- Replicas from per-replica throughput at the SLO (`ReplicaCapacity`, profiled
  offline like Dynamo's pre-deployment profiling; `capacity_from_samples` builds
  it from (load, latency) samples). Prefill side (role "prefill", and "mixed"):
  replicas = ceil(load × min(1, prefill_correction) / throughput), load in prompt
  tokens/s when the capacity has a token rate, else requests/s. Decode side (role
  "decode", and "mixed"): the TPOT (ITL) SLO is divided by the decode correction
  and the throughput a replica sustains at that corrected TPOT is read from the
  profile; replicas = ceil(load / that throughput), load in generated tokens/s or
  requests/s. A mixed pool takes the larger of the two. Prefill and decode pools
  (disaggregated serving) are therefore counted separately, each on its own load.
  Example: forecast 18 req/s, a replica sustains 4 req/s at the SLO → ceil(4.5) = 5.
- Correction factors, as Dynamo: prefill = measured TTFT / profiled TTFT at the
  measured per-replica load, decode = measured TPOT / profiled TPOT; both need a
  latency profile in the capacity (without one they are 1). We read p95s, so the
  profile should hold p95s too (the bench profiles it that way).
- At least 1 replica per pool (Dynamo's min_endpoint), at most the pool max.

Routing: Dynamo's KV router weighs cache overlap against load 1:1. Our router's
weights: prefix 1, queue 1, kv 0 — the queue term stands for the load term.
Load shedding: when a (non-prefill) pool's mean KV usage reaches 0.9 (Dynamo's
example busy threshold is 0.85, the brief's 0.9 is used) the sheddable class is
rejected at the router (shed fraction 1) until usage falls below it again.
Dynamo rejects every request once all workers are busy; we reject only the
sheddable class, so critical and standard traffic is never refused here.

Missing data: an interval with no usable arrival-rate sample leaves the pool's
target unchanged (and adds nothing to the history); correction factors are
computed only from usable latency samples; with no KV reading at all the
shedding state is held. The planner never scales on partial data it does not have.

Pure: no I/O, no clock; does not import telemetry/actuation/api/runtime/gen,
grpc or prometheus clients.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from controller.perf.replica_capacity import ReplicaCapacity
from controller.policies.common import (
    RoutingWeights,
    ceil_replicas,
    change_reason,
    check_choice,
    check_frac,
    check_positive,
    clamp,
    current_target,
    pool_decision,
    reason,
    replica_floor,
    routing_reason,
    tightest_slo,
    value,
)
from controller.types import (
    PRIORITY_CLASSES,
    ClassAdmission,
    PolicyInput,
    PolicyOutput,
    PoolDecision,
    PoolSpec,
    Reason,
    SloSpec,
)

KV_AWARE = RoutingWeights(prefix_weight=1.0, queue_weight=1.0, kv_weight=0.0)
FORECASTERS = ("holt", "constant")


# The capacity profile (`ReplicaCapacity`, `capacity_from_samples`) lives in controller/perf/replica_capacity.py:
# the MPC and the composed stacks read it too.


# --------------------------------------------------------------------------- forecasting

_ALPHAS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
_BETAS = (0.05, 0.1, 0.2, 0.3, 0.5)


def _holt_run(ys: Sequence[float], alpha: float, beta: float) -> tuple[float, float]:
    """(sum of squared one-step errors, next forecast) of Holt's linear method."""
    level, trend = ys[0], ys[1] - ys[0]
    sse = 0.0
    for y in ys[1:]:
        f = level + trend
        sse += (y - f) ** 2
        new_level = alpha * y + (1 - alpha) * (level + trend)
        trend = beta * (new_level - level) + (1 - beta) * trend
        level = new_level
    return sse, level + trend


def forecast_next(history: Sequence[float], method: str = "holt") -> float | None:
    """Forecast the next interval's value from the per-interval history (None if empty).

    "constant": the last value. "holt": Holt's linear trend with (alpha, beta) fitted on a
    grid by least one-step-ahead squared error; falls back to "constant" below 3 points;
    never negative. Example: 10, 12, 14, 16 → 18.
    """
    if not history:
        return None
    ys = [float(y) for y in history]
    if method == "constant" or len(ys) < 3:
        return ys[-1]
    best: tuple[float, float] | None = None
    for a in _ALPHAS:
        for b in _BETAS:
            sse, f = _holt_run(ys, a, b)
            if best is None or sse < best[0] - 1e-12:
                best = (sse, f)
    assert best is not None
    return max(0.0, best[1])


# --------------------------------------------------------------------------- the planner

_SIGNALS = ("rps", "prompt", "gen", "ttft", "tpot", "rps_per_replica")


@dataclass(frozen=True, slots=True)
class PlannerPoolMemory:
    interval: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # this interval's samples per signal
    history_rps: tuple[float, ...] = ()
    history_prompt: tuple[float, ...] = ()
    history_gen: tuple[float, ...] = ()
    prefill_correction: float | None = None
    decode_correction: float | None = None


@dataclass(frozen=True, slots=True)
class PlannerState:
    last_adjust_s: float | None = None
    pools: Mapping[str, PlannerPoolMemory] = field(default_factory=dict)
    shedding: bool = False


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


class SlaPlannerPolicy:
    """Dynamo-style SLA planner: interval forecasts → replicas per pool; KV-aware routing; sheddable load shedding."""

    name = "sla-planner"

    def __init__(self, capacity: Mapping[str, ReplicaCapacity | Mapping[str, Any]], *,
                 adjustment_interval_s: float = 180.0, forecaster: str = "holt", window_size: int = 50,
                 min_endpoint: int = 1, slo_class: str | None = None, shed_kv_threshold: float = 0.9,
                 shed_class: str = "sheddable", shed_frac: float = 1.0, routing: RoutingWeights = KV_AWARE) -> None:
        if not isinstance(capacity, Mapping) or not capacity:
            raise ValueError("sla_planner: capacity must be a non-empty mapping pool -> ReplicaCapacity")
        self.capacity: Mapping[str, ReplicaCapacity] = {str(k): ReplicaCapacity.of(v) for k, v in capacity.items()}
        self.interval_s = check_positive("sla_planner.adjustment_interval_s", adjustment_interval_s)
        self.forecaster = check_choice("sla_planner.forecaster", forecaster, FORECASTERS)
        if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
            raise ValueError(f"sla_planner.window_size must be an integer >= 1 (got {window_size!r})")
        self.window_size = window_size
        if isinstance(min_endpoint, bool) or not isinstance(min_endpoint, int) or min_endpoint < 0:
            raise ValueError(f"sla_planner.min_endpoint must be an integer >= 0 (got {min_endpoint!r})")
        self.min_endpoint = min_endpoint
        self.slo_class = slo_class
        self.shed_kv_threshold = check_frac("sla_planner.shed_kv_threshold", shed_kv_threshold)
        self.shed_class = check_choice("sla_planner.shed_class", shed_class, PRIORITY_CLASSES)
        self.shed_frac = check_frac("sla_planner.shed_frac", shed_frac)
        self.routing = routing

    def initial_state(self) -> PlannerState:
        return PlannerState()

    # ----------------------------------------------------------------- per tick

    def decide(self, state: PlannerState, inp: PolicyInput,
               rng: np.random.Generator) -> tuple[PlannerState, PolicyOutput]:
        now = inp.now_s
        last = now if state.last_adjust_s is None else state.last_adjust_s
        due = state.last_adjust_s is not None and now - last >= self.interval_s - 1e-9
        slo = tightest_slo(inp.fleet, self.slo_class)
        pools: dict[str, PoolDecision] = {}
        reasons: list[Reason] = []
        diag: dict[str, Any] = {}
        memory: dict[str, PlannerPoolMemory] = {}
        for spec in inp.fleet.pools:
            cur, _ = current_target(inp, spec)
            mem = self._sample(state.pools.get(spec.name, PlannerPoolMemory()), inp, spec)
            rr = routing_reason(inp, spec.name, self.routing, self.name)
            if rr is not None:
                reasons.append(rr)
            if not due:
                memory[spec.name] = mem
                pools[spec.name] = pool_decision(cur, self.routing)
                diag[spec.name] = {"replicas": cur, "adjusted": False}
                continue
            n, mem, pool_reasons, d = self._adjust(spec, mem, cur, slo)
            memory[spec.name] = mem
            pools[spec.name] = pool_decision(n, self.routing)
            reasons.extend(pool_reasons)
            diag[spec.name] = d
        shedding, shed_reasons, shed_diag = self._shedding(inp, state.shedding)
        reasons.extend(shed_reasons)
        admission = {self.shed_class: ClassAdmission(shed_frac=self.shed_frac)} if shedding else {}
        new_state = PlannerState(last_adjust_s=now if due else last, pools=memory, shedding=shedding)
        return new_state, PolicyOutput(
            pools=pools, admission=admission, reasons=tuple(reasons),
            diagnostics={"pools": diag, "adjusted": due, "next_adjust_s": (now if due else last) + self.interval_s,
                         "forecaster": self.forecaster, "slo_ttft_s": slo.ttft_s if slo else None,
                         "slo_tpot_s": slo.tpot_s if slo else None, "shedding": shed_diag})

    def _sample(self, mem: PlannerPoolMemory, inp: PolicyInput, spec: PoolSpec) -> PlannerPoolMemory:
        """Add this tick's usable readings to the interval's samples."""
        obs = inp.observation.pools.get(spec.name)
        if obs is None:
            return mem
        got = {"rps": value(obs.arrival_rps), "prompt": value(obs.prompt_tokens_rps),
               "gen": value(obs.generation_tokens_rps), "ttft": value(obs.ttft_p95_s), "tpot": value(obs.tpot_p95_s)}
        ready = value(obs.replicas_ready)
        if got["rps"] is not None and ready is not None and ready > 0:
            got["rps_per_replica"] = got["rps"] / ready
        interval = {k: mem.interval.get(k, ()) + ((v,) if (v := got.get(k)) is not None else ()) for k in _SIGNALS}
        return PlannerPoolMemory(interval=interval, history_rps=mem.history_rps, history_prompt=mem.history_prompt,
                                 history_gen=mem.history_gen, prefill_correction=mem.prefill_correction,
                                 decode_correction=mem.decode_correction)

    # ----------------------------------------------------------------- per interval

    def _adjust(self, spec: PoolSpec, mem: PlannerPoolMemory, cur: int,
                slo: SloSpec | None) -> tuple[int, PlannerPoolMemory, list[Reason], dict[str, Any]]:
        iv = mem.interval
        fresh = PlannerPoolMemory(history_rps=mem.history_rps, history_prompt=mem.history_prompt,
                                  history_gen=mem.history_gen, prefill_correction=mem.prefill_correction,
                                  decode_correction=mem.decode_correction)
        cap = self.capacity.get(spec.name)
        if cap is None:
            return cur, fresh, [reason("no_capacity_profile", spec.name,
                                       f"no capacity profile for {spec.name}: holding {cur}")], {"replicas": cur}
        rps = _mean(iv.get("rps", ()))
        if rps is None:
            return cur, fresh, [reason("missing_data_hold", spec.name,
                                       f"no usable arrival rate this interval: holding {cur}", signal="arrival_rps",
                                       replicas=cur)], {"replicas": cur, "missing": "arrival_rps"}
        w = self.window_size
        h_rps = (mem.history_rps + (rps,))[-w:]
        prompt, gen = _mean(iv.get("prompt", ())), _mean(iv.get("gen", ()))
        h_prompt = (mem.history_prompt + (prompt,))[-w:] if prompt is not None else mem.history_prompt
        h_gen = (mem.history_gen + (gen,))[-w:] if gen is not None else mem.history_gen
        # h_rps ends with this interval's rps: never empty, so the forecast is never None
        fc_rps = cast(float, forecast_next(h_rps, self.forecaster))
        fc_prompt = forecast_next(h_prompt, self.forecaster) if prompt is not None else None
        fc_gen = forecast_next(h_gen, self.forecaster) if gen is not None else None

        # Correction factors (Dynamo step 2): measured latency / profiled latency at the measured load.
        per_rep = _mean(iv.get("rps_per_replica", ()))
        p_corr, d_corr = mem.prefill_correction, mem.decode_correction
        ttft, tpot = _mean(iv.get("ttft", ())), _mean(iv.get("tpot", ()))
        if per_rep is not None and per_rep > 0:
            exp_ttft, exp_tpot = cap.expected_ttft_s(per_rep), cap.expected_tpot_s(per_rep)
            if ttft is not None and exp_ttft:
                p_corr = ttft / exp_ttft
            if tpot is not None and exp_tpot:
                d_corr = tpot / exp_tpot

        terms: list[dict[str, Any]] = []
        role = spec.role
        if role in ("prefill", "mixed"):
            factor = min(1.0, p_corr) if p_corr is not None else 1.0
            if cap.prompt_tokens_per_s > 0 and fc_prompt is not None:
                terms.append({"term": "prefill_tokens", "load": fc_prompt * factor,
                              "per_replica": cap.prompt_tokens_per_s})
            else:
                terms.append({"term": "prefill_requests", "load": fc_rps * factor, "per_replica": cap.rps})
        if role in ("decode", "mixed"):
            thpt_rps = cap.rps
            if d_corr is not None and d_corr > 0 and cap.profile_tpot_s and slo is not None:
                r = cap.rps_within(tpot_s=slo.tpot_s / d_corr)
                thpt_rps = r if r is not None and r > 0 else cap.profile_rps[0]
            if cap.generation_tokens_per_s > 0 and fc_gen is not None:
                per_replica = cap.generation_tokens_per_s * thpt_rps / cap.rps
                terms.append({"term": "decode_tokens", "load": fc_gen, "per_replica": per_replica})
            else:
                terms.append({"term": "decode_requests", "load": fc_rps, "per_replica": thpt_rps})
        for t in terms:
            t["replicas"] = t["load"] / t["per_replica"] if t["per_replica"] > 0 else math.inf
        need = max((t["replicas"] for t in terms), default=0.0)
        wanted = ceil_replicas(need) if math.isfinite(need) else spec.max_replicas
        floor = min(max(replica_floor(spec), self.min_endpoint), spec.max_replicas)
        n, bound = clamp(wanted, floor, spec.max_replicas)
        d = {"current": cur, "interval_rps": rps, "forecast_rps": fc_rps, "forecast_prompt_tokens_rps": fc_prompt,
             "forecast_generation_tokens_rps": fc_gen, "prefill_correction": p_corr, "decode_correction": d_corr,
             "terms": terms, "wanted": wanted, "replicas": n, "history_len": len(h_rps)}
        reasons: list[Reason] = []
        if n != cur:
            binding = max(terms, key=lambda t: t["replicas"])["term"] if terms else "none"
            reasons.append(reason("forecast_scale", spec.name, f"forecast {fc_rps:.3g} req/s ({self.forecaster}); "
                                  f"binding term {binding}: {need:.3g} replicas", forecast_rps=fc_rps,
                                  binding=binding, need=need))
            reasons.insert(0, change_reason(spec.name, cur, n, f"SLA planner forecast needs {need:.3g} replicas",
                                            forecast_rps=fc_rps, need=need))
            if bound is not None:
                reasons.append(reason(f"clamped_{bound}", spec.name,
                                      f"{wanted} kept within [{floor}, {spec.max_replicas}]",
                                      wanted=wanted, replicas=n))
        new_mem = PlannerPoolMemory(history_rps=h_rps, history_prompt=h_prompt, history_gen=h_gen,
                                    prefill_correction=p_corr, decode_correction=d_corr)
        return n, new_mem, reasons, d

    # ----------------------------------------------------------------- shedding

    def _shedding(self, inp: PolicyInput, was: bool) -> tuple[bool, list[Reason], dict[str, Any]]:
        """Shed the sheddable class while any non-prefill pool's KV usage is at or above the threshold."""
        kvs: dict[str, float] = {}
        missing: list[str] = []
        for spec in inp.fleet.pools:
            if spec.role == "prefill":
                continue  # a prefill pool's KV is transient (handed to decode): not a busy signal
            obs = inp.observation.pools.get(spec.name)
            kv = value(obs.kv_usage_frac) if obs is not None else None
            if kv is None:
                missing.append(spec.name)
            else:
                kvs[spec.name] = kv
        d: dict[str, Any] = {"kv_usage": kvs, "missing": missing, "threshold": self.shed_kv_threshold}
        busy = sorted(p for p, kv in kvs.items() if kv >= self.shed_kv_threshold)
        if not kvs or (was and not busy and missing):
            # Nothing to go on, or only part of the fleet visible and none of it busy: do not flip.
            d["shedding"] = was
            return was, [reason("missing_data_hold", None, f"no KV usage reading for {', '.join(missing)}: shedding "
                                f"stays {'on' if was else 'off'}", signal="kv_usage_frac", pools=missing)], d
        now_shedding = bool(busy)
        d["shedding"] = now_shedding
        out: list[Reason] = []
        if now_shedding and not was:
            out.append(reason("shed_sheddable", None, f"KV usage ≥ {self.shed_kv_threshold:g} on {', '.join(busy)}: "
                              f"rejecting {self.shed_frac:.0%} of {self.shed_class}", pools=busy, kv_usage=kvs))
        elif was and not now_shedding:
            out.append(reason("shed_release", None, f"KV usage below {self.shed_kv_threshold:g} everywhere: "
                              f"admitting {self.shed_class} again", kv_usage=kvs))
        return now_shedding, out, d
