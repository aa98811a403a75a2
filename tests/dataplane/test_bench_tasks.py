"""`governor bench tasks` (issue 35, part 6): one JSON object; the hostile-ids part keeps the book at its bound and
refuses the headers that break the convention; the live part counts the same requests at the client and at the
replicas. Small and bounded here; the figures in docs/RELIABILITY.md and docs/BENCHMARKS.md come from full runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from controller.paths import PROJECT_ROOT


def _bench(*args: str, timeout_s: float) -> dict:
    out = subprocess.run([sys.executable, "-m", "controller", "bench", "tasks", "--json", *args],
                         capture_output=True, text=True, timeout=timeout_s, cwd=PROJECT_ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout[-2000:]
    return json.loads(lines[0])


def test_hostile_ids_keep_the_book_bounded():
    h = _bench("--requests", "5000", "--max-tasks", "200", "--max-tenants", "4", "--tenants", "50",
               "--bad-every", "100", timeout_s=120)["hostile"]
    assert h["refused_bad_header"] == 50 and h["distinct_task_ids"] == 4950
    assert h["book_size"] == 200 and max(h["book_at_checkpoints"]) == 200
    assert h["tasks_evicted"] == 4950 - 200
    assert h["tenants_named"] <= 5  # four by name and _other
    assert 0 < h["decide_us"]["p50"] <= h["decide_us"]["p99"] <= h["decide_us"]["max"]


@pytest.mark.e2e
def test_live_tasks_are_counted_alike_at_the_client_and_the_replicas():
    live = _bench("--skip-hostile", "--live", "--task-rate", "1", "--duration", "4", "--drain", "40",
                  "--no-tenants", timeout_s=240)["live"]
    for mode in ("step_aware", "step_blind"):
        r = live[mode]
        assert r["started"] == r["tasks"] > 0
        assert r["completed"] + r["failed"] == r["tasks"]
        assert r["requests_served_replicas"] == r["requests_client"] - r["refused"]
    assert live["step_aware"]["billed_s"] == live["step_blind"]["billed_s"]
