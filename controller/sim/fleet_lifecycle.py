"""Replica lifecycle of the simulated fleet: pools, node slots, placement, start/ready/drain/retire, reconcile.

A replica goes standby → starting → ready → draining → gone (fleet.py's docstring
states the rules: warm standby first, then a slot that still holds the weights, then
a cold start; scale-down cancels starting replicas before draining ready ones; new
engine caps roll out one surge replica at a time). `_reconcile` is the ReplicaSet /
autoscaler controller that moves a pool towards its targets.

Must not: read the wall clock, draw random numbers, or touch requests beyond handing
held ones to a replica that became ready (that is fleet_clients).
"""

from __future__ import annotations

from controller.levers import routing_levers
from controller.sim.engine import Replica
from controller.sim.engine_records import ReplicaBase
from controller.sim.fleet_events import EV_READY
from controller.sim.fleet_records import (
    DRAINING,
    GONE,
    INF,
    READY,
    STANDBY,
    STARTING,
    FleetBase,
    Inst,
    Node,
    PoolRT,
    RouteGroup,
    Slot,
)
from controller.sim.router import PoolRoute
from controller.sim.scenario import PoolSpecModel, Scenario
from controller.sim.stats import NodeStats, ReplicaStats

# Weights stay on a node this long after its replica left (the cluster autoscaler's default
# --scale-down-unneeded-time is 10 minutes before an empty node is removed).
WARM_NODE_TTL_S = 600.0


def route_defaults(scenario: Scenario, spec: PoolSpecModel) -> dict[str, float]:
    """A pool's routing levers as the scenario sets them: the pool's own (traffic_weight), else the
    router's (cap, scorer weights), else the lever table's default (controller/levers.py)."""
    return {lv.name: lv.kind(getattr(spec, lv.name, getattr(scenario.router, lv.name, lv.default)))
            for lv in routing_levers()}


class LifecycleMixin(FleetBase):
    """Pools and replicas of a Fleet (state: `pools`, `_pool_of_route`, `_groups`)."""

    def _init_pools(self, scenario: Scenario) -> None:
        catalogue = scenario.engine_catalogue()
        self.pools: dict[str, PoolRT] = {}
        for spec in scenario.pools:
            e = spec.engine
            if e.max_num_batched_tokens < e.max_num_seqs:
                raise ValueError(f"pools[{spec.name}].engine: max_num_batched_tokens ({e.max_num_batched_tokens}) must "
                                 f"be >= max_num_seqs ({e.max_num_seqs}), as vLLM requires")
            route = PoolRoute(spec.name, route_defaults(scenario, spec))
            self.router.pools[spec.name] = route
            self.pools[spec.name] = PoolRT(spec, route, catalogue)
        self._pool_of_route = {p.route: p for p in self.pools.values()}
        names = sorted({p.group for p in scenario.pools})
        self._groups: list[RouteGroup] = []
        for g in names:
            members = [self.pools[p.name] for p in scenario.pools if p.group == g]
            first = [p.route for p in members if p.role != "decode"]
            decode = [p.route for p in members if p.role == "decode"]
            self._groups.append(RouteGroup(g, first, decode))

    def _start_initial_replicas(self) -> None:
        """Every pool's initial replicas ready (and its standby loaded) at t = 0."""
        for p in self.pools.values():
            for _ in range(p.spec.replicas):
                inst = self._new_inst(p, *self._place(p))
                self._make_ready(inst)
            for _ in range(p.spec.warm_standby):
                inst = self._new_inst(p, *self._place(p))
                inst.phase = STANDBY
                inst.loaded_at = 0.0
            p.peak_serving = p.spec.replicas

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
                      stats=stats, sink=self,
                      enable_prefix_caching=e.enable_prefix_caching and self._hashes is not None)
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
                self._drain(min(old, key=lambda i: (i.live_engine().inflight, i.since)))
            self._reconcile(p)
        self._dispatch_held(p)

    def _drain(self, inst: Inst) -> None:
        inst.phase = DRAINING
        inst.since = self.now_s
        eng = inst.live_engine()
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
            room = p.target - n if p.capacity is None else max(0, min(p.target, p.capacity) - n)
            for _ in range(room):
                self._start_one(p)
            n += room
        # what the target asks beyond the GPUs there are: pending, oldest kept (a scale-down removes the
        # unscheduled first, as a ReplicaSet does)
        short = max(0, p.target - n)
        del p.pending_since[short:]
        p.pending_since.extend([now] * (short - len(p.pending_since)))
        if n > p.target:
            excess = n - p.target
            starting = sorted((i for i in serving if i.phase == STARTING),
                              key=lambda i: (i.gen == p.gen, -i.since, -i.seq))
            for i in starting[:excess]:
                self._retire(i, "standby" if i.loaded_at <= now else "cancelled")
            excess -= min(excess, len(starting))
            if excess:
                ready = sorted((i for i in serving if i.phase == READY),
                               key=lambda i: (i.gen == p.gen, i.live_engine().inflight, -i.since, -i.seq))
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

    def on_empty(self, rep: ReplicaBase, t_s: float) -> None:
        inst = rep.owner
        assert isinstance(inst, Inst)  # set when the fleet started the engine
        if inst.phase == DRAINING:
            self._retire(inst, "drained")
