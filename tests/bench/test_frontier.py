"""`governor bench frontier`: the JSON interface on a tiny run (2 cases, 2 policies at 2 settings each,
a 30 s tick), the dominance computation on hand-made points, the knob table against the registry, the
capacity at a scaled SLO, --policies parsing, and the arena family's shapes."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from controller.bench import frontier as fr
from controller.bench import generator as gen
from controller.bench.harness import BenchError
from controller.bench.profile import ProfilePoint
from controller.bench.shapes import ARENA_SHAPES, SHAPES, draw_shape_params, rate_multiplier
from controller.bench.side_by_side import _auto_params
from controller.cli import main
from controller.core.objective import PROFILES
from controller.perf.replica_capacity import ReplicaCapacity
from controller.policies.registry import build_policy, policy_params
from controller.sim.fleetspec import fleet_spec_from_scenario
from controller.types import SloSpec

ONLINE_BASELINES = ("hpa", "kpa", "slo-feedback", "sla-planner", "scorer-kpa", "llm-d-stack", "aibrix-stack",
                    "dynamo-stack")


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["bench", "frontier", *argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, dict]:
    # Seed 5: robustness case 0 (as test_robustness.py's) and arena case 0, both a few thousand requests.
    out = tmp_path_factory.mktemp("frontier")
    code, stdout, stderr = run_cli("--cases", "2", "--seed", "5", "--policies", "hpa:0.5:0.7,mpc:0.6:0.9",
                                   "--tick", "30", "--out", str(out), "--workers", "2", "--json", "--quiet")
    assert code == 0, stderr
    return out, json.loads(stdout)  # exactly one JSON object on stdout


def test_json_has_the_keys_and_shape(tiny) -> None:
    out, rep = tiny
    assert rep["cases"] == 2 and rep["errors"] == [] and rep["family"] == "all"
    assert [(r["family"], r["family_index"]) for r in rep["cases_detail"]] == [("robustness", 0), ("arena", 0)]
    assert rep["cases_detail"][1]["shape"] in ARENA_SHAPES
    assert set(rep["policies"]) == {"hpa", "mpc"}
    hpa, mpc = rep["policies"]["hpa"], rep["policies"]["mpc"]
    assert [(p["setting"], p["default"]) for p in hpa["points"]] == [("0.5", False), ("0.7", True)]
    assert [(p["setting"], p["default"]) for p in mpc["points"]] == [("0.6", True), ("0.9", False)]
    for name, pol in rep["policies"].items():
        for p in pol["points"]:
            for key in ("setting", "default", "slo_pass_rate", "slo_pass_rate_feasible", "cost_ratio_vs_static_median",
                        "cost_ratio_vs_static_p90", "good_requests_per_gpu_s"):
                assert key in p, (name, key)
            assert p["cases"] == 2 and 0.0 <= p["slo_pass_rate"] <= 1.0
            assert 0.1 < p["cost_ratio_vs_static_median"] <= p["cost_ratio_vs_static_p90"] + 1e-12 < 10.0
            assert p["good_requests_per_gpu_s"] > 0
    assert rep["references"]["static"]["cost_ratio_vs_static_median"] == pytest.approx(1.0)
    assert set(rep["dominance"]) == {"hpa"} and [d["setting"] for d in rep["dominance"]["hpa"]] == ["0.5", "0.7"]
    assert (out / "frontier-seed5.png").stat().st_size > 0 and (out / "frontier-seed5.json").exists()
    assert rep["replays"] >= 2 * (4 + 2) and rep["cpu_s_per_replay"] > 0


def test_the_figures_follow_the_rows(tiny) -> None:
    _, rep = tiny
    rows = rep["cases_detail"]
    for name, pol in rep["policies"].items():
        for p in pol["points"]:
            es = [r["points"][name][p["setting"]] for r in rows]
            assert p["passes"] == sum(e["pass"] for e in es)
            assert p["slo_pass_rate"] == pytest.approx(p["passes"] / 2)
            assert p["good_requests_per_gpu_s"] == pytest.approx(sum(e["good_requests"] for e in es)
                                                                 / sum(e["gpu_s"] for e in es))
            for e in es:
                att = e["slo_attainment"]
                assert e["pass"] == (att["critical"] >= 0.99 and att["standard"] >= 0.99)
                assert 0 < e["good_requests"] <= e["requests_sent"]
    for r in rows:
        refs = r["references"]
        assert r["feasible"] == (refs["static"]["pass"] or refs["ceiling"]["pass"])
        assert refs["static"]["cost_ratio_vs_static"] == pytest.approx(1.0)
    # the dominance entries point at the cheapest MPC setting passing enough cases
    mpc = rep["policies"]["mpc"]["points"]
    for d in rep["dominance"]["hpa"]:
        ok = [m for m in mpc if m["passes"] >= d["passes"]]
        if not ok:
            assert d["mpc_at_least"] is None
        else:
            best = min(ok, key=lambda m: m["cost_ratio_vs_static_median"])
            assert d["mpc_at_least"]["setting"] == best["setting"]


def test_resume_reuses_the_saved_rows_and_only_those_of_the_same_run(tiny) -> None:
    out, rep = tiny
    assert rep["resumed_cases"] == 0
    code, stdout, stderr = run_cli("--cases", "2", "--seed", "5", "--policies", "hpa:0.5:0.7,mpc:0.6:0.9",
                                   "--tick", "30", "--out", str(out), "--workers", "1", "--json", "--quiet", "--resume")
    assert code == 0, stderr
    again = json.loads(stdout)
    assert again["resumed_cases"] == 2
    machine = {"wall_s", "workers", "case_wall_s", "case_cpu_s", "cpu_s_total", "cpu_s_per_replay", "cpu_s_by_policy",
               "resumed_cases"}
    assert {k: v for k, v in again.items() if k not in machine} == {k: v for k, v in rep.items() if k not in machine}
    # another tick is another run: its key differs, so nothing saved is reused
    key = fr.checkpoint_key(5, "all", 0, [("hpa", "0.5"), ("hpa", "0.7"), ("mpc", "0.6"), ("mpc", "0.9")], 30.0)
    saved = json.loads((out / "rows" / "frontier-s5-all-0000.json").read_text())
    assert saved["key"] == key
    assert fr.checkpoint_key(5, "all", 0, [("hpa", "0.5")], 30.0) != key
    assert fr.checkpoint_key(5, "all", 0, [("hpa", "0.5"), ("hpa", "0.7"), ("mpc", "0.6"), ("mpc", "0.9")],
                             15.0) != key


def test_the_robustness_case_is_robustness_own(tiny) -> None:
    out, rep = tiny
    case = gen.generate_case(5, 0, work_dir=out / "again", cache_dir=out / ".cache")
    assert rep["cases_detail"][0]["case"] == json.loads(json.dumps(case.spec.to_dict()))


# --------------------------------------------------------------------------- dominance


def pt(setting: str, passes: int, cost: float | None, cases: int = 40, default: bool = False) -> dict:
    return {"setting": setting, "passes": passes, "cases": cases, "cost_ratio_vs_static_median": cost,
            "default": default}


MPC_POINTS = [pt("cost", 20, 0.90), pt("balanced", 29, 1.00, default=True), pt("throughput", 31, 1.10),
              pt("latency", 33, 1.20)]


def test_dominance_picks_the_cheapest_mpc_setting() -> None:
    dom = fr.dominance({"hpa": [pt("0.7", 30, 1.35, default=True), pt("0.5", 33, 1.15)], "mpc": MPC_POINTS})
    assert set(dom) == {"hpa"}
    a, b = dom["hpa"]
    assert a["mpc_at_least"] == {"setting": "throughput", "passes": 31, "cost_ratio_vs_static_median": 1.10}
    assert a["mpc_at_least_less_one"]["setting"] == "balanced"  # 29 >= 30 - 1, and cheaper than throughput
    assert a["dominated"] and a["considered"] and a["default"]
    assert b["mpc_at_least"]["setting"] == "latency"  # 33 cases: only latency passes as many
    assert b["mpc_at_least_less_one"]["setting"] == "latency"  # 32: still only latency
    assert not b["dominated"]  # 1.20 > 1.15


def test_dominance_none_when_no_mpc_setting_passes_enough() -> None:
    dom = fr.dominance({"kpa": [pt("20", 36, 2.0), pt("70", 10, 0.7, default=True)], "mpc": MPC_POINTS})
    hi, lo = dom["kpa"]
    assert hi["mpc_at_least"] is None and hi["mpc_at_least_less_one"] is None and not hi["dominated"]
    assert lo["mpc_at_least"]["setting"] == "cost" and not lo["dominated"]  # 0.90 > 0.70
    assert not lo["considered"]  # 10 of 40 < 50 %: the acceptance does not count it


def test_dominance_skips_mpc_points_without_a_cost_and_keeps_knob_order_on_ties() -> None:
    mpc = [pt("a", 30, None), pt("b", 30, 1.0), pt("c", 31, 1.0)]
    (d,) = fr.dominance({"hpa": [pt("0.7", 30, 1.0)], "mpc": mpc})["hpa"]
    assert d["mpc_at_least"]["setting"] == "b"  # a has no cost ratio; b before c at the same cost
    assert d["dominated"]  # 1.0 <= 1.0: no dearer
    assert fr.dominance({"hpa": [pt("0.7", 30, 1.0)]}) == {}  # no MPC in the run


def test_cheapest_needs_the_pass_count() -> None:
    assert fr.cheapest(MPC_POINTS, 34) is None
    assert (fr.cheapest(MPC_POINTS, 0) or {}).get("setting") == "cost"


# --------------------------------------------------------------------------- the knob table


def test_every_online_baseline_has_a_knob_with_its_default_among_four_settings() -> None:
    assert set(fr.BASELINES) == set(ONLINE_BASELINES)
    for name in (*ONLINE_BASELINES, "mpc"):
        knob = fr.KNOBS[name]
        assert len(knob.settings) >= 4, name
        assert knob.default in knob.settings, name
        assert len(set(knob.labels)) == len(knob.labels), name


def test_every_setting_builds_its_policy() -> None:
    scenario = gen.shipped_fleets()[0].scenario
    fleet = fleet_spec_from_scenario(scenario)
    for name, knob in fr.KNOBS.items():
        for v in knob.settings:
            how = knob.replay(v)
            build_policy(name, fleet, {**_auto_params(name, None, scenario), **how.params})
            assert how.profile in PROFILES and 0.3 <= how.slo_factor <= 1.0


def test_the_declared_defaults_are_the_shipped_ones() -> None:
    assert policy_params("scorer-kpa")["target_kv_usage"] == fr.KNOBS["scorer-kpa"].default
    assert policy_params("aibrix-stack")["target_kv_usage"] == fr.KNOBS["aibrix-stack"].default
    p = policy_params("llm-d-stack")
    assert (p["kv_cache_threshold"], p["queue_length_threshold"]) == fr.KNOBS["llm-d-stack"].default
    fleet = fleet_spec_from_scenario(gen.shipped_fleets()[0].scenario)
    hpa: Any = build_policy("hpa", fleet)
    kpa: Any = build_policy("kpa", fleet)
    assert hpa.target == fr.KNOBS["hpa"].default and kpa.params.target == fr.KNOBS["kpa"].default
    # the dial's setting the MPC ships with: the balanced profile's (what `bench policies` and the daemon run)
    assert fr.KNOBS["mpc"].default == PROFILES["balanced"].reliability
    # the margin 1 and the SLA target 1 are the policies as shipped: no override, no new parameter
    for name in ("slo-feedback", "sla-planner", "dynamo-stack"):
        knob = fr.KNOBS[name]
        how = knob.replay(knob.default)
        assert how.slo_factor == 1.0
        assert all(policy_params(name)[k] == v for k, v in how.params.items())


def test_parse_policies() -> None:
    assert fr.parse_policies("hpa:0.5:0.7,static,kpa:20") == [("hpa", "0.5"), ("hpa", "0.7"), ("kpa", "20")]
    assert fr.parse_policies("llm-d-stack:0.8/5") == [("llm-d-stack", "0.8/5")]
    assert [lab for _, lab in fr.parse_policies("slo-feedback")] == ["0.5", "0.65", "0.8", "1"]
    with pytest.raises(BenchError, match="hpa has no setting '0.55'"):
        fr.parse_policies("hpa:0.55")
    with pytest.raises(BenchError, match="no knob for 'oracle'"):
        fr.parse_policies("oracle")


def test_bad_input_exits_2(tmp_path: Path) -> None:
    code, out, err = run_cli("--cases", "0", "--out", str(tmp_path))
    assert code == 2 and out == "" and "--cases" in err
    code, out, err = run_cli("--policies", "hpa:0.55", "--out", str(tmp_path))
    assert code == 2 and "hpa has no setting" in err


# --------------------------------------------------------------------------- the SLA targets


def test_capacity_at_a_scaled_slo_reads_the_profile_points() -> None:
    # loads 1, 2, 4 req/s with p95 TTFT 0.3, 0.5, 2.1 s; the SLO's TTFT 1.3 s → capacity 3 req/s
    points = tuple(ProfilePoint(rps_per_replica=r, requests=100, ttft_p50_s=t / 2, ttft_p95_s=t, tpot_p50_s=0.01,
                                tpot_p95_s=0.02, completed_frac=1.0) for r, t in ((1.0, 0.3), (2.0, 0.5), (4.0, 2.1)))
    cap = ReplicaCapacity(rps=3.0, prompt_tokens_per_s=3000.0, generation_tokens_per_s=300.0)
    prof = SimpleNamespace(capacity=cap, points=points, slo=SloSpec(ttft_s=1.3, tpot_s=0.1))
    assert fr.capacity_at(prof, 1.0) is cap
    half = fr.capacity_at(prof, 0.5)  # TTFT 0.65 s: 2 + (0.15 / 1.6) x 2 req/s
    assert half.rps == pytest.approx(2.1875)
    assert half.prompt_tokens_per_s == pytest.approx(3000.0 * 2.1875 / 3.0)
    assert fr.capacity_at(prof, 0.5).generation_tokens_per_s == pytest.approx(300.0 * 2.1875 / 3.0)
    assert fr.capacity_at(prof, 0.2).rps == pytest.approx(1.0)  # below the lowest point: that point's load


def test_slo_overrides_scale_every_class() -> None:
    scenario = gen.shipped_fleets()[0].scenario
    slos = fleet_spec_from_scenario(scenario).slos
    assert fr.slo_overrides(scenario, 1.0) == ()
    ov = fr.slo_overrides(scenario, 0.5)
    assert len(ov) == 2 * len(slos)
    for o in ov:
        s = slos[o.priority_class]
        assert o.value == pytest.approx(0.5 * (s.ttft_s if o.kind == "slo_ttft" else s.tpot_s))


# --------------------------------------------------------------------------- the arena family


def test_arena_shapes() -> None:
    t = np.arange(0.0, 1201.0, 1.0)
    for seed in range(20):
        rng = np.random.default_rng(seed)
        p = draw_shape_params("staircase", 1200.0, rng)
        m = rate_multiplier("staircase", p, t, 1200.0)
        levels = np.unique(np.round(m, 9))
        assert len(levels) == int(p["steps"]) + 1 and levels[-1] == pytest.approx(1.0)
        assert np.all(np.diff(m) >= 0)  # a staircase only goes up
        q = draw_shape_params("sinusoid", 1200.0, rng, cold_start_s=300.0)
        assert q["period_s"] >= 1.5 * 300.0
        s = rate_multiplier("sinusoid", q, t, 1200.0)
        assert s.min() >= 1.0 / q["factor"] - 1e-12 and s.max() <= 1.0 + 1e-12


def test_the_arena_family_has_its_own_plan_and_leaves_robustness_alone() -> None:
    n = 4
    assert {gen.arena_case_plan(1, k, n) for k in range(len(ARENA_SHAPES) * n)} == {
        (s, f) for s in ARENA_SHAPES for f in range(n)}
    assert all(gen.case_plan(1, k, n)[0] in SHAPES for k in range(40))
    assert gen.case_name(1, 3) == "gen-s1-c0003" and gen.case_name(1, 3, gen.ARENA) == "gen-s1-a0003"
    assert fr.family_case("all", 0) == ("robustness", 0) and fr.family_case("all", 5) == ("arena", 2)
    assert fr.family_case("arena", 5) == ("arena", 5)
    with pytest.raises(gen.GeneratorError, match="unknown case family"):
        gen.generate_case(1, 0, work_dir=Path("/nonexistent"), family="nope")


def test_good_requests_counts_what_met_both_slos() -> None:
    fleet = SimpleNamespace(request_records=lambda: {"slo_met": np.array([True, False, True, False]),
                                                     "attempts": np.array([1, 2, 1, 0])})
    assert fr.good_requests(fleet) == {"good_requests": 2, "requests_sent": 3}
