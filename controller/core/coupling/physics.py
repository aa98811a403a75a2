"""Step-time physics of the replica types, tabulated for the priors: `PoolPhysics` (one replica
type), `Calibration` (its two fitted knobs) and `PhysicsTable` (several stacked for per-row gathers),
with the piecewise-linear table reads the priors use.

The values are built at the edge (controller/learning/physics.py). Must not: compute step times
itself, do I/O or import the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

# Token counts at which a pool's step time is tabulated (log-spaced; linear between points,
# linear extrapolation past the last one).
TOKEN_GRID = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384], dtype=float)


@dataclass(frozen=True)
class PoolPhysics:
    """Step-time physics of one replica type (model × SKU × TP), tabulated on TOKEN_GRID.

    decode_step_s[i]: a step with TOKEN_GRID[i] decoding sequences and no context (weights,
      LM head, per-sequence overhead); prefill_step_s[i]: a step computing TOKEN_GRID[i] prompt
      tokens, no attention. Context and attention are linear terms on top:
      decode: + decode_ctx_s_per_token × Σ context; prefill: + prefill_attn_s_per_work ×
      Σ chunk × (context before + chunk / 2).
    Example (Llama-3-8B, A100, TP1): decode 64 seqs = 32 ms, + 64 × 2,000 context tokens × 92 ns
    = 44 ms; prefill 2,048 tokens = 145 ms.
    """

    key: str  # "llama-3-8b/a100-80gb/tp1"
    decode_step_s: tuple[float, ...]
    prefill_step_s: tuple[float, ...]
    decode_ctx_s_per_token: float
    prefill_attn_s_per_work: float
    kv_capacity_tokens: float  # per replica
    mixed_seq_s: float = 0.0  # extra time per decoding sequence in a step that also prefills
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192

    def __post_init__(self) -> None:
        for name in ("decode_step_s", "prefill_step_s"):
            v = getattr(self, name)
            if len(v) != len(TOKEN_GRID) or not all(math.isfinite(x) and x > 0 for x in v):
                raise ValueError(f"PoolPhysics({self.key}).{name}: need {len(TOKEN_GRID)} finite positive "
                                 f"step times on TOKEN_GRID, got {v!r}")
        for name in ("decode_ctx_s_per_token", "prefill_attn_s_per_work", "mixed_seq_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"PoolPhysics({self.key}).{name} = {v!r} must be finite and >= 0")
        if not (self.kv_capacity_tokens >= 1):
            raise ValueError(f"PoolPhysics({self.key}).kv_capacity_tokens = {self.kv_capacity_tokens!r} must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (list(getattr(self, f.name)) if isinstance(getattr(self, f.name), tuple)
                         else getattr(self, f.name)) for f in fields(self)}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> PoolPhysics:
        known = {f.name for f in fields(PoolPhysics)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"PoolPhysics: unknown field(s) {sorted(unknown)}")
        kw = dict(d)
        for name in ("decode_step_s", "prefill_step_s"):
            kw[name] = tuple(float(x) for x in kw[name])
        return PoolPhysics(**kw)


@dataclass(frozen=True)
class Calibration:
    """Two physical knobs of the prior, fitted per replica type before the residual correction.

    time_scale multiplies every step time (the calibrated kernels are off by a stack-dependent
    factor on a real fleet); wait_scale multiplies the queueing wait (bursty arrivals queue more
    than Poisson, closed-loop clients — the next turn waits for the last answer — queue less).
    Both are 1 in the uncalibrated prior and stay within [0.2, 5]. ttft_tail_width stretches the
    log-spread of the TTFT distribution the p95 is read from (the traffic's prompt-length tail and
    the queueing spread are wider or narrower than the prior's lognormal); 1 in the prior,
    within [0.5, 2].
    """

    time_scale: float = 1.0
    wait_scale: float = 1.0
    ttft_tail_width: float = 1.0

    def __post_init__(self) -> None:
        for name in ("time_scale", "wait_scale"):
            v = getattr(self, name)
            if not (math.isfinite(v) and 0.05 <= v <= 20.0):
                raise ValueError(f"Calibration.{name} = {v!r} must be within [0.05, 20]")
        if not (math.isfinite(self.ttft_tail_width) and 0.5 <= self.ttft_tail_width <= 2.0):
            raise ValueError(f"Calibration.ttft_tail_width = {self.ttft_tail_width!r} must be within [0.5, 2]")


class PhysicsTable:
    """Several PoolPhysics stacked so that per-row lookups are array gathers (calibration applied)."""

    def __init__(self, physics: Sequence[PoolPhysics], calibration: Mapping[str, Calibration] | None = None) -> None:
        if not physics:
            raise ValueError("PhysicsTable: need at least one PoolPhysics")
        self.physics = tuple(physics)
        self.keys = tuple(p.key for p in physics)
        cal = [(calibration or {}).get(p.key, Calibration()) for p in physics]
        ts = np.array([c.time_scale for c in cal], dtype=float)
        self.wait = np.array([c.wait_scale for c in cal], dtype=float)
        self.tail = np.array([c.ttft_tail_width for c in cal], dtype=float)
        self.decode = np.array([p.decode_step_s for p in physics], dtype=float) * ts[:, None]
        self.prefill = np.array([p.prefill_step_s for p in physics], dtype=float) * ts[:, None]
        self.decode_flat = self.decode.ravel()
        self.prefill_flat = self.prefill.ravel()
        # per grid segment [2^i, 2^(i+1)): y = a_i + s_i·x (the last segment extends past the grid)
        self.decode_seg = _segments(self.decode)
        self.prefill_seg = _segments(self.prefill)
        self.ctx = np.array([p.decode_ctx_s_per_token for p in physics], dtype=float) * ts
        self.attn = np.array([p.prefill_attn_s_per_work for p in physics], dtype=float) * ts
        self.kv = np.array([p.kv_capacity_tokens for p in physics], dtype=float)
        self.seq = np.array([p.mixed_seq_s for p in physics], dtype=float) * ts
        self.max_num_seqs = np.array([p.max_num_seqs for p in physics], dtype=float)
        self.max_num_batched_tokens = np.array([p.max_num_batched_tokens for p in physics], dtype=float)

    def index(self, key: str) -> int:
        try:
            return self.keys.index(key)
        except ValueError:
            raise KeyError(f"no physics for {key!r}; known: {list(self.keys)}") from None


def _segments(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(intercepts, slopes) raveled like the table: segment i of a row is y = a_i + s_i·x."""
    g = TOKEN_GRID
    slope = np.zeros_like(table)
    slope[:, :-1] = np.diff(table, axis=1) / np.diff(g)[None, :]
    slope[:, -1] = slope[:, -2]
    inter = table - slope * g[None, :]
    return inter.ravel(), slope.ravel()


def interp_seg(seg: tuple[np.ndarray, np.ndarray], base: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per-row piecewise-linear table read: the segment is the binary exponent of x (np.frexp),
    then y = a + s·x. x < 1 reads as 1; past the grid the last segment extends. Example: x = 300
    → segment 8 ([256, 512)). Same values as interp_rows, fewer array passes."""
    x = np.maximum(x, 1.0)
    _, e = np.frexp(x)
    e -= 1
    np.minimum(e, len(TOKEN_GRID) - 2, out=e)
    idx = base + e
    y: np.ndarray = np.take(seg[1], idx)
    y *= x
    y += np.take(seg[0], idx)
    return y


def interp_rows(flat: np.ndarray, base: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per-row linear interpolation over TOKEN_GRID (powers of two) at x; x < 1 reads as 1, linear
    past the end. `flat` is a PhysicsTable's (n_physics × G) table raveled, `base` = row × G.

    The grid index is the binary exponent (np.frexp), not a search: TOKEN_GRID[i] = 2**i, so
    x = 300 → i = 8 (256), frac = 300 / 256 − 1 = 0.17.
    """
    x = np.maximum(x, 1.0)
    _, e = np.frexp(x)
    e -= 1
    np.minimum(e, len(TOKEN_GRID) - 2, out=e)
    frac = x / np.ldexp(1.0, e)
    frac -= 1.0
    idx = base + e
    y0 = np.take(flat, idx)
    d: np.ndarray = np.take(flat, idx + 1)
    d -= y0
    d *= frac
    d += y0
    return d


def interp_rows_slope(flat: np.ndarray, base: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """As interp_rows, also returning the segment's slope (for the Newton steps of the prior)."""
    x = np.maximum(x, 1.0)
    _, e = np.frexp(x)
    i = np.minimum(e - 1, len(TOKEN_GRID) - 2)
    g0 = np.ldexp(1.0, i)
    idx = base + i
    y0 = np.take(flat, idx)
    slope = (np.take(flat, idx + 1) - y0) / g0
    return y0 + (x - g0) * slope, slope


assert np.array_equal(TOKEN_GRID, 2.0 ** np.arange(len(TOKEN_GRID))), "TOKEN_GRID must be 1, 2, 4, ... (frexp lookup)"
