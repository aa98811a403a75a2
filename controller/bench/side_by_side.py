"""`governor bench policies`: every policy on one scenario, same seed, side by side, against the oracle.

Steps: load the scenario → build its workload once (the same the fleet would build
for the seed) → profile each pool's per-replica capacity at the SLO (cached) →
estimate demand → size static provisioning from the trace's peak and verify it
(`verify_static`) → replay the scenario once per policy through `runner.run_policy`
→ find and replay the hindsight oracle → one table (rich, stdout), the same as JSON (`--json` prints
only that object on stdout) and a PNG, both written to `--out` (default bench-out/).
A progress bar goes to stderr. With `--seeds 1,2,3` the whole comparison runs once per seed
(reports S-seedN.json / .png) and the spread of each policy's figures across the seeds is
printed and written as S-seeds.json (`report.summarise_seeds`): one seed is one draw of the
arrivals, and a bursty trace's cost can move by 10 % between draws.

Policy names: the registered ones (static, hpa, kpa, sla-planner, scorer-kpa,
slo-feedback, the composed stacks llm-d-stack, aibrix-stack and dynamo-stack, and mpc
once it is registered — picked up when it builds, silently left out otherwise), the
variants below (the `OPT_IN_VARIANTS` only when `--policies` names them), and "oracle"
(always run unless a `--policies` list leaves it out), plus "oracle-joint" where a route
group has two or more first-hop pools (the oracle that also schedules the split between
them; oracle_joint.py) and "oracle-lag" (that schedule with every change one tick plus a
warm start-up late: the reference an online controller can reach; on request for any
scenario), and "ceiling" on request (every pool at max_replicas with the sheddable class
shed: what replica counts and admission can serve at all; ceiling.py). Scenario-dependent
parameters come from the profile: `replicas` (static) = peak
demand / capacity, raised one replica per pool at a time until a replay meets the oracle's
task targets (at most `STATIC_VERIFY_ROUNDS` more replays; "static peak provisioning" is a
fleet that serves the peak, checked, not an estimate that may fall short); `capacity` (SLA
planner, and any policy that takes it) = the profiled ReplicaCapacity.

Exit codes: 0 done; 2 bad scenario, unknown policy, or a pool that cannot meet its
SLO at any load. Must not: write anywhere but --out (and its .cache), or read the
wall clock except through controller.clock for the elapsed time it prints.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from controller.bench.ceiling import CEILING, ceiling_policy
from controller.bench.harness import (
    DEFAULT_OUT,
    DEFAULT_TICK_S,
    STATIC,
    BenchContext,
    BenchError,
    ProgressBar,
    emit,
    parse_list,
    prepare,
    scenario_seed,
    verify_static,
)
from controller.bench.oracle import (
    OracleResult,
    PoolDemand,
    peak_rate,
    pool_demands,
    run_oracle,
)
from controller.bench.oracle_joint import joint_groups
from controller.bench.oracle_lag import reference_lag_s, replay_lagged
from controller.bench.profile import ProfileError
from controller.bench.report import (
    build_report,
    meets_bar,
    policy_entry,
    render_seeds_table,
    render_table,
    summarise_seeds,
    write_png,
)
from controller.bench.runner import Progress, RunResult, run_closed_loop, run_policy
from controller.clock import WallClock
from controller.perf.replica_capacity import ReplicaCapacity
from controller.policies.registry import POLICY_NAMES, build_policy, policy_params
from controller.sim.fleetspec import fleet_spec_from_scenario
from controller.sim.scenario import Scenario, ScenarioError, load_scenario

# Bench variants of registered policies: label → (policy, parameters).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    # Dynamo's planner at a shorter adjustment interval than its 180 s default.
    "sla-planner-60s": ("sla-planner", {"adjustment_interval_s": 60.0}),
    # The vLLM production-stack tutorial's HPA: waiting requests per replica, target 1.
    "hpa-queue": ("hpa", {"metric": "queue_per_replica"}),
    # The MPC planning on the learned coupling models (the shipped models/) instead of the queueing prior.
    "mpc-learned": ("mpc", {"planning_model": "learned"}),
    # The MPC without its redundancy floor (a pool with traffic may run on one replica): what the floor costs and buys.
    "mpc-no-redundancy": ("mpc", {"min_serving_replicas": 1}),
    # The MPC without its slow-replica detection (controller/core/outliers.py; on by default, decision 0035).
    "mpc-no-outliers": ("mpc", {"outliers": False}),
    # A stack's router alone: the verified static fleet routed with llm-d's scorer weights (3/2/2) or
    # AIBrix's prefix-cache break-even (2/1/0), against static's least-loaded routing (issue 16).
    "static-llm-d-routing": ("static", {"routing": {"prefix_weight": 3.0, "queue_weight": 2.0, "kv_weight": 2.0}}),
    "static-aibrix-routing": ("static", {"routing": {"prefix_weight": 2.0, "queue_weight": 1.0, "kv_weight": 0.0}}),
}
# Variants run only when `--policies` names them (not in the default list, nor in `bench all`).
OPT_IN_VARIANTS = frozenset({"static-llm-d-routing", "static-aibrix-routing", "mpc-no-redundancy", "mpc-no-outliers"})
ORACLE = "oracle"
# The joint oracle: replicas and each multi-pool route group's split (controller/bench/oracle_joint.py);
# listed by default where a route group has two or more first-hop pools.
ORACLE_JOINT = "oracle-joint"
# The reachable reference: the joint oracle's schedule (the plain one's where no group has two pools)
# with every change one tick plus the longest warm start-up late (oracle_lag.reference_lag_s).
ORACLE_LAG = "oracle-lag"
# The capacity ceiling (CEILING, controller/bench/ceiling.py): every pool at max_replicas, the sheddable
# class shed; on request (`--policies ...,ceiling`), and in `bench robustness`, where it tells which cases
# replica counts and admission can serve at all.
REFERENCE_LABELS = (ORACLE, ORACLE_JOINT, ORACLE_LAG, CEILING)
MPC = "mpc"


def mpc_available(scenario: Scenario) -> bool:
    """True when the MPC is registered and builds for this scenario with the bench's parameters."""
    try:
        build_policy(MPC, fleet_spec_from_scenario(scenario), _auto_params(MPC, None, scenario))
        return True
    except Exception:  # noqa: BLE001 - not registered yet, or not buildable: leave it out silently
        return False


