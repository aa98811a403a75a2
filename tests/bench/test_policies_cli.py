"""`governor bench policies`: the JSON interface, determinism, errors, and the PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.cli import main
from controller.types import PRIORITY_CLASSES

REQUIRED = ("cost_per_successful_task_usd", "successful_tasks", "tasks", "slo_attainment", "gpu_hours",
            "ttft_p95_s", "tpot_p95_s", "hit_rate", "shed", "failed")
POLICIES = "static,hpa,sla-planner,oracle"


def bench(capsys, scenario: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    code = main(["bench", "policies", "--scenario", str(scenario), "--out", str(out), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> tuple[Path, dict, str]:
    from tests.bench.conftest import write_scenario

    folder = tmp_path_factory.mktemp("bench")
    scenario = write_scenario(folder)
    out = folder / "out1"
    # capsys is function-scoped: call the CLI and read stdout by redirecting it ourselves.
    import contextlib
    import io

    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        code = main(["bench", "policies", "--scenario", str(scenario), "--out", str(out), "--policies", POLICIES,
                     "--json"])
    assert code == 0, err.getvalue()
    return scenario, json.loads(buf.getvalue()), buf.getvalue()


def test_json_has_the_interface_keys(first_run) -> None:
    _, report, _ = first_run
    assert report["scenario"] == "bench-tiny"
    assert report["seed"] == 5
    assert set(report["policies"]) == set(POLICIES.split(","))
    for name, entry in report["policies"].items():
        for key in REQUIRED:
            assert key in entry, (name, key)
        assert set(entry["slo_attainment"]) == set(PRIORITY_CLASSES)
        assert entry["tasks"] > 0
    assert report["policies"]["oracle"]["slo_met"] in (True, False)
    assert report["static_replicas"]["small"] >= 1


def test_json_on_stdout_is_one_object_and_files_are_written(first_run) -> None:
    scenario, report, text = first_run
    assert text.count("\n") == 1  # exactly one JSON object, one line
    out = scenario.parent / "out1"
    assert json.loads((out / "bench-tiny.json").read_text()) == report
    png = (out / "bench-tiny.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_same_seed_gives_identical_json(first_run, capsys) -> None:
    scenario, _, text = first_run
    # A fresh output dir: the profile is recomputed, not read from the first run's cache.
    code, out, err = bench(capsys, scenario, scenario.parent / "out2", "--policies", POLICIES, "--json")
    assert code == 0, err
    assert out == text


def test_another_seed_gives_another_result(first_run, capsys) -> None:
    scenario, report, _ = first_run
    code, out, err = bench(capsys, scenario, scenario.parent / "out1", "--policies", "static", "--seed", "6", "--json")
    assert code == 0, err
    other = json.loads(out)
    assert other["seed"] == 6
    assert other["policies"]["static"]["successful_tasks"] != report["policies"]["static"]["successful_tasks"] or \
        other["policies"]["static"]["cost_usd"] != report["policies"]["static"]["cost_usd"]


def test_table_output(first_run, capsys) -> None:
    scenario, _, _ = first_run
    code, out, err = bench(capsys, scenario, scenario.parent / "out1", "--policies", "static")
    assert code == 0, err
    assert "static" in out and "$/succ. task" in out
    assert "wrote" in err


@pytest.mark.parametrize("policies, needle", [
    ("static,no-such-policy", "'no-such-policy'"),
    ("hpa,Static", "'Static'"),
    (",", "at least one"),
])
def test_unknown_policy_exits_2_naming_it(first_run, capsys, policies: str, needle: str) -> None:
    scenario, _, _ = first_run
    code, out, err = bench(capsys, scenario, scenario.parent / "bad", "--policies", policies)
    assert code == 2
    assert needle in err
    assert out == ""
    assert not (scenario.parent / "bad").exists()  # nothing written


def test_bad_scenario_exits_2(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\npools: []\n")
    code, _, err = bench(capsys, bad, tmp_path / "out")
    assert code == 2
    assert "bad.yaml" in err
    code, _, err = bench(capsys, tmp_path / "missing.yaml", tmp_path / "out")
    assert code == 2
    assert "missing.yaml" in err


def test_tick_flag_sets_the_replay_tick_and_rejects_nonsense(first_run, capsys) -> None:
    scenario, report, _ = first_run
    assert report["tick_s"] == 15.0  # the default: the daemon's tick
    code, out, err = bench(capsys, scenario, scenario.parent / "out1", "--policies", "static", "--tick", "30", "--json")
    assert code == 0, err
    assert json.loads(out)["tick_s"] == 30.0
    for bad in ("0", "-5", "nan", "1e9"):
        code, out, err = bench(capsys, scenario, scenario.parent / "out1", "--policies", "static", "--tick", bad)
        assert code == 2 and "--tick must be between 1 and 600" in err and out == "", bad


def test_seeds_flag_runs_each_seed_and_summarises(first_run, capsys) -> None:
    """--seeds 3,4: one report per seed (each the same as a --seed run) and one JSON object of the spread."""
    scenario, _, _ = first_run
    out_dir = scenario.parent / "seeds"
    code, out, err = bench(capsys, scenario, out_dir, "--policies", "static,hpa", "--seeds", "3,4", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["seeds"] == [3, 4] and set(summary["policies"]) == {"static", "hpa"}
    assert {p.name for p in out_dir.iterdir()} >= {f"{scenario.stem}-seed3.json", f"{scenario.stem}-seed4.json",
                                                  f"{scenario.stem}-seeds.json"}
    code, single, err = bench(capsys, scenario, scenario.parent / "single", "--policies", "static,hpa", "--seed", "4",
                              "--json")
    assert code == 0, err
    assert summary["per_seed"]["4"]["policies"] == json.loads(single)["policies"]
    costs = [summary["per_seed"][s]["policies"]["hpa"]["cost_per_successful_task_usd"] for s in ("3", "4")]
    assert summary["policies"]["hpa"]["cost_per_successful_task_usd"]["max"] == pytest.approx(max(costs))


@pytest.mark.parametrize("seeds, needle", [("1,x", "'x' is not an integer"), ("1,1", "listed twice"),
                                           ("-2", ">= 0"), (",".join(str(i) for i in range(21)), "1 to 20")])
def test_bad_seeds_exit_2_naming_the_problem(first_run, capsys, seeds: str, needle: str) -> None:
    scenario, _, _ = first_run
    code, out, err = bench(capsys, scenario, scenario.parent / "badseeds", "--policies", "static", "--seeds", seeds)
    assert code == 2 and needle in err and out == ""
    assert not (scenario.parent / "badseeds").exists()


def test_mpc_learned_plans_on_the_shipped_models(first_run, capsys) -> None:
    """`mpc-learned` = the MPC with planning_model learned over models/; its report records the
    parameter (not the model source, which is not data)."""
    from controller.bench.harness import prepare
    from controller.bench.side_by_side import params_for
    from controller.core.mpc_model import LearnedPlanModel
    from controller.sim.fleetspec import fleet_spec_from_scenario
    from controller.sim.scenario import load_scenario

    scenario, _, _ = first_run
    code, out, err = bench(capsys, scenario, scenario.parent / "learned", "--policies", "mpc-learned", "--json")
    assert code == 0, err
    entry = json.loads(out)["policies"]["mpc-learned"]
    assert entry["params"]["planning_model"] == "learned" and "coupling_source" not in entry["params"]
    assert entry["tasks"] > 0
    sc = load_scenario(scenario)
    policy, params = params_for("mpc-learned", prepare(sc, seed=5, cache_dir=None))
    assert policy == "mpc"
    # the models carry the scenario's pool physics, so the planner does not fall back to the prior
    LearnedPlanModel.for_pools(params["coupling_source"](), fleet_spec_from_scenario(sc).pools)


def test_profile_flag_runs_the_mpc_under_that_objective_profile(first_run, capsys) -> None:
    """--profile sets the objective profile every replay's ticks carry (as the daemon's `profile`);
    the report records it, the MPC plans under it, and a bad name exits 2."""
    scenario, report, _ = first_run
    assert report["objective_profile"] == "balanced"
    runs = {}
    for prof in ("balanced", "latency"):
        code, out, err = bench(capsys, scenario, scenario.parent / f"prof-{prof}", "--policies", "mpc",
                               "--profile", prof, "--json")
        assert code == 0, err
        runs[prof] = json.loads(out)
        assert runs[prof]["objective_profile"] == prof
    # the profile reaches the planner: other weights, other decisions, another run
    lat, bal = runs["latency"]["policies"]["mpc"], runs["balanced"]["policies"]["mpc"]
    assert (lat["shed"], lat["gpu_hours"]) != (bal["shed"], bal["gpu_hours"])
    with pytest.raises(SystemExit) as e:
        bench(capsys, scenario, scenario.parent / "prof-bad", "--policies", "mpc", "--profile", "cheapest")
    assert e.value.code == 2
    assert "cheapest" in capsys.readouterr().err
