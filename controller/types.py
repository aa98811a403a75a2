"""Values that cross a boundary: observations in, decisions out, the policy contract.

Everything here is a frozen dataclass or a Protocol. No I/O, no clock, no
defaults that depend on the environment. Units live in names (_s, _rps, _frac,
_usd, _tokens).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import numpy as np

PRIORITY_CLASSES: tuple[str, ...] = ("critical", "standard", "sheddable")
"""Tenant priority classes, most protected first."""


class Mode(StrEnum):
    ACTIVE = "active"  # decisions are sent to the actuators
    SHADOW = "shadow"  # decisions are computed and recorded, nothing is sent
    PAUSED = "paused"  # no decisions are made


class SignalStatus(StrEnum):
    OK = "ok"
    MISSING = "missing"  # the series is absent (no target, no samples in the window)
    NAN = "nan"  # the series exists but its value is NaN (e.g. histogram_quantile of nothing)
    STALE = "stale"  # the newest sample is older than the staleness limit


@dataclass(frozen=True, slots=True)
class Reading:
    """One telemetry value and how much it can be trusted.

    A missing or stale series is a Reading, never an exception: the core decides
    what to do with it (DESIGN.md §5).
    """

    value: float
    status: SignalStatus = SignalStatus.OK
    age_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status is SignalStatus.OK

    def or_default(self, default: float) -> float:
        return self.value if self.ok else default

    @staticmethod
    def of(value: float | None, age_s: float = 0.0, stale_after_s: float = math.inf) -> Reading:
        """Classify a raw value: None → MISSING, NaN → NAN, too old → STALE."""
        if value is None:
            return Reading(math.nan, SignalStatus.MISSING, age_s)
        if math.isnan(value):
            return Reading(math.nan, SignalStatus.NAN, age_s)
        if age_s > stale_after_s:
            return Reading(value, SignalStatus.STALE, age_s)
        return Reading(float(value), SignalStatus.OK, age_s)

    @staticmethod
    def missing() -> Reading:
        return Reading(math.nan, SignalStatus.MISSING)


MISSING = Reading.missing()


# --------------------------------------------------------------------------- fleet spec


@dataclass(frozen=True, slots=True)
class SloSpec:
    """Latency budget of one priority class (TTFT: time to first token; TPOT: time per output token)."""

    ttft_s: float
    tpot_s: float


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """What the controller knows statically about one pool of identical replicas."""

    name: str
    model: str
    sku: str
    engine: str = "vllm"  # vllm | sglang
    gpus_per_replica: int = 1
    usd_per_replica_hour: float = 0.0
    min_replicas: int = 0
    max_replicas: int = 64
    startup_warm_s: float = 30.0
    startup_cold_s: float = 180.0
    role: str = "mixed"  # mixed | prefill | decode
    group: str = "default"  # route group: pools that can serve the same traffic
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    # Tier rule: (class, share of that class's tasks this pool may serve) for the classes limited
    # below 1; empty: every class. The router splits only eligible traffic by traffic_weight
    # (controller/sim/router.py; docs/SIMULATOR.md "pools").
    eligible: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class FleetSpec:
    pools: tuple[PoolSpec, ...]
    slos: Mapping[str, SloSpec]

    def pool(self, name: str) -> PoolSpec:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)


# --------------------------------------------------------------------------- observations


@dataclass(frozen=True, slots=True)
class ReplicaObservation:
    """One replica's own engine series over the window (what outlier detection compares,
    controller/core/outliers.py). The replica id is what its telemetry target names it: the discovery
    label `replica` when there is one, else the engine's address (host:port)."""

    replica: str
    itl_mean_s: Reading = MISSING  # mean inter-token latency (its decode step time, with the chunks it carries)
    running: Reading = MISSING  # requests in its running batch
    prefill_tokens_rps: Reading = MISSING  # prompt tokens it computes (not served from its prefix cache), per second
    kv_usage_frac: Reading = MISSING  # its KV-cache usage, 0..1 (with its batch: the context its sequences hold)


