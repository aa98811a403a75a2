"""ServeGen 14-day rates: read the per-window rates file and draw requests that follow one tier.

A rates file has one row per 600 s window with, per model tier, the summed client rate, the
rate-weighted CV of inter-arrival times and the active clients; `servegen_arrivals` turns it into
a `Trace` (Gamma-renewal arrivals, lognormal lengths). Every draw uses the Generator passed in.
Must not: read other formats or apply the scenario's transforms (trace_transforms).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from controller.sim.scenario import ServeGenSpec
from controller.sim.trace_csv import float_column, read_csv_rows
from controller.sim.trace_types import MOONCAKE_BLOCK_TOKENS, Trace, TraceError, sorted_trace

SERVEGEN_TIERS = ("m-large", "m-mid", "m-small")
SERVEGEN_WINDOW_S = 600.0
SERVEGEN_DAY_S = 86_400.0
SERVEGEN_DAYS = 14

# The per-window CV is clamped to this range before it sets the Gamma shape 1/CV². Below 0.5 the
# arrivals would be nearly a metronome, which no real client mix produces; above 4 the published
# CVs come from windows where a client sent a handful of requests (m-mid reaches 847), and a shape
# of 1/CV² < 1/16 would put a whole window's load into a few instants. For m-small, the default
# diurnal tier, 90% of windows lie below 3.9, so the cap rarely binds there.
SERVEGEN_CV_MIN = 0.5
SERVEGEN_CV_MAX = 4.0
# Step of the grid on which the interpolated ServeGen rate is integrated (seconds of trace time).
_SERVEGEN_GRID_S = 10.0
# Synthetic ServeGen lengths: lognormal around the spec's means with these log-space standard
# deviations (the Azure 2023 conversation trace has 0.99 for prompts and 0.86 for outputs), clipped
# to [1, LENGTH_CLIP_MULT × mean] so a tail draw cannot exceed any model's context.
PROMPT_LOG_SIGMA = 1.0
OUTPUT_LOG_SIGMA = 0.85
LENGTH_CLIP_MULT = 8


@dataclass(frozen=True)
class ServeGenRates:
    """The per-window columns of a ServeGen rates file, by tier."""

    window_start_s: np.ndarray  # float64, one entry per 600 s window, ascending from 0
    rate_rps: dict[str, np.ndarray]  # summed client rate per window
    cv: dict[str, np.ndarray]  # rate-weighted CV of inter-arrival times per window
    active_clients: dict[str, np.ndarray]


def read_servegen_rates(path: Path) -> ServeGenRates:
    header, rows, lines = read_csv_rows(Path(path), None)
    if header[0] != "window_start_s":
        raise TraceError(f"{path}:1: header: first column must be window_start_s, got {header[0]!r}")
    col = {h: i for i, h in enumerate(header)}
    starts = float_column([r[0] for r in rows], lines, path, "window_start_s")
    steps = np.diff(starts)
    bad = np.flatnonzero(np.abs(steps - SERVEGEN_WINDOW_S) > 1e-6)
    if bad.size or starts[0] != 0.0:
        i = int(bad[0]) + 1 if bad.size else 0
        raise TraceError(
            f"{path}:{lines[i]}: window_start_s: windows must start at 0 and step by {SERVEGEN_WINDOW_S:g} s "
            f"(got {starts[i]:g})"
        )
    rate, cv, clients = {}, {}, {}
    for tier in SERVEGEN_TIERS:
        names = (f"{tier}_rate", f"{tier}_rate_weighted_cv", f"{tier}_active_clients")
        missing = [n for n in names if n not in col]
        if missing:
            raise TraceError(f"{path}:1: header: missing column(s) {missing}")
        rate[tier] = float_column([r[col[names[0]]] for r in rows], lines, path, names[0])
        cv[tier] = float_column([r[col[names[1]]] for r in rows], lines, path, names[1])
        clients[tier] = float_column([r[col[names[2]]] for r in rows], lines, path, names[2])
    return ServeGenRates(starts, rate, cv, clients)


def servegen_arrivals(
    rates: ServeGenRates, spec: ServeGenSpec, rng: np.random.Generator, name: str = "servegen"
) -> Trace:
    """Draw requests whose rate follows a ServeGen tier, rescaled to `spec.mean_rps` (trace seconds).

    Process: a Gamma-renewal process with shape 1/CV² (CV clamped to [0.5, 4]) run in
    "operational time" Λ(t) = ∫ λ, then mapped back to real time. The rate λ(t) is the tier's
    per-window rate, linearly interpolated between window midpoints (so the rate also varies
    inside a window) and multiplied by mean_rps / (its mean over the chosen days). Each 600 s window
    runs its own renewal process with that window's CV, started in its stationary state (first
    point = U × a Gamma(k+1) interval, the length-biased gap) so window edges add no bursts.

    Why renewal and not a doubly stochastic Poisson: the file gives exactly one burstiness number
    per window, the CV of inter-arrival times, and a Gamma renewal with shape k = 1/CV² has
    inter-arrival CV equal to it by construction (Gamma(k, θ) has CV 1/√k), with the mean count
    still λ·Δt; a Cox process would need a modulation timescale the data does not give. Example:
    CV 2 → k = 0.25, i.e. gaps are mostly short with occasional long silences: clumps of about
    1/k = 4 requests. Windows with a zero rate (holes in the source: m-mid has some after day 3.6)
    stay empty.

    Lengths: prompt ~ lognormal(mean prompt_tokens_mean, log-sd 1.0), output ~ lognormal(mean
    output_tokens_mean, log-sd 0.85), each clipped to [1, 8 × mean].
    """
    tier = spec.tier
    begin_s = spec.start_day * SERVEGEN_DAY_S
    end_s = begin_s + spec.days * SERVEGEN_DAY_S
    span_end = float(rates.window_start_s[-1]) + SERVEGEN_WINDOW_S
    if end_s > span_end + 1e-6:
        raise TraceError(
            f"servegen: start_day + days ({spec.start_day:g} + {spec.days:g}) exceeds the "
            f"{span_end / SERVEGEN_DAY_S:g} days in the rates file"
        )
    lam_w = rates.rate_rps[tier]
    mid_s = rates.window_start_s + SERVEGEN_WINDOW_S / 2
    grid_s = np.arange(begin_s, end_s + _SERVEGEN_GRID_S / 2, _SERVEGEN_GRID_S)
    grid_s[-1] = end_s
    lam_grid = np.interp(grid_s, mid_s, lam_w)
    cum = np.concatenate([[0.0], np.cumsum(np.diff(grid_s) * (lam_grid[1:] + lam_grid[:-1]) / 2)])
    if cum[-1] <= 0:
        raise TraceError(
            f"servegen: tier {tier} has zero rate over days [{spec.start_day:g}, {spec.start_day + spec.days:g})"
        )
    # Rescale so the expected count equals mean_rps × span. Example: m-small day 0 averages 985 rps,
    # mean_rps 0.8 → factor 8.1e-4 → ~69,100 requests over the day.
    cum *= spec.mean_rps * (end_s - begin_s) / cum[-1]
    # Keep Λ strictly increasing where the rate is zero so the inverse map stays well defined.
    cum += np.arange(len(cum)) * 1e-9
    points: list[np.ndarray] = []
    first_w = int(begin_s // SERVEGEN_WINDOW_S)
    last_w = int(math.ceil(end_s / SERVEGEN_WINDOW_S)) - 1
    for w in range(first_w, last_w + 1):
        lo = max(begin_s, w * SERVEGEN_WINDOW_S)
        hi = min(end_s, (w + 1) * SERVEGEN_WINDOW_S)
        if hi <= lo or lam_w[w] <= 0:
            continue
        op_lo, op_hi = np.interp([lo, hi], grid_s, cum)
        cv = float(np.clip(rates.cv[tier][w], SERVEGEN_CV_MIN, SERVEGEN_CV_MAX))
        pts = _gamma_renewal(rng, op_hi - op_lo, 1.0 / (cv * cv))
        if pts.size:
            points.append(op_lo + pts)
    op = np.concatenate(points) if points else np.empty(0)
    if op.size == 0:
        raise TraceError(f"servegen: no arrivals drawn (mean_rps {spec.mean_rps:g} is too low for the span)")
    arrival = np.interp(op, cum, grid_s) - begin_s
    n = op.size
    prompt = _lognormal_tokens(rng, spec.prompt_tokens_mean, PROMPT_LOG_SIGMA, n)
    output = _lognormal_tokens(rng, spec.output_tokens_mean, OUTPUT_LOG_SIGMA, n)
    return sorted_trace(f"{name}:{tier}", np.maximum(arrival, 0.0), prompt, output, None, MOONCAKE_BLOCK_TOKENS)


def _gamma_renewal(rng: np.random.Generator, length: float, shape: float) -> np.ndarray:
    """Points of a stationary unit-rate Gamma(shape) renewal process on [0, length)."""
    if length <= 0:
        return np.empty(0)
    scale = 1.0 / shape  # mean gap shape × scale = 1
    first = rng.uniform() * rng.gamma(shape + 1.0, scale)
    if first >= length:
        return np.empty(0)
    # Count sd of a renewal process is about CV·√length; draw enough gaps in one go, top up if short.
    chunk = int(length + 6.0 * math.sqrt(max(length, 1.0) / shape) + 16)
    pts = [np.array([first])]
    last = first
    while True:
        more = last + np.cumsum(rng.gamma(shape, scale, chunk))
        pts.append(more)
        if more[-1] >= length:
            break
        last = float(more[-1])
    out = np.concatenate(pts)
    return out[out < length]


def _lognormal_tokens(rng: np.random.Generator, mean: float, sigma: float, n: int) -> np.ndarray:
    # mean of lognormal(mu, sigma) is exp(mu + sigma²/2): mean 1024, sigma 1 → mu = ln 1024 − 0.5 = 6.43.
    mu = math.log(mean) - sigma * sigma / 2
    x = np.rint(rng.lognormal(mu, sigma, n))
    return np.clip(x, 1, LENGTH_CLIP_MULT * mean).astype(np.int64)
