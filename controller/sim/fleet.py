"""The simulated fleet: pools of engines, the router, the autoscaler, failures, clients and tasks.

One discrete-event loop (a heapq of (time, seq, kind, a, b) plus a cursor over the
trace's first steps) drives everything; engines advance in segments (see
engine.py), so an hour of trace is ~10^5 events, not ~10^7 engine steps.

Semantics decided here (docs/SIMULATOR.md carries the same list):

- Lifecycle of a replica: standby → starting → ready → draining → gone. A new
  serving replica promotes a warm-standby replica if one exists (ready
  `startup_warm_s` after it finished loading), else goes on a node slot that
  still has the model's weights (a replica left it within `WARM_NODE_TTL_S`:
  warm start), else starts cold (`startup_cold_s`). Scaling down removes
  starting replicas first (the latest started first), then drains ready ones
  (old engine settings first, then the fewest in flight): a draining replica
  takes no new requests, finishes its running and waiting ones, then is gone and
  its cache with it. Serving, starting, draining and standby replicas all cost
  `tp × $/GPU-hour`; an empty node slot costs nothing.
- Engine caps (`max_num_seqs`, `max_num_batched_tokens`) are a rolling restart
  (maxSurge 1, maxUnavailable 0): one new replica with the new caps is started
  (warm: the weights are on the pool's nodes); when it is ready one old replica is
  drained; repeat. New caches start empty.
- Failures: `crash` kills the engine (in-flight requests fail with 500, its cache
  is lost). The pool's target is unchanged, so, like a ReplicaSet, the fleet
  immediately starts a replacement: warm if a standby exists, else cold (the crash
  takes the pod's local copy of the weights with it). `preempt` (spot) is the same
  but the replica's GPU slot is gone for good: the replacement goes to another slot
  or a new node. `slow` multiplies the replica's step time by `factor` for
  `duration_s`. Faults hit ready replicas, chosen with the seeded generator;
  Poisson faults (`rate_per_hour` per replica) draw their next time with the pool's
  current ready count.
- Clients: a request that has streamed a token and then fails (crash, timeout)
  cannot be retried: it fails and so does its task. A request that failed before
  its first token (500), was shed (429/503, if `retry_on_shed`) or timed out
  before its first token is re-sent after `retry_backoff_s`, at most `max_retries`
  times. `timeout_s` bounds the whole request (send → last token).
- Tasks: step 0 is sent at its trace arrival, step k+1 `think_time_s` after step k
  finished. A task succeeds if every step finished meeting its class's TTFT and TPOT
  SLOs, TTFT measured by the client from the step's first send (retries included),
  TPOT = (last token − first token) / (output tokens − 1). A failed step ends its task.
- Route groups: with one group (the usual case) all traffic goes to it; with
  several, task t goes to group t mod n (groups sorted by name). In a group with
  prefill and decode pools, the first hop is drawn among the prefill (and mixed)
  pools; after prefill the KV moves in prompt_tokens × kv_bytes_per_token × 8 /
  (kv_transfer_gbps × 10^9) seconds (Gbit/s; e.g. Llama-3-8B, 2,000 tokens:
  262 MB over 100 Gbit/s = 21 ms) and a decode pool produces every output token,
  the first one included.
- Prompts longer than max_model_len are served (scenarios that need it assume the
  long-context variant); a request that cannot fit in a replica's whole KV cache
  is rejected (error, not retried).

Must not: read the wall clock, use unseeded randomness, or keep module-level state.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import numpy as np

from controller.jsonsafe import json_safe
from controller.perf.catalogue import MODELS, SKUS
from controller.perf.iteration import IterationModel
from controller.sim.engine import (
    DONE,
    EV_KICK,
    EV_SEG_END,
    FAILED,
    HELD,
    IDLE,
    MODE_DECODE_ONLY,
    MODE_FULL,
    MODE_PREFILL_ONLY,
    RUNNING,
    TRANSFER,
    WAITING,
    Replica,
    Req,
)
from controller.sim.router import PoolRoute, Router
from controller.sim.scenario import AdmissionSpec, PoolSpecModel, Scenario
from controller.sim.stats import NodeStats, ReplicaStats, RouterStats
from controller.sim.workload import Workload, build_workload
from controller.types import PRIORITY_CLASSES

# Weights stay on a node this long after its replica left (the cluster autoscaler's default
# --scale-down-unneeded-time is 10 minutes before an empty node is removed).
WARM_NODE_TTL_S = 600.0
TIMELINE_INTERVAL_S = 10.0
MAX_NUM_SEQS_RANGE = (1, 4096)
MAX_NUM_BATCHED_TOKENS_RANGE = (16, 262144)

# event kinds (1 and 2 are the engine's)
EV_SEND, EV_RETRY, EV_READY, EV_TIMEOUT, EV_HOLD_EXPIRE, EV_TRANSFER, EV_FAULT, EV_SLOW_END, EV_SAMPLE = range(3, 12)

# replica phases
STANDBY, STARTING, READY, DRAINING, GONE = "standby", "starting", "ready", "draining", "gone"
INF = math.inf


# --------------------------------------------------------------------------- values out


@dataclass(frozen=True)
class PoolState:
    pool: str
    target_replicas: int
    ready: int
    starting: int
    draining: int
    standby: int
    max_num_seqs: int
    max_num_batched_tokens: int


@dataclass(frozen=True)
class PoolPoint:
    """One pool in one timeline window (rates over the window, gauges at its end)."""

    replicas_ready: int
    replicas_target: int
    arrival_rps: float
    ttft_p95_s: float  # client TTFT of first tokens in the window; NaN if none
    hit_rate: float  # prefix-cache hits / queries (tokens) in the window; NaN if no queries
    kv_usage_frac: float  # mean over ready replicas
    gpu_busy_frac: float  # engine busy time / (window × replicas up at its end)


@dataclass(frozen=True)
class TimelinePoint:
    t_s: float
    pools: Mapping[str, PoolPoint]
    shed: Mapping[str, int]  # per class, in the window
    cost_usd: float  # accrued so far


@dataclass(frozen=True)
class PoolSummary:
    gpu_hours: float
    cost_usd: float
    usd_per_gpu_hour: float
    replicas_final: int
    replicas_peak: int
    routed_attempts: int  # first-hop attempts routed to this pool (retries included)
    hit_rate: float
    preemptions: int


@dataclass(frozen=True)
class SimSummary:
    scenario: str
    seed: int
    duration_s: float
    requests: int  # requests sent at least once
    completed: int  # requests that streamed their last token
    tasks: int
    successful_tasks: int
    cost_usd: float
    cost_per_successful_task_usd: float
    gpu_hours: float
    slo_attainment: Mapping[str, float]  # per class: succeeded tasks / tasks of the class
    ttft_p50_s: float
    ttft_p95_s: float
    tpot_p50_s: float
    tpot_p95_s: float
    hit_rate: float  # token-weighted over every engine
    shed: int  # rejections (429 + 503), every attempt counted
    failed: int  # requests that finally failed
    retried: int  # re-sent attempts
    timed_out: int  # client timeouts, every attempt counted
    preemptions: int
    scaling_actions: int  # target changes (replicas or warm standby) applied
    per_pool: Mapping[str, PoolSummary] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready: NaN becomes None."""
        return json_safe(asdict(self))


