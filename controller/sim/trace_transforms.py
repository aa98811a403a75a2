"""Trace transforms, in `load_trace`'s order: window, compress (time_scale), scale_rate, surge, mix
shift, and synthetic prefixes for traces without their own block ids (the workload adds per-tenant
surges with `add_surge_where`).

Each returns a new `Trace` (or the same one when it does nothing); every random choice uses the
Generator passed in. Must not: read files or know any format.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from controller.sim.scenario import MixShiftSpec, SurgeSpec, SyntheticPrefixSpec
from controller.sim.trace_types import FreshIds, Trace, TraceError


def _take(trace: Trace, idx: np.ndarray, arrival_s: np.ndarray | None = None) -> Trace:
    arrival = trace.arrival_s[idx] if arrival_s is None else arrival_s
    hashes = tuple(trace.block_hashes[i] for i in idx) if trace.block_hashes is not None else None
    return Trace(
        name=trace.name,
        arrival_s=np.ascontiguousarray(arrival, dtype=np.float64),
        prompt_tokens=np.ascontiguousarray(trace.prompt_tokens[idx]),
        output_tokens=np.ascontiguousarray(trace.output_tokens[idx]),
        block_hashes=hashes,
        hash_block_tokens=trace.hash_block_tokens,
    )


def window(trace: Trace, start_s: float, duration_s: float | None, source: str = "trace") -> Trace:
    """Keep arrivals in [start_s, start_s + duration_s) and shift them so start_s becomes 0."""
    if start_s <= 0 and duration_s is None:
        return trace
    end_s = math.inf if duration_s is None else start_s + duration_s
    lo, hi = np.searchsorted(trace.arrival_s, [start_s, end_s], side="left")
    if hi <= lo:
        raise TraceError(
            f"{source}: trace.start_s/duration_s: window [{start_s:g}, {end_s:g}) s holds no requests; "
            f"the trace spans [0, {trace.duration_s:g}] s"
        )
    idx = np.arange(lo, hi)
    return _take(trace, idx, trace.arrival_s[idx] - start_s)


def compress(trace: Trace, time_scale: float) -> Trace:
    """arrival_s / time_scale: 24 turns 86,400 s into 3,600 s and multiplies every rate by 24."""
    if time_scale == 1.0:
        return trace
    return _take(trace, np.arange(len(trace)), trace.arrival_s / time_scale)


def scale_rate(trace: Trace, rate_scale: float, rng: np.random.Generator, source: str = "trace") -> Trace:
    """Multiply the arrival rate by `rate_scale`.

    < 1: keep each request independently with probability rate_scale (thinning keeps the rate
    shape and the length mix). > 1: every request gets floor(rate_scale − 1) copies plus one more
    with probability frac(rate_scale − 1) — e.g. 2.5 gives each request 1 or 2 copies, 1.5 on
    average — placed by `_add_copies`.
    """
    if rate_scale == 1.0:
        return trace
    if rate_scale < 1.0:
        keep = np.flatnonzero(rng.random(len(trace)) < rate_scale)
        if keep.size == 0:
            raise TraceError(f"{source}: trace.rate_scale: {rate_scale:g} thinned every request away")
        return _take(trace, keep)
    return _add_copies(trace, np.full(len(trace), rate_scale - 1.0), rng)


def surge_multiplier(t_s: np.ndarray, surge: SurgeSpec) -> np.ndarray:
    """Rate multiplier at times t_s: 1 outside [at_s, at_s + duration_s); inside, it ramps linearly
    from 1 to `factor` over the first ramp_s seconds and holds. Example: at 100, factor 5, ramp 60,
    duration 240 → ×3 at t = 130, ×5 from 160 to 340, ×1 from 340."""
    t = np.asarray(t_s, dtype=np.float64)
    inside = (t >= surge.at_s) & (t < surge.at_s + surge.duration_s)
    ramp = np.ones_like(t) if surge.ramp_s <= 0 else np.clip((t - surge.at_s) / surge.ramp_s, 0.0, 1.0)
    return np.where(inside, 1.0 + (surge.factor - 1.0) * ramp, 1.0)


def add_surge(trace: Trace, surge: SurgeSpec, rng: np.random.Generator) -> Trace:
    """Add copies of requests arriving in the surge so the local rate is multiplied by `surge_multiplier`."""
    extra = surge_multiplier(trace.arrival_s, surge) - 1.0
    if not np.any(extra > 0):
        return trace
    return _add_copies(trace, extra, rng)


def add_surge_where(trace: Trace, surge: SurgeSpec, mask: np.ndarray,
                    rng: np.random.Generator) -> tuple[Trace, np.ndarray]:
    """`add_surge` for the requests where `mask` holds (one tenant's): returns the new trace and, per
    request of it, the index of its source request in `trace` (copies name their original)."""
    extra = np.where(mask, surge_multiplier(trace.arrival_s, surge) - 1.0, 0.0)
    if not np.any(extra > 0):
        return trace, np.arange(len(trace))
    return _add_copies_src(trace, extra, rng)


def mix_shift(trace: Trace, spec: MixShiftSpec, rng: np.random.Generator, source: str = "trace") -> Trace:
    """Resample each request's (prompt, output) pair so the mix moves as `spec` says (see MixShiftSpec).

    The halves split at the median of prompt/output (ties by index, so they are equal in size);
    arrivals are kept. Example: prefill_heavy_frac 0.2 at 0 s and 0.8 at 3,600 s → at 1,800 s half
    the requests carry a pair from the prefill-heavy half."""
    if trace.block_hashes is not None:
        raise TraceError(f"{source}: trace.mix_shift: the trace has its own hash_ids; resampled lengths would "
                         "not match them (use a trace without hash ids, with trace.prefixes)")
    n = len(trace)
    if n < 2:
        raise TraceError(f"{source}: trace.mix_shift needs at least 2 requests")
    ratio = trace.prompt_tokens / np.maximum(trace.output_tokens, 1)
    order = np.argsort(ratio, kind="stable")
    decode_heavy, prefill_heavy = order[: n // 2], order[n // 2:]
    frac = np.interp(trace.arrival_s, spec.at_s, spec.prefill_heavy_frac)
    heavy = rng.random(n) < frac
    pick = np.where(heavy, prefill_heavy[rng.integers(0, len(prefill_heavy), n)],
                    decode_heavy[rng.integers(0, len(decode_heavy), n)])
    return Trace(trace.name, trace.arrival_s, np.ascontiguousarray(trace.prompt_tokens[pick]),
                 np.ascontiguousarray(trace.output_tokens[pick]), None, trace.hash_block_tokens)


def _add_copies(trace: Trace, extra: np.ndarray, rng: np.random.Generator) -> Trace:
    return _add_copies_src(trace, extra, rng)[0]


def _add_copies_src(trace: Trace, extra: np.ndarray, rng: np.random.Generator) -> tuple[Trace, np.ndarray]:
    """Request i gets floor(extra_i) copies, plus one with probability frac(extra_i).

    A copy keeps the original's token counts and lands uniformly in the original's neighbourhood
    cell (half-way to the previous and next arrivals), so bursts stay bursts and the local rate
    is multiplied by 1 + extra. Example: arrivals 10.0, 10.2, 11.0 → a copy of the middle one
    lands in [10.1, 10.6).

    Prefix blocks of a copy: ids that another request of the source trace also has (system
    prompts, earlier turns of the conversation) are kept; ids only this request has (its new
    content) are replaced by fresh ids, so a copy is another user's request with the same shared
    context, not a repeat that would hit the cache on its own content.
    """
    base = np.floor(extra).astype(np.int64)
    counts = base + (rng.random(len(extra)) < (extra - base)).astype(np.int64)
    src = np.repeat(np.arange(len(trace)), counts)
    if src.size == 0:
        return trace, np.arange(len(trace))
    t = trace.arrival_s
    lo_cell = np.concatenate([[t[0]], (t[:-1] + t[1:]) / 2])
    hi_cell = np.concatenate([(t[:-1] + t[1:]) / 2, [t[-1]]])
    copy_t = lo_cell[src] + rng.random(src.size) * (hi_cell[src] - lo_cell[src])
    hashes = None
    if trace.block_hashes is not None:
        all_ids = np.fromiter(itertools.chain.from_iterable(trace.block_hashes), dtype=np.int64)
        ids, uses = np.unique(all_ids, return_counts=True)
        shared = set(ids[uses >= 2].tolist())
        fresh = FreshIds(trace.block_hashes)
        copies = []
        for i in src.tolist():
            h = trace.block_hashes[i]
            copies.append(tuple(b if b in shared else fresh.next() for b in h))
        hashes = trace.block_hashes + tuple(copies)
    arrival = np.concatenate([t, copy_t])
    order = np.argsort(arrival, kind="stable")  # originals first at equal times
    all_src = np.concatenate([np.arange(len(trace)), src])[order]
    merged = Trace(
        name=trace.name,
        arrival_s=np.ascontiguousarray(arrival[order]),
        prompt_tokens=np.ascontiguousarray(trace.prompt_tokens[all_src]),
        output_tokens=np.ascontiguousarray(trace.output_tokens[all_src]),
        block_hashes=tuple(hashes[i] for i in order) if hashes is not None else None,
        hash_block_tokens=trace.hash_block_tokens,
    )
    return merged, all_src


def add_synthetic_prefixes(
    trace: Trace, spec: SyntheticPrefixSpec, rng: np.random.Generator, source: str = "trace"
) -> Trace:
    """Give a trace without hash ids block ids with shared prefixes.

    Each request draws a group g with Zipf popularity P(g) ∝ (g + 1)^-zipf_a over `groups`
    groups (64 groups, a = 1.2: group 0 gets ~29% of requests, group 63 ~0.2%). Its first
    floor(min(prefix_tokens, prompt_tokens) / B) blocks are the group's shared blocks (ids
    g·P + k, P = prefix_tokens // B); the rest of its ceil(prompt_tokens / B) blocks get unique
    ids above every group id. Only full blocks are shared: a 700-token prompt with a 1024-token
    group prefix and B = 512 shares 1 block, and its partial second block is its own.
    """
    b = trace.hash_block_tokens
    per_group = spec.prefix_tokens // b
    if spec.prefix_tokens > 0 and per_group == 0:
        raise TraceError(
            f"{source}: trace.prefixes.prefix_tokens ({spec.prefix_tokens}) is below trace.hash_block_tokens ({b}): "
            f"no whole block could be shared"
        )
    weights = (np.arange(spec.groups) + 1.0) ** -spec.zipf_a
    group = rng.choice(spec.groups, size=len(trace), p=weights / weights.sum())
    n_blocks = -(-trace.prompt_tokens // b)
    n_shared = np.minimum(spec.prefix_tokens, trace.prompt_tokens) // b
    n_own = n_blocks - n_shared
    own_start = spec.groups * per_group + np.concatenate([[0], np.cumsum(n_own)[:-1]])
    hashes = tuple(
        tuple(range(g * per_group, g * per_group + s)) + tuple(range(o, o + k))
        for g, s, o, k in zip(group.tolist(), n_shared.tolist(), own_start.tolist(), n_own.tolist(), strict=True)
    )
    return Trace(trace.name, trace.arrival_s, trace.prompt_tokens, trace.output_tokens, hashes, b)