@dataclass(frozen=True, slots=True)
class PoolObservation:
    """Windowed telemetry of one pool (rates and quantiles over the last window)."""

    pool: str
    replicas_ready: Reading = MISSING  # replicas exporting engine metrics
    replicas_starting: Reading = MISSING  # from the autoscaler's state, when known
    replicas_draining: Reading = MISSING
    arrival_rps: Reading = MISSING  # requests/s sent to the pool
    running: Reading = MISSING  # sum of requests in running batches
    waiting: Reading = MISSING  # sum of requests queued in the engines
    kv_usage_frac: Reading = MISSING  # mean KV-cache usage, 0..1
    hit_rate: Reading = MISSING  # prefix-cache hit rate (tokens), 0..1
    ttft_p50_s: Reading = MISSING
    ttft_p95_s: Reading = MISSING
    tpot_p50_s: Reading = MISSING  # inter-token latency (ITL): the gap between successive tokens
    tpot_p95_s: Reading = MISSING  # ITL p95 (chunked-prefill steps push it above the request's mean TPOT)
    request_tpot_p95_s: Reading = MISSING  # p95 of each finished request's mean TPOT: what a TPOT SLO judges
    prompt_tokens_rps: Reading = MISSING
    generation_tokens_rps: Reading = MISSING
    preemptions_rps: Reading = MISSING
    gpu_util_frac: Reading = MISSING  # DCGM GPU utilisation, 0..1
    gpu_mem_used_frac: Reading = MISSING  # DCGM framebuffer used / (used + free) of the pool's fullest GPU, 0..1
    # per replica, its own series (empty when the source reads the pool only, as PromQL aggregates do)
    replicas: Mapping[str, ReplicaObservation] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ClassObservation:
    """Router-side telemetry of one priority class."""

    priority_class: str
    arrival_rps: Reading = MISSING
    admitted_rps: Reading = MISSING
    shed_rps: Reading = MISSING
    queue_depth: Reading = MISSING  # requests held at the router
    ttft_p95_s: Reading = MISSING
    tpot_p95_s: Reading = MISSING
    retry_rps: Reading = MISSING


@dataclass(frozen=True, slots=True)
class StepProfile:
    """The measured step profile of one priority class (or tenant): how many steps its tasks run and what a step
    costs at each index, from the picker's task book (controller/dataplane/task_book.py) or the simulator's tasks.

    `tasks[n]` is the share of tasks that ran n + 1 steps (the last entry: that many or more); `tokens[s]` the mean
    tokens (prompt + output) of a step at index s (the last entry: that index or later), the work a step sinks
    into its task. Same length, at least 1. Example: tasks (0.5, 0.5), tokens (1000, 3000): half the tasks run
    one step, half two; a second step costs 3,000 tokens and carries the 1,000 of the first.
    """

    tasks: tuple[float, ...]
    tokens: tuple[float, ...]
    count: int = 0  # tasks measured
    # the share of the class's arriving steps at each index, as measured (shedding first steps raises the first
    # one's: the dropped tasks' later steps never arrive); empty: the tasks' own (those that reach each index)
    requests: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.tasks or len(self.tasks) != len(self.tokens) or (self.requests and
                                                                     len(self.requests) != len(self.tasks)):
            raise ValueError(f"StepProfile: tasks, tokens (and requests, if given) must have the same length >= 1 "
                             f"(got {len(self.tasks)}, {len(self.tokens)} and {len(self.requests)})")
        if self.requests and sum(self.requests) <= 0:
            raise ValueError(f"StepProfile.requests: no step at all (got {self.requests})")
        for name, vals in (("tasks", self.tasks), ("tokens", self.tokens), ("requests", self.requests)):
            if any(not (math.isfinite(v) and v >= 0) for v in vals):
                raise ValueError(f"StepProfile.{name}: every value must be a finite number >= 0 (got {vals})")
        if sum(self.tasks) <= 0:
            raise ValueError(f"StepProfile.tasks: no task at all (got {self.tasks})")


