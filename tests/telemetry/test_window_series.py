"""The window's per-series rate bookkeeping against a plain reference (every snapshot kept, every rate
recomputed from scratch, as the window did before it kept series incrementally), on seeded random
scrape sequences with counter resets, series that come and go, repeated instants and a clock going back."""

from __future__ import annotations

import itertools
from collections import namedtuple

import numpy as np
import pytest

from controller.telemetry.source import ScrapeTarget
from controller.telemetry.window import _ENGINE_SIGNALS, _TargetHistory

S = namedtuple("S", "labels value")
NAMES = ("vllm:prompt_tokens_total", "vllm:time_to_first_token_seconds_bucket")
TARGET = ScrapeTarget("http://x/metrics", "a", "vllm")


def _reference_rates(kept: list[tuple[float, dict]]) -> dict:
    if len(kept) < 2:
        return {}
    out = {}
    for key in kept[-1][1]:
        pts = [(t, c[key]) for t, c in kept if key in c]
        if len(pts) >= 2 and pts[-1][0] > pts[0][0]:
            inc = 0.0
            for (_, a), (_, b) in itertools.pairwise(pts):
                inc += b - a if b >= a else b
            out[key] = inc / (pts[-1][0] - pts[0][0])
    return out


@pytest.mark.parametrize("seed", range(6))
def test_incremental_rates_equal_the_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    window_s = 60.0
    h = _TargetHistory(TARGET, _ENGINE_SIGNALS, None)
    snaps: list[tuple[float, dict]] = []  # what the reference keeps: (time, {key: value})
    values: dict[tuple[str, int | str], float] = {("prompt", i): 0.0 for i in range(3)}
    values |= {("ttft", le): 0.0 for le in ("0.5", "1.0", "+Inf")}
    t = 0.0
    checked = 0
    for _ in range(80):
        step = float(rng.choice([15.0, 15.0, 7.5, 0.0, -10.0, 40.0]))  # repeats, clock back, gaps
        t = max(0.0, t + step)
        samples: dict[str, list] = {n: [] for n in NAMES}
        for (kind, x) in values:
            if rng.random() < 0.1:
                continue  # this series is absent from this scrape
            values[(kind, x)] = 0.0 if rng.random() < 0.05 else values[(kind, x)] + float(rng.integers(0, 50))
            if kind == "prompt":
                samples[NAMES[0]].append(S({"engine": "0", "replica": str(x)}, values[(kind, x)]))
            else:
                samples[NAMES[1]].append(S({"engine": "0", "le": x}, values[(kind, x)]))
        h.add(t, samples, window_s)
        snaps = [(ts, c) for ts, c in snaps if ts < t]  # the same instant again or the clock back: replaced
        snaps.append((t, dict(h.newest)))
        snaps = [(ts, c) for ts, c in snaps if ts >= t - window_s]  # pruned for good, as the window does
        want = _reference_rates(snaps)
        assert h.rates() == want, f"seed {seed}, t = {t}"
        checked += len(want)
    assert checked > 100
