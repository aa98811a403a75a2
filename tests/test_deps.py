"""Dependencies: compatible ranges in pyproject.toml, exact versions in constraints.txt, and both in step.

`make`, CI (through `make test`) and the image install from constraints.txt; `make lowest` installs the
wheel at the ranges' floors (tools/deps.py lowest) and runs the demo (its figures: docs/OPERATING.md §2).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("deps", ROOT / "tools" / "deps.py")  # tools/ is not a package
assert _spec is not None and _spec.loader is not None
deps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(deps)


def test_every_dependency_is_a_range_with_a_floor_and_pinned_inside_it():
    for req in deps.requirements():
        assert not any(s.operator == "==" for s in req.specifier), f"{req}: an exact pin belongs in constraints.txt"
        assert deps.floor(req) is not None
    assert deps.problems() == []
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "deps.py"), "check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_the_check_names_a_pin_outside_its_range_and_a_missing_one(tmp_path):
    lines = [f"{n}=={v}" for n, v in deps.pins().items() if n not in ("numpy", "psutil")]
    lines.append("numpy==1.26.4")  # below the floor of 2.0
    (tmp_path / "constraints.txt").write_text("\n".join(lines) + "\n")
    found = deps.problems(tmp_path / "constraints.txt")
    assert any(p.startswith("numpy: constraints.txt pins 1.26.4, outside") for p in found), found
    assert any(p.startswith("psutil: not pinned") for p in found), found
    assert len(found) == 2, found


def test_lowest_is_each_runtime_floor_and_a_range_without_one_is_refused():
    lowest = subprocess.run([sys.executable, str(ROOT / "tools" / "deps.py"), "lowest"], capture_output=True,
                            text=True, check=True).stdout.split()
    assert "numpy==2.0" in lowest and "grpcio==1.85.1" in lowest and len(lowest) == len(deps.requirements())
    try:
        deps.floor(Requirement("rich<16"))
    except ValueError as exc:
        assert "no lower bound" in str(exc)
    else:
        raise AssertionError("a range without a floor has no lowest version")


def test_make_and_the_image_install_from_the_constraints():
    make = (ROOT / "Makefile").read_text()
    assert "pip install --quiet -c constraints.txt -e '.[dev]'" in make
    assert "$(STAMP): pyproject.toml constraints.txt" in make  # a new lock reinstalls
    image = (ROOT / "deploy" / "Containerfile").read_text()
    assert "COPY pyproject.toml README.md constraints.txt" in image and "--constraint constraints.txt" in image
