"""controller/core/ must stay pure: no edge packages, no I/O clients, no wall clock."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "controller" / "core"
FORBIDDEN_MODULES = (
    "controller.telemetry", "controller.actuation", "controller.api", "controller.runtime", "controller.gen",
    "controller.sim", "controller.bench", "controller.obs", "controller.clock", "controller.cli",
    "grpc", "prometheus_client", "prometheus_api_client", "requests", "urllib", "http", "socket",
    "sqlite3", "threading", "asyncio", "subprocess", "apscheduler", "time", "datetime", "random",
)
FORBIDDEN_CALLS = {("np", "random", "seed"), ("numpy", "random", "seed")}


def _imports(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module


def _core_files():
    return sorted(CORE.rglob("*.py"))


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: p.name)
def test_core_module_imports_nothing_impure(path):
    tree = ast.parse(path.read_text())
    bad = [(line, mod) for line, mod in _imports(tree)
           if any(mod == f or mod.startswith(f + ".") for f in FORBIDDEN_MODULES)]
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: p.name)
def test_core_module_uses_no_global_randomness_or_open(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in ("open", "print", "input"), f"{path.name}:{node.lineno} calls {node.func.id}()"
        if isinstance(node, ast.Attribute) and node.attr in ("seed", "rand", "randn", "randint") and \
                isinstance(node.value, ast.Attribute) and node.value.attr == "random":
            pytest.fail(f"{path.name}:{node.lineno} uses numpy's global random state")


def test_the_checker_catches_a_violation(tmp_path):
    bad = "import time\nfrom controller.telemetry import scrape\n"
    found = [m for _, m in _imports(ast.parse(bad)) if any(m == f or m.startswith(f + ".") for f in FORBIDDEN_MODULES)]
    assert found == ["time", "controller.telemetry"]


def test_core_is_not_empty():
    names = {p.name for p in _core_files()}
    assert {"step.py", "guards.py", "objective.py"} <= names
