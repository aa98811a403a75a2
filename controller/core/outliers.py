"""Slow and failing replicas: outlier detection against the pool's median, ejection that expires, replacement.

What a slow replica looks like (a degraded GPU, a throttled host, a noisy neighbour): its engine
steps take longer than its own load explains. Each tick, for each replica reporting its own
series (`PoolObservation.replicas`: the mean inter-token latency of its window and its running
batch, from its own /metrics), its *slowness* is

    slowness = measured ITL / the step time its own load explains
    (decode a + b·batch + c·context·batch, the context its sequences hold read from its KV usage,
    stretched by the prompt tokens it computes riding in the steps: `expected_step_s`; the pool's
    calibrated engine figures, perf/)

so a replica running a larger batch, or computing more prefill (a colder cache, a new replica), is not
taken for a slow one, and what every replica of the pool shares (a model the figures miss) cancels in
the comparison below. A replica is an outlier when its slowness is at least `1 + threshold` times the median
slowness of the *other* replicas of its pool (leave-one-out: in a pool of three, the slow one
does not drag the reference up; a replica ejected already is no one's reference while another is
left, so the second of two slow replicas is judged against the healthy ones once the first is out).
Example: figures give 30 ms at a batch of 40; the replica measures 75 ms (2.5); the others 33 and
36 ms at similar batches (1.1, 1.2; median 1.15) → 2.5 / 1.15 = 2.17 ≥ 1.40 (the threshold against
two others, below): an outlier.

Load is not slowness: a surge raises every replica's steps (bigger batches, more prefill riding in
them, or a cost the figures miss that every replica shares), so each is compared with its peers for
the load each runs, never with a fixed expectation or its own history; a pool-wide slowdown leaves
every score near 1 and ejects nobody (tests/core/test_outliers.py).

What matters: a replica is judged an outlier only while its mean step is at least `min_step_slo_frac`
(0.5) of the tightest TPOT SLO among the classes its pool serves (`step_limit_s`). Ejection is there
for its requests' TPOT, and a pool's TPOT p95 runs about twice its replicas' median step (median 2.2×,
p10-p90 1.35-4.1×, over 115 ticks of generated cases 1 and 77 of seed 1 under the MPC): below half the SLO its
requests make their TPOT however much slower than its peers it steps, and ejecting it would only take
capacity. A 15-s window of a lightly loaded replica is noisy too (a few long prompts riding in its
steps lift its mean ITL by half): the false ejections seen before this rule (robustness seed 1, cases
1 and 77: 16 and 31 ms steps against a 100 ms TPOT SLO, in pools of two and five) were all under it.

Like Envoy's outlier detection (its `consecutive_*` detectors and `max_ejection_percent`,
`base_ejection_time`; envoyproxy.io, "Outlier detection"):

- a replica is ejected after `consecutive` ticks in a row as an outlier (one noisy window is
  not enough);
- at most `max_ejection_frac` of a pool's replicas are ejected at once (at least one when the pool
  has two or more: a slow replica's requests miss their TPOT anyway), and never the last serving
  one: if the reference itself is wrong, ejection must not empty a pool. The outliers the cap keeps
  serving count as capacity the pool does not have, like the ejected ones (below). Ejection does not
  wait for the others to have room: with the MPC's stream guard the excess waits at the router in
  priority order, so critical requests go to the healthy replicas first (a check that the others could
  absorb the slow one's share at their own batch cost case 79 of seed 1 five points of critical);
- an ejection expires after `base_ejection_s` × the times that replica has been ejected (capped
  at `max_ejection_s`); the router sends it traffic again, and detection starts over;
- a replica ejected a second time (`replace_after`: slow again once its first ejection expired) is
  replaced (the autoscaler deletes it so its controller makes a new one) when `replace` is on: a
  transient slowdown passes within one ejection, a degraded GPU does not, and a replacement costs a
  start-up's worth of the pool's capacity. As far as the guardrails allow: never more per pool per tick
  than `guards.max_step_down`, never more drains at once than `guards.max_concurrent_drains`
  (counting the drains in progress), never in a pool frozen by an override or while the
  telemetry as a whole is frozen. A replica not replaced (the guardrails' room was used up)
  stays ejected; the replacement is tried again next tick.

The threshold: with the windows a tick reads (60 s of a replica's tokens, hundreds to thousands
of gaps), healthy replicas of one pool sit within ±15 % of each other's slowness in the
simulated fleets (tests/core/test_outliers.py's note); 30 % above a reference known exactly is twice
that spread, and below the mildest slowdown worth acting on (× 1.5: a degraded GPU keeps its share
of traffic, and its requests' TPOT rises by that much). The reference is the median of m other
replicas, as noisy as the replica judged: the sample median's variance is π/2·σ²/m, so the ratio's
spread is σ·√(1 + π/(2m)) and the threshold is `threshold`·√(1 + π/(2m)) (`outlier_threshold`): 0.48
against one other replica, 0.40 against two, 0.37 against three, 0.33 against seven. Against one other at
0.3, of two overloaded 70B replicas of tiers-crash at the same batch (132 and 113 ms a step) the first
scored 1.34 and was ejected: the pool lost half its serving replicas for 120 s.

The planner: an ejected replica (and an outlier the cap keeps serving) is capacity the pool does not
have. `Controller.step` runs the detection before the policy and hands the policy `planning_view`: the
pool less those replicas (its ready count, the estimate's `serving` and `PoolAccount.ejected`, and, for
those not being replaced, the target in force and max_replicas); the policy's replicas then get their
slots back on the target (`with_ejected_slots`), so the replicas it asked for take traffic. A replaced
replica's successor is in the target already (the fleet starts it at the same target; the estimate
counts it starting, cold). Example: 4 ready, r3 ejected → the policy sees 3 and asks for 4 → target 5.
When the ejection expires the pool has one replica more than the policy planned; its own scale-down
rules (the MPC's stabilisation window) take it back.

The state is a frozen value `Controller.step` carries (`ControllerState.outliers`).

Must not: do I/O, read the clock (time is `now_s`), or draw randomness.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from controller.perf.engine_figures import EngineFigures
from controller.perf.figures import figures_for
from controller.types import (
    FleetObservation,
    FleetSpec,
    Override,
    PolicyInput,
    PoolDecision,
    PoolObservation,
    PoolSpec,
    Reading,
    Reason,
)

# A replica that has not reported for this long is forgotten (replaced, drained, or gone).
FORGET_S = 600.0


@dataclass(frozen=True, slots=True)
class OutlierConfig:
    """Outlier detection of slow replicas (module docstring); `enabled` False turns it off."""

    enabled: bool = True
    # an outlier's slowness is at least (1 + threshold) × the others' median, known exactly (`outlier_threshold`
    # widens it for the median's own noise)
    threshold: float = 0.3
    consecutive: int = 2  # ticks in a row as an outlier before ejection
    max_ejection_frac: float = 0.34  # of a pool's replicas with readings, ejected at once
    base_ejection_s: float = 120.0  # × the times ejected (Envoy's base_ejection_time)
    max_ejection_s: float = 600.0
    min_batch: float = 1.0  # a replica decoding fewer requests than this is not judged (no signal)
    # a replica is judged only once its mean step is at least this share of the tightest TPOT SLO its pool
    # serves (module docstring, "What matters")
    min_step_slo_frac: float = 0.5
    replace: bool = True  # replace chronically slow replicas (as far as the guardrails allow)
    # ...once ejected this many times (slow again after an ejection expired): a transient slowdown passes
    # within one ejection, a degraded GPU does not, and a replacement costs a start-up of capacity
    replace_after: int = 2

    def __post_init__(self) -> None:
        for name in ("threshold", "max_ejection_frac", "base_ejection_s", "max_ejection_s", "min_batch",
                     "min_step_slo_frac"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"outliers.{name} must be a finite number >= 0 (got {v!r})")
        if not 0 < self.max_ejection_frac <= 1:
            raise ValueError(f"outliers.max_ejection_frac must be in (0, 1] (got {self.max_ejection_frac!r})")
        if self.threshold <= 0:
            raise ValueError(f"outliers.threshold must be > 0 (got {self.threshold!r})")
        for name in ("consecutive", "replace_after"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"outliers.{name} must be an integer >= 1 (got {v!r})")
        if self.max_ejection_s < self.base_ejection_s:
            raise ValueError(f"outliers.max_ejection_s ({self.max_ejection_s}) must be >= base_ejection_s "
                             f"({self.base_ejection_s})")


def outlier_setting(v: object) -> OutlierConfig | None:
    """An outlier setting as a config gives it: true/false, a mapping of OutlierConfig fields (an unknown
    one named), an OutlierConfig, or None; None when off."""
    if v is None:
        return None
    if isinstance(v, OutlierConfig):
        cfg = v
    elif isinstance(v, bool):
        cfg = OutlierConfig(enabled=v)
    elif isinstance(v, Mapping):
        known = set(OutlierConfig.__dataclass_fields__)
        bad = sorted(set(map(str, v)) - known)
        if bad:
            raise ValueError(f"outliers: unknown field(s) {bad}; valid: {sorted(known)}")
        cfg = OutlierConfig(**{str(k): x for k, x in v.items()})
    else:
        raise ValueError(f"outliers must be true/false or a mapping of OutlierConfig fields (got {v!r})")
    return cfg if cfg.enabled else None


@dataclass(frozen=True, slots=True)
class ReplicaRecord:
    """What the detector remembers of one replica."""

    seen_s: float  # last tick it reported
    strikes: int = 0  # consecutive ticks as an outlier
    ejected_until_s: float | None = None
    times_ejected: int = 0
    replace_asked_s: float | None = None  # when its replacement was put in a decision


@dataclass(frozen=True, slots=True)
class OutlierState:
    replicas: Mapping[tuple[str, str], ReplicaRecord] = field(default_factory=dict)  # (pool, replica id)

    def replaced_since(self, since_s: Mapping[str, float]) -> dict[str, int]:
        """Per pool, replacements this detector ordered at or after `since_s[pool]`."""
        out: dict[str, int] = {}
        for (pool, _), r in self.replicas.items():
            if r.replace_asked_s is not None and pool in since_s and r.replace_asked_s >= since_s[pool]:
                out[pool] = out.get(pool, 0) + 1
        return out

    def ejected(self, now_s: float) -> dict[str, tuple[str, ...]]:
        """Per pool, the replicas ejected at `now_s` (sorted)."""
        out: dict[str, list[str]] = {}
        for (pool, rid), r in self.replicas.items():
            if r.ejected_until_s is not None and now_s < r.ejected_until_s:
                out.setdefault(pool, []).append(rid)
        return {p: tuple(sorted(v)) for p, v in out.items()}


@dataclass(frozen=True, slots=True)
class OutlierResult:
    state: OutlierState
    ejected: Mapping[str, tuple[str, ...]]  # per pool: replicas the router must not send new requests to
    replace: Mapping[str, tuple[str, ...]]  # per pool: replicas the autoscaler replaces this tick
    reasons: tuple[Reason, ...]
    scores: Mapping[str, Mapping[str, float]]  # per pool, per replica: slowness over the others' median
    # per pool, the capacity the ejections take (`planning_view`): ejected replicas the telemetry still counts
    # ready (they take no new requests), and those of them the replica target still counts (not being replaced)
    out_of_service: Mapping[str, int] = field(default_factory=dict)
    in_target: Mapping[str, int] = field(default_factory=dict)


def expected_step_s(fig: EngineFigures, batch: float, context_tokens: float, prefill_tps: float = 0.0) -> float:
    """The mean step time a replica's own load explains: decode a + b·batch + c·context·batch, and the
    prompt tokens it computes at `prefill_tps` a second riding in its steps (chunked prefill): a step of
    t seconds carries prefill_tps·t of them at d each, so t = decode / (1 − d·prefill_tps) (at most 10×:
    a replica that cannot keep up with its prefill is slow for its load, not by its load). Example (70B,
    4×H100-like figures a 25 ms, b 0.1 ms, c 2 ns, d 25 µs): batch 40 of 2,000-token contexts →
    25 + 4 + 0.16 = 29.2 ms; with 8,000 prompt tokens/s computed, 29.2 / (1 − 0.2) = 36.5 ms."""
    decode = fig.a_s + batch * (fig.b_s_per_seq + fig.c_s_per_ctx_token * context_tokens)
    return decode / max(1.0 - fig.d_s_per_prefill_token * max(prefill_tps, 0.0), 0.1)


def _context_tokens(po: PoolObservation) -> float:
    """Mean context of a decoding request: prompt + half the output, from the pool's token and request
    rates (1,000 + 100 when the rates are not read)."""
    arr = po.arrival_rps.value if po.arrival_rps.ok else None
    if arr is None or arr <= 0:
        return 1100.0
    prompt = po.prompt_tokens_rps.value / arr if po.prompt_tokens_rps.ok else 1000.0
    gen = po.generation_tokens_rps.value / arr if po.generation_tokens_rps.ok else 200.0
    return max(prompt, 0.0) + 0.5 * max(gen, 0.0)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def slowness_scores(spec: PoolSpec, po: PoolObservation, min_batch: float = 1.0,
                    fig: EngineFigures | None = None, exclude: frozenset[str] = frozenset()) -> dict[str, float]:
    """Per replica with readings: its slowness over the median slowness of the others (module docstring).
    Replicas without an OK ITL and batch ≥ `min_batch` are left out; a pool with fewer than two such
    replicas gives no scores (in a pool of two, each is judged against the other: the slow one scores
    ≥ 1 + threshold, the other ≤ 1 / (1 + threshold), so which one is slow is not in doubt). The replicas
    in `exclude` (ejected already: judged slow) are scored but are no one's reference while another is left:
    two slow replicas of three would otherwise hold the reference up for each other."""
    fig = fig or figures_for(spec)
    ctx = _context_tokens(po)
    slow: dict[str, float] = {}
    for rid, r in po.replicas.items():
        if not (r.itl_mean_s.ok and r.running.ok) or r.running.value < min_batch or r.itl_mean_s.value <= 0:
            continue
        prefill = r.prefill_tokens_rps.value if r.prefill_tokens_rps.ok else 0.0
        # the context its own sequences hold, from its KV usage (a replica holding the long conversations
        # reads more KV a step); the pool's mean when its KV usage is not read
        own_ctx = r.kv_usage_frac.value * fig.kv_tokens / r.running.value if r.kv_usage_frac.ok else ctx
        slow[rid] = r.itl_mean_s.value / expected_step_s(fig, r.running.value, own_ctx, prefill)
    if len(slow) < 2:
        return {}
    out = {}
    for rid, x in slow.items():
        others = [v for k, v in slow.items() if k != rid and k not in exclude] or \
            [v for k, v in slow.items() if k != rid]
        ref = _median(others)
        out[rid] = x / ref if ref > 0 else math.inf
    return out


def outlier_threshold(config: OutlierConfig, references: int) -> float:
    """The score above 1 an outlier reaches against the median of `references` other replicas (module docstring,
    "The threshold"): `threshold` × √(1 + π / (2·references)), the sample median's own noise added."""
    return config.threshold * math.sqrt(1.0 + math.pi / (2.0 * max(references, 1)))


