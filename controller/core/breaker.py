"""The cascading-failure breaker: see replica loss turn into a cache and latency collapse, respond as a unit.

The pattern (DESIGN.md §7): replicas are lost → their caches go with them → the rerouted load
lands on cold caches, the hit rate collapses, prefill work and latency jump, clients retry
and add load, more replicas tip over. The breaker watches for it in telemetry alone:

  loss      replicas of a pool vanished: the fleet started replacements nobody ordered (the
            caller counts them: `lost`), or — when the starting count is not known — ready
            replicas fell with no drain and no lower target in the window; at least
            max(loss_min, loss_frac × target) within `loss_window_s`;
  symptoms  the pool's hit rate fell ≥ hit_drop_frac below its baseline, or a protected
            class's (critical, standard) p95 TTFT/TPOT rose above its SLO (or ≥
            latency_rise × its baseline), or client retries not caused by shedding rose above
            retry_rise_rps + baseline. Only the latency symptoms keep it open: a smaller
            fleet may keep a lower hit rate, and shedding itself causes retries.

It trips (phase "open") when a loss is followed by a symptom within `suspect_s`, or at once
when a loss takes ≥ `big_loss_frac` of the pool — or, with no loss, on overload: a protected
class late while a pool's engine queue holds ≥ `overload_waiting_per_replica` requests per
ready replica or its batches run at ≥ `overload_batch_frac` of max_num_seqs (or clients
retry), `overload_ticks` ticks in a row (a surge sets off the same
cascade: full batches slow every stream, requests time out and retry). While open it hands the planner
constraints, all at once:

  replacements   the pool's replica floor is its target before the loss (replacements start
                 now and are never traded away for cost while the fleet is hurt);
  spread         the cache-affinity (prefix) weight is capped low, so the moved prefixes are
                 spread by load instead of piling onto the first replica that caches them;
                 the cap is raised step by step while recovering (a ramp, not a jump);
  protect        a ceiling on the in-flight cap per replica (the batch at which TPOT p95 stays
                 within the tightest SLO, computed by the policy from its model), so running
                 streams keep their pace and the excess waits at the router (critical passes
                 the cap: see controller/sim/router.py, protos/governor/v1/control.proto);
  shed           a floor on the sheddable class's shed fraction (stage 2: 0.5, stage 3: 1.0);
                 the standard class only at stage 3 and only while critical is still late.

Stages: 3 = open and critical still late, 2 = open, 1 = recovering (ramp), 0 = closed.
Escalation from 2 to 3 when critical p95 stays above its SLO for `escalate_s`; relaxation
one stage per `stable_s` of no symptoms (recovering → closed after the ramp), but not below
stage 2 while a hit pool serves fewer replicas than before its loss (calm then is the
shedding's doing, not the fleet's). The latency symptoms are 60 s-window p95s, which still hold a
drained backlog's requests for up to a minute: while open after a loss, they do not count when the
caller says the fleet carries the load it admits now (`carried`: the replicas its load needs are ready
and no queue stands). Not after an overload trip: there the calm may be the shedding's doing (the need
the caller compares with counts only the admitted load), while after a loss stage 2 already holds
until the lost replicas are back. A loss counts as big against the replicas serving before
it when the pool was still scaling up (3 of 7 serving with a target of 11 is big). The state is a
frozen value the controller carries (`ControllerState.breaker`); `BreakerState.status()` is what
status and metrics export.

Where it runs: `Controller.step`, before the policy, for every policy (a guardrail, never
bypassed: DESIGN §7), configured on the Controller (`Controller(breaker=...)`; None only for the
bench's hindsight schedules, yardsticks rather than controllers). A policy with its own estimator tells it what it
knows (`BreakerSignals`: replicas lost, load carried; without one the loss is inferred from ready
replicas); the constraints reach the policy in `PolicyInput.breaker` (the MPC plans within them),
and `apply_breaker` holds every proposal to them before the other guards run.

Must not: do I/O, read the clock (time is `now_s`), or decide anything beyond the constraints
above (the planner chooses within them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from controller.core.estimate import target_in_force
from controller.core.guards import override_bounds
from controller.types import (
    PRIORITY_CLASSES,
    BreakerAction,
    BreakerSignals,
    ClassAdmission,
    FleetObservation,
    FleetSpec,
    Override,
    PolicyInput,
    PoolDecision,
    Reading,
    Reason,
)

CLOSED, OPEN, RECOVERING = "closed", "open", "recovering"
SHED_SLACK = 1e-3  # shed fractions are sent with three decimals
PROTECTED = PRIORITY_CLASSES[:2]  # critical, standard: the classes whose lateness keeps the breaker open


@dataclass(frozen=True)
class BreakerConfig:
    enabled: bool = True
    loss_frac: float = 0.2
    loss_min: int = 1
    big_loss_frac: float = 0.3
    loss_window_s: float = 60.0
    suspect_s: float = 90.0
    hit_drop_frac: float = 0.25
    latency_rise: float = 1.5
    retry_rise_rps: float = 0.5
    escalate_s: float = 30.0
    stable_s: float = 45.0
    baseline_alpha: float = 0.1  # EWMA weight of a new sample in the baselines (closed phase only)
    spread_prefix_weight: float = 1.0  # affinity ceiling while open
    ramp_prefix_weight: float = 2.0  # affinity ceiling while recovering
    shed_stage2: float = 0.5
    shed_stage3: float = 1.0
    standard_shed_stage3: float = 0.3
    overload_waiting_per_replica: float = 8.0  # queued requests per ready replica that mean "swamped"
    overload_batch_frac: float = 0.8  # ...or running batches this close to max_num_seqs
    overload_ticks: int = 2
    # count replica losses from the estimate's accounting (replacements the fleet started that nobody
    # ordered, core/estimate.py) rather than from drops in ready replicas; on under the MPC (whose
    # figures were measured so), off for the others (a change to their figures, to be measured first)
    count_replacements: bool = False

    def __post_init__(self) -> None:
        for name in ("loss_frac", "big_loss_frac", "hit_drop_frac", "baseline_alpha", "shed_stage2", "shed_stage3",
                     "standard_shed_stage3"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0):
                raise ValueError(f"breaker.{name} must be in [0, 1] (got {v!r})")
        for name in ("loss_window_s", "suspect_s", "escalate_s", "stable_s", "latency_rise", "spread_prefix_weight",
                     "ramp_prefix_weight", "retry_rise_rps"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"breaker.{name} must be a finite number >= 0 (got {v!r})")
        if not (isinstance(self.loss_min, int) and self.loss_min >= 1):
            raise ValueError(f"breaker.loss_min must be an integer >= 1 (got {self.loss_min!r})")


DEFAULT_BREAKER = BreakerConfig()  # what every policy runs under unless its controller is given another


def breaker_setting(v: bool | Mapping[str, Any] | BreakerConfig | None) -> BreakerConfig | None:
    """A breaker setting as a config gives it: true/false (the default breaker, on or off), a mapping of
    BreakerConfig fields, a BreakerConfig, or None (no breaker at all: the bench's yardsticks)."""
    if v is None or isinstance(v, BreakerConfig):
        return v
    if isinstance(v, Mapping):
        return BreakerConfig(**dict(v))
    if isinstance(v, bool):
        return BreakerConfig(enabled=v)
    raise ValueError(f"breaker must be true/false or a mapping of BreakerConfig fields (got {v!r})")


@dataclass(frozen=True)
class PoolWatch:
    """What the breaker remembers about one pool."""

    last_ready: int | None = None
    last_target: int | None = None
    losses: tuple[tuple[float, int], ...] = ()  # (t, replicas lost) inside the loss window
    loss_seen_s: float | None = None  # time of the latest qualifying loss
    pre_loss_target: int = 0
    hit_baseline: float | None = None
    pre_loss_ready: int = 0  # replicas serving just before the latest loss (what must come back)


@dataclass(frozen=True)
class BreakerState:
    phase: str = CLOSED
    stage: int = 0
    since_s: float = 0.0
    tripped_at_s: float | None = None
    trigger: str = ""
    pools_hit: tuple[str, ...] = ()
    calm_since_s: float | None = None
    late_since_s: float | None = None
    trips: int = 0
    watch: Mapping[str, PoolWatch] = field(default_factory=dict)
    ttft_baseline: Mapping[str, float] = field(default_factory=dict)
    tpot_baseline: Mapping[str, float] = field(default_factory=dict)
    retry_baseline: float | None = None
    floors: Mapping[str, int] = field(default_factory=dict)
    overload_ticks: int = 0

    def status(self) -> BreakerStatus:
        """The breaker as status/metrics show it."""
        return BreakerStatus(phase=self.phase, stage=self.stage, since_s=self.since_s, tripped_at_s=self.tripped_at_s,
                             trigger=self.trigger, pools=tuple(self.pools_hit), trips=self.trips,
                             replica_floors=dict(self.floors))


@dataclass(frozen=True, slots=True)
class BreakerStatus:
    """The breaker as `governor status`, the metrics and the tick record show it."""

    phase: str
    stage: int
    since_s: float | None
    tripped_at_s: float | None
    trigger: str
    pools: tuple[str, ...]
    trips: int
    replica_floors: Mapping[str, int]

    def to_dict(self) -> dict[str, Any]:
        """The tick record's form (diagnostics["breaker"])."""
        return {"phase": self.phase, "stage": self.stage, "since_s": self.since_s, "tripped_at_s": self.tripped_at_s,
                "trigger": self.trigger, "pools": list(self.pools), "trips": self.trips,
                "replica_floors": dict(self.replica_floors)}

    def lines(self) -> tuple[tuple[str, str], ...]:
        """Its rows of `governor status`."""
        return (("breaker.phase", self.phase), ("breaker.stage", str(self.stage)), ("breaker.trigger", self.trigger),
                ("breaker.pools", str(list(self.pools))), ("breaker.trips", str(self.trips)))


def _ok(r: Reading) -> float | None:
    return float(r.value) if r.ok and math.isfinite(r.value) else None


def _watch_pools(state: BreakerState, cfg: BreakerConfig, now_s: float, observation: FleetObservation,
                 fleet: FleetSpec, targets: Mapping[str, int], lost: Mapping[str, int] | None
                 ) -> tuple[dict[str, PoolWatch], list[str], bool, list[str]]:
    """Each pool's watch brought up to date (losses inside the window, the hit-rate baseline): (watch, pools
    with a loss this tick, whether a loss is big, pools whose hit rate dropped)."""
    lost_map = lost  # (the name `lost` is reused below for the count inside the loss window)
    watch = dict(state.watch)
    losses_now: list[str] = []
    big = False
    hit_drop: list[str] = []
    for spec in fleet.pools:
        name = spec.name
        obs = observation.pools.get(name)
        w = watch.get(name, PoolWatch())
        ready = _ok(obs.replicas_ready) if obs is not None else None
        target = int(targets.get(name, w.last_target if w.last_target is not None else 0))
        hit = _ok(obs.hit_rate) if obs is not None else None
        losses = tuple((t, n) for t, n in w.losses if now_s - t < cfg.loss_window_s)
        loss_seen = w.loss_seen_s
        pre = w.pre_loss_target
        pre_ready = w.pre_loss_ready
        starting = _ok(obs.replicas_starting) if obs is not None else None
        if lost_map is not None and starting is not None:
            if lost_map.get(name, 0) > 0:
                losses = losses + ((now_s, int(lost_map[name])),)
        elif ready is not None and w.last_ready is not None:
            drop = w.last_ready - int(round(ready))
            draining = _ok(obs.replicas_draining) if obs is not None else None
            planned = (w.last_target is not None and target < w.last_target) or (draining or 0) > 0
            if drop > 0 and not planned:
                losses = losses + ((now_s, drop),)
        lost_n = sum(n for _, n in losses)
        # A crash leaves the target as it was: the size the pool should have. While the pool is still
        # scaling up, the replicas that were serving are the base the loss is measured against
        # (measured against the target, losing 3 of 7 serving replicas with the target at 11 is
        # 27 %, not 43 %: not "big", though the pool lost almost half of what served).
        # (Only for "big": detection keeps the target as its base, and one replica is never big, so a
        # small bursty pool whose accounting misses one start does not trip it.)
        ref = max(target, 1)
        ref_big = max(min(target, w.last_ready) if w.last_ready is not None and w.last_ready > 0 else target, 1)
        if lost_n >= max(cfg.loss_min, cfg.loss_frac * ref):
            if loss_seen is None or now_s - loss_seen >= cfg.loss_window_s:
                pre = max(target, (w.last_target or 0))
                pre_ready = w.last_ready or 0
            loss_seen = now_s
            losses_now.append(name)
            if lost_n >= cfg.big_loss_frac * ref or (lost_n >= 2 and lost_n >= cfg.big_loss_frac * ref_big):
                big = True
        baseline = w.hit_baseline
        if hit is not None and baseline is not None and baseline > 0.05 and hit < baseline * (1 - cfg.hit_drop_frac):
            hit_drop.append(name)
        if hit is not None and state.phase == CLOSED and not losses:
            baseline = hit if baseline is None else (1 - cfg.baseline_alpha) * baseline + cfg.baseline_alpha * hit
        watch[name] = PoolWatch(last_ready=int(round(ready)) if ready is not None else w.last_ready,
                                last_target=target, losses=losses, loss_seen_s=loss_seen, pre_loss_target=pre,
                                hit_baseline=baseline, pre_loss_ready=pre_ready)

    return watch, losses_now, big, hit_drop


def _symptoms(state: BreakerState, cfg: BreakerConfig, observation: FleetObservation, fleet: FleetSpec
              ) -> tuple[list[str], bool, dict[str, float], dict[str, float], float, bool, float | None]:
    """Latency and retry symptoms per class (router view), and the baselines they update: (late classes,
    critical over its SLO, TTFT and TPOT baselines, retries/s, retries risen, retry baseline)."""
    late: list[str] = []
    critical_late = False
    ttft_b, tpot_b = dict(state.ttft_baseline), dict(state.tpot_baseline)
    retries = 0.0
    have_retry = False
    for c, co in observation.classes.items():
        slo = fleet.slos.get(c)
        ttft, tpot = _ok(co.ttft_p95_s), _ok(co.tpot_p95_s)
        r = _ok(co.retry_rps)
        if r is not None:
            retries += max(r - (_ok(co.shed_rps) or 0.0), 0.0)  # retries of shed requests are ours
            have_retry = True
        if c not in PROTECTED:
            continue
        over = False
        if slo is not None:
            if ttft is not None and (ttft > slo.ttft_s or (c in ttft_b and ttft > cfg.latency_rise * ttft_b[c]
                                                           and ttft > 0.5 * slo.ttft_s)):
                over = True
            if tpot is not None and (tpot > slo.tpot_s or (c in tpot_b and tpot > cfg.latency_rise * tpot_b[c]
                                                           and tpot > 0.5 * slo.tpot_s)):
                over = True
        if over:
            late.append(c)
            if c == PRIORITY_CLASSES[0]:
                critical_late = critical_late or (
                    slo is not None and ((ttft or 0) > slo.ttft_s or (tpot or 0) > slo.tpot_s))
        if state.phase == CLOSED and not over:
            a = cfg.baseline_alpha
            if ttft is not None:
                ttft_b[c] = ttft if c not in ttft_b else (1 - a) * ttft_b[c] + a * ttft
            if tpot is not None:
                tpot_b[c] = tpot if c not in tpot_b else (1 - a) * tpot_b[c] + a * tpot
    retry_b = state.retry_baseline
    retry_rise = have_retry and retry_b is not None and retries > retry_b + cfg.retry_rise_rps
    if have_retry and state.phase == CLOSED and not retry_rise:
        retry_b = retries if retry_b is None else (1 - cfg.baseline_alpha) * retry_b + cfg.baseline_alpha * retries
    return late, critical_late, ttft_b, tpot_b, retries, retry_rise, retry_b


def _swamped(cfg: BreakerConfig, observation: FleetObservation, fleet: FleetSpec) -> list[str]:
    """The pools whose engines queue or run near-full batches (the overload trigger's second half)."""
    swamped = []
    for spec in fleet.pools:
        po = observation.pools.get(spec.name)
        if po is None:
            continue
        ready, waiting, running = _ok(po.replicas_ready), _ok(po.waiting), _ok(po.running)
        queued = ready and waiting is not None and waiting / ready >= cfg.overload_waiting_per_replica
        full = ready and running is not None and running / ready >= cfg.overload_batch_frac * spec.max_num_seqs
        if queued or full:
            swamped.append(spec.name)
    return swamped


def _action(cfg: BreakerConfig, phase: str, stage: int, trigger: str, pools_hit: tuple[str, ...],
            watch: Mapping[str, PoolWatch], critical_late: bool) -> tuple[dict[str, int], BreakerAction]:
    """The constraints of the breaker's phase and stage: replica floors, affinity ceiling, stream protection, shed
    floors (none when closed)."""
    floors: dict[str, int] = {}
    action = BreakerAction()
    if phase != CLOSED:
        for name in pools_hit:
            hit_watch = watch.get(name)
            if hit_watch is not None and hit_watch.pre_loss_target > 0:
                floors[name] = hit_watch.pre_loss_target
        cap_pw = cfg.spread_prefix_weight if phase == OPEN else cfg.ramp_prefix_weight
        shed: dict[str, float] = {}
        if stage >= 2:
            shed["sheddable"] = cfg.shed_stage3 if stage >= 3 else cfg.shed_stage2
        if stage >= 3 and critical_late:
            shed["standard"] = cfg.standard_shed_stage3
        spread = {} if trigger.startswith("overload") else dict.fromkeys(pools_hit, cap_pw)  # no cache was lost
        action = BreakerAction(min_replicas=floors, max_prefix_weight=spread, protect_streams=stage >= 2,
                               min_shed=shed, pools=tuple(pools_hit))
    return floors, action


def update_breaker(state: BreakerState, cfg: BreakerConfig, *, now_s: float, observation: FleetObservation,
                   fleet: FleetSpec, targets: Mapping[str, int],
                   lost: Mapping[str, int] | None = None,
                   carried: bool | None = None) -> tuple[BreakerState, BreakerAction, list[str]]:
    """Advance the breaker one tick. `targets`: the replica target in force per pool; `lost`: per
    pool, replacements the fleet started this tick that nobody ordered (None: infer from ready);
    `carried`: the caller's judgement that the fleet carries the load it admits now (the replicas
    its load needs are ready and no queue stands): while open after a loss, a p95 over its SLO is
    then the window's memory of a drained backlog, not a symptom (None: unknown, latency counts).

    Returns (new state, constraints for the planner, notes on what changed: human-readable).
    """
    if not cfg.enabled:
        return state, BreakerAction(), []
    notes: list[str] = []
    watch, losses_now, big, hit_drop = _watch_pools(state, cfg, now_s, observation, fleet, targets, lost)

    late, critical_late, ttft_b, tpot_b, retries, retry_rise, retry_b = _symptoms(state, cfg, observation, fleet)
    if carried and state.phase != CLOSED and not state.trigger.startswith("overload"):
        late, critical_late = [], False
    symptoms = bool(hit_drop or late or retry_rise)
    suspects = [n for n, w in watch.items() if w.loss_seen_s is not None and now_s - w.loss_seen_s < cfg.suspect_s]

    phase, stage, since = state.phase, state.stage, state.since_s
    tripped_at, trigger = state.tripped_at_s, state.trigger
    pools_hit, calm_since, late_since, trips = state.pools_hit, state.calm_since_s, state.late_since_s, state.trips
    # Overload, the same cascade without a crash: protected classes late while a pool's queue
    # grows (or clients retry), for `overload_ticks` ticks in a row.
    swamped = _swamped(cfg, observation, fleet)
    overload_now = bool(late) and (bool(swamped) or retry_rise)
    overload_ticks = state.overload_ticks + 1 if overload_now else 0
    if phase == CLOSED:
        if overload_ticks >= cfg.overload_ticks and not suspects:
            phase, stage, since, tripped_at = OPEN, 2, now_s, now_s
            pools_hit = tuple(swamped) or tuple(p.name for p in fleet.pools)
            trigger = (f"overload: p95 latency over SLO for {', '.join(late)} with "
                       + (f"queues building in {', '.join(swamped)}" if swamped else f"retries up to {retries:.2g}/s"))
            calm_since, late_since, trips = None, (now_s if critical_late else None), trips + 1
            notes.append(f"breaker tripped: {trigger}")
            for name in pools_hit:  # overload: hold today's size (no loss to replace)
                w = watch[name]
                watch[name] = PoolWatch(w.last_ready, w.last_target, w.losses, w.loss_seen_s,
                                        max(int(targets.get(name, 0)), w.pre_loss_target if w.loss_seen_s else 0),
                                        w.hit_baseline)
        elif suspects and (symptoms or big):
            why = []
            if big:
                why.append("large replica loss")
            if hit_drop:
                why.append(f"hit-rate drop in {', '.join(hit_drop)}")
            if late:
                why.append(f"p95 latency over SLO for {', '.join(late)}")
            if retry_rise:
                why.append(f"retries up to {retries:.2g}/s")
            phase, stage, since, tripped_at = OPEN, 2, now_s, now_s
            trigger = "replica loss in " + ", ".join(suspects) + ": " + "; ".join(why)
            pools_hit = tuple(suspects)
            calm_since, late_since, trips = None, (now_s if critical_late else None), trips + 1
            notes.append(f"breaker tripped: {trigger}")
    else:
        if losses_now:  # further losses while open: stay (or go back to) open
            if phase == RECOVERING:
                notes.append("breaker re-opened: more replicas lost while recovering")
            phase, stage, since = OPEN, max(stage, 2), now_s if phase != OPEN else since
            pools_hit = tuple(sorted(set(pools_hit) | set(losses_now)))
        if critical_late:
            late_since = late_since if late_since is not None else now_s
            if phase == OPEN and stage < 3 and now_s - late_since >= cfg.escalate_s:
                stage = 3
                notes.append("breaker escalated: critical still late")
        else:
            late_since = None
        if late:
            calm_since = None
        else:
            calm_since = calm_since if calm_since is not None else now_s
            # Calm while shedding is not stable: the open stages hold until the replicas lost are
            # back (ready again at the size that served before the loss), or the calm is only the
            # shedding's doing (closing then would drop the shed onto a pool still short of replicas).
            waiting_for = [n for n in pools_hit if n in watch and watch[n].pre_loss_ready > 0
                           and (watch[n].last_ready or 0) < min(watch[n].pre_loss_ready,
                                                                 watch[n].pre_loss_target or watch[n].pre_loss_ready)]
            if now_s - calm_since >= cfg.stable_s and (stage > 2 or not waiting_for):
                calm_since = now_s  # one relaxation per stable period
                if stage > 1:
                    stage -= 1
                    if stage == 1:
                        phase, since = RECOVERING, now_s
                    notes.append(f"breaker relaxed to stage {stage}")
                else:
                    phase, stage, since = CLOSED, 0, now_s
                    pools_hit = ()
                    notes.append("breaker closed: fleet stable")

    floors, action = _action(cfg, phase, stage, trigger, pools_hit, watch, critical_late)
    new = BreakerState(phase=phase, stage=stage, since_s=since, tripped_at_s=tripped_at, trigger=trigger,
                       pools_hit=pools_hit, calm_since_s=calm_since, late_since_s=late_since, trips=trips,
                       watch=watch, ttft_baseline=ttft_b, tpot_baseline=tpot_b, retry_baseline=retry_b, floors=floors,
                       overload_ticks=overload_ticks)
    return new, action, notes


def breaker_reasons(notes: list[str], state: BreakerState) -> tuple[Reason, ...]:
    """The breaker's notes of this tick as reasons (breaker_open / breaker_recovering / breaker_closed)."""
    out = []
    for n in notes:
        code = "breaker_closed" if "closed" in n else "breaker_recovering" if "relaxed" in n else "breaker_open"
        out.append(Reason(code=code, message=n, pool=None, data=state.status().to_dict()))
    return tuple(out)


def apply_breaker(action: BreakerAction, *, fleet: FleetSpec, pools: Mapping[str, PoolDecision],
                  admission: Mapping[str, ClassAdmission], overrides: tuple[Override, ...],
                  now_s: float) -> tuple[dict[str, PoolDecision], dict[str, ClassAdmission], tuple[Reason, ...]]:
    """A policy's proposal within the breaker's constraints: replica floors (not on a pool the operator
    froze or pinned), the cache-affinity ceiling, the shed floors. The stream-protecting in-flight cap
    needs a latency model (the MPC computes it from its own); it is not applied here. A policy that
    planned within the constraints (the MPC) comes out unchanged.

    Example: floor 6 on pool a, the policy proposes 4 → 6, with a guard_breaker_floor reason.
    """
    out, adm = dict(pools), dict(admission)
    if not action.active:
        return out, adm, ()
    notes: list[Reason] = []
    for spec in fleet.pools:
        pd = out.get(spec.name)
        if pd is None:
            continue
        floor = action.min_replicas.get(spec.name)
        if floor is not None:
            lo, hi, frozen = override_bounds(spec, overrides, now_s)
            held = frozen or lo >= hi  # the operator's count wins over the breaker's floor
            want = min(max(lo, floor), hi)
            if not held and pd.replicas < want:
                notes.append(Reason("guard_breaker_floor", f"raised to {want}: the breaker replaces lost replicas",
                                    pool=spec.name, data={"from": pd.replicas, "to": want}))
                pd = replace(pd, replicas=want)
        cap = action.max_prefix_weight.get(spec.name)
        if cap is not None and pd.prefix_weight > cap:
            notes.append(Reason("guard_breaker_spread", f"cache-affinity weight capped at {cap:g} while the "
                                f"breaker is open", pool=spec.name, data={"from": pd.prefix_weight, "to": cap}))
            pd = replace(pd, prefix_weight=cap)
        out[spec.name] = pd
    for c, shed in action.min_shed.items():
        a = adm.get(c, ClassAdmission())
        if a.shed_frac + SHED_SLACK < shed:  # a planner's rounding of the floor is not a breach
            notes.append(Reason("guard_breaker_shed", f"{c} shed fraction raised to {shed:g} by the breaker",
                                data={"class": c, "from": a.shed_frac, "to": shed}))
            adm[c] = replace(a, shed_frac=shed)
    return out, adm, tuple(notes)


def advance_breaker(state: BreakerState, cfg: BreakerConfig, inp: PolicyInput,
                    signals: BreakerSignals) -> tuple[BreakerState, BreakerAction, list[str]]:
    """`update_breaker` for one controller tick: the targets in force are the decision's (or what the
    fleet runs), what the policy's estimator knows comes in `signals`."""
    targets = {spec.name: target_in_force(inp.current, inp.observation, spec)[0] for spec in inp.fleet.pools}
    return update_breaker(state, cfg, now_s=inp.now_s, observation=inp.observation, fleet=inp.fleet,
                          targets=targets, lost=signals.lost, carried=signals.carried)
