"""The MPC policy's explanation: reasons a human can follow, and the diagnostics a tick record keeps.

Reason codes (Reason.code): mpc_scale_up, mpc_scale_up_early (the forecast needs more replicas
within the start-up delay), mpc_scale_down, binding_max_replicas, binding_pin (an override pins the
pool), binding_floor (floors raised its lower bound to its upper one: `pin_cause` names them), lever_avoid
(cache-affinity weight), lever_share (in-flight cap, engine batch caps), lever_move (traffic
split between pools), lever_standby (`pool_reasons`), lever_delay (shedding a class:
`class_reasons`), backlog_floor (a measured backlog raised a pool's floor: `backlog_reasons`),
memory_headroom (the framebuffer bars raising a pool's engine batch caps: `memory_reasons`),
stream_guard (the standing in-flight ceiling binds: `guard_reasons`), step_admission (step-aware admission turned
on or handed back to the router) and tenant_share (a tenant held to its fair share, or its limit lifted:
`task_reasons`).
The policy adds scale_down_stabilised and low_confidence; the breaker's own
(breaker_open / breaker_recovering / breaker_closed) come from Controller.step.

Must not: change a decision; do I/O or read a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from controller.core.forecast import LoadForecast
from controller.core.guards import override_bounds
from controller.core.mpc import PlanProblem, PlanResult, PoolInput, PoolPlan
from controller.core.mpc_model import PlanModel
from controller.jsonsafe import json_safe
from controller.levers import LEVERS
from controller.policies.common import reason, value
from controller.policies.mpc.feedback import Feedback
from controller.policies.mpc.plan_inputs import FB_MARGIN_GIB, MemoryHeadroom
from controller.policies.mpc.task_levers import StepAdmission, TenantPlan
from controller.types import (
    PRIORITY_CLASSES,
    BreakerAction,
    Decision,
    FleetObservation,
    PolicyStatus,
    PoolDecision,
    PoolGauges,
    PoolSpec,
    Reason,
    TaskProfile,
)

# the pool levers a move of which pool_reasons explains (the lever table's `reason` column)
_EXPLAINED = tuple(lv for lv in LEVERS if lv.scope == "pool" and lv.reason and lv.threshold is not None)

def pin_cause(spec: PoolSpec, pin: PoolInput, inp: Any, action: BreakerAction, fb: Feedback,
              redundancy: Mapping[str, int] | None) -> str:
    """What left a pool's planning bounds at one value (plan_inputs.py: the operator's overrides, then the
    breaker's, the measured backlog's and the redundancy floors raise the lower bound up to the upper one):
    "override" when the overrides alone pin it, else the floors that reached the upper bound, by name."""
    lo, hi, _ = override_bounds(spec, inp.overrides, inp.now_s)
    if lo == hi:
        return "override"
    floors = (("the breaker's replacements", action.min_replicas.get(spec.name)),
              ("a measured backlog", fb.floors.get(spec.name)),
              ("the redundancy floor", (redundancy or {}).get(spec.name)))
    return ", ".join(name for name, f in floors if f is not None and f >= pin.hi) or "a floor"


def _predicted(t: Mapping[str, Any], key: str, step: int = 0) -> float | None:
    """The plan's prediction `key` for the pool at `step` (clipped to the horizon), or None."""
    xs = t.get(key) or []
    x = xs[min(step, len(xs) - 1)] if xs else None
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def lever_why(code: str, before: float, after: float, t: Mapping[str, Any]) -> str:
    """What a pool lever's move does and what the plan expects of it, as an operator would say it (the
    quadrants' names — avoid, share, move — say where the lever acts, not why it moved)."""
    up = after > before
    ttft, tpot = _predicted(t, "ttft_p95_s_p90"), _predicted(t, "tpot_p95_s_p90")
    util, hit = _predicted(t, "utilisation_p90"), _predicted(t, "hit_rate", 2)
    if code == "lever_move":
        seen = (f"; the plan predicts p95 TTFT {ttft:.2f} s at {util:.0%} busy here at p90 load"
                if ttft is not None and util is not None else "")
        return f"{'more' if up else 'less'} of its route group's requests come here{seen}"
    if code == "lever_share":  # the in-flight cap per replica; 0 = none
        tighter = after != 0 and (before == 0 or after < before)
        kept = f" (predicted p95 TPOT {tpot * 1000:.0f} ms)" if tpot is not None else ""
        return ("fewer requests run at once on each replica and the rest wait at the router, so the streams "
                f"already running keep their pace{kept}" if tighter else
                f"more requests may run at once on each replica: the engines have room{kept}")
    if code == "lever_avoid":
        what = ("prompts that share a prefix go to the replica that caches it" if up else
                "load spreads over the replicas ahead of cache affinity")
        return what + (f" (predicted hit rate {hit:.2f})" if hit is not None else "")
    if code == "lever_standby":
        return ("replicas kept warm so that the forecast's peaks start in seconds" if up else
                "fewer replicas kept warm: the forecast no longer needs them")
    return ""