# --------------------------------------------------------------------------- runtime records


class Slot:
    """`tp` GPUs of a node that host one replica at a time."""

    __slots__ = ("node", "gpus", "inst", "warm_until", "gone", "busy_base_s")

    def __init__(self, node: Node, gpus: tuple[int, ...]) -> None:
        self.node = node
        self.gpus = gpus
        self.inst: Inst | None = None
        self.warm_until = -INF
        self.gone = False
        self.busy_base_s = 0.0  # busy seconds of earlier replicas on these GPUs


class Node:
    __slots__ = ("node_id", "stats", "slots")

    def __init__(self, node_id: str, stats: NodeStats, tp: int) -> None:
        self.node_id = node_id
        self.stats = stats
        self.slots = [Slot(self, tuple(range(k * tp, (k + 1) * tp))) for k in range(stats.gpus // tp)]


class Inst:
    """A replica's lifecycle (the engine exists from ready until gone)."""

    __slots__ = ("rid", "seq", "pool", "phase", "since", "engine", "slot", "gen", "caps", "ready_at", "loaded_at",
                 "version", "slow_version")

    def __init__(self, rid: str, seq: int, pool: PoolRT, slot: Slot, gen: int, caps: tuple[int, int],
                 now: float) -> None:
        self.rid = rid
        self.seq = seq  # creation order within the pool
        self.pool = pool
        self.phase = STARTING
        self.since = now
        self.engine: Replica | None = None
        self.slot = slot
        self.gen = gen
        self.caps = caps
        self.ready_at = now
        self.loaded_at = now
        self.version = 0
        self.slow_version = 0


class PoolRT:
    """One pool at run time."""

    def __init__(self, spec: PoolSpecModel, route: PoolRoute) -> None:
        self.spec = spec
        self.name = spec.name
        self.role = spec.role
        self.tp = spec.tp
        self.model = IterationModel.build(spec.model, spec.sku, spec.tp)
        self.arch = MODELS[spec.model]
        self.sku = SKUS[spec.sku]
        self.usd_per_gpu_hour = spec.usd_per_gpu_hour if spec.usd_per_gpu_hour is not None else self.sku.usd_per_gpu_hour
        self.kv_blocks = self.model.kv_capacity_blocks(spec.engine.gpu_memory_utilization, spec.engine.block_size)
        self.fb_used_mib = self.model.fb_used_mib_per_gpu(spec.engine.gpu_memory_utilization)
        self.route = route
        self.target = spec.replicas
        self.standby_target = spec.warm_standby
        self.max_num_seqs = spec.engine.max_num_seqs
        self.max_batched_tokens = spec.engine.max_num_batched_tokens
        self.gen = 0
        self.insts: list[Inst] = []
        self.nodes: list[Node] = []
        self.next_rep = 0
        self.surge: Inst | None = None
        self.gpu_s = 0.0
        self.t_acc = 0.0
        self.billed_gpus = 0
        self.peak_serving = 0
        self.requests = 0
        # counters of engines that are gone (so pool totals survive replica churn)
        self.gone_hits = 0.0
        self.gone_queries = 0.0
        self.gone_busy_s = 0.0
        self.gone_preemptions = 0.0
        # timeline window
        self.win_arrivals = 0
        self.win_ttft: list[float] = []
        self.win_prev = (0.0, 0.0, 0.0)  # hits, queries, busy at the previous sample

    def totals(self) -> tuple[float, float, float, float]:
        """Cumulative (hits, queries, busy_s, preemptions) over every engine this pool ever ran."""
        h, q, b, pr = self.gone_hits, self.gone_queries, self.gone_busy_s, self.gone_preemptions
        for i in self.insts:
            e = i.engine
            if e is not None:
                s = e.stats
                h += s.prefix_cache_hits
                q += s.prefix_cache_queries
                b += s.busy_s
                pr += s.num_preemptions
        return h, q, b, pr


class _Group:
    __slots__ = ("name", "first", "decode")

    def __init__(self, name: str, first: list[PoolRoute], decode: list[PoolRoute]) -> None:
        self.name = name
        self.first = first
        self.decode = decode


# --------------------------------------------------------------------------- the fleet


class Fleet:
    """A simulated fleet driven by a scenario. Not thread-safe: callers serialise access."""

    timeline_interval_s: float = TIMELINE_INTERVAL_S

    def __init__(self, scenario: Scenario, *, seed: int | None = None, workload: Workload | None = None,
                 record_requests: bool = True) -> None:
        self.scenario = scenario
        self.seed = int(scenario.seed if seed is None else seed)
        ss = np.random.SeedSequence(self.seed)
        w_ss, r_ss, f_ss = ss.spawn(3)
        self.workload = workload if workload is not None else build_workload(scenario, np.random.default_rng(w_ss))
        self._fault_rng = np.random.default_rng(f_ss)
        self.router = Router(np.random.default_rng(r_ss))
        self.record_requests = record_requests
        self.now_s = 0.0
        self._heap: list = []
        self._seq = itertools.count()
        rs = scenario.router
        self.router_stats = RouterStats(model_name=MODELS[scenario.pools[0].model].served_name)
        self._kv_transfer_bytes_per_s = rs.kv_transfer_gbps * 1e9 / 8.0
        self._hold_timeout_s = rs.hold_timeout_s
        cl = scenario.clients
        self._timeout_s = cl.timeout_s
        self._max_retries = cl.max_retries
        self._backoff_s = cl.retry_backoff_s
        self._retry_on_shed = cl.retry_on_shed

        # pools and route groups
        self.pools: dict[str, PoolRT] = {}
        for spec in scenario.pools:
            e = spec.engine
            if e.max_num_batched_tokens < e.max_num_seqs:
                raise ValueError(f"pools[{spec.name}].engine: max_num_batched_tokens ({e.max_num_batched_tokens}) must "
                                 f"be >= max_num_seqs ({e.max_num_seqs}), as vLLM requires")
            route = PoolRoute(spec.name, spec.traffic_weight, rs.inflight_cap, rs.prefix_weight, rs.queue_weight,
                              rs.kv_weight)
            self.router.pools[spec.name] = route
            self.pools[spec.name] = PoolRT(spec, route)
        self._pool_of_route = {p.route: p for p in self.pools.values()}
        names = sorted({p.group for p in scenario.pools})
        self._groups = []
        for g in names:
            members = [self.pools[p.name] for p in scenario.pools if p.group == g]
            first = [p.route for p in members if p.role != "decode"]
            decode = [p.route for p in members if p.role == "decode"]
            self._groups.append(_Group(g, first, decode))
        self._reset_admission()

        # workload arrays (Python lists: scalar access in the hot path is faster than numpy)
        wl = self.workload
        tr = wl.trace
        n = len(tr)
        self._n = n
        self._prio = wl.priority.astype(np.int64).tolist()
        self._task = wl.task_id.astype(np.int64).tolist()
        self._step = wl.step.astype(np.int64).tolist()
        self._prompt = tr.prompt_tokens.astype(np.int64).tolist()
        self._output = tr.output_tokens.astype(np.int64).tolist()
        self._hashes = tr.block_hashes
        self._hbt = int(tr.hash_block_tokens)
        self._think_s = float(wl.think_time_s)
        nxt = np.full(n, -1, dtype=np.int64)
        if n:
            order = np.lexsort((wl.step, wl.task_id))
            same = wl.task_id[order[1:]] == wl.task_id[order[:-1]]
            nxt[order[:-1][same]] = order[1:][same]
        self._next = nxt.tolist()
        first = np.flatnonzero(wl.step == 0)
        first = first[np.argsort(tr.arrival_s[first], kind="stable")]
        self._arr_i = first.tolist()
        self._arr_t = tr.arrival_s[first].astype(np.float64).tolist()
        self._arr_pos = 0
        if self._hashes is not None:
            for p in self.pools.values():
                e = p.spec.engine
                if e.enable_prefix_caching and self._hbt % e.block_size:
                    raise ValueError(
                        f"trace.hash_block_tokens ({self._hbt}) must be a multiple of pools[{p.name}].engine.block_size "
                        f"({e.block_size}) when prefix caching is enabled")
        self._n_tasks = int(wl.n_tasks)
        self._task_ok = np.ones(self._n_tasks, dtype=bool)
        self._task_resolved = np.zeros(self._n_tasks, dtype=bool)
        self._n_resolved = 0
        task_prio = np.zeros(self._n_tasks, dtype=np.int64)
        task_prio[wl.task_id] = wl.priority
        self._task_prio = task_prio
        self._tasks_per_class = np.bincount(task_prio, minlength=len(PRIORITY_CLASSES))
        self._success_per_class = np.zeros(len(PRIORITY_CLASSES), dtype=np.int64)
        inf_slo = (INF, INF)
        slos = [(scenario.classes[c].ttft_slo_s, scenario.classes[c].tpot_slo_s) if c in scenario.classes else inf_slo
                for c in PRIORITY_CLASSES]
        self._slo_ttft = [s[0] for s in slos]
        self._slo_tpot = [s[1] for s in slos]
        self._cells = [[None] * 1 for _ in PRIORITY_CLASSES]  # per class: list indexed by step (grown on demand)
        # per-request outcomes
        self._ttft = np.full(n, np.nan)
        self._tpot = np.full(n, np.nan)
        self._e2e = np.full(n, np.nan)
        self._sent_at = np.full(n, np.nan)
        self._status = np.zeros(n, dtype=np.int8)  # 0 not finished, 1 completed, 2 failed
        self._attempts = np.zeros(n, dtype=np.int16)
        self._slo_met = np.zeros(n, dtype=bool)
        # counters
        self._sent = 0
        self._completed = 0
        self._shed = 0
        self._failed = 0
        self._retried = 0
        self._timed_out = 0
        self._scaling_actions = 0
        self._win_shed = [0] * len(PRIORITY_CLASSES)
        self._timeline: list[TimelinePoint] = []
        self._t_prev_sample = 0.0
        self._stop_s = scenario.duration_s if scenario.duration_s is not None else INF

        # initial replicas: ready (and standby loaded) at t = 0
        for p in self.pools.values():
            for _ in range(p.spec.replicas):
                inst = self._new_inst(p, *self._place(p))
                self._make_ready(inst)
            for _ in range(p.spec.warm_standby):
                inst = self._new_inst(p, *self._place(p))
                inst.phase = STANDBY
                inst.loaded_at = 0.0
            p.peak_serving = p.spec.replicas
        # faults
        for k, f in enumerate(scenario.faults):
            if f.at_s is not None:
                self._push(f.at_s, EV_FAULT, k, 0)
            else:
                self._schedule_poisson(k)
        self._push(self.timeline_interval_s, EV_SAMPLE, 0, 0)
        self._refresh()

    # ------------------------------------------------------------------ public: running

    @property
    def done(self) -> bool:
        return self._n_resolved >= self._n_tasks or self.now_s >= self._stop_s

    def run_until(self, t_s: float) -> None:
        """Process every event with time <= t_s; afterwards now_s = t_s and the stats are current."""
        if t_s < self.now_s:
            raise ValueError(f"run_until: t_s ({t_s}) is before now_s ({self.now_s})")
        self._advance(t_s, stop_when_done=False)
        self.now_s = t_s
        self._refresh()

    def run(self) -> SimSummary:
        """Run until every task is resolved, or until scenario.duration_s."""
        self._advance(self._stop_s, stop_when_done=True)
        if self._n_resolved < self._n_tasks and self._stop_s < INF:
            self.now_s = self._stop_s
        self._refresh()
        return self.summary()

    @property
    def cost_usd(self) -> float:
        total = 0.0
        for p in self.pools.values():
            self._accrue(p)
            total += p.gpu_s * p.usd_per_gpu_hour / 3600.0
        return total

    # ------------------------------------------------------------------ public: observability

    def replica_stats(self) -> list[ReplicaStats]:
        return [i.engine.stats for p in self.pools.values() for i in p.insts
                if i.engine is not None and i.phase in (READY, DRAINING)]

    def node_stats(self) -> list[NodeStats]:
        out = []
        now = self.now_s
        for p in self.pools.values():
            for node in p.nodes:
                if any(not s.gone and (s.inst is not None or s.warm_until >= now) for s in node.slots):
                    out.append(node.stats)
        return out

    def pool_states(self) -> dict[str, PoolState]:
        out = {}
        for name, p in self.pools.items():
            c = {STANDBY: 0, STARTING: 0, READY: 0, DRAINING: 0}
            for i in p.insts:
                c[i.phase] += 1
            out[name] = PoolState(name, p.target, c[READY], c[STARTING], c[DRAINING], c[STANDBY], p.max_num_seqs,
                                  p.max_batched_tokens)
        return out

    def replica_phases(self) -> list[tuple[str, str, str, float]]:
        return [(i.rid, p.name, i.phase, i.since) for p in self.pools.values() for i in p.insts]

    def timeline(self) -> list[TimelinePoint]:
        return list(self._timeline)

    def request_records(self) -> dict[str, np.ndarray]:
        """Per workload request: first send time, client TTFT/TPOT/e2e (NaN unless completed), status
        (0 pending, 1 completed, 2 failed), attempts, SLO met."""
        if not self.record_requests:
            raise RuntimeError("request_records: the fleet was built with record_requests=False")
        return {"sent_s": self._sent_at.copy(), "ttft_s": self._ttft.copy(), "tpot_s": self._tpot.copy(),
                "e2e_s": self._e2e.copy(),
                "status": self._status.copy(), "attempts": self._attempts.copy(), "slo_met": self._slo_met.copy()}

    def summary(self) -> SimSummary:
        ok = self._status == 1
        ttft = self._ttft[ok]
        tpot = self._tpot[ok]

        def pct(a: np.ndarray, q: float) -> float:
            return float(np.percentile(a, q)) if len(a) else math.nan

        hits = queries = preempt = 0.0
        per_pool = {}
        for name, p in self.pools.items():
            self._accrue(p)
            h, q, _b, pr = p.totals()
            hits += h
            queries += q
            preempt += pr
            cost = p.gpu_s * p.usd_per_gpu_hour / 3600.0
            per_pool[name] = PoolSummary(
                gpu_hours=p.gpu_s / 3600.0, cost_usd=cost, usd_per_gpu_hour=p.usd_per_gpu_hour,
                replicas_final=sum(1 for i in p.insts if i.phase in (READY, STARTING)),
                replicas_peak=p.peak_serving, routed_attempts=p.requests, hit_rate=h / q if q else math.nan,
                preemptions=int(pr))
        cost = sum(s.cost_usd for s in per_pool.values())
        succ = int(self._success_per_class.sum())
        att = {}
        for k, c in enumerate(PRIORITY_CLASSES):
            if c in self.scenario.classes or self._tasks_per_class[k]:
                n = int(self._tasks_per_class[k])
                att[c] = float(self._success_per_class[k]) / n if n else math.nan
        return SimSummary(
            scenario=self.scenario.name, seed=self.seed, duration_s=float(self.now_s), requests=self._sent,
            completed=self._completed, tasks=self._n_tasks, successful_tasks=succ, cost_usd=cost,
            cost_per_successful_task_usd=cost / succ if succ else math.nan,
            gpu_hours=sum(s.gpu_hours for s in per_pool.values()), slo_attainment=att,
            ttft_p50_s=pct(ttft, 50), ttft_p95_s=pct(ttft, 95), tpot_p50_s=pct(tpot, 50), tpot_p95_s=pct(tpot, 95),
            hit_rate=hits / queries if queries else math.nan, shed=self._shed, failed=self._failed,
            retried=self._retried, timed_out=self._timed_out, preemptions=int(preempt),
            scaling_actions=self._scaling_actions, per_pool=per_pool)

    # ------------------------------------------------------------------ public: control

    def set_pool_routing(self, pool: str, *, traffic_weight: float | None = None, inflight_cap: int | None = None,
                         prefix_weight: float | None = None, queue_weight: float | None = None,
                         kv_weight: float | None = None) -> None:
        p = self._pool(pool)
        for name, v in (("traffic_weight", traffic_weight), ("prefix_weight", prefix_weight),
                        ("queue_weight", queue_weight), ("kv_weight", kv_weight)):
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"set_pool_routing({pool!r}): {name} = {v!r} must be a finite number >= 0")
        if inflight_cap is not None and (isinstance(inflight_cap, bool) or not isinstance(inflight_cap, int)
                                         or inflight_cap < 0):
            raise ValueError(f"set_pool_routing({pool!r}): inflight_cap = {inflight_cap!r} must be an int >= 0 "
                             "(0 = no cap)")
        r = p.route
        if traffic_weight is not None:
            r.traffic_weight = float(traffic_weight)
        if inflight_cap is not None:
            r.inflight_cap = int(inflight_cap)
        if prefix_weight is not None:
            r.prefix_weight = float(prefix_weight)
        if queue_weight is not None:
            r.queue_weight = float(queue_weight)
        if kv_weight is not None:
            r.kv_weight = float(kv_weight)
        self._dispatch_held(p)

    def set_admission(self, priority_class: str, *, rate_limit_rps: float, queue_budget: int, shed_frac: float) -> None:
        k = self._class_index(priority_class)
        self._check_admission(priority_class, rate_limit_rps, queue_budget, shed_frac)
        a = self.router.classes[k]
        a.take_token(self.now_s)  # settle the bucket at the old rate first
        a.rate_limit_rps = float(rate_limit_rps)
        cap = a.rate_limit_rps if a.rate_limit_rps > 1.0 else 1.0
        a.tokens = min(a.tokens, cap)
        a.queue_budget = int(queue_budget)
        a.shed_frac = float(shed_frac)

    def set_pool_target(self, pool: str, *, replicas: int, warm_standby: int | None = None,
                        max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None) -> None:
        p = self._pool(pool)
        self._check_target(p, replicas, warm_standby, max_num_seqs, max_num_batched_tokens)
        changed = replicas != p.target or (warm_standby is not None and warm_standby != p.standby_target)
        if changed:
            self._scaling_actions += 1
        p.target = int(replicas)
        if warm_standby is not None:
            p.standby_target = int(warm_standby)
        caps = (max_num_seqs if max_num_seqs is not None else p.max_num_seqs,
                max_num_batched_tokens if max_num_batched_tokens is not None else p.max_batched_tokens)
        if caps != (p.max_num_seqs, p.max_batched_tokens):
            p.max_num_seqs, p.max_batched_tokens = caps
            p.gen += 1
        self._reconcile(p)

    def reset_controls(self) -> None:
        """Routing, admission and pool targets back to the scenario's values."""
        rs = self.scenario.router
        for p in self.pools.values():
            self.set_pool_routing(p.name, traffic_weight=p.spec.traffic_weight, inflight_cap=rs.inflight_cap,
                                  prefix_weight=rs.prefix_weight, queue_weight=rs.queue_weight, kv_weight=rs.kv_weight)
        self._reset_admission()
        for p in self.pools.values():
            e = p.spec.engine
            self.set_pool_target(p.name, replicas=p.spec.replicas, warm_standby=p.spec.warm_standby,
                                 max_num_seqs=e.max_num_seqs, max_num_batched_tokens=e.max_num_batched_tokens)

    def inject_fault(self, kind: str, pool: str, count: int = 1, duration_s: float = 300.0,
                     factor: float = 3.0) -> list[str]:
        """Hit `count` ready replicas of `pool` now. Returns the replica ids hit."""
        p = self._pool(pool)
        if kind not in ("crash", "preempt", "slow"):
            raise ValueError(f"inject_fault: kind = {kind!r}; allowed: 'crash', 'preempt', 'slow'")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"inject_fault: count = {count!r} must be an int >= 1")
        if not (math.isfinite(duration_s) and duration_s > 0):
            raise ValueError(f"inject_fault: duration_s = {duration_s!r} must be > 0")
        if not (math.isfinite(factor) and factor > 1):
            raise ValueError(f"inject_fault: factor = {factor!r} must be > 1")
        return self._fault(kind, p, count, duration_s, factor)

    # ------------------------------------------------------------------ validation helpers

    def _pool(self, name: str) -> PoolRT:
        p = self.pools.get(name)
        if p is None:
            raise ValueError(f"unknown pool {name!r}; pools are {sorted(self.pools)}")
        return p

    @staticmethod
    def _class_index(c: str) -> int:
        if c not in PRIORITY_CLASSES:
            raise ValueError(f"unknown priority class {c!r}; allowed: {list(PRIORITY_CLASSES)}")
        return PRIORITY_CLASSES.index(c)

    @staticmethod
    def _check_admission(c: str, rate_limit_rps: float, queue_budget: int, shed_frac: float) -> None:
        if not (isinstance(rate_limit_rps, (int, float)) and math.isfinite(rate_limit_rps) and rate_limit_rps >= 0):
            raise ValueError(f"set_admission({c!r}): rate_limit_rps = {rate_limit_rps!r} must be a finite number >= 0 "
                             "(0 = unlimited)")
        if isinstance(queue_budget, bool) or not isinstance(queue_budget, int) or queue_budget < -1:
            raise ValueError(f"set_admission({c!r}): queue_budget = {queue_budget!r} must be an int >= -1 "
                             "(-1 = unlimited)")
        if not (isinstance(shed_frac, (int, float)) and 0.0 <= shed_frac <= 1.0):
            raise ValueError(f"set_admission({c!r}): shed_frac = {shed_frac!r} must be in [0, 1]")

    @staticmethod
    def _check_target(p: PoolRT, replicas: int, warm_standby: int | None, max_num_seqs: int | None,
                      max_num_batched_tokens: int | None) -> None:
        s = p.spec
        where = f"set_pool_target({p.name!r})"

        def is_int(v: object) -> bool:
            return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

        if not is_int(replicas) or not (s.min_replicas <= replicas <= s.max_replicas):
            raise ValueError(f"{where}: replicas = {replicas!r} is outside [min_replicas, max_replicas] = "
                             f"[{s.min_replicas}, {s.max_replicas}]")
        if warm_standby is not None and (not is_int(warm_standby) or not 0 <= warm_standby <= s.max_replicas):
            raise ValueError(f"{where}: warm_standby = {warm_standby!r} is outside [0, {s.max_replicas}]")
        lo, hi = MAX_NUM_SEQS_RANGE
        if max_num_seqs is not None and (not is_int(max_num_seqs) or not lo <= max_num_seqs <= hi):
            raise ValueError(f"{where}: max_num_seqs = {max_num_seqs!r} is outside [{lo}, {hi}]")
        lo, hi = MAX_NUM_BATCHED_TOKENS_RANGE
        if max_num_batched_tokens is not None and (not is_int(max_num_batched_tokens)
                                                   or not lo <= max_num_batched_tokens <= hi):
            raise ValueError(f"{where}: max_num_batched_tokens = {max_num_batched_tokens!r} is outside [{lo}, {hi}]")
        seqs = max_num_seqs if max_num_seqs is not None else p.max_num_seqs
        tokens = max_num_batched_tokens if max_num_batched_tokens is not None else p.max_batched_tokens
        if tokens < seqs:
            raise ValueError(f"{where}: max_num_batched_tokens ({tokens}) must be >= max_num_seqs ({seqs}), "
                             "as vLLM requires")

    def _reset_admission(self) -> None:
        spec = self.scenario.router.admission
        for k, c in enumerate(PRIORITY_CLASSES):
            a = spec.get(c, AdmissionSpec())
            st = self.router.classes[k]
            st.rate_limit_rps = a.rate_limit_rps
            st.queue_budget = a.queue_budget
            st.shed_frac = a.shed_frac
            st.reset_bucket(self.now_s)

    # ------------------------------------------------------------------ event loop

    def push(self, t_s: float, kind: int, a: object, b: object) -> None:
        heapq.heappush(self._heap, (t_s, next(self._seq), kind, a, b))

    _push = push

    def _advance(self, t_end: float, stop_when_done: bool) -> None:
        heap = self._heap
        pop = heapq.heappop
        arr_t = self._arr_t
        arr_i = self._arr_i
        n_arr = len(arr_t)
        k = self._arr_pos
        n_tasks = self._n_tasks
        while True:
            ta = arr_t[k] if k < n_arr else INF
            if heap and heap[0][0] < ta:
                ev = heap[0]
                t = ev[0]
                if t > t_end:
                    break
                pop(heap)
                self.now_s = t
                kind = ev[2]
                if kind == EV_SEG_END:
                    ev[3].on_segment_end(ev[4])
                elif kind == EV_KICK:
                    ev[3].kick(t)
                elif kind == EV_SEND:
                    self._send(self._new_req(ev[3]))
                elif kind == EV_TIMEOUT:
                    self._on_timeout(ev[3], ev[4])
                elif kind == EV_RETRY:
                    r = ev[3]
                    if r.attempt == ev[4] and r.state == IDLE:
                        self._send(r)
                elif kind == EV_READY:
                    inst = ev[3]
                    if inst.version == ev[4] and inst.phase == STARTING:
                        self._make_ready(inst)
                elif kind == EV_HOLD_EXPIRE:
                    self._on_hold_expire(ev[3], ev[4])
                elif kind == EV_TRANSFER:
                    self._on_transfer(ev[3], ev[4])
                elif kind == EV_FAULT:
                    self._on_fault_event(ev[3])
                elif kind == EV_SLOW_END:
                    inst = ev[3]
                    if inst.slow_version == ev[4] and inst.engine is not None and inst.engine.alive:
                        inst.engine.set_slow(1.0, t)
                elif kind == EV_SAMPLE:
                    self._sample()
            else:
                if ta > t_end or ta == INF:
                    break
                self.now_s = ta
                k += 1
                self._arr_pos = k
                self._send(self._new_req(arr_i[k - 1]))
            if stop_when_done and self._n_resolved >= n_tasks:
                break
        self._arr_pos = k

    # ------------------------------------------------------------------ clients and router

    def _new_req(self, i: int) -> Req:
        prompt = self._prompt[i]
        units = ()
        if self._hashes is not None:
            units = tuple(self._hashes[i][: prompt // self._hbt])
        task = self._task[i]
        r = Req(i, self._prio[i], task, self._step[i], prompt, self._output[i], units,
                task % len(self._groups) if len(self._groups) > 1 else 0)
        r.cell = self._cell(r.prio, r.step)
        return r

    def _cell(self, prio: int, step: int):
        cells = self._cells[prio]
        while len(cells) <= step:
            cells.append(None)
        c = cells[step]
        if c is None:
            c = cells[step] = self.router_stats.cell(PRIORITY_CLASSES[prio], step)
        return c

    def _send(self, r: Req) -> None:
        now = self.now_s
        r.attempt += 1
        if r.attempt == 1:
            r.t_first_send = now
            self._sent += 1
            self._sent_at[r.idx] = now
        self._attempts[r.idx] = r.attempt
        r.t_send = now
        r.t_queued = now
        r.streamed = False
        r.state = IDLE
        self.push(now + self._timeout_s, EV_TIMEOUT, r, r.attempt)
        cell = r.cell
        cell.arrivals += 1
        code = self.router.admit(r.prio, now)
        if code:
            self._on_shed(r, code)
            return
        cell.admitted += 1
        g = self._groups[r.group]
        route = self.router.choose(g.first)
        p = self._pool_of_route[route]
        p.requests += 1
        p.win_arrivals += 1
        r.pool = p
        self._dispatch(r, p, MODE_PREFILL_ONLY if p.role == "prefill" else MODE_FULL)

    def _dispatch(self, r: Req, p: PoolRT, mode: int) -> None:
        route = p.route
        rep = route.pick(r)
        if rep is None:
            a = self.router.classes[r.prio]
            if a.queue_budget >= 0 and a.held >= a.queue_budget:
                self._on_shed(r, 503)
                return
            r.e_mode = mode
            route.hold(r)
            a.held += 1
            self.push(self.now_s + self._hold_timeout_s, EV_HOLD_EXPIRE, r, r.attempt)
            return
        self._assign(r, rep, mode)

    def _assign(self, r: Req, rep: Replica, mode: int) -> None:
        need = r.prompt + (1 if mode == MODE_PREFILL_ONLY else r.output)
        if need > rep.capacity_tokens:
            self._count_error(r, "400")
            self._fail(r)
            return
        if mode != MODE_DECODE_ONLY:
            r.cell.queue_time_s.observe(self.now_s - r.t_queued)
        rep.add(r, self.now_s, mode)

    def _dispatch_held(self, p: PoolRT) -> None:
        route = p.route
        classes = self.router.classes
        while route.n_held:
            r = route.peek_held()
            if r is None:
                break
            rep = route.pick(r)
            if rep is None:
                break
            route.pop_held()
            classes[r.prio].held -= 1
            self._assign(r, rep, r.e_mode)

    def _count_error(self, r: Req, code: str) -> None:
        errs = r.cell.errors
        errs[code] = errs.get(code, 0.0) + 1.0

    def _on_shed(self, r: Req, code: int) -> None:
        self._shed += 1
        r.cell.shed += 1
        self._count_error(r, str(code))
        self._win_shed[r.prio] += 1
        r.state = IDLE
        if self._retry_on_shed:
            self._retry_or_fail(r)
        else:
            self._fail(r)

    def _retry_or_fail(self, r: Req) -> None:
        if r.attempt <= self._max_retries:
            self._retried += 1
            r.cell.retries += 1
            r.state = IDLE
            self.push(self.now_s + self._backoff_s, EV_RETRY, r, r.attempt)
        else:
            self._fail(r)

    def _fail(self, r: Req) -> None:
        r.state = FAILED
        self._failed += 1
        self._status[r.idx] = 2
        t = r.task
        if not self._task_resolved[t]:
            self._task_ok[t] = False
            self._resolve(t)

    def _resolve(self, t: int) -> None:
        self._task_resolved[t] = True
        self._n_resolved += 1
        if self._task_ok[t]:
            self._success_per_class[self._task_prio[t]] += 1

    def _on_timeout(self, r: Req, attempt: int) -> None:
        if r.attempt != attempt:
            return
        st = r.state
        if st == HELD:
            r.held_pool.unhold(r)
            self.router.classes[r.prio].held -= 1
        elif st == WAITING or st == RUNNING:
            rep = r.rep
            rep.abort(r, self.now_s)
            self._dispatch_held(rep.owner.pool)
        elif st != TRANSFER:
            return  # done, failed, or between attempts
        r.state = IDLE
        self._timed_out += 1
        self._count_error(r, "timeout")
        if r.streamed:
            self._fail(r)
        else:
            self._retry_or_fail(r)

    def _on_hold_expire(self, r: Req, attempt: int) -> None:
        if r.attempt != attempt or r.state != HELD:
            return
        r.held_pool.unhold(r)
        self.router.classes[r.prio].held -= 1
        self._on_shed(r, 503)

    def _on_transfer(self, r: Req, attempt: int) -> None:
        if r.attempt != attempt or r.state != TRANSFER:
            return
        route = self.router.choose(self._groups[r.group].decode)
        r.t_queued = self.now_s
        self._dispatch(r, self._pool_of_route[route], MODE_DECODE_ONLY)

    # engine sink ---------------------------------------------------------------

    def on_first_token(self, r: Req, t_s: float) -> None:
        r.streamed = True
        if r.t_first_tok < 0:
            r.t_first_tok = t_s
        r.cell.ttft_s.observe(t_s - r.t_send)
        r.pool.win_ttft.append(t_s - r.t_first_send)

    def on_finish(self, r: Req, t_s: float, rep: Replica) -> None:
        if r.e_mode == MODE_PREFILL_ONLY:
            r.state = TRANSFER
            xfer = r.prompt * rep.owner.pool.arch.kv_bytes_per_token / self._kv_transfer_bytes_per_s
            self.push(t_s + xfer, EV_TRANSFER, r, r.attempt)
        else:
            self._complete(r, t_s)
        p = rep.owner.pool
        if p.route.n_held:
            self._dispatch_held(p)

    def on_reject(self, r: Req, t_s: float, rep: Replica) -> None:
        self._count_error(r, "400")
        self._fail(r)

    def on_empty(self, rep: Replica, t_s: float) -> None:
        inst = rep.owner
        if inst.phase == DRAINING:
            self._retire(inst, "drained")

    def _complete(self, r: Req, t: float) -> None:
        r.state = DONE
        i = r.idx
        out = r.output
        ttft = r.t_first_tok - r.t_first_send
        tpot = (t - r.t_first_tok) / (out - 1) if out > 1 else 0.0
        cell = r.cell
        if out > 1:
            cell.tpot_s.observe(tpot)
        cell.e2e_s.observe(t - r.t_send)
        self._ttft[i] = ttft
        self._tpot[i] = tpot
        self._e2e[i] = t - r.t_first_send
        self._status[i] = 1
        self._completed += 1
        met = ttft <= self._slo_ttft[r.prio] and tpot <= self._slo_tpot[r.prio]
        self._slo_met[i] = met
        task = r.task
        if not met:
            self._task_ok[task] = False
        if self._task_resolved[task]:
            return
        nxt = self._next[i]
        if nxt >= 0:
            self.push(t + self._think_s, EV_SEND, nxt, 0)
        else:
            self._resolve(task)

    # ------------------------------------------------------------------ autoscaler

    def _accrue(self, p: PoolRT) -> None:
        now = self.now_s
        if now > p.t_acc:
            p.gpu_s += p.billed_gpus * (now - p.t_acc)
            p.t_acc = now

    def _place(self, p: PoolRT) -> tuple[Slot, bool]:
        """A free slot for a new replica: one with warm weights if any, else any free one, else a new node."""
        now = self.now_s
        free = None
        for node in p.nodes:
            for s in node.slots:
                if s.inst is None and not s.gone:
                    if s.warm_until >= now:
                        return s, True
                    if free is None:
                        free = s
        if free is not None:
            return free, False
        spec = p.spec
        node_id = f"{p.name}-node-{len(p.nodes)}"
        stats = NodeStats(node_id=node_id, sku=spec.sku, model_name_label=p.sku.dcgm_model_name, gpus=spec.node_gpus,
                          fb_total_mib=p.sku.memory_gib * 1024.0, pool=p.name)
        node = Node(node_id, stats, spec.tp)
        p.nodes.append(node)
        return node.slots[0], False

    def _new_inst(self, p: PoolRT, slot: Slot, warm: bool) -> Inst:
        self._accrue(p)
        rid = f"{p.name}-{p.next_rep}"
        p.next_rep += 1
        inst = Inst(rid, p.next_rep - 1, p, slot, p.gen, (p.max_num_seqs, p.max_batched_tokens), self.now_s)
        inst.loaded_at = self.now_s + (p.spec.startup_warm_s if warm else p.spec.startup_cold_s)
        slot.inst = inst
        slot.warm_until = -INF
        p.insts.append(inst)
        p.billed_gpus += p.tp
        return inst

    def _start_one(self, p: PoolRT, surge: bool = False) -> Inst:
        now = self.now_s
        standby = [i for i in p.insts if i.phase == STANDBY]
        if standby:
            inst = min(standby, key=lambda i: i.loaded_at)
            inst.ready_at = max(now, inst.loaded_at) + p.spec.startup_warm_s
            inst.gen = p.gen
            inst.caps = (p.max_num_seqs, p.max_batched_tokens)
        else:
            slot, warm = self._place(p)
            inst = self._new_inst(p, slot, warm or surge)
            inst.ready_at = now + (p.spec.startup_warm_s if (warm or surge) else p.spec.startup_cold_s)
        inst.phase = STARTING
        inst.since = now
        inst.version += 1
        self.push(inst.ready_at, EV_READY, inst, inst.version)
        return inst

    def _make_ready(self, inst: Inst) -> None:
        p = inst.pool
        spec = p.spec
        e = spec.engine
        stats = ReplicaStats(replica_id=inst.rid, pool=p.name, model_name=p.arch.served_name,
                             node_id=inst.slot.node.node_id, gpu_indices=inst.slot.gpus, num_gpu_blocks=p.kv_blocks,
                             block_size=e.block_size, gpu_memory_utilization=e.gpu_memory_utilization,
                             max_model_len=p.arch.max_model_len)
        eng = Replica(inst.rid, p.name, p.model, kv_blocks=p.kv_blocks, block_size=e.block_size,
                      unit_tokens=self._hbt, max_num_seqs=inst.caps[0], max_batched_tokens=inst.caps[1],
                      stats=stats, sink=self, enable_prefix_caching=e.enable_prefix_caching and self._hashes is not None)
        eng.owner = inst
        inst.engine = eng
        inst.phase = READY
        inst.since = self.now_s
        p.route.candidates.append(eng)
        serving = sum(1 for i in p.insts if i.phase in (READY, STARTING))
        if serving > p.peak_serving:
            p.peak_serving = serving
        if p.surge is inst:
            p.surge = None
            old = [i for i in p.insts if i.phase == READY and i.gen != p.gen]
            if old:
                self._drain(min(old, key=lambda i: (i.engine.inflight, i.since)))
            self._reconcile(p)
        self._dispatch_held(p)

    def _drain(self, inst: Inst) -> None:
        inst.phase = DRAINING
        inst.since = self.now_s
        eng = inst.engine
        p = inst.pool
        if eng in p.route.candidates:
            p.route.candidates.remove(eng)
        eng.draining = True
        if eng.inflight == 0 and eng.seg_kind == 0:
            self._retire(inst, "drained")

    def _retire(self, inst: Inst, why: str) -> None:
        """The replica is gone (drained, cancelled, crashed, preempted, standby removed)."""
        p = inst.pool
        self._accrue(p)
        p.billed_gpus -= p.tp
        eng = inst.engine
        slot = inst.slot
        if eng is not None:
            s = eng.stats
            p.gone_hits += s.prefix_cache_hits
            p.gone_queries += s.prefix_cache_queries
            p.gone_busy_s += s.busy_s
            p.gone_preemptions += s.num_preemptions
            slot.busy_base_s += s.busy_s
            if eng in p.route.candidates:
                p.route.candidates.remove(eng)
        inst.phase = GONE
        inst.since = self.now_s
        inst.version += 1
        p.insts.remove(inst)
        slot.inst = None
        if why == "preempt":
            slot.gone = True
        # weights stay on the node after a clean exit; a crash or a half-finished load leaves none
        slot.warm_until = self.now_s + WARM_NODE_TTL_S if why in ("drained", "standby") else -INF
        if p.surge is inst:
            p.surge = None

    def _reconcile(self, p: PoolRT) -> None:
        """Move the pool towards its targets (the ReplicaSet / autoscaler controller)."""
        now = self.now_s
        serving = [i for i in p.insts if i.phase in (STARTING, READY) and i is not p.surge]
        n = len(serving)
        if n < p.target:
            for _ in range(p.target - n):
                self._start_one(p)
        elif n > p.target:
            excess = n - p.target
            starting = sorted((i for i in serving if i.phase == STARTING),
                              key=lambda i: (i.gen == p.gen, -i.since, -i.seq))
            for i in starting[:excess]:
                self._retire(i, "standby" if i.loaded_at <= now else "cancelled")
            excess -= min(excess, len(starting))
            if excess:
                ready = sorted((i for i in serving if i.phase == READY),
                               key=lambda i: (i.gen == p.gen, i.engine.inflight, -i.since, -i.seq))
                for i in ready[:excess]:
                    self._drain(i)
        standby = [i for i in p.insts if i.phase == STANDBY]
        if len(standby) < p.standby_target:
            for _ in range(p.standby_target - len(standby)):
                slot, warm = self._place(p)
                inst = self._new_inst(p, slot, warm)
                inst.phase = STANDBY
        elif len(standby) > p.standby_target:
            standby.sort(key=lambda i: -i.loaded_at)  # still loading first
            for i in standby[: len(standby) - p.standby_target]:
                self._retire(i, "standby" if i.loaded_at <= now else "cancelled")
        # rolling restart for new engine caps: one surge replica at a time
        if p.surge is None and p.target > 0:
            serving = [i for i in p.insts if i.phase in (STARTING, READY)]
            if (any(i.phase == READY and i.gen != p.gen for i in serving)
                    and not any(i.phase == STARTING for i in serving)):
                p.surge = self._start_one(p, surge=True)
        serving_n = sum(1 for i in p.insts if i.phase in (READY, STARTING))
        if serving_n > p.peak_serving:
            p.peak_serving = serving_n

    # ------------------------------------------------------------------ faults

    def _schedule_poisson(self, k: int) -> None:
        f = self.scenario.faults[k]
        p = self.pools[f.pool]
        n = max(1, sum(1 for i in p.insts if i.phase == READY))
        rate_per_s = f.rate_per_hour / 3600.0 * n
        self.push(self.now_s + float(self._fault_rng.exponential(1.0 / rate_per_s)), EV_FAULT, k, 0)

    def _on_fault_event(self, k: int) -> None:
        f = self.scenario.faults[k]
        self._fault(f.kind, self.pools[f.pool], f.count if f.at_s is not None else 1, f.duration_s, f.factor)
        if f.rate_per_hour is not None:
            self._schedule_poisson(k)

    def _fault(self, kind: str, p: PoolRT, count: int, duration_s: float, factor: float) -> list[str]:
        ready = [i for i in p.insts if i.phase == READY]
        if not ready:
            return []
        pick = self._fault_rng.choice(len(ready), size=min(count, len(ready)), replace=False)
        hit = [ready[j] for j in sorted(int(x) for x in pick)]
        now = self.now_s
        for inst in hit:
            eng = inst.engine
            if kind == "slow":
                inst.slow_version += 1
                eng.set_slow(factor, now)
                self.push(now + duration_s, EV_SLOW_END, inst, inst.slow_version)
                continue
            reqs = eng.crash()
            self._retire(inst, "preempt" if kind == "preempt" else "crash")
            for r in reqs:
                self._count_error(r, "500")
                if r.streamed:
                    self._fail(r)
                else:
                    self._retry_or_fail(r)
        if kind != "slow":
            self._reconcile(p)
        return [i.rid for i in hit]

    # ------------------------------------------------------------------ stats

    def _settle_all(self) -> None:
        now = self.now_s
        for p in self.pools.values():
            for i in p.insts:
                if i.engine is not None:
                    i.engine.settle(now)

    def _refresh(self) -> None:
        """Bring gauges and node/router views up to now_s (after run_until)."""
        self._settle_all()
        rs = self.router_stats
        now = self.now_s
        for p in self.pools.values():
            self._accrue(p)
            running = 0
            for i in p.insts:
                e = i.engine
                if e is not None:
                    e.refresh_gauges()
                    running += e.inflight
            rs.queue_size[p.name] = p.route.n_held
            rs.ready_endpoints[p.name] = len(p.route.candidates)
            rs.running[p.name] = running
            for node in p.nodes:
                st = node.stats
                for s in node.slots:
                    inst = s.inst
                    busy = s.busy_base_s
                    fb = 0.0
                    if inst is not None:
                        if inst.engine is not None:
                            busy += inst.engine.stats.busy_s
                        if inst.phase in (STARTING, READY, DRAINING) and now >= inst.since:
                            fb = p.fb_used_mib
                    for g in s.gpus:
                        st.gpu_busy_s[g] = busy
                        st.fb_used_mib[g] = fb

    def _sample(self) -> None:
        now = self.now_s
        dt = now - self._t_prev_sample
        self._settle_all()
        pts = {}
        for name, p in self.pools.items():
            h, q, b, _ = p.totals()
            ph, pq, pb = p.win_prev
            up = [i for i in p.insts if i.phase in (READY, DRAINING)]
            ready = [i for i in up if i.phase == READY]
            kv = sum(i.engine.cache.usage_frac for i in ready) / len(ready) if ready else math.nan
            busy = (b - pb) / (dt * len(up)) if up and dt > 0 else 0.0
            pts[name] = PoolPoint(
                replicas_ready=len(ready), replicas_target=p.target,
                arrival_rps=p.win_arrivals / dt if dt > 0 else 0.0,
                ttft_p95_s=float(np.percentile(p.win_ttft, 95)) if p.win_ttft else math.nan,
                hit_rate=(h - ph) / (q - pq) if q > pq else math.nan, kv_usage_frac=kv,
                gpu_busy_frac=min(1.0, busy))
            p.win_prev = (h, q, b)
            p.win_arrivals = 0
            p.win_ttft = []
        shed = {c: self._win_shed[k] for k, c in enumerate(PRIORITY_CLASSES)}
        self._win_shed = [0] * len(PRIORITY_CLASSES)
        self._timeline.append(TimelinePoint(t_s=now, pools=pts, shed=shed, cost_usd=self.cost_usd))
        self._t_prev_sample = now
        if self._heap or self._arr_pos < len(self._arr_t):  # else nothing can happen any more
            self.push(now + self.timeline_interval_s, EV_SAMPLE, 0, 0)
