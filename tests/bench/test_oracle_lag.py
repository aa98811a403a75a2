"""`governor bench oracle-lag`: the lag and hold transforms (tables), the study on the tiny scenario, bad input."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from controller.bench.oracle_lag import hedged_levels, lagged_targets
from controller.cli import main
from controller.sim.scenario import PoolSpecModel

HEDGE_CASES = [
    ("no hedge", (1, 5, 1, 1, 2), 0, 0, None, [1, 5, 1, 1, 2]),
    ("a peak held two windows", (1, 5, 1, 1, 2), 2, 0, None, [1, 5, 5, 5, 2]),
    ("a hold longer than the schedule", (3, 1, 1), 10, 0, None, [3, 3, 3]),
    ("a rising schedule is unchanged by a hold", (1, 2, 3), 4, 0, None, [1, 2, 3]),
    ("an extra replica on every window", (1, 2, 3), 0, 1, None, [2, 3, 4]),
    ("held, raised and capped at the pool's max", (1, 5, 1, 1, 2), 2, 1, 5, [2, 5, 5, 5, 3]),
]


@pytest.mark.parametrize("label, replicas, hold, extra, top, want", HEDGE_CASES, ids=[c[0] for c in HEDGE_CASES])
def test_hedged_levels(label, replicas, hold, extra, top, want) -> None:
    assert hedged_levels(replicas, hold, extra, top) == want


def spec(replicas: int) -> PoolSpecModel:
    return PoolSpecModel(name="p", model="llama-3-8b", sku="a100-80gb", replicas=replicas, min_replicas=1,
                         max_replicas=8, startup_warm_s=20.0, startup_cold_s=90.0)


LAG_CASES = [
    ("no lag: the points themselves", 4, ((0.0, 3), (120.0, 5)), 0.0, ((0.0, 3), (120.0, 5))),
    # until the first (late) change lands the pool keeps what the scenario starts with
    ("every change later", 4, ((0.0, 3), (120.0, 5)), 30.0, ((0.0, 4), (30.0, 3), (150.0, 5))),
    ("a first point equal to the start is not repeated", 3, ((0.0, 3), (60.0, 1)), 15.0, ((0.0, 3), (75.0, 1))),
]


@pytest.mark.parametrize("label, start, points, lag, want", LAG_CASES, ids=[c[0] for c in LAG_CASES])
def test_lagged_targets(label, start, points, lag, want) -> None:
    assert lagged_targets(spec(start), points, lag) == want


def test_bad_transform_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="hold_windows"):
        hedged_levels((1, 2), -1)
    with pytest.raises(ValueError, match="extra"):
        hedged_levels((1, 2), 0, -1)
    with pytest.raises(ValueError, match="lag_s"):
        lagged_targets(spec(1), ((0.0, 1),), float("nan"))


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["bench", "oracle-lag", *argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> tuple[dict, dict, Path]:
    """The study on the tiny scenario, and the oracle row of `bench policies` for the same seed."""
    from tests.bench.conftest import write_scenario

    folder = tmp_path_factory.mktemp("lag")
    scenario = write_scenario(folder)
    code, out, err = run_cli("--scenario", str(scenario), "--lags", "0,60", "--holds", "0,3", "--extras", "0",
                             "--out", str(folder / "out"), "--json")
    assert code == 0, err
    assert out.count("\n") == 1  # one JSON object on stdout
    buf, e2 = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(e2):
        code = main(["bench", "policies", "--scenario", str(scenario), "--policies", "oracle", "--out",
                     str(folder / "out"), "--json"])
    assert code == 0, e2.getvalue()
    return json.loads(out), json.loads(buf.getvalue())["policies"]["oracle"], folder


def test_study_reports_every_lag_and_hold(study) -> None:
    report, _, folder = study
    assert report["scenario"] == "bench-tiny" and report["seed"] == 5
    assert [(r["lag_s"], r["hold_windows"], r["extra_replicas"]) for r in report["rows"]] == [
        (0.0, 0, 0), (0.0, 3, 0), (60.0, 0, 0), (60.0, 3, 0)]
    for r in report["rows"]:
        assert set(r["task_slo_attainment"]) == {"critical", "standard", "sheddable"}
        assert r["ratio_to_oracle"] > 0
    assert set(report["cheapest_meeting_bar"]) == {"0", "60"}
    assert json.loads((folder / "out" / "bench-tiny-oracle-lag.json").read_text()) == report


def test_no_lag_no_hold_is_the_oracle_itself(study) -> None:
    report, oracle_row, _ = study
    first = report["rows"][0]
    assert first["ratio_to_oracle"] == pytest.approx(1.0)
    # the same schedule replayed: the same figures as the oracle row of `bench policies`
    assert report["oracle"]["schedule"] == oracle_row["schedule"]
    assert first["cost_per_successful_task_usd"] == pytest.approx(oracle_row["cost_per_successful_task_usd"])
    assert first["successful_tasks"] == oracle_row["successful_tasks"]


def test_holding_levels_costs_more(study) -> None:
    rows = {(r["lag_s"], r["hold_windows"]): r for r in study[0]["rows"]}
    for lag in (0.0, 60.0):
        assert rows[(lag, 3)]["gpu_hours"] >= rows[(lag, 0)]["gpu_hours"]


@pytest.mark.parametrize("args, message", [
    (("--lags", "0,abc"), "--lags: 'abc' is not a number"),
    (("--lags", "700"), "--lags: 700 is outside [0, 600]"),
    (("--holds", "1,1"), "--holds: 1 is listed twice"),
    (("--holds", "-1"), "--holds: -1 is outside [0, 30]"),
    (("--extras", "17"), "--extras: 17 is outside [0, 16]"),
    (("--lags", ""), "--lags: give 1 to 8 values (got 0)"),
])
def test_bad_lists_exit_2_naming_the_problem(tiny_scenario, tmp_path, args, message) -> None:
    code, out, err = run_cli("--scenario", str(tiny_scenario), "--out", str(tmp_path), *args)
    assert code == 2
    assert message in err and out == ""


def test_missing_scenario_exits_2(tmp_path) -> None:
    code, _, err = run_cli("--scenario", str(tmp_path / "nope.yaml"), "--out", str(tmp_path))
    assert code == 2 and "nope.yaml" in err
