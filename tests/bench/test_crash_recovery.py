"""Crash recovery figures: time until critical requests are back under 1 % late, late share after the crash."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from controller.bench.runner import crash_recovery


def fake_fleet(crash_at: float | None, late_share_per_window: list[float], per_window: int = 200):
    """Critical requests, `per_window` per 30 s window after the crash, the given share late in each;
    plus sheddable requests that are all late (they must not count)."""
    sent, met, prio = [], [], []
    at = crash_at or 0.0
    for k, share in enumerate(late_share_per_window):
        t = at + 30.0 * k + np.linspace(0.0, 29.0, per_window)
        n_late = int(round(share * per_window))
        sent += list(t) * 2
        met += [i >= n_late for i in range(per_window)] + [False] * per_window
        prio += [0] * per_window + [2] * per_window
    faults = [] if crash_at is None else [SimpleNamespace(kind="crash", at_s=crash_at)]
    records = {"sent_s": np.array(sent), "slo_met": np.array(met), "attempts": np.ones(len(sent), dtype=int)}
    return SimpleNamespace(scenario=SimpleNamespace(faults=faults), workload=SimpleNamespace(priority=np.array(prio)),
                           request_records=lambda: records)


@pytest.mark.parametrize("shares, recovery_s", [
    ([0.04, 0.02, 0.005, 0.003, 0.0, 0.0], 60.0),  # the docstring's example
    ([0.0] * 5, 0.0),  # never late
    ([0.05, 0.0, 0.02, 0.0, 0.0, 0.0], 90.0),  # a relapse restarts the calm run
    ([0.5] * 80, None),  # never recovers within 30 minutes
])
def test_recovery_time(shares, recovery_s):
    got = crash_recovery(fake_fleet(1640.0, shares))
    assert got is not None
    assert got["at_s"] == 1640.0 and got["recovery_s"] == recovery_s


def test_late_share_in_the_ten_minutes_after_the_crash_counts_critical_only():
    shares = [0.1] * 10 + [0.0] * 10 + [1.0] * 5  # 20 windows = 10 minutes, then outside the span
    got = crash_recovery(fake_fleet(100.0, shares))
    assert got is not None
    assert got["critical_late_frac_10min"] == pytest.approx(0.05)


def test_no_scheduled_crash_gives_none():
    assert crash_recovery(fake_fleet(None, [0.5])) is None
