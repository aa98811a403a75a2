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


# --------------------------------------------------------------------------- capacity


def _max_load_within(loads: Sequence[float], lats: Sequence[float], bound: float) -> float | None:
    """Largest load whose (monotone, linearly interpolated) latency is ≤ bound; None if even the first is over.

    Example: loads 1, 2, 4 with latency 0.2, 0.4, 1.2 and bound 0.8 → 2 + (0.8-0.4)/(1.2-0.4) × 2 = 3.
    """
    if lats[0] > bound:
        return None
    for i in range(len(loads) - 1):
        if lats[i + 1] > bound:
            if lats[i + 1] == lats[i]:
                return float(loads[i])
            return float(loads[i] + (bound - lats[i]) * (loads[i + 1] - loads[i]) / (lats[i + 1] - lats[i]))
    return float(loads[-1])


@dataclass(frozen=True, slots=True)
class ReplicaCapacity:
    """What one replica of a pool sustains while meeting the SLO, plus (optionally) its latency profile.

    rps: requests/s per replica at the SLO; prompt_tokens_per_s / generation_tokens_per_s:
    the same in tokens (0 = unknown, requests/s is used). profile_*: per-replica load
    (ascending) and the latency measured there (made non-decreasing), used for Dynamo's
    correction factors; empty = no profile.
    """

    rps: float
    prompt_tokens_per_s: float = 0.0
    generation_tokens_per_s: float = 0.0
    profile_rps: tuple[float, ...] = ()
    profile_ttft_s: tuple[float, ...] = ()
    profile_tpot_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        check_positive("capacity.rps", self.rps)
        check_positive("capacity.prompt_tokens_per_s", self.prompt_tokens_per_s, allow_zero=True)
        check_positive("capacity.generation_tokens_per_s", self.generation_tokens_per_s, allow_zero=True)
        n = len(self.profile_rps)
        for f in ("profile_ttft_s", "profile_tpot_s"):
            if len(getattr(self, f)) not in (0, n):
                raise ValueError(f"capacity.{f} has {len(getattr(self, f))} points, profile_rps has {n}")
        if any(b <= a for a, b in zip(self.profile_rps, self.profile_rps[1:], strict=False)):
            raise ValueError("capacity.profile_rps must be strictly ascending")
        for f in ("profile_rps", "profile_ttft_s", "profile_tpot_s"):
            if any(not (math.isfinite(x) and x >= 0) for x in getattr(self, f)):
                raise ValueError(f"capacity.{f} must hold finite numbers >= 0")

    @classmethod
    def of(cls, v: ReplicaCapacity | Mapping[str, Any]) -> ReplicaCapacity:
        """Accept a ReplicaCapacity or a mapping of its fields (from a config file)."""
        if isinstance(v, ReplicaCapacity):
            return v
        if not isinstance(v, Mapping):
            raise ValueError(f"capacity must be a ReplicaCapacity or a mapping (got {type(v).__name__})")
        allowed = set(cls.__dataclass_fields__)
        unknown = set(v) - allowed
        if unknown:
            raise ValueError(f"capacity: unknown field(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        kw: dict[str, Any] = {k: (tuple(float(x) for x in val) if k.startswith("profile_") else float(val))
                              for k, val in v.items()}
        return cls(**kw)

    def _interp(self, lats: tuple[float, ...], rps: float) -> float | None:
        if not lats:
            return None
        return float(np.interp(rps, self.profile_rps, lats))

    def expected_ttft_s(self, rps_per_replica: float) -> float | None:
        return self._interp(self.profile_ttft_s, rps_per_replica)

    def expected_tpot_s(self, rps_per_replica: float) -> float | None:
        return self._interp(self.profile_tpot_s, rps_per_replica)

    def rps_within(self, *, ttft_s: float | None = None, tpot_s: float | None = None) -> float | None:
        """Highest profiled per-replica load meeting the given latency bounds (None: not even the lowest)."""
        out = math.inf
        for lats, bound in ((self.profile_ttft_s, ttft_s), (self.profile_tpot_s, tpot_s)):
            if bound is None:
                continue
            if not lats:
                raise ValueError("capacity has no latency profile for this bound")
            m = _max_load_within(self.profile_rps, lats, bound)
            if m is None:
                return None
            out = min(out, m)
        return None if math.isinf(out) else out


def capacity_from_samples(load_rps: Sequence[float], ttft_s: Sequence[float] | None, tpot_s: Sequence[float] | None,
                          slo: SloSpec, *, mean_prompt_tokens: float = 0.0,
                          mean_output_tokens: float = 0.0) -> ReplicaCapacity:
    """Build a ReplicaCapacity from profiled (per-replica load, latency) samples.

    Samples at the same load are averaged, rows with a NaN/inf value are dropped,
    and each latency curve is made non-decreasing in load (a running max) so noise
    cannot invent capacity. The sustainable load is the largest load whose
    interpolated latency meets the SLO on every curve given (TTFT and/or TPOT);
    it is never extrapolated beyond the highest profiled load. Token rates are the
    load times the mean prompt/output length. Example: loads 1, 2, 4 req/s with
    p95 TTFT 0.3, 0.5, 2.1 s and a 1.3 s TTFT SLO → 2 + (0.8/1.6) × 2 = 3 req/s.
    Raises ValueError naming the problem (lengths, no usable rows, SLO not met even
    at the lowest load).
    """
    if ttft_s is None and tpot_s is None:
        raise ValueError("capacity_from_samples: give ttft_s and/or tpot_s")
    load = np.asarray(load_rps, dtype=float)
    cols: dict[str, np.ndarray] = {}
    for name, arr in (("ttft_s", ttft_s), ("tpot_s", tpot_s)):
        if arr is not None:
            a = np.asarray(arr, dtype=float)
            if a.shape != load.shape:
                raise ValueError(f"capacity_from_samples: {name} has {a.size} samples, load_rps has {load.size}")
            cols[name] = a
    if load.ndim != 1 or load.size == 0:
        raise ValueError("capacity_from_samples: load_rps must be a non-empty 1-D sequence")
    ok = np.isfinite(load) & (load > 0)
    for a in cols.values():
        ok &= np.isfinite(a) & (a >= 0)
    if not ok.any():
        raise ValueError("capacity_from_samples: no sample has a finite load > 0 and finite latencies")
    load = load[ok]
    uniq, inv = np.unique(load, return_inverse=True)
    curves: dict[str, tuple[float, ...]] = {}
    for name, a in cols.items():
        means = np.bincount(inv, weights=a[ok]) / np.bincount(inv)
        curves[name] = tuple(float(x) for x in np.maximum.accumulate(means))
    loads = tuple(float(x) for x in uniq)
    best = math.inf
    for name, bound in (("ttft_s", slo.ttft_s), ("tpot_s", slo.tpot_s)):
        if name not in curves:
            continue
        m = _max_load_within(loads, curves[name], bound)
        if m is None:
            raise ValueError(f"capacity_from_samples: {name} {curves[name][0]:.3g} at the lowest profiled load "
                             f"{loads[0]:.3g} req/s already exceeds the SLO {bound:g} s")
        best = min(best, m)
    rps = float(best)
    return ReplicaCapacity(rps=rps, prompt_tokens_per_s=rps * float(mean_prompt_tokens),
                           generation_tokens_per_s=rps * float(mean_output_tokens), profile_rps=loads,
                           profile_ttft_s=curves.get("ttft_s", ()), profile_tpot_s=curves.get("tpot_s", ()))


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