def _references(scores: Mapping[str, float], rid: str, exclude: list[str]) -> int:
    """How many replicas `slowness_scores` took the median of for `rid`."""
    others = [k for k in scores if k != rid]
    return len([k for k in others if k not in exclude]) or len(others)


def step_limit_s(spec: PoolSpec, fleet: FleetSpec, config: OutlierConfig) -> float | None:
    """The mean step time above which a replica's slowness costs requests their TPOT: `min_step_slo_frac` of
    the tightest TPOT SLO among the classes the pool serves (its tier rule's classes with a share above 0;
    every class without one). None when the fleet has no SLO (every outlier is judged)."""
    barred = {c for c, share in spec.eligible if share <= 0}
    tpots = [s.tpot_s for c, s in fleet.slos.items() if c not in barred]
    return config.min_step_slo_frac * min(tpots) if tpots else None


def _guard_room(pool: str, obs: PoolObservation | None, guards: object, frozen: bool) -> int:
    """Replacements the guardrails allow in `pool` this tick (module docstring)."""
    if frozen:
        return 0
    room = 10**6
    step = getattr(guards, "max_step_down", None)
    if step is not None:
        room = min(room, int(step))
    drains = getattr(guards, "max_concurrent_drains", None)
    if drains is not None:
        draining = obs.replicas_draining.value if obs is not None and obs.replicas_draining.ok else 0.0
        room = min(room, max(int(drains) - int(math.ceil(draining)), 0))
    return room