@dataclass(frozen=True, slots=True)
class TaskProfile:
    """What the data plane measured of tasks, steps and tenants over its window: the step profile per class
    (classes without labelled tasks left out) and each tenant's tokens per second (prompt + output). Empty
    (no classes, no tenants) where no request carried a task id: the planner then weighs steps statically."""

    classes: Mapping[str, StepProfile] = field(default_factory=dict)
    tenant_tokens_rps: Mapping[str, float] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.classes and not self.tenant_tokens_rps


class PoolPhases(Protocol):
    """One pool as the autoscaler reports it: its replicas per phase. The actuation adapters'
    `PoolStateView` and the simulator's `PoolState` both are one."""

    @property
    def ready(self) -> int: ...

    @property
    def starting(self) -> int: ...

    @property
    def draining(self) -> int: ...


@dataclass(frozen=True, slots=True)
class FleetObservation:
    at_s: float
    pools: Mapping[str, PoolObservation]
    classes: Mapping[str, ClassObservation] = field(default_factory=dict)
    source: str = ""
    errors: tuple[str, ...] = ()  # transport/parse problems seen while reading

    @property
    def all_stale(self) -> bool:
        """True when no pool has a single fresh core signal and the router reports no fresh class
        arrivals or holds either: the controller must freeze. A router that still counts traffic
        while every pool reads missing is what a fleet scaled to zero looks like from Prometheus
        (no engine exports a series), so that is not frozen: the policies hold pools whose
        signals are missing, and the MPC starts a replica for a route group serving nothing."""
        for p in self.pools.values():
            for r in (p.replicas_ready, p.arrival_rps, p.ttft_p95_s, p.running, p.waiting):
                if r.ok:
                    return False
        for c in self.classes.values():
            for r in (c.arrival_rps, c.queue_depth):
                if r.ok:
                    return False
        return True


# --------------------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class ClassAdmission:
    """Router admission for one priority class."""

    rate_limit_rps: float = 0.0  # 0 = unlimited
    queue_budget: int = -1  # max requests held at the router; -1 = unlimited
    shed_frac: float = 0.0  # fraction of arrivals rejected at once (HTTP 429)


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """Router limits for one tenant (the request's fairness id; "*" = every tenant not named)."""

    rate_limit_rps: float = 0.0  # requests per second; 0 = unlimited
    max_inflight: int = 0  # requests in flight at the replicas or held; 0 = unlimited
    weight: float = 1.0  # share of the token-weighted fair share of held requests


@dataclass(frozen=True, slots=True)
class PoolDecision:
    replicas: int
    warm_standby: int = 0
    inflight_cap: int = 0  # per replica, enforced by the router on standard/sheddable (critical passes); 0 = no cap
    traffic_weight: float = 1.0  # share of the route group's traffic
    prefix_weight: float = 3.0  # router scorer weights (cache affinity is prefix_weight)
    queue_weight: float = 2.0
    kv_weight: float = 2.0
    max_num_seqs: int = 0  # engine batch cap; 0 = leave unchanged
    max_num_batched_tokens: int = 0  # 0 = leave unchanged
    # slow replicas (controller/core/outliers.py): the router sends them no new requests while ejected;
    # the autoscaler replaces those in `replace` (drains the replica; its controller starts a new one)
    ejected: tuple[str, ...] = ()
    replace: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Reason:
    """A machine-readable reason attached to a decision."""

    code: str  # e.g. "slo_breach", "scale_down_stabilised", "override_pin", "missing_data_hold"
    message: str
    pool: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decision:
    decision_id: str
    generation: int
    at_s: float
    valid_until_s: float
    pools: Mapping[str, PoolDecision]
    admission: Mapping[str, ClassAdmission] = field(default_factory=dict)
    reasons: tuple[Reason, ...] = ()
    # tenant → limits the router applies while the decision is valid; a tenant left out keeps the router's own
    tenants: Mapping[str, TenantLimits] = field(default_factory=dict)
    # step-aware admission at the router; None: the router's own setting
    step_aware: bool | None = None


