"""`governor bench api-load` (make loadtest), short: the daemon ticking under API load, the picker beside it.

The full run (60 s at 1,000 reads/s and 50 override changes/s, the picker at 500 req/s) is `make loadtest`;
its figures are in docs/RELIABILITY.md. This is the same bench for 5 s at a fifth of the rates, as a subprocess
(the CLI a user runs), asserting what the full run must show: no call failed, none was shed by the client's
bound, no tick skipped or overran, the picker answered every request.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from controller.paths import PROJECT_ROOT


@pytest.mark.e2e
def test_api_load_short_run_has_no_errors_and_no_skipped_ticks():
    out = subprocess.run([sys.executable, "-m", "controller", "bench", "api-load", "--json", "--duration", "5",
                          "--rps", "200", "--write-rps", "10", "--picker-rate", "100"],
                         capture_output=True, text=True, timeout=240, cwd=PROJECT_ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout[-2000:]
    res = json.loads(lines[0])
    for key in ("reads", "changes", "read_rps", "write_rps", "errors", "not_sent", "rpcs", "ticks", "tick_overruns",
                "tick_max_ms", "skipped_ticks", "tick_errors", "picker"):
        assert key in res, key
    assert res["reads"] == 1000 and res["changes"] == 50
    assert res["errors"] == 0 and res["not_sent"] == 0, res["rpcs"]
    assert set(res["rpcs"]) == {"GetStatus", "ListDecisions", "ListOverrides", "ListAudit", "SetOverride",
                                "DeleteOverride"}
    for kind, r in res["rpcs"].items():
        assert 0 < r["p50_ms"] <= r["p99_ms"], kind
    assert res["ticks"] >= 1 and res["skipped_ticks"] == 0 and res["tick_errors"] == 0 and res["tick_overruns"] == 0
    picker = res["picker"]
    for key in ("requests", "errors", "pick_latency_p50_ms", "pick_latency_p99_ms", "rps"):
        assert key in picker, key
    assert picker["requests"] == 500 and picker["errors"] == 0
    assert 0 < picker["pick_latency_p50_ms"] <= picker["pick_latency_p99_ms"]
    # where the CPU went (Linux /proc): every process of the run used some
    assert res["cpu_s"]["daemon"] > 0 and res["cpu_s"]["api_client"] > 0, res["cpu_s"]
    assert set(picker["cpu_s"]) == {"picker", "envoy", "replicas", "driver"}
    assert all(v > 0 for v in picker["cpu_s"].values()), picker["cpu_s"]


def test_api_load_refuses_bad_rates_before_starting_anything():
    out = subprocess.run([sys.executable, "-m", "controller", "bench", "api-load", "--json", "--rps", "0",
                          "--duration", "nan"], capture_output=True, text=True, timeout=60, cwd=PROJECT_ROOT)
    assert out.returncode == 2 and out.stdout == ""
    assert "--rps 0: must be in (0, 20000]" in out.stderr and "--duration nan" in out.stderr