def _frozen_pools(overrides: tuple[Override, ...], now_s: float) -> set[str]:
    return {o.pool for o in overrides if o.kind in ("freeze", "pin_replicas") and o.active(now_s)}


def detect(state: OutlierState, config: OutlierConfig, fleet: FleetSpec, obs: FleetObservation, now_s: float, *,
           guards: object = None, overrides: tuple[Override, ...] = (), telemetry_frozen: bool = False,
           figures: Mapping[str, EngineFigures] | None = None) -> OutlierResult:
    """One tick of detection, ejection, expiry and replacement (module docstring). Pure."""
    if not config.enabled:
        return OutlierResult(state, {}, {}, (), {})
    records = {k: v for k, v in state.replicas.items() if now_s - v.seen_s <= FORGET_S}
    reasons: list[Reason] = []
    replace_out: dict[str, tuple[str, ...]] = {}
    scores_out: dict[str, dict[str, float]] = {}
    frozen_pools = _frozen_pools(overrides, now_s)
    kept: dict[str, list[str]] = {}  # per pool: outliers due for ejection that the cap keeps serving
    for spec in fleet.pools:
        po = obs.pools.get(spec.name)
        if po is None or not po.replicas:
            continue
        fig = (figures or {}).get(spec.name) or figures_for(spec)
        limit = step_limit_s(spec, fleet, config)
        for rid in po.replicas:  # expiry first: a replica back from an ejection is judged afresh
            rec = replace(records.get((spec.name, rid)) or ReplicaRecord(seen_s=now_s), seen_s=now_s)
            if rec.ejected_until_s is not None and now_s >= rec.ejected_until_s:
                reasons.append(Reason("slow_replica_restored", f"{rid}: its ejection expired; it takes traffic "
                                      "again and is judged afresh", spec.name, {"replica": rid}))
                rec = replace(rec, ejected_until_s=None, strikes=0, replace_asked_s=None)
            records[(spec.name, rid)] = rec
        ejected_now = [rid for rid in po.replicas if _is_ejected(records[(spec.name, rid)], now_s)]
        scores = {} if telemetry_frozen else slowness_scores(spec, po, config.min_batch, fig, frozenset(ejected_now))
        scores_out[spec.name] = {k: round(v, 3) for k, v in scores.items()}
        for rid in po.replicas:
            rec = records[(spec.name, rid)]
            s = scores.get(rid)
            itl = po.replicas[rid].itl_mean_s
            # an outlier among its peers whose steps cost its requests their TPOT (module docstring)
            outlier = s is not None and s >= 1.0 + outlier_threshold(config, _references(scores, rid, ejected_now)) \
                and (limit is None or itl.value >= limit)
            if rec.ejected_until_s is None:
                records[(spec.name, rid)] = replace(rec, strikes=rec.strikes + 1 if outlier else 0)
        found, kept[spec.name] = _eject(spec, po, records, scores, ejected_now, config, now_s)
        reasons += found
        # replacement of the ejected ones not yet asked for, as far as the guardrails allow
        if config.replace and ejected_now:
            asked = _replace(spec, po, records, ejected_now, config, guards, reasons,
                             telemetry_frozen or spec.name in frozen_pools, now_s)
            if asked:
                replace_out[spec.name] = tuple(asked)
    new_state = OutlierState(replicas=records)
    out_of_service, in_target = _capacity_taken(new_state, obs, now_s, kept)
    return OutlierResult(new_state, new_state.ejected(now_s), replace_out, tuple(reasons), scores_out,
                         out_of_service, in_target)