def pool_reasons(spec: PoolSpec, pin: PoolInput, cur: int, final: int, pp: PoolPlan, cur_pd: PoolDecision | None,
                 result: PlanResult, step_s: float, pinned_by: str = "override") -> list[Reason]:
    out: list[Reason] = []
    t = result.terms["pools"][spec.name]
    need = t["need_by_step_p90"]
    late = result.terms.get("late_or_shed_frac_p90", {})
    worst = max(late, key=lambda c: late[c]) if late else None
    tail = (f"; the p95s fit {max(need)}, the plan keeps {final} for the tail (predicted late-or-shed share "
            f"at p90 load: {worst} {late[worst]:.1%})" if worst is not None else "")
    if final > cur:
        soon = need[0] > cur
        when = next((k for k, n in enumerate(need) if n > cur), None)
        if when is None:
            # no step's p95 needs more than the current count: a floor (breaker replacements, an
            # override) or the chance constraint (requests beyond the p95) bought it; say which,
            # not "needs 3" next to a scale-up to 5
            code = "mpc_scale_up"
            msg = (f"{cur}→{final}: held at the floor {pin.lo} (breaker replacements or an override)"
                   if final <= pin.lo else f"{cur}→{final}{tail}")
        else:
            code = "mpc_scale_up" if soon else "mpc_scale_up_early"
            msg = (f"{cur}→{final}: p90 load needs {max(need[: when + 1])} now" if soon else
                   f"{cur}→{final}: forecast p90 needs {max(need)} by +{(when + 0.5) * step_s:.0f} s; "
                   f"start-up takes {spec.startup_warm_s:g}-{spec.startup_cold_s:g} s")
            if final > max(need):
                msg += tail
        out.append(reason(code, spec.name, msg, before=cur, after=final, need_by_step=need))
    elif final < cur:
        kept = (f" (keeps {final} for the tail: predicted late-or-shed share at p90 load {worst} "
                f"{late[worst]:.1%})" if worst is not None and final > max(need) else "")
        out.append(reason("mpc_scale_down", spec.name,
                          f"{cur}→{final}: p90 load over the horizon needs at most {max(need)}{kept}; "
                          f"saves ${(cur - final) * spec.usd_per_replica_hour:.2f}/h",
                          before=cur, after=final, need_by_step=need))
    if final >= spec.max_replicas and max(need) > spec.max_replicas:
        out.append(reason("binding_max_replicas", spec.name,
                          f"at the pool maximum {spec.max_replicas}; the p90 load needs {max(need)}",
                          need=max(need)))
    if pin.lo == pin.hi and not pin.frozen and pin.lo != spec.min_replicas:
        if pinned_by == "override":
            out.append(reason("binding_pin", spec.name, f"pinned to {pin.lo} by an override: planning around it"))
        else:  # no override pins it: floors raised its lower bound to its maximum (or an override's ceiling)
            top = "maximum" if pin.hi >= spec.max_replicas else "ceiling (an override's)"
            out.append(reason("binding_floor", spec.name,
                              f"held at {pin.lo}, the pool's {top}: {pinned_by} raised its lower bound that far",
                              floor=pin.lo, by=pinned_by))
    if cur_pd is not None:
        # every planned pool lever whose move is priced, in table order (controller/levers.py): prefix weight
        # (lever_avoid), in-flight cap (lever_share), traffic weight (lever_move), warm standby (lever_standby)
        for lv in _EXPLAINED:
            before, after = getattr(cur_pd, lv.field), getattr(pp, lv.field)
            if abs(after - before) > (lv.threshold or 0.0):
                why = lever_why(lv.reason or "", before, after, t)
                out.append(reason(lv.reason or "", spec.name,
                                  f"{lv.label} {lv.show(before)}→{lv.show(after)}" + (f": {why}" if why else ""),
                                  before=before, after=after))
    if (pp.max_num_seqs, pp.max_num_batched_tokens) != (pin.max_num_seqs, pin.max_num_batched_tokens):
        out.append(reason("lever_share", spec.name,
                          f"engine batch caps → max_num_seqs {pp.max_num_seqs}, max_num_batched_tokens "
                          f"{pp.max_num_batched_tokens} (rolling restart)",
                          max_num_seqs=pp.max_num_seqs, max_num_batched_tokens=pp.max_num_batched_tokens))
    return out


