"""`governor run --demo --for S` headless: the JSON-lines contract other tools rely on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def test_demo_headless_prints_listening_then_ticks_and_stops(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "controller", "run", "--demo", "--for", "12", "--headless"],
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    first = events[0]
    assert first["event"] == "listening"
    assert set(first) >= {"policy_api", "keda_scaler", "metrics"}
    ticks = [e for e in events if e["event"] == "tick"]
    assert {t["pool"] for t in ticks} == {"llama8b-a100", "llama8b-h100"}
    for t in ticks:
        assert set(t) >= {"pool", "replicas_desired", "replicas_ready", "ttft_p95_s", "slo_ttft_s", "reason"}
    # 12 s at a 3 s tick: a few ticks per pool, and the fleet was really read (replicas observed).
    assert len(ticks) >= 6
    assert any(t["replicas_ready"] == 2 for t in ticks)
    assert events[-1]["event"] == "summary"
    # One structured log line per tick on stderr.
    logs = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    assert sum(1 for entry in logs if entry.get("event") == "tick") == len(ticks) // 2


def test_demo_with_the_mpc_policy(tmp_path):
    # `--policy` chooses the policy the demo (or a config) runs; the started line names it
    proc = subprocess.run([sys.executable, "-m", "controller", "run", "--demo", "--policy", "mpc", "--for", "8",
                           "--headless"], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    logs = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    started = next(e for e in logs if e.get("event") == "listening")
    assert started["policy"] == "mpc"
    ticks = [e for e in map(json.loads, proc.stdout.splitlines()) if e["event"] == "tick"]
    assert {t["pool"] for t in ticks} == {"llama8b-a100", "llama8b-h100"}  # the planner decided every pool
    assert any(e.get("event") == "tick" and e.get("decision_id") for e in logs)


@pytest.mark.parametrize("argv,message", [
    (["run", "--demo", "--policy", "best"], "--policy 'best' is not a policy; choose one of"),
    (["run", "--demo", "--config", "governor.yaml"], "--config is not used with it"),
])
def test_run_refuses_a_bad_policy_and_demo_with_a_config(capsys, argv, message):
    from controller.cli import main

    assert main(argv) == 2
    assert message in capsys.readouterr().err