@dataclass(frozen=True, slots=True)
class Override:
    """An operator override, active while created_s <= now < expires_s."""

    override_id: str
    # pin_replicas | min_replicas | max_replicas | freeze | admission | slo_ttft | slo_tpot | profile | reliability
    # | tenant_rate_limit | tenant_max_inflight | tenant_weight (text: the tenant) | step_admission (text: aware|blind)
    kind: str
    value: float = 0.0
    pool: str = ""
    priority_class: str = ""
    text: str = ""
    author: str = ""
    reason: str = ""
    created_s: float = 0.0
    expires_s: float = math.inf

    def active(self, now_s: float) -> bool:
        return self.created_s <= now_s < self.expires_s


# --------------------------------------------------------------------------- policy contract


@dataclass(frozen=True, slots=True)
class BreakerAction:
    """Constraints the cascading-failure breaker (core/breaker.py) sets this tick (empty when closed):
    the planner plans within them, and `Controller.step` applies them to every policy's output."""

    min_replicas: Mapping[str, int] = field(default_factory=dict)
    max_prefix_weight: Mapping[str, float] = field(default_factory=dict)
    protect_streams: bool = False  # cap in-flight per replica at the SLO-safe batch (pools in `pools`)
    pools: tuple[str, ...] = ()  # the pools the breaker acts on
    min_shed: Mapping[str, float] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return bool(self.min_replicas or self.max_prefix_weight or self.protect_streams or self.min_shed or self.pools)


@dataclass(frozen=True, slots=True)
class BreakerSignals:
    """What a policy's own estimator tells the breaker (see `update_breaker`); None = not known."""

    lost: Mapping[str, int] | None = None  # per pool: replacements the fleet started that nobody ordered
    carried: bool | None = None  # the fleet carries the load it admits now


@dataclass(frozen=True, slots=True)
class PoolAccount:
    """One pool's replicas as the core's estimator accounts for them (controller/core/estimate.py)."""

    etas: tuple[float, ...] = ()  # absolute times the starting replicas should be ready
    warm: tuple[float, ...] = ()  # times replicas were drained (their slots stay warm for a while)
    serving: int | None = None  # ready + starting after this tick's accounting
    target: int | None = None  # the target in force at this tick
    unordered: int = 0  # replicas the fleet started this tick that nobody ordered (crash replacements)
    # old-cap replicas still to be replaced by a rolling restart a batch-cap change set off (their surge
    # replicas are started by the fleet, warm, and are not losses)
    rollout_left: int = 0
    rollout_seen_s: float = -math.inf  # the caps change or the latest surge replica seen
    prompt_tokens: float | None = None  # mean prompt tokens per request (EWMA of windowed rates)
    output_tokens: float | None = None  # mean output tokens per request
    # (running, waiting) at the first tick, where the telemetry windows begin: the requests in flight whose
    # tokens a warming window counts without their arrivals (controller/core/estimate.py, the token mix)
    first_in_flight: tuple[float, float] | None = None
    caps: tuple[int, int] | None = None  # the engine batch caps last decided (max_num_seqs, max_num_batched_tokens)
    # ready replicas ejected as slow (no new requests: controller/core/outliers.py), left out of `serving` and of
    # the telemetry's ready count in the view a policy plans on (`planning_view`); 0 in the core's own accounting
    ejected: int = 0


