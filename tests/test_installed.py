"""The package on its own: build the wheel, install it into a fresh virtualenv in a temporary directory with
no ../shared beside it and GOVERNOR_SHARED_DATA unset, and run `governor run --demo --for 20 --headless`
and `governor config validate` from there (what deploy/Containerfile's image runs, without the image).

Offline: the wheel is built with the setuptools already installed (`--no-build-isolation`) and installed
with `--no-deps --no-index`; the dependencies come from this interpreter's site-packages through a
`.pth` line, which puts the directory on the path without running the `.pth` files in it, so the
editable install of this checkout is not seen (the test checks `controller.__file__`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("installed")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "controller", src / "controller", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GOVERNOR_SHARED_DATA", "VIRTUAL_ENV")}
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                  "-w", str(tmp / "wheels"), str(src)], cwd=tmp, env=env, timeout=120)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp / "wheels").glob("llm_governor-*.whl"))
    venv = tmp / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp, env=env, timeout=60)
    assert made.returncode == 0, made.stderr
    py = venv / "bin" / "python"
    inst = _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
                 str(wheel)], cwd=tmp, env=env, timeout=120)
    assert inst.returncode == 0, inst.stderr
    purelib = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        cwd=tmp, env=env, timeout=30).stdout.strip())
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (purelib / "zz_governor_test_deps.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    run_dir = tmp / "elsewhere" / "run"  # no ../shared beside it
    run_dir.mkdir(parents=True)
    return venv, run_dir, env


def test_the_wheel_carries_its_data_and_not_the_checkout(installed):
    venv, run_dir, env = installed
    out = _run([str(venv / "bin" / "python"), "-c",
                "import controller, controller.learning.store as s, controller.runtime.main as m; "
                "print(controller.__file__); print(s.SHIPPED_MODELS_DIR); print(m.DEMO_SCENARIO)"],
               cwd=run_dir, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    files = [Path(line) for line in out.stdout.split()]
    for f in files:
        assert str(f).startswith(str(venv)) and ROOT not in f.resolve().parents, f
    assert (files[1] / "coupling.skops").is_file() and files[2].is_file()


def test_the_installed_package_runs_the_demo_and_validates_a_config(installed):
    venv, run_dir, env = installed
    governor = str(venv / "bin" / "governor")
    config = run_dir / "governor.yaml"
    shutil.copy(ROOT / "deploy" / "governor.example.yaml", config)
    # the example names a Prometheus password file: it validates where that file is (issue 34, part 1)
    (run_dir / "prometheus-password").write_text("example\n")
    with_password = {**env,
                     "GOVERNOR_TELEMETRY__PROMETHEUS__BASIC_AUTH__PASSWORD_FILE": str(run_dir / "prometheus-password")}
    ok = _run([governor, "config", "validate", str(config)], cwd=run_dir, env=with_password, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "engines: chat-h100=llama-3-8b/h100-80gb/tp1 (calibrated)" in ok.stdout
    demo = _run([governor, "run", "--demo", "--for", "20", "--headless"], cwd=run_dir, env=env, timeout=90)
    assert demo.returncode == 0, demo.stderr[-3000:]
    events = [json.loads(line) for line in demo.stdout.splitlines() if line.startswith("{")]
    kinds = {e["event"] for e in events}
    assert {"listening", "tick", "summary"} <= kinds, kinds
    ticks = [e for e in events if e["event"] == "tick"]
    assert any(e["telemetry"] == "ok" for e in ticks), ticks[-2:]
    assert any(0.5 < (e.get("gpu_mem_used_frac") or 0) <= 0.95 for e in ticks)  # DCGM FB of the demo's GPUs
    summary = next(e for e in events if e["event"] == "summary")
    assert summary["scenario"] == "demo" and summary["completed"] > 0
    assert "shared data not found" not in demo.stderr


def test_the_container_image_is_built_in_two_stages_and_runs_the_demo_by_default():
    """The build cannot run here: check the Containerfile says what tests above exercise."""
    text = (ROOT / "deploy" / "Containerfile").read_text()
    stages = text.split("\nFROM ")[1:]
    assert len(stages) == 2 and stages[0].startswith("python:3.11-slim AS build")
    final = stages[1]
    assert "COPY --from=build /wheels /wheels" in final and "--no-index --find-links /wheels llm-governor" in final
    assert "COPY controller" not in final and "VOLUME" not in text  # nothing of the source tree, no mounts
    assert 'CMD ["run", "--demo", "--headless"]' in final
