"""Traffic shapes of the generated bench cases: each a rate multiplier m(t) in [0, 1] and its drawn parameters.

Role: `draw_shape_params(shape, duration_s, rng)` draws one shape's parameters (seeded by the
generator passed in) and `rate_multiplier(shape, params, t_s, duration_s)` evaluates it; both
are pure. `controller.bench.generator` scales m(t) to the fleet and turns it into arrivals. Must
not: read the wall clock, draw unseeded randomness, or know about fleets.

Shapes (times as fractions of the case's duration D; factor F is peak / base):
  steady        m = 1;
  ramp-up/down  linear between 1/F and 1 over a span of 0.15-0.5 D (F 1.5-5: different slopes);
  ramp-up-down  1/F up to 1, hold, back down to 1/F;
  step-up/down  1/F → 1 (or 1 → 1/F) at 0.3-0.6 D, F 1.5-5;
  flash-crowd   base 1/F (F 3-6), rises to 1 within 5-30 s, holds 30-120 s, decays exponentially
                (time constant 30-120 s) back to the base;
  diurnal       one day of a ServeGen tier's rates (the shared 14-day file), compressed into D,
                times lognormal noise (sigma 0.05-0.2) per 30 s, peak 1;
  bursts        base 1/F (F 2-4) with bursts of 5-40 s at 1, about one per two minutes (sub-minute
                bursts as in the Azure code trace);
  slow-decay    1 → 1/F exponentially over D (F 2-5);
  quiet         1, then 0-5 % for 0.3-0.45 D from 0.2-0.4 D (a long quiet period), then 1 again.

The Arena family (`ARENA_SHAPES`, opt-in: `governor bench frontier --family arena|all`) adds the
traffic patterns NVIDIA's Autoscaling Arena publishes (issue 32) to the ramps, flash crowd and
diurnal day above; they are never drawn for `SHAPES` cases, so those stay as they were:
  staircase     1/F (F 2-5) from 0 to 0.1-0.2 D, then n = 3-5 equal steps up to 1, each held the
                same 0.5-1 x (0.85 D - start) / n;
  sinusoid      1/F + (1 - 1/F) (1 + sin(2 pi t / P + phase)) / 2 (F 1.5-4), the period P drawn in
                [1.5 x the fleet's longest cold start-up, max(that, D / 2)]: a swing slower than a
                replica takes to start, so a controller that plans for it can follow it.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import numpy as np

from controller.paths import shared_data_dir
from controller.sim.trace_servegen import SERVEGEN_DAY_S, SERVEGEN_TIERS, SERVEGEN_WINDOW_S, read_servegen_rates

SHAPES = ("steady", "ramp-up", "ramp-down", "ramp-up-down", "step-up", "step-down", "flash-crowd", "diurnal",
          "bursts", "slow-decay", "quiet")
# The Arena family: its own two shapes and the shipped ones it shares (see the module docstring).
ARENA_SHAPES = ("staircase", "flash-crowd", "diurnal", "sinusoid", "ramp-up", "ramp-down", "ramp-up-down")
ALL_SHAPES = SHAPES + tuple(x for x in ARENA_SHAPES if x not in SHAPES)
SINUSOID_MIN_PERIODS_OF_COLD = 1.5  # the sinusoid's period is at least this many cold start-ups
SERVEGEN_RATES_FILE = "servegen_14day_rates.csv"  # in the shared traces folder


class ShapeError(ValueError):
    """An unknown shape or a missing rates file; the message names it."""


def draw_shape_params(shape: str, duration_s: float, rng: np.random.Generator, *,
                      cold_start_s: float = 0.0) -> dict[str, float]:
    """The drawn parameters of `shape` (times in seconds from the case's start; factors >= 1).
    `cold_start_s` (the fleet's longest cold start-up) bounds the sinusoid's period from below."""
    d = duration_s
    if shape == "steady":
        return {}
    if shape in ("ramp-up", "ramp-down"):
        span = float(rng.uniform(0.15, 0.5)) * d  # different slopes: a ramp of 1.5-5x over 1.5-10 min
        return {"factor": float(rng.uniform(1.5, 5.0)), "start_s": float(rng.uniform(0.15, 0.45)) * d, "span_s": span}
    if shape == "ramp-up-down":
        up, hold, down = (float(x) * d for x in (rng.uniform(0.1, 0.3), rng.uniform(0.0, 0.2), rng.uniform(0.1, 0.3)))
        return {"factor": float(rng.uniform(1.5, 5.0)), "start_s": float(rng.uniform(0.1, 0.25)) * d,
                "up_s": up, "hold_s": hold, "down_s": down}
    if shape in ("step-up", "step-down"):
        return {"factor": float(rng.uniform(1.5, 5.0)), "at_s": float(rng.uniform(0.3, 0.6)) * d}
    if shape == "flash-crowd":
        return {"factor": float(rng.uniform(3.0, 6.0)), "at_s": float(rng.uniform(0.3, 0.55)) * d,
                "rise_s": float(rng.uniform(5.0, 30.0)), "hold_s": float(rng.uniform(30.0, 120.0)),
                "decay_s": float(rng.uniform(30.0, 120.0))}
    if shape == "diurnal":
        return {"tier": float(rng.integers(len(SERVEGEN_TIERS))), "day": float(rng.integers(13)),
                "noise_sigma": float(rng.uniform(0.05, 0.2)), "noise_seed": float(rng.integers(2**31))}
    if shape == "bursts":
        n = max(1, int(rng.poisson(d / 120.0)))
        p: dict[str, float] = {"factor": float(rng.uniform(2.0, 4.0)), "bursts": float(n)}
        for i, (at, length) in enumerate(zip(np.sort(rng.uniform(0.05, 0.95, n) * d).tolist(),
                                             rng.uniform(5.0, 40.0, n).tolist(), strict=True)):
            p[f"burst{i}_at_s"], p[f"burst{i}_s"] = float(at), float(length)
        return p
    if shape == "slow-decay":
        return {"factor": float(rng.uniform(2.0, 5.0))}
    if shape == "quiet":
        at = float(rng.uniform(0.2, 0.4)) * d
        return {"at_s": at, "quiet_s": float(rng.uniform(0.3, 0.45)) * d, "level": float(rng.uniform(0.0, 0.05))}
    if shape == "staircase":
        start = float(rng.uniform(0.1, 0.2)) * d
        n = int(rng.integers(3, 6))
        return {"factor": float(rng.uniform(2.0, 5.0)), "start_s": start, "steps": float(n),
                "hold_s": float(rng.uniform(0.5, 1.0)) * (0.85 * d - start) / n}
    if shape == "sinusoid":
        lo = SINUSOID_MIN_PERIODS_OF_COLD * cold_start_s
        return {"factor": float(rng.uniform(1.5, 4.0)), "period_s": float(rng.uniform(lo, max(lo, d / 2.0))),
                "phase": float(rng.uniform(0.0, 2.0 * np.pi))}
    raise ShapeError(f"unknown shape {shape!r}; shapes: {', '.join(ALL_SHAPES)}")


def rate_multiplier(shape: str, params: Mapping[str, float], t_s: np.ndarray, duration_s: float) -> np.ndarray:
    """m(t) in [0, 1] (the peak is 1) of `shape` with `params` at the times `t_s`."""
    t = np.asarray(t_s, dtype=np.float64)
    p = params
    if shape == "steady":
        return np.ones_like(t)
    if shape in ("ramp-up", "ramp-down"):
        lo = 1.0 / p["factor"]
        x = np.clip((t - p["start_s"]) / p["span_s"], 0.0, 1.0)
        return lo + (1.0 - lo) * (x if shape == "ramp-up" else 1.0 - x)
    if shape == "ramp-up-down":
        lo = 1.0 / p["factor"]
        up = np.clip((t - p["start_s"]) / p["up_s"], 0.0, 1.0)
        down = np.clip((t - p["start_s"] - p["up_s"] - p["hold_s"]) / p["down_s"], 0.0, 1.0)
        return lo + (1.0 - lo) * (up - down)
    if shape in ("step-up", "step-down"):
        lo = 1.0 / p["factor"]
        after = t >= p["at_s"]
        return np.where(after, 1.0, lo) if shape == "step-up" else np.where(after, lo, 1.0)
    if shape == "flash-crowd":
        lo = 1.0 / p["factor"]
        rel = t - p["at_s"]
        rise = np.clip(rel / p["rise_s"], 0.0, 1.0)
        decay = np.exp(-np.maximum(rel - p["rise_s"] - p["hold_s"], 0.0) / p["decay_s"])
        return lo + (1.0 - lo) * rise * decay
    if shape == "diurnal":
        return _diurnal(p, t, duration_s)
    if shape == "bursts":
        lo = 1.0 / p["factor"]
        m = np.full_like(t, lo)
        for i in range(int(p["bursts"])):
            at, length = p[f"burst{i}_at_s"], p[f"burst{i}_s"]
            m[(t >= at) & (t < at + length)] = 1.0
        return m
    if shape == "slow-decay":
        return p["factor"] ** (-np.clip(t / duration_s, 0.0, 1.0))
    if shape == "quiet":
        quiet = (t >= p["at_s"]) & (t < p["at_s"] + p["quiet_s"])
        return np.where(quiet, p["level"], 1.0)
    if shape == "staircase":
        lo, n = 1.0 / p["factor"], int(p["steps"])
        step = np.clip(np.floor((t - p["start_s"]) / p["hold_s"]) + 1.0, 0.0, float(n))
        return lo + (1.0 - lo) * step / n
    if shape == "sinusoid":
        lo = 1.0 / p["factor"]
        return lo + (1.0 - lo) * 0.5 * (1.0 + np.sin(2.0 * np.pi * t / p["period_s"] + p["phase"]))
    raise ShapeError(f"unknown shape {shape!r}; shapes: {', '.join(ALL_SHAPES)}")


@lru_cache(maxsize=1)
def _servegen_rates() -> Any:
    return read_servegen_rates(shared_data_dir() / "traces" / SERVEGEN_RATES_FILE)


def _diurnal(p: Mapping[str, float], t: np.ndarray, duration_s: float) -> np.ndarray:
    """A ServeGen day (tier, day) compressed into the case, with lognormal noise per 30 s, peak 1."""
    rates = _servegen_rates()
    tier = SERVEGEN_TIERS[int(p["tier"])]
    per_day = int(SERVEGEN_DAY_S // SERVEGEN_WINDOW_S)
    first = int(p["day"]) * per_day
    day = np.asarray(rates.rate_rps[tier][first:first + per_day + 1], dtype=np.float64)
    x = np.linspace(0.0, duration_s, len(day))
    base = np.interp(t, x, day)
    seg = np.floor(t / 30.0).astype(np.int64)
    noise = np.random.default_rng(int(p["noise_seed"])).normal(0.0, p["noise_sigma"], int(seg.max()) + 1)
    m = base * np.exp(noise[seg])
    return m / float(m.max())


__all__ = ["ALL_SHAPES", "ARENA_SHAPES", "SHAPES", "ShapeError", "draw_shape_params", "rate_multiplier"]
