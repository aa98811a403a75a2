"""Run-time records of the simulated fleet: GPU slots, nodes, replica lifecycles, pools, route groups.

Plain mutable records (with __slots__ where the event loop reads them); the Fleet's
concern modules (fleet_lifecycle, fleet_clients, fleet_faults, fleet_accounting)
change them. Must not: hold behaviour beyond read-only helpers, read the clock, or
draw random numbers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from controller.perf.engines import Catalogue, step_model
from controller.sim.engine import Replica
from controller.sim.router import PoolRoute
from controller.sim.scenario import PoolSpecModel
from controller.sim.stats import NodeStats

if TYPE_CHECKING:
    import numpy as np

    from controller.sim.engine_records import ReplicaBase, Req
    from controller.sim.router import Router
    from controller.sim.scenario import Scenario
    from controller.sim.stats import RouterStats
    from controller.sim.workload import Workload

# replica phases
STANDBY, STARTING, READY, DRAINING, GONE = "standby", "starting", "ready", "draining", "gone"
INF = math.inf


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
    """A GPU node of one pool (`node_gpus` GPUs cut into `node_gpus // tp` slots), created on demand."""

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

    def live_engine(self) -> Replica:
        """The engine of a ready or draining replica (it exists from ready until gone)."""
        eng = self.engine
        assert eng is not None, f"{self.rid} has no engine (phase {self.phase})"
        return eng


class PoolRT:
    """One pool at run time."""

    def __init__(self, spec: PoolSpecModel, route: PoolRoute, catalogue: Catalogue | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.role = spec.role
        self.tp = spec.tp
        cat = catalogue if catalogue is not None else Catalogue.builtin()
        self.arch = cat.model(spec.model)
        self.sku = cat.sku(spec.sku)
        self.model = step_model(self.arch, self.sku, spec.tp)  # calibrated, else the roofline
        self.usd_per_gpu_hour = (spec.usd_per_gpu_hour if spec.usd_per_gpu_hour is not None
                                 else self.sku.usd_per_gpu_hour)
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
        # GPUs that run out (Fleet.set_capacity): replicas the pool may place; the rest of its target stays
        # pending (no GPU, never ready), each with the time it was asked for
        self.capacity: int | None = None
        self.pending_since: list[float] = []
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


class RouteGroup:
    """A route group: the pools a task's first hop is drawn from, and its decode pools."""

    __slots__ = ("name", "first", "decode")

    def __init__(self, name: str, first: list[PoolRoute], decode: list[PoolRoute]) -> None:
        self.name = name
        self.first = first
        self.decode = decode


class FleetBase:
    """What the Fleet's concern mixins share, declared for readers and type checkers; empty at run time.

    The attributes are the state one concern reads and another owns (each is assigned in its
    owner's `_init_*`, called by `Fleet.__init__`); the methods under TYPE_CHECKING are the
    handlers one mixin calls on another, and the engine sink (so any mixin is an EngineSink).
    Adding neither a value nor a method here keeps the event loop's lookups exactly what they were.
    """

    # owned by Fleet
    scenario: Scenario
    seed: int
    workload: Workload
    router: Router
    router_stats: RouterStats
    record_requests: bool
    _fault_rng: np.random.Generator
    _scaling_actions: int
    # fleet_events
    now_s: float
    _heap: list
    # fleet_lifecycle
    pools: dict[str, PoolRT]
    _groups: list[RouteGroup]
    _pool_of_route: dict[PoolRoute, PoolRT]
    # fleet_clients
    _hashes: tuple[tuple[int, ...], ...] | None
    _hbt: int
    _n: int
    _n_tasks: int
    _n_resolved: int
    _arr_i: list[int]
    _arr_t: list[float]
    _arr_pos: int
    _tasks_per_class: np.ndarray
    _success_per_class: np.ndarray
    _task_resolved: np.ndarray
    _task_ok: np.ndarray
    _task_prio: np.ndarray
    # fleet_accounting (per-request outcomes, written by fleet_clients)
    _ttft: np.ndarray
    _tpot: np.ndarray
    _e2e: np.ndarray
    _sent_at: np.ndarray
    _status: np.ndarray
    _attempts: np.ndarray
    _slo_met: np.ndarray
    _sent: int
    _completed: int
    _shed: int
    _failed: int
    _retried: int
    _timed_out: int
    _win_shed: list[int]

    if TYPE_CHECKING:
        # fleet_events
        def push(self, t_s: float, kind: int, a: object, b: object) -> None: ...
        def _push(self, t_s: float, kind: int, a: object, b: object) -> None: ...
        # fleet_lifecycle
        def _make_ready(self, inst: Inst) -> None: ...
        def on_empty(self, rep: ReplicaBase, t_s: float) -> None: ...
        def _retire(self, inst: Inst, why: str) -> None: ...
        def _reconcile(self, p: PoolRT) -> None: ...
        # fleet_clients
        def _new_req(self, i: int) -> Req: ...
        def _send(self, r: Req) -> None: ...
        def _dispatch_held(self, p: PoolRT) -> None: ...
        def _count_error(self, r: Req, code: str) -> None: ...
        def _retry_or_fail(self, r: Req) -> None: ...
        def _fail(self, r: Req) -> None: ...
        def _on_timeout(self, r: Req, attempt: int) -> None: ...
        def _on_hold_expire(self, r: Req, attempt: int) -> None: ...
        def _on_transfer(self, r: Req, attempt: int) -> None: ...
        def _on_admit(self, r: Req, attempt: int) -> None: ...
        def on_first_token(self, r: Req, t_s: float) -> None: ...
        def on_finish(self, r: Req, t_s: float, rep: ReplicaBase) -> None: ...
        def on_reject(self, r: Req, t_s: float, rep: ReplicaBase) -> None: ...
        # fleet_faults
        def _on_fault_event(self, k: int) -> None: ...
        # fleet_accounting
        def _accrue(self, p: PoolRT) -> None: ...
        def _sample(self) -> None: ...