def guard_reasons(problem: PlanProblem, pools_out: Mapping[str, PoolDecision], guards: Mapping[str, int],
                  obs: FleetObservation) -> list[Reason]:
    """One reason per pool where the stream guard binds: the decided in-flight cap sits at the guard's
    ceiling (the guard, not the plan's own trade-off, set it; a ceiling the breaker or a backlog
    replaced is not named) and the engines run at 90 % of it or more, or the router holds requests (it
    counts them per class, not per pool: in a fleet of several pools a held queue names each pool at
    its ceiling)."""
    held = sum((value(c.queue_depth) or 0.0) for c in obs.classes.values())
    out = []
    for p in problem.pools:
        g = guards.get(p.name)
        d = pools_out.get(p.name)
        if g is None or d is None or p.max_inflight_cap != g or d.inflight_cap != g:
            continue
        po = obs.pools.get(p.name)
        running, ready = (value(po.running), value(po.replicas_ready)) if po is not None else (None, None)
        batch = running / ready if running is not None and ready else 0.0
        if batch < 0.9 * g and held <= 0:
            continue
        out.append(reason("stream_guard", p.name,
                          f"in-flight cap {g} per replica (engines at {batch:.0f}, {held:.0f} held at the router): the "
                          "batch the engine runs within 90 % of the tightest protected TPOT SLO; more waits at the "
                          "router, critical passes the cap", ceiling=g, batch=round(batch, 1), held=held))
    return out


def class_reasons(before: Mapping[str, float], after: Mapping[str, float], result: PlanResult,
                  action: BreakerAction, feedback: Feedback | None = None) -> list[Reason]:
    out = []
    fb_shed = feedback.min_shed if feedback is not None else {}
    for c in PRIORITY_CLASSES:
        a, b = before.get(c, 0.0), after.get(c, 0.0)
        if abs(a - b) > 0.005:
            if action.min_shed.get(c, 0.0) >= b - 1e-9 and action.min_shed.get(c):
                why = "breaker floor"
            elif fb_shed.get(c, 0.0) >= b - 1e-9 and fb_shed.get(c):
                why = "measured backlog: the ready replicas serve less than arrives"
            else:
                late = result.terms["late_or_shed_frac_p90"].get(c, 0.0)
                why = f"predicted late-or-shed share at p90 load {late:.1%}"
            out.append(reason("lever_delay", None, f"{c} shed fraction {a:.2f}→{b:.2f} ({why})",
                              priority_class=c, before=a, after=b))
    return out


