"""`governor bench compare`: wall-time keys ignored, every other difference named by its path."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

from controller.bench.compare import CompareError, cmd_bench_compare, compare, diff_values


@pytest.mark.parametrize(
    ("label", "old", "new", "expected"),
    [
        ("identical", {"a": 1.5, "b": [1, 2]}, {"a": 1.5, "b": [1, 2]}, []),
        ("wall keys ignored", {"a": 1, "wall_s": 3.0, "timings_s": {"x": 1}}, {"a": 1, "wall_s": 9.0}, []),
        ("paths and run times ignored", {"file": "/a/s.yaml", "run_seconds": 2.9},
         {"file": "s.yaml", "run_seconds": 6.5}, []),
        ("float changed", {"p": {"cost": 0.1}}, {"p": {"cost": 0.1000001}}, ["$.p.cost: 0.1 -> 0.1000001"]),
        ("key missing", {"a": 1, "b": 2}, {"a": 1}, ["$.b: only in old"]),
        ("list length", {"r": [1, 2, 3]}, {"r": [1, 2]}, ["$.r: 3 items -> 2"]),
        ("nan equals nan", {"x": float("nan")}, {"x": float("nan")}, []),
        ("bool is not int", {"ok": True}, {"ok": 1}, ["$.ok: True -> 1"]),
        ("int vs equal float", {"n": 2}, {"n": 2.0}, []),
    ],
)
def test_diff_values(label: str, old: object, new: object, expected: list[str]) -> None:
    assert list(diff_values(old, new)) == expected, label


def test_rel_tol_accepts_small_float_noise() -> None:
    assert list(diff_values({"c": 1.0}, {"c": 1.0 + 1e-12}, rel_tol=1e-9)) == []
    assert list(diff_values({"c": 1.0}, {"c": 1.01}, rel_tol=1e-9)) == ["$.c: 1.0 -> 1.01"]


def _write(folder: Path, name: str, value: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(value))


def test_folders_compared_by_report_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path / "old", "a.json", {"cost": 1.0, "wall_s": 5})
    _write(tmp_path / "old", "b.json", {"cost": 2.0})
    _write(tmp_path / "new", "a.json", {"cost": 1.0, "wall_s": 7})
    _write(tmp_path / "new", "b.json", {"cost": 2.5})
    assert compare(tmp_path / "old", tmp_path / "new") == {"a.json": [], "b.json": ["$.cost: 2.0 -> 2.5"]}
    args = Namespace(old=str(tmp_path / "old"), new=str(tmp_path / "new"), rel_tol=0.0, max_diffs=20, json=True)
    assert cmd_bench_compare(args) == 1
    out = json.loads(capsys.readouterr().out)
    assert out == {"reports": 2, "identical": 1, "differences": {"b.json": ["$.cost: 2.0 -> 2.5"]}}


def test_missing_report_is_an_error_naming_it(tmp_path: Path) -> None:
    _write(tmp_path / "old", "a.json", {})
    _write(tmp_path / "old", "b.json", {})
    _write(tmp_path / "new", "a.json", {})
    with pytest.raises(CompareError, match="missing b.json"):
        compare(tmp_path / "old", tmp_path / "new")
    args = Namespace(old=str(tmp_path / "old"), new=str(tmp_path / "nowhere"), rel_tol=0.0, max_diffs=20, json=False)
    assert cmd_bench_compare(args) == 2
