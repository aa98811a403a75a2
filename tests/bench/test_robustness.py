"""`governor bench robustness`: the JSON interface end to end on two generated cases, rerunning one
case alone, feasibility from the references, the summary's arithmetic and bad input."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from controller.bench import robustness as rb
from controller.cli import main

# Seed 5's first two cases are small (a Mooncake and an Azure-code fleet, a few thousand requests).
SEED = "5"
POLICIES = "static,slo-feedback"


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["bench", "robustness", *argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def two_cases(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("robust")
    code, stdout, stderr = run_cli("--cases", "2", "--seed", SEED, "--policies", POLICIES, "--out", str(out),
                                   "--workers", "2", "--json", "--quiet")
    assert code == 0, stderr
    return out, json.loads(stdout)  # exactly one JSON object on stdout


def test_json_has_the_keys_and_sane_values(two_cases) -> None:
    out, rep = two_cases
    assert rep["cases"] == 2 and rep["seed"] == int(SEED) and rep["errors"] == []
    # static (the cost reference) and the ceiling (the feasibility reference) are run whatever is listed
    assert set(rep["policies"]) == {"static", "slo-feedback", "ceiling"}
    for e in rep["policies"].values():
        assert 0.0 <= e["slo_pass_rate"] <= 1.0
        for key in ("cost_ratio_vs_static_median", "cost_ratio_vs_static_p90"):
            assert 0.1 < e[key] < 10.0
        assert e["cost_ratio_vs_static_median"] <= e["cost_ratio_vs_static_p90"] + 1e-12
        assert e["cost_ratio_vs_oracle_median"] is None  # the oracle was not asked for
        w = e["worst_case"]
        assert w["index"] in (0, 1) and w["shape"] and w["fleet"]
        assert 0.0 <= w["slo_attainment"]["critical"] <= 1.0
    assert rep["policies"]["static"]["cost_ratio_vs_static_median"] == pytest.approx(1.0)
    rows = rep["cases_detail"]
    assert [r["index"] for r in rows] == [0, 1]
    for r in rows:
        assert set(r["policies"]) == {"static", "slo-feedback", "ceiling"}
        for e in r["policies"].values():
            att = e["slo_attainment"]
            assert e["pass"] == (att["critical"] >= 0.99 and att["standard"] >= 0.99)
        assert Path(r["scenario_file"]).exists()


def test_a_case_is_feasible_when_a_reference_passes_it(two_cases) -> None:
    _, rep = two_cases
    for r in rep["cases_detail"]:
        refs = r["policies"]
        assert r["feasible"] == (refs["static"]["pass"] or refs["ceiling"]["pass"])
        assert refs["ceiling"]["slo_attainment"]["sheddable"] < 0.05  # the ceiling refuses the sheddable class
    assert rep["feasible_cases"] == sum(r["feasible"] for r in rep["cases_detail"])


def test_the_ceiling_is_run_when_not_listed() -> None:
    assert rb.parse_labels("slo-feedback") == ["static", "slo-feedback", "ceiling"]
    assert rb.parse_labels("ceiling,static") == ["static", "ceiling"]


def test_pass_rate_and_worst_case_follow_the_rows(two_cases) -> None:
    _, rep = two_cases
    for name, e in rep["policies"].items():
        passes = [r["policies"][name]["pass"] for r in rep["cases_detail"]]
        assert e["slo_pass_rate"] == pytest.approx(sum(passes) / len(passes))
        mine = [r["policies"][name] for r in rep["cases_detail"]]
        # Lowest min(critical, standard); a tie goes to the dearer case.
        key = [(min(m["slo_attainment"]["critical"], m["slo_attainment"]["standard"]), -m["cost_ratio_vs_static"], i)
               for i, m in enumerate(mine)]
        assert e["worst_case"]["index"] == min(key)[2]


def test_files_are_written(two_cases) -> None:
    out, rep = two_cases
    report = json.loads((out / f"robustness-seed{SEED}.json").read_text())
    assert report["cases_detail"] == rep["cases_detail"]
    png = (out / f"robustness-seed{SEED}.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert len(list((out / "cases").glob("gen-s5-c*.yaml"))) == 2


def test_one_case_alone_in_one_worker_gives_the_same_row(two_cases) -> None:
    out, rep = two_cases
    code, stdout, stderr = run_cli("--case", "1", "--seed", SEED, "--policies", POLICIES, "--out", str(out),
                                   "--workers", "1", "--json", "--quiet")
    assert code == 0, stderr
    alone = json.loads(stdout)
    assert alone["cases"] == 1
    assert alone["cases_detail"][0] == rep["cases_detail"][1]


def test_summary_arithmetic() -> None:
    def row(k: int, crit: float, std: float, ratio: float, shape: str = "steady") -> dict:
        e = {"slo_attainment": {"critical": crit, "standard": std, "sheddable": 1.0},
             "pass": crit >= 0.99 and std >= 0.99, "cost_ratio_vs_static": ratio, "cost_ratio_vs_oracle": ratio / 0.8}
        return {"index": k, "shape": shape, "fleet": "f", "mix": "trace", "fault": "none", "beyond_max": False,
                "scenario_file": "x.yaml", "feasible": k != 3, "policies": {"p": e}}

    rows = [row(0, 1.0, 1.0, 1.0), row(1, 0.995, 0.97, 0.9, "ramp-up"), row(2, 1.0, 0.999, 1.2),
            row(3, 0.96, 0.999, 2.0, "bursts")]
    s = rb.summarise(rows, ["p"])["p"]
    assert s["slo_pass_rate"] == pytest.approx(0.5)
    assert s["slo_pass_rate_feasible"] == pytest.approx(2 / 3)
    assert s["critical_min"] == pytest.approx(0.96) and s["standard_min"] == pytest.approx(0.97)
    assert s["cost_ratio_vs_static_median"] == pytest.approx(1.1)
    assert s["worst_case"]["index"] == 3 and s["worst_case"]["shape"] == "bursts"
    assert s["failed_by_shape"] == {"bursts": 1, "ramp-up": 1}
    assert s["failed_by_fleet"] == {"f": 2} and s["failed_by_fault"] == {"none": 2}
    assert rb.summarise([{"index": 0, "error": "boom"}], ["p"])["p"]["slo_pass_rate"] is None


@pytest.mark.parametrize(("argv", "message"), [
    (("--cases", "0"), "--cases: 0 is outside"),
    (("--policies", "static,bogus"), "unknown policy 'bogus'"),
    (("--tick", "0.5"), "--tick must be between"),
    (("--case", "-2"), "--case: -2 is outside"),
])
def test_bad_input_is_named(tmp_path: Path, argv: tuple[str, ...], message: str) -> None:
    code, stdout, stderr = run_cli(*argv, "--out", str(tmp_path), "--quiet")
    assert code == 2 and stdout == "" and message in stderr