def task_reasons(current: Decision | None, steps: StepAdmission, tenants: TenantPlan,
                 result: PlanResult, hold_s: float) -> list[Reason]:
    """Step-aware admission turned on or handed back, and each tenant whose limit the plan sets or lifts, said
    as an operator would: what changed and why (task_levers.py)."""
    out: list[Reason] = []
    was = current.step_aware if current is not None else None
    step_aware = steps.on
    if step_aware != was and (step_aware or was):
        if step_aware:
            shed = {c: s for c, s in result.terms.get("shed_frac", {}).items() if s > 0}
            loss = result.terms.get("task_loss", {})
            why = []
            if steps.planned:
                why.append("the plan drops " + ", ".join(f"{s:.1%} of {c}" for c, s in shed.items())
                           if shed else "the plan predicts requests timing out")
            if steps.measured:
                why.append("the router sheds " + ", ".join(f"{v:.1f} {c}" for c, v in steps.measured.items())
                           + " requests/s now")
            pick = [c for c in loss if c in shed or c in steps.measured] or list(loss)
            worst = max(pick, key=lambda c: loss[c], default=None)
            what = (f"; a {worst} request lost step-blind loses {loss[worst]:.1f} requests' worth of work, its "
                    "task's earlier steps with it" if worst is not None else "")
            out.append(reason("step_admission", None,
                              "step-aware admission on: " + " and ".join(why)
                              + f"{what}; new tasks' first steps are shed and held before steps of tasks under way",
                              step_aware=True, shed=shed, measured=dict(steps.measured), task_loss=dict(loss)))
        else:
            out.append(reason("step_admission", None, f"step admission back to the router's own setting: for "
                              f"{hold_s:.0f} s no plan has shed or timed out requests of tasks with earlier steps "
                              "to protect", step_aware=None, hold_s=hold_s))
    before = dict(current.tenants) if current is not None else {}
    for t, lim in tenants.limits.items():
        if before.get(t) == lim:
            continue
        share = tenants.token_share.get(t, 0.0)
        if lim.max_inflight > 0:
            msg = (f"tenant {t} held to {lim.max_inflight} requests in flight: it sends {share:.0%} of the tokens "
                   f"and the plan admits {tenants.admitted_frac:.0%} of the demand ({tenants.slots} in flight); "
                   "this is its fair share")
        else:
            msg = (f"tenant {t} not limited: it sends {share:.0%} of the tokens, within its fair share of what the "
                   f"plan admits ({tenants.admitted_frac:.0%} of the demand)")
        out.append(reason("tenant_share", None, msg, tenant=t, max_inflight=lim.max_inflight,
                          token_share=round(share, 4), admitted_frac=round(tenants.admitted_frac, 4)))
    for t in sorted(set(before) - set(tenants.limits)):
        out.append(reason("tenant_share", None, f"tenant {t}: limits lifted, the plan predicts no overload",
                          tenant=t, max_inflight=0))
    return out


def task_diagnostics(tasks: TaskProfile | None, step_aware: bool | None, tenants: TenantPlan,
                     result: PlanResult) -> dict[str, Any]:
    """The explain record's view of the task levers: the profile planned with and what it chose."""
    return {"profile": None if tasks is None else {
                "classes": {c: {"tasks": list(p.tasks), "tokens": list(p.tokens), "count": p.count}
                            for c, p in tasks.classes.items()},
                "tenant_tokens_rps": dict(tasks.tenant_tokens_rps)},
            "task_loss": dict(result.terms.get("task_loss", {})), "step_aware": step_aware,
            "tenants": {t: {"max_inflight": lim.max_inflight, "weight": lim.weight}
                        for t, lim in tenants.limits.items()},
            "admitted_frac": tenants.admitted_frac, "slots": tenants.slots}


def backlog_reasons(feedback: Feedback, targets: Mapping[str, int]) -> list[Reason]:
    """One reason per pool whose measured backlog raised its floor above the target in force."""
    out = []
    for name, b in feedback.breaches.items():
        if b.floor <= targets.get(name, 0):
            continue
        out.append(reason("backlog_floor", name,
                          f"{b.waiting:.0f} requests waiting; the ready replicas serve {b.served_rps:.1f} of "
                          f"{b.arrivals_rps:.1f} req/s: floor {b.floor} replicas (serves the arrivals and the "
                          "backlog within a minute of start-up)",
                          floor=b.floor, waiting=b.waiting, served_rps=round(b.served_rps, 3),
                          arrivals_rps=round(b.arrivals_rps, 3)))
    return out