def default_policies(scenario: Scenario) -> list[str]:
    names = [n for n in POLICY_NAMES if n != MPC]
    out: list[str] = []
    for n in names:
        out.append(n)
        out.extend(v for v, (base, _) in VARIANTS.items() if base == n and v not in OPT_IN_VARIANTS)
    if mpc_available(scenario):
        out.append(MPC)
    out.append(ORACLE)
    if joint_groups(scenario):
        out += [ORACLE_JOINT, ORACLE_LAG]
    return out


def resolve(label: str) -> tuple[str, dict[str, Any]]:
    """label → (registered policy, fixed parameters); BenchError naming the label if unknown."""
    if label in VARIANTS:
        base, params = VARIANTS[label]
        return base, dict(params)
    if label in POLICY_NAMES or label == MPC:
        return label, {}
    valid = [*POLICY_NAMES, *VARIANTS, *REFERENCE_LABELS]
    raise BenchError(f"unknown policy {label!r}; valid policies: {', '.join(valid)}")


def _auto_params(policy: str, ctx: BenchContext | None, scenario: Scenario | None = None) -> dict[str, Any]:
    """Scenario-dependent parameters a policy accepts: `replicas` and `capacity` from the profile.

    Without a context (the availability probe, before anything is profiled) placeholders of
    the right shape are given, so a policy that needs them can still be built.
    """
    accepted = policy_params(policy)
    out: dict[str, Any] = {}
    if ctx is None:
        pools = [p.name for p in scenario.pools] if scenario is not None else []
        if "replicas" in accepted:
            out["replicas"] = dict.fromkeys(pools, 1)
        if "capacity" in accepted:
            out["capacity"] = {p: ReplicaCapacity(rps=1.0) for p in pools}
        return out
    if "replicas" in accepted:
        out["replicas"] = dict(ctx.static_replicas)
    if "capacity" in accepted:
        out["capacity"] = {p: prof.capacity for p, prof in ctx.profiles.items()}
    return out


def params_for(label: str, ctx: BenchContext) -> tuple[str, dict[str, Any]]:
    policy, fixed = resolve(label)
    params = {**_auto_params(policy, ctx), **fixed}
    if policy == MPC and params.get("planning_model") == "learned":
        coupling = shipped_coupling(ctx.scenario)
        params["coupling_source"] = lambda: coupling
    if policy == MPC:
        # the shipped forecaster, as the daemon loads it: the policy plans on it only where it
        # scores better than the prior online (controller/policies/mpc/forecasting.py)
        fc_model = shipped_forecaster()
        params.setdefault("forecast_source", lambda: fc_model)
    return policy, params


