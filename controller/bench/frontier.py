"""`governor bench frontier`: every policy swept over its own knob on the generated cases: pass rate against cost.

A policy that offers one operating point cannot be compared with one that offers another by a single
row: a reactive rule tuned to spend more passes more cases. The honest comparison is a frontier, SLO
pass rate against cost, one curve per policy, each policy swept over the knob its project documents
(`KNOBS`, declared once below with the documented default; `default` marks the shipped setting).

The cases are those of `governor bench robustness` (controller/bench/generator.py: the shipped fleets
under generated traffic, faults and length mixes), from the family `--family` names: `robustness` (its
cases 0, 1, 2, ... exactly), `arena` (the traffic patterns NVIDIA's Autoscaling Arena publishes:
staircase, flash crowd, diurnal, a sinusoid slower than a cold start, ramps; controller/bench/shapes.py)
or `all` (the default: the two interleaved, robustness case i at index 2i and arena case i at 2i + 1).
Each case is profiled once, its static fleet verified once (`harness.verify_static`) and its capacity
ceiling (controller/bench/ceiling.py) replayed once, and every (policy, setting) is replayed against
them; cases run in `--workers` processes through `robustness.run_cases`. A case's figures depend on
neither the worker count nor the order.

Per policy and setting (`points`):
- slo_pass_rate: the share of cases keeping >= 99 % of critical AND of standard tasks (`report.meets_bar`,
  as robustness); slo_pass_rate_feasible: over the feasible cases (the verified static fleet or the
  ceiling passes them); slo_pass_rate_ceiling: over the cases the ceiling passes;
- cost_ratio_vs_static_{median,p90}: cost per successful task over the verified static fleet's on the
  same case, median and p90 over the cases;
- good_requests_per_gpu_s: requests that met both their SLOs (TTFT and TPOT, every class) divided by
  the GPU-seconds paid, pooled over the cases (sum over sum; the Arena's score); its per-case median too.
`dominance.<baseline>`: for each of the baseline's points, the cheapest MPC setting (lowest median cost
ratio) passing at least as many cases, and the cheapest passing at least as many less one, or None;
`dominated` when the latter costs no more than the baseline point (the issue-32 acceptance, which
counts the baseline points that pass >= 50 % of the cases: `considered`).

Outputs in --out (default bench-out/frontier): frontier-seedS.json (the report, one row per case in
`cases_detail`), the PNG (--png, default frontier-seedS.png: pass rate against median cost ratio, one
curve per policy), cases/ (each case's YAML and trace) and rows/ (each finished case's row, keyed by
what made it: `--resume` reuses those of an interrupted run at the same sources; their CPU seconds
are the first run's). `--json` prints the report as exactly one
JSON object on stdout; progress goes to stderr. Wall and CPU seconds are top-level fields only.
Exit codes: 0 done, 1 some case failed to run (its row carries the error), 2 bad input.
Must not: write anywhere but --out and --png.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from controller.clock import WallClock

DEFAULT_OUT = "bench-out/frontier"
FAMILY_CHOICES = ("all", "robustness", "arena")
MPC = "mpc"
STATIC = "static"
CEILING = "ceiling"
COST = "cost_per_successful_task_usd"
DOMINANCE_CONSIDERED = 0.5  # issue 32: baseline points that pass at least half the cases must be dominated


# --------------------------------------------------------------------------- the knobs


@dataclass(frozen=True)
class Replay:
    """How one setting is replayed: parameters over the bench's own (`side_by_side.params_for`), the
    objective profile every tick carries, and the factor on the SLOs the policy is told (an `slo_ttft`
    / `slo_tpot` override per class, as `governor override` sets one; the replay is still judged on the
    scenario's SLOs). A policy told a scaled SLO that takes a `capacity` is given the capacity
    profiled at that SLO (read off the same profile's points)."""

    params: Mapping[str, Any] = field(default_factory=dict)
    profile: str = "balanced"
    slo_factor: float = 1.0


def _param(name: str) -> Callable[[Any], Replay]:
    return lambda v: Replay(params={name: v})


def _slo_margin(v: float) -> Replay:
    # slo-feedback aims at both its targets (p95 TTFT against the SLO, waiting requests per replica
    # against queue_target_per_replica, 2 by default): a margin m aims at m x each.
    return Replay(params={"queue_target_per_replica": 2.0 * v}, slo_factor=v)


def _sla_target(v: float) -> Replay:
    return Replay(slo_factor=v)


def _wva_thresholds(v: tuple[float, float]) -> Replay:
    return Replay(params={"kv_cache_threshold": v[0], "queue_length_threshold": v[1]})


@dataclass(frozen=True)
class Knob:
    """One policy's knob: what it is, the settings swept (in order of what they buy), the shipped one."""

    policy: str
    name: str
    settings: tuple[Any, ...]
    default: Any
    replay: Callable[[Any], Replay]
    meaning: str

    def label(self, v: Any) -> str:
        if isinstance(v, tuple):
            return "/".join(f"{x:g}" for x in v)
        return f"{v:g}" if isinstance(v, float) else str(v)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(self.label(v) for v in self.settings)

    def value_of(self, label: str) -> Any:
        return self.settings[self.labels.index(label)]


# Each policy's knob, declared once: the settings swept and the shipped default (always among them).
KNOBS: dict[str, Knob] = {k.policy: k for k in (
    # Kubernetes HPA on DCGM GPU utilisation: averageUtilization target. Kubernetes has no default
    # target; the walkthrough uses 50 %, GPU fleets run 60-80 %; ours ships 0.7 (controller/policies/hpa.py
    # DEFAULT_TARGETS, docs/TELEMETRY.md §7).
    Knob("hpa", "target", (0.5, 0.6, 0.7, 0.8, 0.9), 0.7, _param("target"),
         "GPU-utilisation target per ready replica"),
    # Knative KPA: container-concurrency-target-default 100 x target utilisation 0.7 = 70 in-flight requests
    # per replica (knative/serving pkg/autoscaler/config; controller/policies/kpa.py); an LLM engine runs
    # tens of sequences at once, so the sweep goes well below Knative's web-service default.
    Knob("kpa", "target_concurrency", (10.0, 20.0, 40.0, 70.0, 100.0), 70.0, _param("target_concurrency"),
         "in-flight requests per replica"),
    # Governor's slo-feedback: aims at p95 TTFT = the SLO and 2 waiting per replica
    # (controller/policies/slo_feedback.py); margin m aims at m x both (1 = as shipped).
    Knob("slo-feedback", "margin", (0.5, 0.65, 0.8, 1.0), 1.0, _slo_margin,
         "share of the TTFT SLO and of the queue target it aims at"),
    # Dynamo's SLA planner sizes pools from profiled throughput at its SLA targets (--ttft, --itl; docs
    # "SLA-based Planner"); shipped here at the scenario's SLOs (controller/policies/sla_planner.py).
    Knob("sla-planner", "sla_target", (0.5, 0.7, 0.85, 1.0), 1.0, _sla_target,
         "its TTFT and ITL targets as a share of the SLOs"),
    # llm-d's scorer + AIBrix's KPA on KV-cache usage, target 0.5 per replica (AIBrix docs
    # "Metric-based Autoscaling"; controller/policies/scorer_kpa.py).
    Knob("scorer-kpa", "target_kv_usage", (0.3, 0.4, 0.5, 0.6, 0.7), 0.5, _param("target_kv_usage"),
         "KV-cache usage target per replica"),
    # llm-d's Workload Variant Autoscaler: kvCacheThreshold 0.80 and queueLengthThreshold 5 (its
    # docs/saturation-analyzer.md, docs/capacity-scaling-config.md; controller/policies/llm_d_stack.py);
    # with the spare triggers at their defaults (0.1, 3) it scales up past KV 0.7 or queue 2, and each
    # setting moves both saturation thresholds (the queue one must stay above its trigger, 3).
    Knob("llm-d-stack", "saturation_thresholds", ((0.6, 3.5), (0.7, 4.0), (0.8, 5.0), (0.9, 7.0)), (0.8, 5.0),
         _wva_thresholds, "WVA's KV-cache / queue-length saturation thresholds"),
    # AIBrix: its KPA on kv_cache_usage_perc, the docs' target 0.5 (controller/policies/aibrix_stack.py).
    Knob("aibrix-stack", "target_kv_usage", (0.3, 0.4, 0.5, 0.6, 0.7), 0.5, _param("target_kv_usage"),
         "KV-cache usage target per replica"),
    # Dynamo: its SLA planner's targets, as sla-planner's (controller/policies/dynamo_stack.py).
    Knob("dynamo-stack", "sla_target", (0.5, 0.7, 0.85, 1.0), 1.0, _sla_target,
         "its TTFT and ITL targets as a share of the SLOs"),
    # The MPC's reliability dial (controller/core/objective.py, `reliability`: the probability that demand
    # through the longest start-up stays within what the plan provisions for; 0.5-0.99, the balanced
    # profile's 0.6 shipped, the latency profile's 0.9), set as the policy parameter.
    Knob(MPC, "reliability", (0.5, 0.6, 0.75, 0.9, 0.99), 0.6, _param("reliability"),
         "probability that demand through the longest start-up stays within the plan"),
)}
BASELINES = tuple(p for p in KNOBS if p != MPC)


def default_policies() -> list[str]:
    """Every policy of `KNOBS`; the MPC only when it builds (as `bench robustness`)."""
    from controller.bench.generator import shipped_fleets
    from controller.bench.side_by_side import mpc_available

    return [p for p in KNOBS if p != MPC or mpc_available(shipped_fleets()[0].scenario)]


def parse_policies(text: str | None) -> list[tuple[str, str]]:
    """--policies → (policy, setting label) jobs in knob order. "hpa,kpa:20:70" is every HPA setting and
    KPA at 20 and 70; static and the ceiling are always run (listing them changes nothing). BenchError
    names an unknown policy or setting."""
    from controller.bench.generator import shipped_fleets
    from controller.bench.harness import BenchError
    from controller.bench.side_by_side import mpc_available

    if text is None:
        return [(p, lab) for p in default_policies() for lab in KNOBS[p].labels]
    jobs: list[tuple[str, str]] = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, *wanted = item.split(":")
        if name in (STATIC, CEILING):
            continue
        if name not in KNOBS:
            raise BenchError(f"--policies: no knob for {name!r}; policies: {', '.join(KNOBS)} "
                             "(static and the ceiling are always run)")
        knob = KNOBS[name]
        if name == MPC and not mpc_available(shipped_fleets()[0].scenario):
            raise BenchError("--policies: 'mpc' is not available (not registered, or it does not build)")
        bad = [w for w in wanted if w not in knob.labels]
        if bad:
            raise BenchError(f"--policies: {name} has no setting {bad[0]!r}; its {knob.name} settings: "
                             f"{', '.join(knob.labels)}")
        for lab in knob.labels:
            if (not wanted or lab in wanted) and (name, lab) not in jobs:
                jobs.append((name, lab))
    if not jobs:
        raise BenchError("--policies: give at least one policy with a knob")
    return jobs


# --------------------------------------------------------------------------- one case


def family_case(family: str, j: int) -> tuple[str, int]:
    """Index j of `--family` → (generator family, its case index)."""
    from controller.bench.generator import ARENA, ROBUSTNESS

    if family == "all":
        return (ROBUSTNESS, j // 2) if j % 2 == 0 else (ARENA, j // 2)
    return family, j


def good_requests(fleet: Any) -> dict[str, Any]:
    """`runner.run_closed_loop`'s measure: requests that met both SLOs, and requests sent."""
    rec = fleet.request_records()
    return {"good_requests": int(np.count_nonzero(rec["slo_met"])),
            "requests_sent": int(np.count_nonzero(rec["attempts"] > 0))}


def capacity_at(profile: Any, factor: float) -> Any:
    """The pool's per-replica capacity at `factor` x its profiled SLO, read off the profile's own points
    (`capacity_from_samples`, never extrapolated); below its lowest point, that point's load (the
    planner's own fallback in sla_planner.py). Token rates scale with the request rate."""
    from controller.perf.replica_capacity import capacity_from_samples
    from controller.types import SloSpec

    cap = profile.capacity
    if factor == 1.0:
        return cap
    pts = profile.points
    slo = SloSpec(ttft_s=profile.slo.ttft_s * factor, tpot_s=profile.slo.tpot_s * factor)
    try:
        rps = capacity_from_samples([p.rps_per_replica for p in pts], [p.ttft_p95_s for p in pts],
                                    [p.tpot_p95_s for p in pts], slo).rps
    except ValueError:
        rps = min(p.rps_per_replica for p in pts)
    scale = rps / cap.rps
    return replace(cap, rps=rps, prompt_tokens_per_s=cap.prompt_tokens_per_s * scale,
                   generation_tokens_per_s=cap.generation_tokens_per_s * scale)


def slo_overrides(scenario: Any, factor: float) -> tuple[Any, ...]:
    """Per class, an slo_ttft and an slo_tpot override at `factor` x the scenario's SLO (none at 1)."""
    from controller.sim.fleetspec import fleet_spec_from_scenario
    from controller.types import Override

    if factor == 1.0:
        return ()
    out = []
    for c, s in fleet_spec_from_scenario(scenario).slos.items():
        for kind, v in (("slo_ttft", s.ttft_s), ("slo_tpot", s.tpot_s)):
            out.append(Override(override_id=f"frontier-{kind}-{c}", kind=kind, value=v * factor, priority_class=c,
                                author="bench frontier", reason=f"SLO x {factor:g} (the setting swept)"))
    return tuple(out)


def point_entry(e: Mapping[str, Any], static_cost: Any) -> dict[str, Any]:
    """One replay's figures on one case (from `report.policy_entry`)."""
    from controller.bench.robustness import case_entry

    full = case_entry(e, static_cost, None)
    gpu_h = e.get("gpu_hours")
    out = {k: full[k] for k in ("slo_attainment", "pass", COST, "cost_ratio_vs_static", "successful_tasks",
                                "tasks", "shed", "scaling_actions")}
    out.update({"good_requests": e.get("good_requests"), "requests_sent": e.get("requests_sent"),
                "gpu_s": None if gpu_h is None else float(gpu_h) * 3600.0})
    return out


def _replay(ctx: Any, policy: str, label: str, tick_s: float) -> Any:
    from controller.bench.runner import run_policy
    from controller.bench.side_by_side import params_for

    knob = KNOBS[policy]
    how = knob.replay(knob.value_of(label))
    name, params = params_for(policy, ctx)
    if how.slo_factor != 1.0 and "capacity" in params:
        params["capacity"] = {p: capacity_at(prof, how.slo_factor) for p, prof in ctx.profiles.items()}
    params.update(how.params)
    return run_policy(ctx.scenario, name, seed=ctx.seed, tick_s=tick_s, params=params, workload=ctx.workload,
                      label=f"{policy}@{label}", profile=how.profile,
                      overrides=slo_overrides(ctx.scenario, how.slo_factor), measure=good_requests)


@functools.cache
def source_digest() -> str:
    """SHA-256 of every source a case row depends on: controller/**/*.py and the shipped scenarios (the
    fleets the cases are drawn on). The shared traces are read-only data and not hashed."""
    import hashlib

    from controller.paths import PROJECT_ROOT

    h = hashlib.sha256()
    files = sorted([*(PROJECT_ROOT / "controller").rglob("*.py"), *(PROJECT_ROOT / "scenarios").glob("*.yaml")])
    for f in files:
        h.update(str(f.relative_to(PROJECT_ROOT)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def checkpoint_key(seed: int, family: str, j: int, jobs: Sequence[tuple[str, str]], tick_s: float) -> str:
    """What a saved row was made from: the case, the settings, the tick and the sources."""
    import hashlib

    blob = json.dumps({"seed": seed, "family": family, "index": j, "jobs": [list(x) for x in jobs],
                       "tick_s": tick_s, "sources": source_digest()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def run_frontier_case(seed: int, j: int, jobs: Sequence[tuple[str, str]], out_dir: str, tick_s: float,
                      family: str = "all", resume: bool = False) -> dict[str, Any]:
    """`frontier_case`, checkpointed: each finished row is saved under OUT/rows/ with `checkpoint_key`, and
    with `resume` a saved row with the same key is returned as it was (marked `_resumed`), so an
    interrupted run picks up where it stopped and nothing is reused across a change of sources."""
    path = Path(out_dir) / "rows" / f"frontier-s{seed}-{family}-{j:04d}.json"
    key = checkpoint_key(seed, family, j, jobs, tick_s)
    if resume and path.exists():
        try:
            saved = json.loads(path.read_text())
            if isinstance(saved, dict) and saved.get("key") == key and isinstance(saved.get("row"), dict):
                return {**saved["row"], "_resumed": True}
        except (OSError, ValueError):
            pass  # unreadable: run the case again and overwrite it
    row = frontier_case(seed, j, jobs, out_dir, tick_s, family)
    if "error" not in row:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "row": row}, sort_keys=True))
        tmp.replace(path)
    return row


def frontier_case(seed: int, j: int, jobs: Sequence[tuple[str, str]], out_dir: str, tick_s: float,
                  family: str = "all") -> dict[str, Any]:
    """Index j of `family`: generate it, verify its static fleet and replay the ceiling once, then every
    (policy, setting) of `jobs`; its row (JSON-ready; CPU seconds per job under `_cpu_s`, for the caller
    to take out: the row must not depend on the machine)."""
    from controller.bench.ceiling import ceiling_policy
    from controller.bench.generator import GeneratorError, generate_case
    from controller.bench.harness import BenchError, prepare, verify_static
    from controller.bench.profile import ProfileError
    from controller.bench.report import policy_entry
    from controller.bench.robustness import case_fields
    from controller.bench.runner import run_closed_loop
    from controller.sim.scenario import ScenarioError

    out = Path(out_dir)
    kind, k = family_case(family, j)
    row: dict[str, Any] = {"index": j, "family": kind, "family_index": k}
    cpu: dict[str, float] = {}
    try:
        case = generate_case(seed, k, work_dir=out / "cases", cache_dir=out / ".cache", family=kind)
    except (GeneratorError, ProfileError, ScenarioError) as exc:
        return {**row, "error": f"generating the case: {exc}"}
    row.update(case_fields(case))
    try:
        c0 = time.process_time()
        ctx = prepare(case.scenario, seed=case.spec.sim_seed, cache_dir=out / ".cache")
        verified, static_run, _ = verify_static(ctx, tick_s=tick_s, measure=good_requests)
        ctx = replace(ctx, static_replicas=verified)
        cpu[STATIC] = time.process_time() - c0
        c0 = time.process_time()
        ceiling_run = run_closed_loop(ctx.scenario, ceiling_policy(ctx.scenario), seed=ctx.seed, tick_s=tick_s,
                                      workload=ctx.workload, label=CEILING, breaker=None, measure=good_requests)
        cpu[CEILING] = time.process_time() - c0
        static_e = policy_entry(static_run)
        static_cost = static_e.get(COST)
        refs = {STATIC: point_entry(static_e, static_cost),
                CEILING: point_entry(policy_entry(ceiling_run), static_cost)}
        points: dict[str, dict[str, Any]] = {}
        for policy, label in jobs:
            c0 = time.process_time()
            try:
                run = _replay(ctx, policy, label, tick_s)
            except ValueError as exc:
                raise BenchError(f"policy {policy} at {KNOBS[policy].name} {label}: {exc}") from None
            points.setdefault(policy, {})[label] = point_entry(policy_entry(run), static_cost)
            cpu[f"{policy}@{label}"] = time.process_time() - c0
    except (BenchError, ProfileError, ScenarioError) as exc:
        return {**row, "error": str(exc)}
    row.update({"static_replicas": dict(verified), "static_verify_rounds": static_run.extra.get("verify_rounds"),
                "feasible": refs[STATIC]["pass"] or refs[CEILING]["pass"], "references": refs, "points": points,
                "_cpu_s": {k: round(v, 3) for k, v in cpu.items()}})
    return row


# --------------------------------------------------------------------------- the summary


def _quantile(xs: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if xs else None


def _rate(entries: Sequence[Mapping[str, Any]]) -> float | None:
    return sum(1 for e in entries if e["pass"]) / len(entries) if entries else None


def summarise_point(rows: Sequence[Mapping[str, Any]], get: Callable[[Mapping[str, Any]], Any]) -> dict[str, Any]:
    """The figures of one (policy, setting), or a reference, over the rows `get` finds an entry in."""
    mine = [(r, e) for r in rows if "error" not in r and (e := get(r)) is not None]
    es = [e for _, e in mine]
    ratios = [e["cost_ratio_vs_static"] for e in es if e["cost_ratio_vs_static"] is not None]
    good = [(e["good_requests"], e["gpu_s"]) for e in es
            if e.get("good_requests") is not None and e.get("gpu_s") is not None and e["gpu_s"] > 0]
    crit = [e["slo_attainment"].get("critical") for e in es]
    std = [e["slo_attainment"].get("standard") for e in es]
    ceiling_passes = [e for r, e in mine if r["references"][CEILING]["pass"]]
    return {
        "cases": len(es), "passes": sum(1 for e in es if e["pass"]), "slo_pass_rate": _rate(es),
        "slo_pass_rate_feasible": _rate([e for r, e in mine if r.get("feasible")]),
        "slo_pass_rate_ceiling": _rate(ceiling_passes),
        "critical_min": min((c for c in crit if c is not None), default=None),
        "standard_min": min((s for s in std if s is not None), default=None),
        "critical_min_where_ceiling_passes": min((c for e in ceiling_passes
                                                  if (c := e["slo_attainment"].get("critical")) is not None),
                                                 default=None),
        "cost_ratio_vs_static_median": _quantile(ratios, 50), "cost_ratio_vs_static_p90": _quantile(ratios, 90),
        "good_requests_per_gpu_s": sum(g for g, _ in good) / sum(s for _, s in good) if good else None,
        "good_requests_per_gpu_s_median": _quantile([g / s for g, s in good], 50),
    }


def _cost(p: Mapping[str, Any]) -> float:
    v = p.get("cost_ratio_vs_static_median")
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else math.inf


def cheapest(points: Sequence[Mapping[str, Any]], passes: int) -> Mapping[str, Any] | None:
    """The point with the lowest median cost ratio among those passing at least `passes` cases (the first
    in knob order on a tie; a point without a cost ratio is never the cheapest)."""
    ok = [p for p in points if p["passes"] >= passes and math.isfinite(_cost(p))]
    return min(ok, key=_cost) if ok else None


def dominance(policies: Mapping[str, Sequence[Mapping[str, Any]]], mpc: str = MPC) -> dict[str, list[dict[str, Any]]]:
    """Per baseline and per point of it: the cheapest MPC setting passing at least as many cases, the
    cheapest passing at least as many less one, and whether the latter costs no more (`dominated`).
    Example: HPA at 0.7 passes 30 of 40 at 1.35x; MPC points (cost 20 at 0.90x, balanced 29 at 1.00x,
    latency 33 at 1.20x) → at least as many: latency (1.20x); less one: balanced (1.00x); dominated."""
    mine = policies.get(mpc)
    if not mine:
        return {}

    def ref(p: Mapping[str, Any] | None) -> dict[str, Any] | None:
        return None if p is None else {"setting": p["setting"], "passes": p["passes"],
                                       "cost_ratio_vs_static_median": p["cost_ratio_vs_static_median"]}

    out: dict[str, list[dict[str, Any]]] = {}
    for base, pts in policies.items():
        if base == mpc:
            continue
        rows = []
        for p in pts:
            same, less_one = cheapest(mine, p["passes"]), cheapest(mine, p["passes"] - 1)
            rows.append({"setting": p["setting"], "default": p.get("default", False), "passes": p["passes"],
                         "cases": p["cases"], "cost_ratio_vs_static_median": p["cost_ratio_vs_static_median"],
                         "considered": p["cases"] > 0 and p["passes"] >= DOMINANCE_CONSIDERED * p["cases"],
                         "mpc_at_least": ref(same), "mpc_at_least_less_one": ref(less_one),
                         "dominated": less_one is not None and _cost(less_one) <= _cost(p)})
        out[base] = rows
    return out


def _point_of(r: Mapping[str, Any], policy: str, label: str) -> Any:
    return (r.get("points") or {}).get(policy, {}).get(label)


def _reference_of(r: Mapping[str, Any], name: str) -> Any:
    return (r.get("references") or {}).get(name)


def build_report(seed: int, tick_s: float, family: str, rows: Sequence[Mapping[str, Any]],
                 jobs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    from controller.bench.runner import _jsonable

    policies: dict[str, Any] = {}
    for policy in dict.fromkeys(p for p, _ in jobs):
        knob = KNOBS[policy]
        pts = []
        for label in (lab for p, lab in jobs if p == policy):
            pt = {"setting": label, "value": knob.value_of(label), "default": label == knob.label(knob.default)}
            pt.update(summarise_point(rows, functools.partial(_point_of, policy=policy, label=label)))
            pts.append(pt)
        best = max((p for p in pts if p["good_requests_per_gpu_s"] is not None),
                   key=lambda p: p["good_requests_per_gpu_s"], default=None)
        policies[policy] = {"knob": knob.name, "meaning": knob.meaning, "default_setting": knob.label(knob.default),
                            "points": pts, "best_good_requests_per_gpu_s":
                                None if best is None else {"setting": best["setting"],
                                                           "value": best["good_requests_per_gpu_s"]}}
    refs = {n: summarise_point(rows, functools.partial(_reference_of, name=n)) for n in (STATIC, CEILING)}
    dom = dominance({n: e["points"] for n, e in policies.items()})
    considered = [d for v in dom.values() for d in v if d["considered"]]
    by_shape: dict[str, int] = {}
    for r in rows:
        if "shape" in r:
            by_shape[r["shape"]] = by_shape.get(r["shape"], 0) + 1
    return _jsonable({
        "seed": int(seed), "tick_s": float(tick_s), "family": family, "cases": len(rows),
        "cases_ok": sum(1 for r in rows if "error" not in r),
        "errors": [{"index": r["index"], "error": r["error"]} for r in rows if "error" in r],
        "shapes": dict(sorted(by_shape.items())),
        "feasible_cases": sum(1 for r in rows if r.get("feasible")),
        "ceiling_passes": sum(1 for r in rows if "error" not in r and r["references"][CEILING]["pass"]),
        "references": refs, "policies": policies, "dominance": dom,
        "dominance_summary": {"considered": len(considered), "dominated": sum(1 for d in considered if d["dominated"])},
        "cases_detail": list(rows),
    })


# --------------------------------------------------------------------------- outputs


def _pct(v: Any) -> str:
    return "–" if not isinstance(v, (int, float)) else f"{100 * v:.1f}%"


def _x(v: Any, digits: int = 2) -> str:
    return "–" if not isinstance(v, (int, float)) else f"{v:.{digits}f}"


def render_table(report: Mapping[str, Any]):
    """A rich Table: one row per policy and setting (★ the shipped one), the references last."""
    from rich.table import Table

    t = Table(title=f"governor bench frontier: {report['cases']} cases ({report['family']}; "
                    f"{report['feasible_cases']} feasible, the ceiling passes {report['ceiling_passes']}), "
                    f"seed {report['seed']}, tick {report['tick_s']:g} s")
    for c in ("policy", "setting", "SLO pass", "pass (feasible)", "pass (ceiling's)", "crit min",
              "× static p50", "× static p90", "good req / GPU-s", "MPC ≥ (−1)"):
        t.add_column(c, justify="left" if c in ("policy", "setting", "MPC ≥ (−1)") else "right")
    dom = report.get("dominance") or {}

    def add(name: str, setting: str, e: Mapping[str, Any], mpc: str = "") -> None:
        t.add_row(name, setting, f"{_pct(e['slo_pass_rate'])} ({e['passes']})", _pct(e["slo_pass_rate_feasible"]),
                  _pct(e["slo_pass_rate_ceiling"]), _pct(e["critical_min"]), _x(e["cost_ratio_vs_static_median"]),
                  _x(e["cost_ratio_vs_static_p90"]), _x(e["good_requests_per_gpu_s"], 3), mpc)

    for name, pol in report["policies"].items():
        rows = {d["setting"]: d for d in dom.get(name, [])}
        for p in pol["points"]:
            d = rows.get(p["setting"])
            mpc = ""
            if d is not None:
                m = d["mpc_at_least_less_one"]
                mpc = "none" if m is None else f"{m['setting']} ({_x(m['cost_ratio_vs_static_median'])}×)" + (
                    " ✓" if d["dominated"] else " ✗")
            add(name, f"{pol['knob']}={p['setting']}" + (" ★" if p["default"] else ""), p, mpc)
    for n, e in report["references"].items():
        add(n, "(reference)", e)
    t.caption = ("SLO pass = share of cases keeping ≥ 99 % of critical and standard tasks (feasible: of the cases "
                 "the verified static fleet or the ceiling passes; ceiling's: of those the ceiling passes); × static "
                 "= cost per successful task over the verified static fleet's (median, p90 over cases); good req / "
                 "GPU-s = requests within both SLOs per GPU-second paid, pooled; MPC ≥ (−1) = the cheapest MPC "
                 "setting passing at least as many cases less one (✓ no dearer). ★ = the shipped setting.")
    return t


def write_png(path: Path, report: Mapping[str, Any], dpi: int = 90) -> Path:
    """SLO pass rate against median cost ratio, one curve per policy in knob order (the shipped setting
    ringed), the verified static fleet and the capacity ceiling as points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6), constrained_layout=True)
    cmap = plt.get_cmap("tab10")
    for i, (name, pol) in enumerate(report["policies"].items()):
        pts = [p for p in pol["points"]
               if p["cost_ratio_vs_static_median"] is not None and p["slo_pass_rate"] is not None]
        if not pts:
            continue
        xs = [p["cost_ratio_vs_static_median"] for p in pts]
        ys = [100 * p["slo_pass_rate"] for p in pts]
        color = "black" if name == MPC else cmap(i % 10)
        ax.plot(xs, ys, marker="o", ms=4, lw=2.2 if name == MPC else 1.2, color=color, label=f"{name} ({pol['knob']})")
        for p, x, y in zip(pts, xs, ys, strict=True):
            if p["default"]:
                ax.plot([x], [y], marker="o", ms=10, mfc="none", mec=color, mew=1.5)
            ax.annotate(p["setting"], (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points", color=color)
    for name, marker in ((STATIC, "X"), (CEILING, "^")):
        e = report["references"][name]
        if e["cost_ratio_vs_static_median"] is not None and e["slo_pass_rate"] is not None:
            ax.plot([e["cost_ratio_vs_static_median"]], [100 * e["slo_pass_rate"]], marker=marker, ms=9, ls="none",
                    color="grey", label=f"{name} (reference)")
    ax.set_xlabel("cost per successful task / verified static fleet's (median over cases)")
    ax.set_ylabel("SLO pass rate, % of cases (≥ 99 % of critical and standard)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"bench frontier: {report['cases']} cases ({report['family']}), seed {report['seed']} "
                 "(ringed: the shipped setting)", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, metadata={"Software": None})
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- CLI


def cmd_bench_frontier(args: argparse.Namespace) -> int:
    from controller.bench.generator import GeneratorError
    from controller.bench.harness import BenchError
    from controller.bench.robustness import case_options, run_cases

    prog = "governor bench frontier"
    clock = WallClock()
    t0 = clock.monotonic_s()
    try:
        seed, workers, tick_s, indices = case_options(args)
        family = getattr(args, "family", None) or "all"
        if family not in FAMILY_CHOICES:
            raise BenchError(f"--family: {family!r} is not one of {', '.join(FAMILY_CHOICES)}")
        jobs = parse_policies(getattr(args, "policies", None))
    except (BenchError, GeneratorError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    out_dir = Path(args.out or DEFAULT_OUT)
    out_dir.mkdir(parents=True, exist_ok=True)
    workers = max(1, min(workers, len(indices)))
    case_wall: dict[int, float] = {}
    case_cpu: dict[int, float] = {}
    rows = run_cases(seed, indices, jobs, out_dir, workers=workers, tick_s=tick_s,
                     quiet=getattr(args, "quiet", False), wall_s=case_wall, cpu_s=case_cpu,
                     case_fn=functools.partial(run_frontier_case, family=family,
                                               resume=bool(getattr(args, "resume", False))))
    resumed = sum(1 for r in rows if r.pop("_resumed", False))
    job_cpu: dict[str, list[float]] = {}
    for r in rows:
        for k, v in (r.pop("_cpu_s", None) or {}).items():
            acc = job_cpu.setdefault(k.split("@", 1)[0], [0.0, 0])
            acc[0] += v
            acc[1] += 1
    report = build_report(seed, tick_s, family, rows, jobs)
    # The only machine-dependent fields, top level (`cases_detail` compares equal across runs).
    replays = sum(len(pts) for r in rows for pts in (r.get("points") or {}).values())
    replays += sum(1 + (r.get("static_verify_rounds") or 0) + 1 for r in rows if "error" not in r)
    report.update({"wall_s": round(clock.monotonic_s() - t0, 1), "workers": workers,
                   "case_wall_s": {str(k): v for k, v in sorted(case_wall.items())},
                   "case_cpu_s": {str(k): v for k, v in sorted(case_cpu.items())},
                   "cpu_s_total": round(sum(case_cpu.values()), 1), "replays": replays, "resumed_cases": resumed,
                   "cpu_s_per_replay": round(sum(case_cpu.values()) / replays, 2) if replays else None,
                   "cpu_s_by_policy": {n: {"cpu_s": round(c, 1), "cpu_s_per_replay": round(c / max(m, 1), 2)}
                                       for n, (c, m) in sorted(job_cpu.items())}})
    suffix = f"-case{indices[0]}" if getattr(args, "case", None) is not None else ""
    stem = f"frontier-seed{seed}" + (f"-{family}" if family != "all" else "") + suffix
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    png_path = write_png(Path(args.png) if getattr(args, "png", None) else out_dir / f"{stem}.png", report)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        from rich.console import Console

        console = Console()
        if not console.is_terminal:
            console = Console(width=220)
        console.print(render_table(report))
    print(f"{prog}: {len(indices)} case(s), {replays} replays in {clock.monotonic_s() - t0:.0f} s wall ({workers} "
          f"worker(s), {report['cpu_s_total']:.0f} CPU s in the cases, {report['cpu_s_per_replay'] or 0:.2f} per "
          f"replay); wrote {json_path} and {png_path}", file=sys.stderr)
    return 1 if report["errors"] else 0


__all__ = ["BASELINES", "KNOBS", "Knob", "Replay", "build_report", "capacity_at", "cheapest", "cmd_bench_frontier",
           "default_policies", "dominance", "family_case", "parse_policies", "render_table", "run_frontier_case",
           "summarise_point", "write_png"]