def redundancy_reasons(problem: PlanProblem, decisions: Mapping[str, PoolDecision],
                       floors: Mapping[str, int]) -> list[Reason]:
    """One reason per pool decided at its redundancy floor (plan_inputs.py, `redundancy_floor`): the pool
    may not go lower while it carries traffic, whatever its load needs."""
    out: list[Reason] = []
    for p in problem.pools:
        d = decisions.get(p.name)
        floor = floors.get(p.name)
        if d is None or p.frozen or floor is None or floor <= 1 or d.replicas != floor or d.traffic_weight <= 0:
            continue
        out.append(reason("redundancy_floor", p.name,
                          f"at the redundancy floor of {floor} replicas while it carries traffic: with one, a crash "
                          f"or a slow replica leaves the pool's traffic unserved for a cold start "
                          f"({p.startup_cold_s:.0f} s)", replicas=floor))
    return out


def memory_reasons(problem: PlanProblem, headroom: Mapping[str, MemoryHeadroom],
                   options: tuple[int, ...]) -> list[Reason]:
    """One reason per pool whose batch caps are up for review and whose framebuffer headroom bars a
    raise the planner could otherwise try (an option above the caps in force, above the ceiling)."""
    out = []
    for p in problem.pools:
        h = headroom.get(p.name)
        if h is None or not p.batch_review or p.frozen:
            continue
        barred = [o for o in options if o >= p.max_num_seqs and o > p.max_num_batched_tokens
                  and o > h.max_batched_tokens]
        if not barred:
            continue
        extra_gib = (barred[0] - p.max_num_batched_tokens) * h.act_bytes_per_token / 2**30
        out.append(reason("memory_headroom", p.name,
                          f"engine batch caps not raised: framebuffer {h.used_frac:.0%} used on the fullest GPU, "
                          f"{h.free_gib:.1f} GiB free; max_num_batched_tokens {p.max_num_batched_tokens}→"
                          f"{barred[0]} would hold {extra_gib:.2f} GiB more activation per GPU, more than the free "
                          f"memory less a {FB_MARGIN_GIB:g} GiB margin (lowering stays open)",
                          **h.to_dict(), barred=barred))
    return out


def diagnostics(result: PlanResult, fc: LoadForecast, class_share: Mapping[str, float], model: PlanModel,
                corr: Mapping[str, Any], problem: PlanProblem,
                headroom: Mapping[str, MemoryHeadroom] | None = None) -> dict[str, Any]:
    binding = []
    for p in problem.pools:
        need = result.terms["pools"][p.name]["need_by_step_p90"]
        if max(need) >= p.hi and p.hi < 10**6:
            binding.append(f"{p.name}: max replicas {p.hi}")
        if p.lo == p.hi:
            binding.append(f"{p.name}: pinned at {p.lo}")
    for c, x in result.terms["risk_excess"].items():
        if x > 0:
            binding.append(f"{c}: SLO risk above tolerance by {x:.2%}")
    return {
        "forecast": {"lead_s": [float(x) for x in fc.lead_s], "p50_rps": [round(float(x), 3) for x in fc.p50],
                     "p90_rps": [round(float(x), 3) for x in fc.p90], "level_rps": round(fc.level, 3),
                     "trend_rps_per_s": round(fc.trend_per_s, 5), "class_share": dict(class_share)},
        "plan": {p: {"replicas": list(pp.replicas), "standby": pp.warm_standby, "prefix_weight": pp.prefix_weight,
                     "inflight_cap": pp.inflight_cap, "traffic_weight": pp.traffic_weight,
                     "max_num_seqs": pp.max_num_seqs, "max_num_batched_tokens": pp.max_num_batched_tokens}
                 for p, pp in result.plan.pools.items()},
        "shed": dict(result.plan.shed),
        "predicted": {k: v for k, v in result.terms.items() if k != "pools"},
        "pools": result.terms["pools"],
        "binding_constraints": binding,
        "objective": result.objective, "objective_plan_in_force": result.incumbent_objective,
        "evaluations": result.evaluations, "budget_exhausted": result.budget_exhausted,
        # a large fleet searched route group by route group (controller/core/mpc/groups.py): its parts
        **({"search_groups": [list(g) for g in result.groups]} if result.groups else {}),
        "model": {"corrections": dict(corr), "kind": type(model).__name__},
        # per pool with a framebuffer reading: headroom and the ceiling it sets on max_num_batched_tokens
        "memory": {name: h.to_dict() for name, h in (headroom or {}).items()},
    }