@functools.cache
def shipped_forecaster() -> Any:
    """The shipped load forecaster (models/), or None when it cannot be loaded (the prior is used).
    Read once per process: every MPC replay of a bench run plans with the same frozen model."""
    from controller.learning.store import SHIPPED_MODELS_DIR, ModelLoadError, ModelStore

    try:
        model, _ = ModelStore(SHIPPED_MODELS_DIR).load_forecaster()
    except ModelLoadError:
        return None
    return model


def shipped_coupling(scenario: Scenario):
    """The shipped coupling models (models/) with the physics of the scenario's pools; BenchError if refused."""
    from controller.core.coupling import with_physics
    from controller.learning.physics import physics_for_pool_spec
    from controller.learning.store import SHIPPED_MODELS_DIR, ModelLoadError, ModelStore

    try:
        coupling, _ = ModelStore(SHIPPED_MODELS_DIR).load_coupling()
    except ModelLoadError as e:
        raise BenchError(f"mpc-learned needs the shipped learned models ({SHIPPED_MODELS_DIR}; `make models` "
                         f"refits them): {e}") from None
    fleet = fleet_spec_from_scenario(scenario)
    return with_physics(coupling, [physics_for_pool_spec(p) for p in fleet.pools])


def parse_policies(text: str | None, scenario: Scenario) -> list[str]:
    if text is None:
        return default_policies(scenario)
    labels = [x.strip() for x in text.split(",") if x.strip()]
    if not labels:
        raise BenchError("--policies: give at least one policy name")
    seen: list[str] = []
    for label in labels:
        if label not in REFERENCE_LABELS:
            resolve(label)
        if label == MPC and not mpc_available(scenario):
            raise BenchError("policy 'mpc' is not available (not registered, or it does not build for this scenario)")
        if label not in seen:
            seen.append(label)
    return seen


def profile_summary(ctx: BenchContext) -> dict[str, Any]:
    return {p: {"capacity_rps_per_replica": prof.capacity.rps, "slo_ttft_s": prof.slo.ttft_s,
                "slo_tpot_s": prof.slo.tpot_s, "points": len(prof.points), "profile_replicas": prof.replicas,
                "peak_demand_rps": None, "cache_key": prof.cache_key}
            for p, prof in ctx.profiles.items()}