@dataclass(frozen=True, slots=True)
class FleetEstimate:
    """What the controller takes the fleet to be at `at_s`, built once a tick by the core's estimator
    (controller/core/estimate.py) and read by the breaker and every policy (`PolicyInput.estimate`)."""

    at_s: float
    observation: FleetObservation  # telemetry with the autoscaler's replica phases merged in
    scaled_to_zero: tuple[str, ...] = ()  # pools read as 0 ready because the autoscaler reports no replica
    pools: Mapping[str, PoolAccount] = field(default_factory=dict)  # the replica accounting, per pool
    carried: bool | None = None  # the fleet carries the load it admits now (None: not known)
    # demand history: fleet demand (req/s, retries excluded) per tick for the forecasters, and the class mix
    demand_rps: float | None = None  # this tick's (None: no reading)
    t_hist: tuple[float, ...] = ()
    demand_hist: tuple[float, ...] = ()
    class_share: Mapping[str, float] = field(default_factory=dict)
    first_s: float | None = None  # the first tick's time
    warming: bool = False  # the telemetry windows still cover less than the warm-up since the first tick
    # what the policy decided this tick, for the next tick's accounting: the batch caps it set per pool
    # (a change sets off a rolling restart) and the replicas it says each pool needs now
    decided_caps: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    needs: Mapping[str, int] = field(default_factory=dict)
    # tasks, steps and tenants as the data plane measured them (None: nobody measured them, or no task labelled)
    tasks: TaskProfile | None = None


@dataclass(frozen=True, slots=True)
class PolicyInput:
    now_s: float
    observation: FleetObservation
    fleet: FleetSpec
    current: Decision | None  # what is in force (last decision applied), None at start
    overrides: tuple[Override, ...] = ()
    profile: str = "balanced"
    tick_s: float = 15.0
    breaker: BreakerAction = field(default_factory=BreakerAction)  # the breaker's constraints this tick
    estimate: FleetEstimate | None = None  # the core's estimate this tick (None: driven without a Controller)
    # the newest active `reliability` override (the MPC's dial, controller/core/objective.py); None: none set
    reliability: float | None = None


@dataclass(frozen=True, slots=True)
class PoolGauges:
    """Per-pool figures a policy planned with that the daemon exports as metrics (None: not known this tick)."""

    gpu_mem_free_bytes: float | None = None  # framebuffer free on the pool's fullest GPU
    batch_tokens_ceiling: float | None = None  # the highest max_num_batched_tokens that memory allows


@dataclass(frozen=True, slots=True)
class PolicyStatus:
    """What a policy reports beside its decision for `governor status` and the daemon's metrics, typed, so
    the edges render it without knowing the policy (the free-form `PolicyOutput.diagnostics` is the
    explain record). Example (the MPC): lines (("planner.model", "prior: QueueingPrior"), ...),
    candidates 4000, budget_cut False."""

    lines: tuple[tuple[str, str], ...] = ()  # (key, text) rows of `governor status`, in order
    pools: Mapping[str, PoolGauges] = field(default_factory=dict)
    candidates: int | None = None  # plans a planner's search scored this tick (None: no search)
    budget_cut: bool = False  # the search stopped at its budget


@dataclass(frozen=True, slots=True)
class PolicyOutput:
    pools: Mapping[str, PoolDecision]
    admission: Mapping[str, ClassAdmission] = field(default_factory=dict)
    reasons: tuple[Reason, ...] = ()
    diagnostics: Mapping[str, Any] = field(default_factory=dict)  # predictions, objective terms, binding constraints
    confidence: float | None = None  # the policy's model confidence, 0..1 (None: it reports none)
    status: PolicyStatus = field(default_factory=PolicyStatus)  # typed, for status and metrics
    needs: Mapping[str, int] = field(default_factory=dict)  # replicas each pool needs now, by the policy's model
    tenants: Mapping[str, TenantLimits] = field(default_factory=dict)  # tenant limits at the router (none: its own)
    step_aware: bool | None = None  # step-aware admission at the router (None: its own setting)


class Policy(Protocol):
    """A planner: the first policy, the baselines and the MPC all implement this.

    Pure: state in, state out; time arrives in PolicyInput.now_s; randomness only
    from the Generator passed in.
    """

    name: str

    def initial_state(self) -> Any: ...

    def decide(self, state: Any, inp: PolicyInput, rng: np.random.Generator) -> tuple[Any, PolicyOutput]: ...