# --------------------------------------------------------------------------- status


def planner_status(diag: Mapping[str, Any], guards: Mapping[str, int],
                   headroom: Mapping[str, MemoryHeadroom], result: PlanResult) -> PolicyStatus:
    """The tick's typed status for `governor status` and the daemon's metrics, from its diagnostics: what
    the planner planned with, the reliability dial in force, the standing in-flight ceilings, each pool's
    framebuffer headroom, and the search's size."""
    model = json_safe(dict(diag["model"]))
    used = str(model.get("kind", "?")) + (f" (learned unusable: {model['learned_unusable']})"
                                          if model.get("learned_unusable") else "")
    lines = [("planner.model", f"{model['planning_model']}: {used}"),
             ("planner.reliability", dial_detail(json_safe(dict(diag["reliability"]))))]
    lines += [(f"planner.stream_guard.{pool}", f"in-flight cap at most {ceiling} per replica (critical passes it)")
              for pool, ceiling in sorted(guards.items())]
    memory = {pool: json_safe(h.to_dict()) for pool, h in headroom.items()}
    lines += [(f"memory.{pool}", memory_detail(h)) for pool, h in sorted(memory.items())]
    tasks = diag.get("tasks")
    if tasks is not None:
        lines.append(("planner.tasks", tasks_detail(tasks)))
    gauges = {pool: PoolGauges(gpu_mem_free_bytes=float(h["fb_free_gib"]) * 2**30,
                               batch_tokens_ceiling=float(h["max_batched_tokens"])) for pool, h in memory.items()}
    return PolicyStatus(lines=tuple(lines), pools=gauges, candidates=int(result.evaluations),
                        budget_cut=bool(result.budget_exhausted))


def tasks_detail(t: Mapping[str, Any]) -> str:
    """One line of `governor status` for the task levers (diagnostics["tasks"]), e.g. 'step-aware admission on;
    a lost request loses 2.3 (standard) requests' worth with its task; tenant heavy held to 81 in flight'."""
    if t.get("profile") is None:
        return "no task profile measured (no labelled tasks): steps weighed statically, step admission and " \
               "tenant limits left to the router"
    loss = ", ".join(f"{v:.1f} ({c})" for c, v in sorted(t.get("task_loss", {}).items()))
    aware = "step-aware admission on" if t.get("step_aware") else "step admission left to the router"
    held = [f"{n} held to {v['max_inflight']} in flight" for n, v in sorted(t.get("tenants", {}).items())
            if v.get("max_inflight")]
    return (f"{aware}; a lost request loses {loss} requests' worth with its task"
            + ("; tenant " + ", ".join(held) if held else "; no tenant limits"))


def dial_detail(d: Mapping[str, Any]) -> str:
    """One line of `governor status` for the reliability dial (diagnostics["reliability"]), e.g.
    '0.9 (override): plans for 36 req/s at the 300 s start-up where the median forecast is 30 (+20%)'."""
    head = f"{d.get('value')} ({d.get('source', '?')})"
    if not isinstance(d.get("planned_rps"), (int, float)) or not isinstance(d.get("median_rps"), (int, float)):
        return head
    frac = d.get("margin_frac")
    extra = f" ({frac:+.0%})" if isinstance(frac, (int, float)) else ""
    return (f"{head}: plans for {d['planned_rps']:.4g} req/s at the {d.get('lead_s', 0):g} s lead (the longest "
            f"start-up) where the median forecast is {d['median_rps']:.4g}{extra}")


def memory_detail(h: Mapping[str, Any]) -> str:
    """One line of `governor status` for a pool's framebuffer headroom (diagnostics["memory"])."""
    return (f"FB {h.get('fb_used_frac', float('nan')):.0%} used, {h.get('fb_free_gib', float('nan')):.1f} of "
            f"{h.get('fb_total_gib', float('nan')):.0f} GiB free on the fullest GPU; max_num_batched_tokens may "
            f"rise to {h.get('max_batched_tokens', '?')} ({h.get('activation_kib_per_token', '?')} KiB of "
            "activation a token)")