def run_bench(scenario: Scenario, labels: Sequence[str], *, seed: int, tick_s: float = DEFAULT_TICK_S,
              cache_dir: Path | str | None = None, progress: Callable[[str], Progress | None] | None = None,
              scenario_file: str = "", timings: dict[str, float] | None = None,
              oracle_max_replays: int | None = None,
              profile: str = "balanced", ablate: bool = False) -> tuple[dict[str, Any], list[RunResult], BenchContext]:
    """Run every labelled policy (and the oracle if listed); return (report, runs, context).

    `timings`, when given, receives the wall seconds of each step (kept out of the report,
    which must not depend on the machine). `profile`: the objective profile of every replay
    (only the MPC reads it; static and the oracle are schedules). `ablate`: also replay the MPC
    once per lever of `controller.core.mpc.LEVERS` with that lever held (`lever_ablation`).
    """
    clock = WallClock()
    t = clock.monotonic_s()

    def lap(what: str) -> None:
        nonlocal t
        now = clock.monotonic_s()
        if timings is not None:
            timings[what] = round(now - t, 2)
        t = now

    ctx = prepare(scenario, seed=seed, cache_dir=cache_dir)
    lap("profile")
    runs: list[RunResult] = []
    static_run: RunResult | None = None
    if any(x in labels for x in (STATIC, *REFERENCE_LABELS)):
        verified, static_run, _ = verify_static(ctx, tick_s=tick_s, progress=progress)
        ctx = replace(ctx, static_replicas=verified)
        lap("static (verified)")
    for label in labels:
        if label in REFERENCE_LABELS:
            continue
        if label == STATIC and static_run is not None:
            runs.append(static_run)
            continue
        policy, params = params_for(label, ctx)
        try:
            runs.append(run_policy(scenario, policy, seed=seed, tick_s=tick_s, params=params, workload=ctx.workload,
                                   label=label, progress=progress(label) if progress else None, profile=profile))
        except ValueError as exc:
            raise BenchError(f"policy {label}: {exc}") from None
        lap(label)
    if CEILING in labels:
        runs.append(run_closed_loop(scenario, ceiling_policy(scenario), seed=seed, tick_s=tick_s,
                                    workload=ctx.workload, label=CEILING, breaker=None,
                                    progress=progress(CEILING) if progress else None))
        lap(CEILING)
    joint = bool(joint_groups(scenario))
    found: dict[str, OracleResult] = {}
    for label in (ORACLE, ORACLE_JOINT):
        lagged_base = ORACLE_JOINT if joint else ORACLE
        if label not in labels and not (ORACLE_LAG in labels and label == lagged_base):
            continue
        full = all_ = None
        if label == ORACLE_JOINT:
            full, all_ = joint_demands(ctx)
        found[label] = run_oracle(scenario, workload=ctx.workload, profiles=ctx.profiles, demands=ctx.demands,
                                  seed=seed, tick_s=tick_s, progress=progress, max_replays=oracle_max_replays,
                                  static=ctx.static_replicas, full_demands=full, all_demands=all_, label=label)
        if label in labels:
            runs.append(found[label].run)
        lap(label)
    if ORACLE_LAG in labels:
        lag = reference_lag_s(scenario, tick_s)
        runs.append(replay_lagged(scenario, found[ORACLE_JOINT if joint else ORACLE], seed=seed, tick_s=tick_s,
                                  lag_s=lag, workload=ctx.workload, label=ORACLE_LAG,
                                  progress=progress(ORACLE_LAG) if progress else None))
        lap(ORACLE_LAG)
    profiles = profile_summary(ctx)
    for p, d in ctx.demands.items():
        profiles[p]["peak_demand_rps"] = peak_rate(d)
        profiles[p]["mean_demand_rps"] = d.total / max(float(d.send_s[-1]) if len(d.send_s) else 1.0, 1.0)
    report = build_report(scenario.name, seed, tick_s, runs, profiles, ctx.static_replicas, scenario_file)
    report["objective_profile"] = profile
    report["lever_ablation"] = {}
    if ablate and MPC in labels:
        from controller.core.mpc import LEVERS

        held: dict[str, RunResult] = {}
        for lever in LEVERS:
            label = f"{MPC}-without-{lever}"
            policy, params = params_for(MPC, ctx)
            params["planner"] = {**dict(params.get("planner") or {}), "fixed_levers": [lever]}
            held[lever] = run_policy(scenario, policy, seed=seed, tick_s=tick_s, params=params, workload=ctx.workload,
                                     label=label, progress=progress(label) if progress else None, profile=profile)
            lap(label)
        report["lever_ablation"] = lever_ablation(report, held)
    return report, runs, ctx


def joint_demands(ctx: BenchContext) -> tuple[dict[str, PoolDemand], dict[str, PoolDemand]]:
    """The joint oracle's demands: each pool's at share 1 with its tier rule (what it may serve) and
    without it (the group's whole traffic, for the eligible share per window)."""
    sc = ctx.scenario
    full = pool_demands(sc, ctx.workload, ctx.profiles, full_share=True)
    if not any(p.eligible for p in sc.pools):
        return full, full
    ruleless = sc.model_copy(update={"pools": [p.model_copy(update={"eligible": {}}) for p in sc.pools]})
    return full, pool_demands(ruleless, ctx.workload, ctx.profiles, full_share=True)


def lever_ablation(report: Mapping[str, Any], held: Mapping[str, RunResult]) -> dict[str, Any]:
    """Per lever, the MPC with that lever held against the MPC with every lever, and the share of the
    MPC's gain over the cheapest baseline at the SLO that the lever carries.

    gain = cost per successful task of the best baseline at the SLO − the MPC's; a lever's share =
    (its held run's cost − the MPC's) / gain. Example: best baseline 0.010, MPC 0.007, MPC without
    the traffic split 0.009 → ratio 1.29, share 0.67 (two thirds of the gain comes from the split).
    A share is null where there is no gain to share (no baseline at the SLO, or the MPC no cheaper).
    """
    key = "cost_per_successful_task_usd"
    pols = report["policies"]
    mpc = pols.get(MPC, {}).get(key)
    best = report.get("best_baseline_at_slo")
    base = pols[best][key] if best else None
    gain = base - mpc if base is not None and mpc is not None and base > mpc else None
    levers: dict[str, Any] = {}
    for lever, run in held.items():
        e = policy_entry(run)
        v = e.get(key)
        levers[lever] = {key: v, "slo_attainment": e["slo_attainment"],
                         "meets_bar": meets_bar(e),
                         "ratio_to_mpc": v / mpc if v is not None and mpc else None,
                         "share_of_gain": (v - mpc) / gain if v is not None and gain else None}
    return {"mpc": mpc, "best_baseline_at_slo": best, "gain_usd_per_task": gain, "levers": levers}


