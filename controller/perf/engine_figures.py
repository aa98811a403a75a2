"""The planner's compact step-time model of one replica: `EngineFigures`, t = a + b·seqs + c·Σcontext +
d·prefill tokens + e·attention work, with the replica's KV capacity in tokens.

Where a pool's figures come from (the fitted table, the roofline prior, a guess from the name) is
controller/perf/figures.py; the roofline that computes them from shapes and data sheets is
controller/perf/roofline.py. Pure values: must not read files, the clock or randomness.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineFigures:
    """Step-time model of one replica: t = a + b·seqs + c·Σcontext + d·prefill tokens + e·attention work."""

    a_s: float  # fixed cost per step (weights read, launch)
    b_s_per_seq: float  # per decoding sequence
    c_s_per_ctx_token: float  # per context token of the decoding sequences (KV read)
    d_s_per_prefill_token: float
    e_s_per_attn_work: float  # per unit of Σ chunk × (context before + chunk / 2)
    kv_tokens: float  # KV cache per replica, tokens
    source: str = "profile"

    def __post_init__(self) -> None:
        for f in ("a_s", "b_s_per_seq", "c_s_per_ctx_token", "d_s_per_prefill_token", "e_s_per_attn_work",
                  "kv_tokens"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"EngineFigures.{f} must be a finite number >= 0 (got {v!r})")
        if self.a_s <= 0 or self.kv_tokens <= 0:
            raise ValueError(f"EngineFigures: a_s and kv_tokens must be > 0 (got {self.a_s}, {self.kv_tokens})")

    @staticmethod
    def of(v: EngineFigures | Mapping[str, float]) -> EngineFigures:
        if isinstance(v, EngineFigures):
            return v
        if not isinstance(v, Mapping):
            raise ValueError(f"engine figures must be EngineFigures or a mapping (got {type(v).__name__})")
        allowed = set(EngineFigures.__dataclass_fields__)
        unknown = sorted(set(v) - allowed)
        if unknown:
            raise ValueError(f"engine figures: unknown field(s) {unknown}; allowed: {sorted(allowed)}")
        missing = sorted(allowed - {"source"} - set(v))
        if missing:
            raise ValueError(f"engine figures: missing field(s) {missing}")
        numbers = {k: float(x) for k, x in v.items() if k != "source"}
        source = str(v["source"]) if "source" in v else EngineFigures.source  # else the field's default
        return EngineFigures(**numbers, source=source)


def engine_figures_in_units(a_ms: float, b_ms: float, c_ns: float, d_us: float, e_ps: float,
                            kv: float) -> EngineFigures:
    """EngineFigures from the table's units: ms, ms per sequence, ns per context token, µs per prefill
    token, ps per unit of attention work, KV tokens."""
    return EngineFigures(a_ms * 1e-3, b_ms * 1e-3, c_ns * 1e-9, d_us * 1e-6, e_ps * 1e-12, kv, "profile")