def _eject(spec: PoolSpec, po: PoolObservation, records: dict[tuple[str, str], ReplicaRecord],
           scores: Mapping[str, float], ejected_now: list[str], config: OutlierConfig,
           now_s: float) -> tuple[list[Reason], list[str]]:
    """Eject the pool's due outliers, the slowest first, within its cap (module docstring); `records` and
    `ejected_now` are updated in place. Returns the reasons and the due outliers the cap kept serving."""
    reasons: list[Reason] = []
    kept: list[str] = []
    serving = len(po.replicas)
    cap = max(int(config.max_ejection_frac * serving), 1 if serving >= 2 else 0)
    cap = min(cap, max(serving - 1, 0))  # never the last serving replica
    due = sorted((rid for rid in scores if records[(spec.name, rid)].strikes >= config.consecutive
                  and not _is_ejected(records[(spec.name, rid)], now_s)), key=lambda r: -scores[r])
    for rid in due:
        data = {"replica": rid, "score": round(scores[rid], 3)}
        if len(ejected_now) >= cap:
            reasons.append(Reason("slow_replica_not_ejected", f"{rid} is {scores[rid]:.2f}× the others' "
                                  f"slowness, but {len(ejected_now)} of {serving} replicas are ejected "
                                  f"already (at most {config.max_ejection_frac:.0%}); planned as capacity the "
                                  "pool does not have", spec.name, data))
            kept.append(rid)
            continue
        rec = records[(spec.name, rid)]
        rec = replace(rec, times_ejected=rec.times_ejected + 1, strikes=0)
        dur = _duration(config, rec)
        records[(spec.name, rid)] = replace(rec, ejected_until_s=now_s + dur)
        ejected_now.append(rid)
        reasons.append(Reason("slow_replica", f"{rid}: steps {scores[rid]:.2f}× slower than the other "
                              f"replicas' median for the load it runs, {config.consecutive} ticks in a row; "
                              f"ejected for {dur:.0f} s (no new requests; planned as capacity the pool does "
                              "not have)", spec.name,
                              {**data, "ejected_s": dur, "times_ejected": rec.times_ejected}))
    return reasons, kept


