"""Cumulative histograms and Prometheus-style quantiles (pure; used by telemetry and the simulator).

It sits beside types.py and clock.py, outside core/, so the simulator can use it without reaching the
controller's decision side. Must not import anything from controller/ (it is a leaf).

`histogram_quantile` follows Prometheus' rules so an in-process estimate equals
what PromQL would return for the same buckets: linear interpolation inside the
bucket where the rank falls; a rank in the +Inf bucket returns the highest
finite bound; no observations → NaN.

Worked example: bounds (0.1, 0.5, 1.0), cumulative counts (10, 60, 100, 100)
(the last is +Inf); q=0.95 → rank 95 falls in (0.5, 1.0] which holds 40
observations starting at rank 60 → 0.5 + 0.5 × (95 − 60) / 40 = 0.9375.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence

import numpy as np


def histogram_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float:
    """Quantile from upper `bounds` (finite, ascending) and cumulative counts (len(bounds) + 1, last = +Inf)."""
    if len(cumulative) != len(bounds) + 1:
        raise ValueError(f"need len(bounds) + 1 cumulative counts, got {len(cumulative)} for {len(bounds)} bounds")
    total = cumulative[-1]
    if not total > 0 or math.isnan(q):
        return math.nan
    if q <= 0:
        return -math.inf if q < 0 else (bounds[0] if bounds else math.nan)
    if q >= 1:
        return math.inf if q > 1 else (bounds[-1] if bounds else math.nan)
    rank = q * total
    i = bisect_left(cumulative, rank)
    if i >= len(bounds):  # in the +Inf bucket
        return bounds[-1]
    lower = bounds[i - 1] if i > 0 else 0.0
    below = cumulative[i - 1] if i > 0 else 0.0
    inside = cumulative[i] - below
    if inside <= 0:
        return bounds[i]
    if i == 0 and bounds[0] <= 0:
        return bounds[0]
    return lower + (bounds[i] - lower) * (rank - below) / inside


class Histogram:
    """A fixed-bucket histogram with weighted observations (non-cumulative counts internally)."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        if any(b2 <= b1 for b1, b2 in zip(self.bounds, self.bounds[1:], strict=False)):
            raise ValueError("histogram bounds must be strictly ascending")
        self.counts = [0.0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0.0

    def observe(self, value: float, n: float = 1.0) -> None:
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def cumulative(self) -> list[float]:
        return list(np.cumsum(self.counts))

    def quantile(self, q: float) -> float:
        return histogram_quantile(q, self.bounds, self.cumulative())
