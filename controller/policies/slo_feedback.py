"""Governor's first closed-loop policy: scale each pool on how far it is from its latency SLO and queue target.

Per pool, every tick:
  ttft_ratio  = measured p95 TTFT / SLO TTFT (the tightest class's, or `slo_class`'s)
  queue_ratio = (waiting requests / ready replica) / queue_target_per_replica
  ratio       = the larger of the two
  need        = ceil(ready × ratio)     — the replicas that would bring the ratio to 1
HPA-style: nothing changes while |ratio − 1| ≤ tolerance (0.1), and a scale-down
never goes below the highest recommendation of the last 300 s (stabilisation; the
window starts seeded with the count in force, so a restart never scales down at once).
Example: 4 ready, p95 TTFT 3.6 s vs a 2 s SLO, 2 waiting per replica vs a target
of 2 → ratio max(1.8, 1.0) = 1.8 → need ceil(4 × 1.8) = 8.

Cold-start awareness:
- The measurement comes from the *ready* replicas, so `need` is sized from them,
  and replicas already starting count as capacity on the way: when
  need ≤ the target in force (ready + starting), the pool waits for them instead
  of stacking another scale-up (reason scale_up_pending_startup). This is the
  "current_effective" of the brief: demand is measured on ready replicas and
  compared with the capacity that will exist once starting replicas are up.
  Example: 4 ready + 4 starting (target 8), ratio 1.8 → need 8 ≤ 8 → wait.
- Early trigger: the queue's rate of change (least-squares slope over the last
  `trend_window_s`) predicts the queue at now + startup_warm_s, the earliest a
  replica ordered now could serve. If that predicted queue ratio exceeds the
  tolerance band, scale up now (reason queue_growth_predicted).
  Example: 2 ready, waiting 4 and growing 0.5/s, warm start 30 s → predicted 19
  waiting, 9.5 per replica vs 2 → ratio 4.75 (capped, see below).
- TTFT p95 is a windowed quantile that lags: for `ttft_settle_s` after the ready
  count rises, TTFT does not drive further scale-ups (the queue still can), so the
  overload the new replicas were ordered for is not counted twice.
- TTFT grows non-linearly near saturation, so a ratio of 10 does not mean 10× the
  replicas: one step sizes for at most max(ready × max_scale_up_ratio, ready + 4)
  (the HPA's default "100 % or 4 pods" rule), then measures again.

Missing data (the HPA way): no ready count → hold; both TTFT and queue missing →
hold (missing_data_hold); one missing → the other may scale up, never down
(partial_data_no_scale_down). A pool with no traffic (arrival 0, nothing running
or waiting) has no TTFT samples; that counts as ratio 0 (idle), not missing.
Routing and admission are left at their defaults.

Pure: no I/O, no clock; does not import telemetry/actuation/api/runtime/gen,
grpc or prometheus clients.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from controller.policies.common import (
    SCORER_DEFAULT,
    Events,
    Samples,
    ceil_replicas,
    change_reason,
    check_positive,
    clamp,
    current_target,
    pool_decision,
    push_sample,
    reason,
    replica_floor,
    slope_per_s,
    stabilise,
    tightest_slo,
    value,
)
from controller.types import PolicyInput, PolicyOutput, PoolDecision, PoolObservation, PoolSpec, Reason


@dataclass(frozen=True, slots=True)
class FeedbackPoolMemory:
    recommendations: Events = ()
    waiting: Samples = ()
    last_ready: int | None = None
    ready_rise_s: float | None = None


@dataclass(frozen=True, slots=True)
class FeedbackState:
    pools: Mapping[str, FeedbackPoolMemory] = field(default_factory=dict)


class SloFeedbackPolicy:
    """Scale on max(p95 TTFT / SLO, queue per replica / target), cold-start aware, HPA-style damping."""

    name = "slo-feedback"

    def __init__(self, *, slo_class: str | None = None, queue_target_per_replica: float = 2.0,
                 tolerance: float = 0.1, scale_down_stabilization_s: float = 300.0, trend_window_s: float = 60.0,
                 ttft_settle_s: float = 60.0, max_scale_up_ratio: float = 2.0, max_scale_up_pods: int = 4) -> None:
        self.slo_class = slo_class
        self.queue_target = check_positive("slo_feedback.queue_target_per_replica", queue_target_per_replica)
        self.tolerance = check_positive("slo_feedback.tolerance", tolerance, allow_zero=True)
        self.down_window_s = check_positive("slo_feedback.scale_down_stabilization_s", scale_down_stabilization_s,
                                            allow_zero=True)
        self.trend_window_s = check_positive("slo_feedback.trend_window_s", trend_window_s)
        self.ttft_settle_s = check_positive("slo_feedback.ttft_settle_s", ttft_settle_s, allow_zero=True)
        self.max_up_ratio = check_positive("slo_feedback.max_scale_up_ratio", max_scale_up_ratio)
        if self.max_up_ratio <= 1:
            raise ValueError(f"slo_feedback.max_scale_up_ratio must be > 1 (got {max_scale_up_ratio})")
        if isinstance(max_scale_up_pods, bool) or not isinstance(max_scale_up_pods, int) or max_scale_up_pods < 0:
            raise ValueError(f"slo_feedback.max_scale_up_pods must be an integer >= 0 (got {max_scale_up_pods!r})")
        self.max_up_pods = max_scale_up_pods

    def initial_state(self) -> FeedbackState:
        return FeedbackState()

    def decide(self, state: FeedbackState, inp: PolicyInput,
               rng: np.random.Generator) -> tuple[FeedbackState, PolicyOutput]:
        slo = tightest_slo(inp.fleet, self.slo_class)
        pools: dict[str, PoolDecision] = {}
        reasons: list[Reason] = []
        diag: dict[str, Any] = {}
        memory: dict[str, FeedbackPoolMemory] = {}
        for spec in inp.fleet.pools:
            cur, _ = current_target(inp, spec)
            # A pool seen for the first time starts with its count in force in the scale-down
            # window (as the HPA does), so a restart never scales down at once.
            mem = state.pools.get(spec.name) or FeedbackPoolMemory(recommendations=((inp.now_s, cur),))
            n, mem, pool_reasons, d = self._pool(spec, inp.observation.pools.get(spec.name), cur, mem, inp.now_s,
                                                 slo.ttft_s if slo else None)
            memory[spec.name] = mem
            pools[spec.name] = pool_decision(n, SCORER_DEFAULT)
            reasons.extend(pool_reasons)
            diag[spec.name] = d
        return FeedbackState(pools=memory), PolicyOutput(
            pools=pools, reasons=tuple(reasons),
            diagnostics={"pools": diag, "slo_ttft_s": slo.ttft_s if slo else None,
                         "queue_target_per_replica": self.queue_target})

    def _pool(self, spec: PoolSpec, obs: PoolObservation | None, cur: int, mem: FeedbackPoolMemory, now: float,
              slo_ttft: float | None) -> tuple[int, FeedbackPoolMemory, list[Reason], dict[str, Any]]:
        get = (lambda f: value(getattr(obs, f))) if obs is not None else (lambda f: None)
        ready_v, starting_v = get("replicas_ready"), get("replicas_starting")
        waiting, running, arrival, ttft = get("waiting"), get("running"), get("arrival_rps"), get("ttft_p95_s")
        samples = push_sample(mem.waiting, now, waiting, self.trend_window_s) if waiting is not None else mem.waiting
        d: dict[str, Any] = {"current": cur, "ready": ready_v, "starting": starting_v, "waiting": waiting,
                             "ttft_p95_s": ttft, "slo_ttft_s": slo_ttft}

        def hold(code: str, msg: str, **data: Any) -> tuple[int, FeedbackPoolMemory, list[Reason], dict[str, Any]]:
            d["replicas"] = cur
            m = FeedbackPoolMemory(mem.recommendations, samples, mem.last_ready, mem.ready_rise_s)
            return cur, m, [reason(code, spec.name, msg, replicas=cur, **data)], d

        if ready_v is None:
            return hold("missing_data_hold", f"no replicas_ready reading: holding {cur}", signal="replicas_ready")
        ready = int(round(ready_v))
        rise_s = now if mem.last_ready is not None and ready > mem.last_ready else mem.ready_rise_s
        if ready <= 0:
            if (starting_v or 0) > 0 or cur > 0:
                return hold("scale_up_pending_startup", f"no replica ready yet, {cur} ordered: waiting for them")
            floor = replica_floor(spec)
            d["replicas"] = floor
            return floor, FeedbackPoolMemory(mem.recommendations, samples, ready, rise_s), [
                change_reason(spec.name, cur, floor, "no replica at all: start the minimum")], d

        # The ratios. Idle (no traffic at all) is a measurement, not missing data.
        idle = arrival == 0.0 and (waiting or 0.0) == 0.0 and (running or 0.0) == 0.0
        ttft_ratio = (ttft / slo_ttft if ttft is not None and slo_ttft else (0.0 if idle else None))
        queue_ratio = waiting / ready / self.queue_target if waiting is not None else None
        slope = slope_per_s(samples, now, self.trend_window_s, min_span_s=self.trend_window_s / 4)
        pred_ratio = None
        if waiting is not None and slope is not None and slope > 0:
            predicted = waiting + slope * spec.startup_warm_s
            pred_ratio = predicted / ready / self.queue_target
            d.update(queue_slope_per_s=slope, predicted_waiting=predicted, predicted_queue_ratio=pred_ratio)
        settling = rise_s is not None and now - rise_s < self.ttft_settle_s
        d.update(ttft_ratio=ttft_ratio, queue_ratio=queue_ratio, idle=idle, ttft_settling=settling)
        if ttft_ratio is None and queue_ratio is None:
            return hold("missing_data_hold", f"neither p95 TTFT nor queue depth usable: holding {cur}",
                        signal="ttft_p95_s,waiting")
        partial = ttft_ratio is None or queue_ratio is None

        # Which signal drives: the largest ratio (TTFT only for scale-up once it has settled).
        candidates: list[tuple[float, str]] = []
        if ttft_ratio is not None:
            candidates.append((ttft_ratio, "slo_breach"))
        if queue_ratio is not None:
            candidates.append((queue_ratio, "queue_breach"))
        if pred_ratio is not None:
            candidates.append((pred_ratio, "queue_growth_predicted"))
        ratio, driver = max(candidates, key=lambda c: c[0])
        if driver == "slo_breach" and settling and ratio > 1.0 + self.tolerance:
            # TTFT still reflects the overload the newly ready replicas were ordered for.
            rest = [c for c in candidates if c[1] != "slo_breach"]
            ratio, driver = max(rest, key=lambda c: c[0]) if rest else (1.0, "ttft_settling")
            partial = True
        d.update(ratio=ratio, driver=driver)

        floor, hi = replica_floor(spec), spec.max_replicas
        reasons: list[Reason] = []
        if ratio > 1.0 + self.tolerance:
            cap = max(ceil_replicas(ready * self.max_up_ratio), ready + self.max_up_pods)
            need = min(ceil_replicas(ready * ratio), cap)
        elif ratio < 1.0 - self.tolerance:
            need = ceil_replicas(ready * ratio)
        else:
            need = cur
        need = max(need, floor)
        d["need"] = need

        if cur < floor or cur > hi:
            final, bound = clamp(cur, floor, hi)
            recs = stabilise(mem.recommendations, now, final, cur, 0.0, self.down_window_s)[1]
            reasons.append(change_reason(spec.name, cur, final, f"outside the pool bounds [{floor}, {hi}]"))
            reasons.append(reason(f"clamped_{bound}", spec.name, f"{cur} kept within [{floor}, {hi}]",
                                  wanted=cur, replicas=final))
        elif need > cur:
            final, bound = clamp(need, floor, hi)
            recs = stabilise(mem.recommendations, now, need, cur, 0.0, self.down_window_s)[1]
            if final != cur:
                msgs = {"slo_breach": f"p95 TTFT {ttft:.3g} s vs SLO {slo_ttft:g} s" if ttft is not None else "",
                        "queue_breach": (f"{queue_ratio * self.queue_target:.3g} waiting per replica "
                                         f"vs {self.queue_target:g}") if queue_ratio is not None else "",
                        "queue_growth_predicted": f"queue predicted to reach {d.get('predicted_waiting', 0):.3g} "
                                                  f"in {spec.startup_warm_s:g} s (start-up)"}
                reasons.append(change_reason(spec.name, cur, final, f"ratio {ratio:.3g} ({driver}) on {ready} ready",
                                             ratio=ratio, driver=driver, need=need))
                reasons.append(reason(driver, spec.name, msgs.get(driver, driver), ratio=ratio))
            if bound is not None and final != need:
                reasons.append(reason(f"clamped_{bound}", spec.name, f"{need} kept within [{floor}, {hi}]",
                                      wanted=need, replicas=final))
        elif ratio > 1.0 + self.tolerance:
            # Over target but the replicas already ordered cover it: wait for them.
            final, recs = cur, stabilise(mem.recommendations, now, cur, cur, 0.0, self.down_window_s)[1]
            reasons.append(reason("scale_up_pending_startup", spec.name,
                                  f"ratio {ratio:.3g} ({driver}) needs {need}; {cur} already ordered "
                                  f"({ready} ready, {cur - ready} on the way): waiting for them",
                                  need=need, ratio=ratio, driver=driver))
        elif need < cur:
            stab, recs = stabilise(mem.recommendations, now, need, cur, 0.0, self.down_window_s)
            if partial:
                final = cur
                reasons.append(reason("partial_data_no_scale_down", spec.name,
                                      f"{'p95 TTFT' if ttft_ratio is None else 'queue depth'} missing: no scale-down "
                                      f"to {need}", wanted=need, replicas=cur))
            else:
                final = max(stab, floor)
                if final < cur:
                    reasons.append(change_reason(spec.name, cur, final,
                                                 f"ratio {ratio:.3g} ({driver}) on {ready} ready",
                                                 ratio=ratio, driver=driver, need=need))
                    if idle:
                        reasons.append(reason("idle", spec.name, "no traffic: TTFT ratio taken as 0"))
                if stab > need:
                    reasons.append(reason("scale_down_stabilised", spec.name,
                                          f"recommendation {need} held at {stab}: highest of the last "
                                          f"{self.down_window_s:g} s", proposal=need, stabilised=stab))
        else:
            final, recs = cur, stabilise(mem.recommendations, now, cur, cur, 0.0, self.down_window_s)[1]
        d["replicas"] = final
        return final, FeedbackPoolMemory(recs, samples, ready, rise_s), reasons, d