def _replace(spec: PoolSpec, po: PoolObservation, records: dict[tuple[str, str], ReplicaRecord],
             ejected_now: list[str], config: OutlierConfig, guards: object, reasons: list[Reason], frozen: bool,
             now_s: float) -> list[str]:
    """Ask for the replacement of the pool's chronically slow ejected replicas, within the guardrails' room."""
    room = _guard_room(spec.name, po, guards, frozen)
    asked: list[str] = []
    for rid in sorted(ejected_now):
        rec = records[(spec.name, rid)]
        if rec.replace_asked_s is not None or rec.times_ejected < config.replace_after:
            continue
        if len(asked) >= room:
            reasons.append(Reason("slow_replica_replace_held", f"{rid} stays ejected: the guardrails "
                                  "allow no more replacements in this pool now (max_step_down, "
                                  "max_concurrent_drains, a freeze or pin, or frozen telemetry)",
                                  spec.name, {"replica": rid}))
            continue
        records[(spec.name, rid)] = replace(rec, replace_asked_s=now_s)
        asked.append(rid)
        reasons.append(Reason("slow_replica_replace", f"{rid}: replaced (the autoscaler drains it and "
                              "starts a new one)", spec.name, {"replica": rid}))
    return asked


def _capacity_taken(state: OutlierState, obs: FleetObservation, now_s: float,
                    kept: Mapping[str, list[str]]) -> tuple[dict[str, int], dict[str, int]]:
    """Per pool: the ejected replicas its telemetry still counts ready, and those of them its replica target still
    counts (no replacement asked: a replaced one's successor is in the target instead); the outliers the cap
    keeps serving count in both (their requests miss their TPOT: capacity the pool does not have either)."""
    out: dict[str, int] = {p: len(v) for p, v in kept.items() if v}
    held: dict[str, int] = dict(out)
    for (pool, rid), r in state.replicas.items():
        po = obs.pools.get(pool)
        if not _is_ejected(r, now_s) or po is None or rid not in po.replicas:
            continue
        out[pool] = out.get(pool, 0) + 1
        if r.replace_asked_s is None:
            held[pool] = held.get(pool, 0) + 1
    return out, held