# --------------------------------------------------------------------------- CLI


MAX_SEEDS = 20


def parse_seeds(text: str) -> list[int]:
    """"1,2,3" → [1, 2, 3]; distinct integers ≥ 0, at most MAX_SEEDS, else a BenchError naming the problem."""
    return parse_list(text, "seeds", int, 0, math.inf, MAX_SEEDS)


def cmd_bench_policies(args: argparse.Namespace) -> int:
    prog = "governor bench policies"
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    try:
        labels = parse_policies(getattr(args, "policies", None), scenario)
    except BenchError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    seed = scenario_seed(scenario, getattr(args, "seed", None))
    try:
        seeds = parse_seeds(args.seeds) if getattr(args, "seeds", None) else None
    except BenchError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    out_dir = Path(args.out or DEFAULT_OUT)
    tick_s = getattr(args, "tick_s", None)
    tick_s = DEFAULT_TICK_S if tick_s is None else float(tick_s)
    if not (math.isfinite(tick_s) and 1.0 <= tick_s <= 600.0):
        print(f"{prog}: --tick must be between 1 and 600 simulated seconds (got {tick_s:g})", file=sys.stderr)
        return 2
    if seeds is not None:
        return _bench_seeds(args, prog, scenario, labels, seeds, out_dir, tick_s)
    clock = WallClock()
    t0 = clock.monotonic_s()
    try:
        with ProgressBar(enabled=not getattr(args, "quiet", False)) as bar:
            report, runs, ctx = run_bench(scenario, labels, seed=seed, tick_s=tick_s, cache_dir=out_dir / ".cache",
                                          progress=bar.task, scenario_file=str(args.scenario),
                                          profile=getattr(args, "profile", "balanced"),
                                          ablate=bool(getattr(args, "ablate", False)))
    except (BenchError, ProfileError, ScenarioError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    png_path = write_png(out_dir / f"{scenario.name}.png", report, runs,
                         {c: s.ttft_s for c, s in fleet_spec_from_scenario(scenario).slos.items()})
    json_path = emit(out_dir / f"{scenario.name}.json", report, args.json, render_table)
    elapsed = clock.monotonic_s() - t0
    print(f"wrote {json_path} and {png_path} ({elapsed:.0f} s wall)", file=sys.stderr)
    return 0


def _bench_seeds(args: argparse.Namespace, prog: str, scenario: Scenario, labels: list[str], seeds: list[int],
                 out_dir: Path, tick_s: float) -> int:
    """`--seeds`: the whole comparison once per seed, each report written as S-seedN.json (and .png),
    the spread across seeds as S-seeds.json and printed (one JSON object with --json)."""
    clock = WallClock()
    t0 = clock.monotonic_s()
    reports = []
    out_dir.mkdir(parents=True, exist_ok=True)
    slo_ttft = {c: s.ttft_s for c, s in fleet_spec_from_scenario(scenario).slos.items()}
    try:
        with ProgressBar(enabled=not getattr(args, "quiet", False)) as bar:
            for seed in seeds:
                def seed_task(label: str, s: int = seed) -> Progress:
                    return bar.task(f"{label} (seed {s})")

                report, runs, _ = run_bench(scenario, labels, seed=seed, tick_s=tick_s, cache_dir=out_dir / ".cache",
                                            progress=seed_task,
                                            scenario_file=str(args.scenario),
                                            profile=getattr(args, "profile", "balanced"))
                path = out_dir / f"{scenario.name}-seed{seed}.json"
                path.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
                write_png(out_dir / f"{scenario.name}-seed{seed}.png", report, runs, slo_ttft)
                reports.append(report)
    except (BenchError, ProfileError, ScenarioError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    json_path = emit(out_dir / f"{scenario.name}-seeds.json", summarise_seeds(reports), args.json,
                      render_seeds_table)
    print(f"wrote {json_path} and one report per seed ({clock.monotonic_s() - t0:.0f} s wall)", file=sys.stderr)
    return 0


__all__ = ["BenchContext", "BenchError", "VARIANTS", "cmd_bench_policies", "default_policies", "params_for",
           "parse_list", "parse_policies", "prepare", "resolve", "run_bench"]
