"""Trial (issue 31, part 3): would one latency prior serve the learned planning model?

Today the learned planning model (controller/core/mpc_model.py `LearnedPlanModel`) takes TTFT from the
coupling models (controller/core/coupling/: their own queueing prior, calibrated per replica type, read
through vLLM's histogram buckets, plus fitted corrections) and TPOT from the MPC's `QueueingPrior`. The
trial fits the alternative — the `QueueingPrior` alone times a fitted correction (scikit-learn's
QuantileRegressor on features of the prior's own terms, kept only if it wins leave-runs-out
cross-validation on the training runs, as controller/learning/fit.py keeps a correction) — on the training
runs of `governor bench models` and scores all three on its held-out test runs (later trace segments,
another ServeGen day, other fleet sizes and seeds), below saturation as that bench counts windows.

Truth: TTFT p50/p95 and TPOT p50 as the telemetry reads them (histogram_quantile); TPOT p95 the per-request
TPOT p95 (`request_tpot_p95_s`, what a TPOT SLO judges and what the planner's TPOT models).

    GOVERNOR_RECORDING_CACHE=DIR .venv/bin/python tools/one_latency_prior_trial.py --seed 0

prints one JSON object (MAPE per model, per trace and pooled); `--scenario S` replays a scenario under mpc,
mpc-learned and the MPC on the trial's model; `--cases N --case-seed K` the generated cases 0..N-1 of seed K
under the last two. It calls the bench's and the fit's own helpers (`_recordings`, `_data`, `_fit_correction`)
so that it records, fits and scores exactly as they do. Run by hand; not part of `make test`. The figures and
what was decided: docs/decisions/0032-one-latency-prior-trial.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from controller.bench.models import MAX_RHO, _data, _recordings
from controller.bench.recordings import trace_of
from controller.core.coupling import Correction, PhysicsTable, PoolPhysics, latency_prior, with_physics
from controller.core.mpc_model import LatencyAnswer, LatencyQuery, QueueingPrior
from controller.learning.fit import CorrectionConfig, _fit_correction, fit_coupling
from controller.learning.training_data import TrainingData, engine_not_saturated
from controller.perf.figures import figures_for
from controller.types import PoolSpec

TARGETS = ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s")


def queueing_prior(physics: tuple[PoolPhysics, ...]) -> QueueingPrior:
    """The MPC's prior over the replica types of `physics` ("model/sku/tpN"), with the planner's figures."""
    def figures(key: str):
        model, sku, tp = key.split("/")
        return figures_for(PoolSpec(key, model, sku, gpus_per_replica=int(tp[2:])))

    return QueueingPrior(pools=tuple(p.key for p in physics), figures=tuple(figures(p.key) for p in physics),
                         compiled=False)


def answer(prior: QueueingPrior, data: TrainingData) -> LatencyAnswer:
    x = data.latency
    return prior.latency(LatencyQuery(pool_index=x.physics_index, rps_per_replica=x.arrival_rps_per_replica,
                                      prompt_tokens=x.prompt_tokens, output_tokens=x.output_tokens,
                                      hit_rate=x.hit_rate, inflight_cap=x.inflight_cap, max_num_seqs=x.max_num_seqs,
                                      max_num_batched_tokens=x.max_num_batched_tokens))


def features(a: LatencyAnswer, data: TrainingData, prior_target: np.ndarray) -> np.ndarray:
    """log of the target's prior, then the prior's own terms (dimensionless or logs, as the coupling features)."""
    x = data.latency
    u = np.minimum(np.asarray(a.utilisation), 0.97)
    uncached = x.prompt_tokens * (1.0 - np.clip(x.hit_rate, 0.0, 0.999))
    assert a.slot_wait_p95_s is not None
    return np.column_stack([
        np.log(np.maximum(prior_target, 1e-4)), u, u / (1.0 - u), np.log1p(a.batch),
        np.log(np.maximum(uncached, 1.0)), np.log(np.maximum(x.output_tokens, 1.0)),
        np.log(np.maximum(a.tpot_p50_s, 1e-4)), np.clip(x.hit_rate, 0.0, 1.0),
        np.log(np.clip(x.arrival_dispersion, 0.5, 100.0)),
        np.log1p(np.asarray(a.slot_wait_p95_s) / np.maximum(a.ttft_p95_s, 1e-4))])


def truth(data: TrainingData, t: str) -> np.ndarray:
    return data.aux["request_tpot_p95_s"] if t == "tpot_p95_s" else data.targets[t]


def valid(data: TrainingData, t: str) -> np.ndarray:
    """Steady windows with a positive reading and at least 30 requests (learning/training_data.py's rules)."""
    y = truth(data, t)
    return (np.isfinite(y) & (y > 0) & (data.latency.arrival_rps_per_replica > 0) & data.steady
            & (data.aux["requests_in_window"] >= 30))


def fit_trial(train_recs: list[Any], seed: int) -> dict[str, Correction]:
    """The corrections of the queueing prior, fitted on the training runs (learning/fit.py's rules)."""
    gdata, gphys = _data(train_recs)
    cfg = CorrectionConfig()
    rng = np.random.default_rng(seed)
    ga = answer(queueing_prior(gphys), gdata)
    operating = (np.asarray(ga.utilisation) < cfg.max_train_rho) & engine_not_saturated(gdata)
    corrections = {}
    for t in TARGETS:
        m = valid(gdata, t) & operating
        pt = np.asarray(getattr(ga, t))
        r = np.log(truth(gdata, t)[m]) - np.log(np.maximum(pt[m], 1e-4))
        corrections[t] = _fit_correction(t, features(ga, gdata, pt)[m], r, 0.5, cfg, rng, gdata.t_s[m],
                                         groups=gdata.aux["run"][m])
    return corrections


def run(seed: int) -> dict[str, Any]:
    train_recs, test_recs = _recordings(seed)
    corrections = fit_trial(train_recs, seed)
    gdata, gphys = _data(train_recs)
    coupling = fit_coupling(gdata, gphys, np.random.default_rng(seed), seed=seed)
    names = ("today", "queueing_prior", "queueing_prior_x_correction")
    pooled: dict[str, dict[str, list[np.ndarray]]] = {k: {t: [] for t in TARGETS} for k in names}
    out: dict[str, Any] = {"seed": seed, "per_trace": {},
                           "kept": {t: corrections[t].estimator is not None for t in TARGETS}}
    for tr in sorted({trace_of(r.label) for r in test_recs}):
        d, ph = _data([r for r in test_recs if trace_of(r.label) == tr])
        below = (latency_prior(PhysicsTable(ph), d.latency).rho_engine < MAX_RHO) & engine_not_saturated(d)
        a = answer(queueing_prior(ph), d)
        lat, cprior, _ = with_physics(coupling, ph).predict_latency(d.latency)
        wait = cprior.router_wait_p95_s
        preds = {"today": {"ttft_p50_s": lat["ttft_p50_s"] + 0.5 * wait, "ttft_p95_s": lat["ttft_p95_s"] + wait,
                           "tpot_p50_s": np.asarray(a.tpot_p50_s), "tpot_p95_s": np.asarray(a.tpot_p95_s)},
                 "queueing_prior": {t: np.asarray(getattr(a, t)) for t in TARGETS},
                 "queueing_prior_x_correction": {}}
        for t in TARGETS:
            pt, c = np.asarray(getattr(a, t)), corrections[t]
            X = features(a, d, pt)
            preds["queueing_prior_x_correction"][t] = pt * np.exp(c.weight(X) * c.residual(X))
        row: dict[str, Any] = {}
        for t in TARGETS:
            m = valid(d, t) & below
            y = truth(d, t)[m]
            row[f"windows_{t}"] = int(m.sum())
            for k in names:
                e = np.abs(preds[k][t][m] - y) / y
                pooled[k][t].append(e)
                row.setdefault(k, {})[t] = round(float(e.mean()), 4) if len(e) else None
        out["per_trace"][tr] = row
    out["pooled"] = {k: {t: round(float(np.concatenate(v).mean()), 4) for t, v in pooled[k].items()} for k in names}
    return out


@dataclass(frozen=True)
class TrialPlanModel:
    """The MPC's planning model as the trial would ship it: the policy's own QueueingPrior (its online
    corrections and burst term included) times the fitted corrections, evaluated on the prior's plain answer
    (no online corrections, no burst: what they were fitted on) at Poisson dispersion, for TTFT and TPOT."""

    fallback: QueueingPrior
    corrections: Mapping[str, Correction]

    @property
    def pools(self) -> tuple[str, ...]:
        return self.fallback.pools

    @staticmethod
    def for_pools(models: Any, pools: Any, fallback: QueueingPrior) -> TrialPlanModel:
        return TrialPlanModel(fallback, models)

    def with_corrections(self, ttft: Any, tpot: Any, confidence: float, burst: Any = None) -> TrialPlanModel:
        return replace(self, fallback=self.fallback.with_corrections(ttft, tpot, confidence, burst))

    def kv_tokens(self) -> np.ndarray:
        return self.fallback.kv_tokens()

    def hit_rate(self, *args: Any) -> np.ndarray:
        return self.fallback.hit_rate(*args)

    def burst_for(self, q: LatencyQuery, tpot_p95_s: float, hi: float = 200.0) -> float:
        return self.fallback.burst_for(q, tpot_p95_s, hi)

    def latency(self, q: LatencyQuery) -> LatencyAnswer:
        shape = np.shape(q.rps_per_replica)
        flat = LatencyQuery(**{f: np.ravel(np.broadcast_to(getattr(q, f), shape))
                               for f in LatencyQuery.__dataclass_fields__})
        n = len(self.pools)
        plain = self.fallback.with_corrections((1.0,) * n, (1.0,) * n, self.fallback.base_confidence,
                                               (0.0,) * n).latency(flat)
        own = self.fallback.latency(flat)
        u = np.minimum(np.asarray(plain.utilisation), 0.97)
        uncached = flat.prompt_tokens * (1.0 - np.clip(flat.hit_rate, 0.0, 0.999))
        assert plain.slot_wait_p95_s is not None and own.tpot_max_s is not None
        shared = np.column_stack([
            u, u / (1.0 - u), np.log1p(plain.batch), np.log(np.maximum(uncached, 1.0)),
            np.log(np.maximum(flat.output_tokens, 1.0)), np.log(np.maximum(plain.tpot_p50_s, 1e-4)),
            np.clip(flat.hit_rate, 0.0, 1.0), np.zeros(len(uncached)),
            np.log1p(np.asarray(plain.slot_wait_p95_s) / np.maximum(plain.ttft_p95_s, 1e-4))])
        out: dict[str, Any] = {}
        for t in TARGETS:
            c = self.corrections[t]
            X = np.column_stack([np.log(np.maximum(np.asarray(getattr(plain, t)), 1e-4)), shared])
            out[t] = np.asarray(getattr(own, t)) * np.exp(c.weight(X) * c.residual(X))
        ans = replace(own, ttft_p50_s=out["ttft_p50_s"], ttft_p95_s=out["ttft_p95_s"], tpot_p50_s=out["tpot_p50_s"],
                      tpot_p95_s=out["tpot_p95_s"], tpot_max_s=np.maximum(own.tpot_max_s, out["tpot_p95_s"]))
        shaped: dict[str, Any] = {f: (None if getattr(ans, f) is None else np.reshape(getattr(ans, f), shape))
                                  for f in LatencyAnswer.__dataclass_fields__}
        return LatencyAnswer(**shaped)


def mpc_trial(scenario_path: str, seed: int | None, train_seed: int) -> dict[str, Any]:
    """`governor bench policies --scenario S --policies mpc,mpc-learned` and the MPC on the trial's model (label
    mpc-one-prior), in one process: the same workload and profiles for the three."""
    from controller.bench import side_by_side
    from controller.bench.report import policy_entry
    from controller.policies.mpc import policy as mpc_policy
    from controller.sim.scenario import load_scenario

    train_recs, _ = _recordings(train_seed)
    corrections = fit_trial(train_recs, train_seed)
    scenario = load_scenario(scenario_path)
    seed = scenario.seed if seed is None else seed
    _, runs, _ = side_by_side.run_bench(scenario, ["mpc", "mpc-learned"], seed=seed)
    learned_cls, shipped = mpc_policy.LearnedPlanModel, side_by_side.shipped_coupling
    try:
        mpc_policy.LearnedPlanModel = TrialPlanModel  # type: ignore[misc, assignment]  # the trial's adapter
        side_by_side.shipped_coupling = lambda _scenario: corrections  # type: ignore[assignment]  # its models
        _, trial, _ = side_by_side.run_bench(scenario, ["mpc-learned"], seed=seed)
    finally:
        mpc_policy.LearnedPlanModel = learned_cls  # type: ignore[misc]
        side_by_side.shipped_coupling = shipped
    out = {r.policy: policy_entry(r) for r in runs}
    out["mpc-one-prior"] = policy_entry(trial[0])
    keep = ("cost_per_successful_task_usd", "slo_attainment", "gpu_hours", "ttft_p95_s", "tpot_p95_s")
    return {"scenario": scenario_path, "seed": seed, "train_seed": train_seed,
            "policies": {k: {f: v.get(f) for f in keep} for k, v in out.items()}}


def cases_trial(case_seed: int, cases: int, train_seed: int, out_dir: str) -> dict[str, Any]:
    """Generated cases k = 0..cases-1 of `case_seed` (`governor bench robustness`'s generator) replayed under
    mpc-learned and the MPC on the trial's model, case by case in this process."""
    from controller.bench import side_by_side
    from controller.bench.generator import generate_case
    from controller.bench.report import policy_entry
    from controller.policies.mpc import policy as mpc_policy

    train_recs, _ = _recordings(train_seed)
    corrections = fit_trial(train_recs, train_seed)
    learned_cls, shipped = mpc_policy.LearnedPlanModel, side_by_side.shipped_coupling
    rows = []
    for k in range(cases):
        case = generate_case(case_seed, k, work_dir=Path(out_dir) / "cases", cache_dir=Path(out_dir) / ".cache")
        row: dict[str, Any] = {"index": k, "scenario": case.scenario.name}
        for label in ("mpc-learned", "mpc-one-prior"):
            try:
                if label == "mpc-one-prior":
                    mpc_policy.LearnedPlanModel = TrialPlanModel  # type: ignore[misc, assignment]  # as above
                    side_by_side.shipped_coupling = lambda _scenario: corrections  # type: ignore[assignment]
                _, runs, _ = side_by_side.run_bench(case.scenario, ["mpc-learned"], seed=case.spec.sim_seed,
                                                    cache_dir=Path(out_dir) / ".cache")
            finally:
                mpc_policy.LearnedPlanModel = learned_cls  # type: ignore[misc]
                side_by_side.shipped_coupling = shipped
            e = policy_entry(runs[0])
            row[label] = {"cost_per_successful_task_usd": e["cost_per_successful_task_usd"],
                          "slo_attainment": e["slo_attainment"], "gpu_hours": e["gpu_hours"]}
        print(f"case {k}: {json.dumps(row)}", file=sys.stderr, flush=True)
        rows.append(row)
    return {"case_seed": case_seed, "train_seed": train_seed, "cases": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="the recording suite's seed (governor bench models --seed)")
    ap.add_argument("--scenario", default=None, help="instead: replay this scenario under mpc, mpc-learned and the "
                                                     "MPC on the trial's model (fitted on --seed's training runs)")
    ap.add_argument("--scenario-seed", type=int, default=None, help="the replay's seed (default: the scenario's)")
    ap.add_argument("--cases", type=int, default=0, help="instead: this many generated cases of --case-seed under "
                                                         "mpc-learned and the MPC on the trial's model")
    ap.add_argument("--case-seed", type=int, default=2, help="the generated cases' seed (default 2)")
    ap.add_argument("--out", default="/tmp/one-prior-cases", help="where the generated cases are written")
    args = ap.parse_args(argv)
    if args.cases:
        print(json.dumps(cases_trial(args.case_seed, args.cases, args.seed, args.out)))
    elif args.scenario:
        print(json.dumps(mpc_trial(args.scenario, args.scenario_seed, args.seed)))
    else:
        print(json.dumps(run(args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