def _is_ejected(rec: ReplicaRecord, now_s: float) -> bool:
    return rec.ejected_until_s is not None and now_s < rec.ejected_until_s


def _duration(config: OutlierConfig, rec: ReplicaRecord) -> float:
    return min(config.base_ejection_s * max(rec.times_ejected, 1), config.max_ejection_s)


# --------------------------------------------------------------------------- the capacity an ejection takes


def planning_view(inp: PolicyInput, found: OutlierResult) -> PolicyInput:
    """What the policy plans on while replicas are ejected (module docstring, "The planner:"): the pool without
    them. Its ready count (telemetry and the estimate's `serving`) less the ejected replicas still exporting;
    the target in force, the decision in force and the pool's bounds less those the target still counts (not
    being replaced); the estimate's `PoolAccount.ejected` says how many. `inp` itself when nothing is ejected.

    Example: 4 ready, target 4, r3 ejected → the policy sees 3 ready, a target of 3 and max_replicas − 1; it
    asks for 4 to carry the load, and `with_ejected_slots` makes that 5 (r3 still holds a slot)."""
    gone, held = found.out_of_service, found.in_target
    if not any(gone.values()) and not any(held.values()):
        return inp
    pools_obs = dict(inp.observation.pools)
    for name, k in gone.items():
        po = pools_obs.get(name)
        if po is not None and k > 0 and po.replicas_ready.ok:
            pools_obs[name] = replace(po, replicas_ready=Reading(max(po.replicas_ready.value - k, 0.0)))
    obs = replace(inp.observation, pools=pools_obs)
    est = inp.estimate
    if est is not None:
        accts = {name: replace(a, serving=None if a.serving is None else max(a.serving - gone.get(name, 0), 0),
                               target=None if a.target is None else max(a.target - held.get(name, 0), 0),
                               ejected=gone.get(name, 0))
                 for name, a in est.pools.items()}
        est = replace(est, observation=obs, pools=accts)
    current = inp.current
    if current is not None:
        current = replace(current, pools={n: replace(pd, replicas=max(pd.replicas - held.get(n, 0), 0))
                                          for n, pd in current.pools.items()})
    fleet = replace(inp.fleet, pools=tuple(_without(p, held.get(p.name, 0)) for p in inp.fleet.pools))
    return replace(inp, observation=obs, estimate=est, current=current, fleet=fleet)


def _without(spec: PoolSpec, k: int) -> PoolSpec:
    """A pool's bounds less `k` slots its ejected replicas hold (a pool with a floor keeps one replica)."""
    if k <= 0:
        return spec
    lo = max(spec.min_replicas - k, min(spec.min_replicas, 1))
    return replace(spec, min_replicas=lo, max_replicas=max(spec.max_replicas - k, lo))


def with_ejected_slots(pools: Mapping[str, PoolDecision], found: OutlierResult,
                       fleet: FleetSpec) -> dict[str, PoolDecision]:
    """The policy's replicas (planned without the ejected ones) plus the slots the ejected replicas still hold in
    the pool's target, at most the pool's max_replicas: the replicas asked for take traffic."""
    out = dict(pools)
    for spec in fleet.pools:
        k = found.in_target.get(spec.name, 0)
        pd = pools.get(spec.name)
        if k > 0 and pd is not None:
            out[spec.name] = replace(pd, replicas=min(pd.replicas + k, max(spec.max_replicas, pd.replicas)))
    return out
