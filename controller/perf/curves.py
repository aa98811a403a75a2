"""One-dimensional curves the performance model is built from: piecewise-linear interpolation with a
least-squares tail, and an isotonic (non-decreasing) smoothing of noisy timings.

Pure functions of their arguments; must not read files or keep state.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence


def isotonic(ys: Sequence[float]) -> list[float]:
    """Least-squares non-decreasing fit (pool adjacent violators): removes timing noise dips."""
    blocks: list[list[float]] = []  # [sum, count]
    for y in ys:
        blocks.append([y, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    out: list[float] = []
    for s, c in blocks:
        out.extend([s / c] * int(c))
    return out


def tail_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope over the upper half of the x range (the linear, compute/bandwidth-bound part)."""
    lo = xs[-1] / 2
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if x >= lo]
    if len(pts) < 2:
        pts = list(zip(xs[-2:], ys[-2:], strict=True))
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    if sxx == 0:
        return 0.0
    return max(0.0, sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx)


def interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise linear; flat below the first point; linear with the tail slope past the last."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1] + tail_slope(xs, ys) * (x - xs[-1])
    i = bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def grid_interp(xs: Sequence[float], ys: Sequence[float], tail_slope: float, x: float) -> float:
    """Piecewise linear over a grid, flat below it, `tail_slope` past it (as IterationModel's hot path)."""
    if x >= xs[-1]:
        return ys[-1] + tail_slope * (x - xs[-1])
    if x <= xs[0]:
        return ys[0]
    i = bisect_right(xs, x) - 1
    return ys[i] + (ys[i + 1] - ys[i]) * (x - xs[i]) / (xs[i + 1] - xs[i])
