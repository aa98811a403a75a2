"""docs/BENCHMARKS.md as a report: its tables are what the saved results render, and the renderer's parts.

The first test is the one `make test` relies on: every generated region of docs/BENCHMARKS.md and
README.md equals what `governor bench report` renders from docs/bench/*.json, every saved result says
which command and commit made it, and every plot exists. The others check the pieces on small inputs.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from controller.bench.benchdoc import charts, command, regions, render, sources
from controller.cli import main

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "bench"


def test_the_docs_tables_match_the_saved_results() -> None:
    out = command.check(ROOT, RESULTS)
    assert out["stale_regions"] == {}, (
        f"generated regions differ from what docs/bench/*.json renders: {out['stale_regions']}; "
        "run `governor bench report` (or rerun the bench: `governor bench report --run NAME`)")
    assert out["missing_charts"] == []
    assert out["ok"]
    assert len(out["regions"]["docs/BENCHMARKS.md"]) >= 15


def test_every_saved_result_names_its_command_and_commit() -> None:
    saved = sorted(p.stem for p in RESULTS.glob("*.json"))
    assert saved, "docs/bench/ holds no results"
    known = sources.by_name()
    for name in saved:
        env = sources.load(name, RESULTS)  # the envelope's own checks: name, command, commit, result keys
        assert re.fullmatch(r"[0-9a-f]{40}", env["commit"]), f"{name}: commit {env['commit']!r}"
        assert env["command"] == known[name].command
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", env["recorded_on"])
    used = {s for r in render.REGIONS.values() for s in r.sources}
    assert used <= set(saved), f"regions read results not saved: {sorted(used - set(saved))}"


def test_report_check_through_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "report", "--check", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["stale_regions"] == {}


# --------------------------------------------------------------------------- regions


def test_regions_block_and_inline() -> None:
    text = ("# T\n\n<!-- bench:a begin -->\nold table\n<!-- bench:a end -->\n\n"
            "It keeps <!-- bench:b begin -->3 of 9<!-- bench:b end --> cases.\n")
    assert [(r.name, r.inline) for r in regions.find(text)] == [("a", False), ("b", True)]
    new = regions.rewrite(text, {"a": "| x |\n|---|", "b": "4 of 9"})
    assert "<!-- bench:a begin -->\n| x |\n|---|\n<!-- bench:a end -->" in new
    assert "It keeps <!-- bench:b begin -->4 of 9<!-- bench:b end --> cases." in new
    assert regions.stale(text, {"a": "old table", "b": "4 of 9"}) == ["b"]
    assert regions.stale(new, {"a": "| x |\n|---|", "b": "4 of 9"}) == []
    assert regions.rewrite(new, {"a": "| x |\n|---|", "b": "4 of 9"}) == new  # idempotent


@pytest.mark.parametrize(("text", "message"), [
    ("<!-- bench:a begin -->\nx\n", "bench:a never ends"),
    ("x\n<!-- bench:a end -->\n", "bench:a ends without a begin"),
    ("<!-- bench:a begin -->\n<!-- bench:b begin -->\n", "bench:b begins inside bench:a"),
    ("<!-- bench:a begin -->1<!-- bench:a end --> <!-- bench:a begin -->2<!-- bench:a end -->", "appears twice"),
])
def test_unpaired_markers_are_named(text: str, message: str) -> None:
    with pytest.raises(regions.RegionError, match=message):
        regions.find(text, "doc.md")


def test_an_inline_region_stays_one_line_and_a_region_needs_a_renderer() -> None:
    with pytest.raises(regions.RegionError, match="inside a line"):
        regions.rewrite("a <!-- bench:x begin -->1<!-- bench:x end -->", {"x": "1\n2"})
    with pytest.raises(regions.RegionError, match="nothing renders bench:x"):
        regions.rewrite("a <!-- bench:x begin -->1<!-- bench:x end -->", {})
    with pytest.raises(command.ReportError, match="doc.md:1: nothing renders bench:no-such-table"):
        command.needed({"doc.md": "<!-- bench:no-such-table begin -->\n<!-- bench:no-such-table end -->\n"})


def test_a_stale_table_is_found_and_rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(charts, "CHARTS", ())
    (tmp_path / "docs" / "bench").mkdir(parents=True)
    shutil.copy(RESULTS / "roofline.json", tmp_path / "docs" / "bench" / "roofline.json")
    doc = tmp_path / "docs" / "BENCHMARKS.md"
    doc.write_text("Intro, hand-written.\n\n<!-- bench:roofline begin -->\n| stale |\n<!-- bench:roofline end -->\n"
                   "\nMore prose.\n")
    out = command.check(tmp_path, tmp_path / "docs" / "bench")
    assert not out["ok"] and out["stale_regions"] == {"docs/BENCHMARKS.md": ["roofline"]}
    command.write(tmp_path, tmp_path / "docs" / "bench")
    text = doc.read_text()
    assert text.startswith("Intro, hand-written.\n") and text.endswith("\nMore prose.\n")
    assert "| llama-3-70b/h100-80gb/tp4 | azure-code (2048/28) |" in text
    assert "`python -m controller.perf.roofline --json` at `" in text
    assert command.check(tmp_path, tmp_path / "docs" / "bench")["ok"]


def test_a_missing_result_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(charts, "CHARTS", ())
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "BENCHMARKS.md").write_text("<!-- bench:tick begin -->\n<!-- bench:tick end -->\n")
    with pytest.raises(sources.SourceError, match=r"tick-prometheus.json: missing .*--run tick-prometheus"):
        command.check(tmp_path, tmp_path / "docs" / "bench")


# --------------------------------------------------------------------------- sources


def test_commands_run_with_this_interpreter() -> None:
    argv = sources.argv_of("governor bench planner --ticks 60 --json", python="/py")
    assert argv == ["/py", "-m", "controller", "bench", "planner", "--ticks", "60", "--json"]
    assert sources.argv_of("python -m controller.perf.roofline --json", python="/py")[:3] == \
        ["/py", "-m", "controller.perf.roofline"]
    pinned = sources.argv_of("taskset -c 0 governor bench planner --json", python="/py")
    assert pinned[-6:] == ["/py", "-m", "controller", "bench", "planner", "--json"]
    assert pinned[:3] == ["taskset", "-c", "0"] or len(pinned) == 6  # without taskset on PATH: unpinned


def test_import_wraps_an_output_with_its_provenance(tmp_path: Path) -> None:
    src = sources.by_name()["planner-budget"]
    out = tmp_path / "planner.out"
    out.write_text(json.dumps({"cpu_p99_ms": 140.0, "wall_p99_ms": 160.0, "objective_gap_p90": 0.0}))
    path = sources.import_output(src, out, commit="a" * 40, folder=tmp_path / "bench", recorded_on="2026-12-07")
    env = sources.load("planner-budget", tmp_path / "bench")
    assert path.name == "planner-budget.json"
    assert env["command"] == src.command and env["commit"] == "a" * 40 and env["recorded_on"] == "2026-12-07"
    assert env["result"]["cpu_p99_ms"] == 140.0
    out.write_text(json.dumps({"cpu_p99_ms": 140.0}))
    with pytest.raises(sources.SourceError, match="lacks wall_p99_ms, objective_gap_p90"):
        sources.import_output(src, out, commit="a" * 40, folder=tmp_path / "bench")
    out.write_text("progress\nnot json\n")
    with pytest.raises(sources.SourceError, match="did not print one JSON object"):
        sources.import_output(src, out, commit="a" * 40, folder=tmp_path / "bench")


def test_a_summary_line_is_read_from_json_lines() -> None:
    src = sources.by_name()["demo-live-mpc"]
    lines = "\n".join(json.dumps(x) for x in ({"event": "listening"}, {"event": "tick", "pool": "a"},
                                              {"event": "summary", "slo_attainment": {"critical": 0.97}}))
    assert sources.parse_output(src, lines) == {"slo_attainment": {"critical": 0.97}}
    with pytest.raises(sources.SourceError, match="no 'summary' line"):
        sources.parse_output(src, '{"event": "tick"}\n')


def test_large_outputs_are_trimmed_and_say_so() -> None:
    src = sources.by_name()["all"]
    result: dict[str, Any] = {"wall_s": 1.0, "workers": 2, "tick_s": 15.0, "scenarios": {"x": {
        "timings_s": {"mpc": 3.0}, "policies": {"mpc": {"cost_per_successful_task_usd": 0.004, "params": {"big": 1},
                                                        "slo_attainment": {"critical": 1.0}, "decisions": 240}}}}}
    env = sources.wrap(src, result, commit="b" * 40, dirty=False, wall_s=1.0, machine_info={"cpus": 2})
    assert env["result"]["scenarios"]["x"] == {"policies": {"mpc": {"cost_per_successful_task_usd": 0.004,
                                                                    "slo_attainment": {"critical": 1.0}}}}
    assert "headline figures" in env["trimmed"] and "timings_s" in env["trimmed"]
    assert result["scenarios"]["x"]["policies"]["mpc"]["params"] == {"big": 1}  # the input is left alone


def test_unknown_and_recorded_results_are_not_run() -> None:
    with pytest.raises(sources.SourceError, match="unknown result 'nope'"):
        sources.select("nope")
    with pytest.raises(sources.SourceError, match="measured by hand"):
        sources.select("aiperf")
    assert "aiperf" not in [s.name for s in sources.select("all")]


def test_the_plots_are_drawn_from_the_saved_results(tmp_path: Path) -> None:
    results = {n: sources.load(n, RESULTS) for c in charts.CHARTS for n in c.sources}
    drawn = charts.draw_all(results, tmp_path)
    assert sorted(p.name for p in drawn) == sorted(c.file for c in charts.CHARTS)
    for p in drawn:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size < 200_000
