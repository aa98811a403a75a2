"""The MPC policy's planning problem: telemetry, memory and constraints → a `PlanProblem` for the solver.

Per pool: the replica bounds under the operator's overrides and the breaker's floor, what is
ready and on its way (`starting_eta_s`), warm slots, the levers in force, the traffic mix and
reuse, the breaker's ceilings (affinity, and the SLO-safe in-flight cap `safe_batch` while it
protects running streams, never below a batch the pool is seen running on pace: `seen_safe_batch`),
the stream guard's standing ceiling on the in-flight cap otherwise (`stream_guards`), whether the
slow lever (engine batch caps) is up for review and the framebuffer ceiling on raising it
(`memory_headroom`). Per class: the forecast's share at the
plan quantile, the shed in force and the breaker's floor.
Scale from zero (`activate`): a route group serving nothing while traffic for it shows gets one
replica.

Must not: do I/O or read a clock; solve anything (the planner in controller/core/mpc/ does).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from controller.core.estimate import standing_queue
from controller.core.forecast import LoadForecast
from controller.core.guards import override_bounds
from controller.core.mpc import ClassInput, PlanProblem, PoolInput, hop
from controller.core.mpc_model import LatencyQuery, PlanModel, QueueingPrior
from controller.core.objective import ObjectiveWeights
from controller.core.workflow import step_loss
from controller.perf.catalogue import GIB, NON_TORCH_GIB_PER_GPU
from controller.perf.engines import Catalogue, EngineError
from controller.policies.common import value
from controller.policies.mpc.dial import planned_quantile, reachable_rps
from controller.policies.mpc.feedback import PROTECTED, Feedback
from controller.policies.mpc.memory import MpcPoolMemory, reuse
from controller.types import PRIORITY_CLASSES, BreakerAction, FleetSpec, PolicyInput, PoolObservation, PoolSpec

_CATALOGUE = Catalogue.builtin()
# Framebuffer a batch-cap raise must leave free on the fullest GPU. DCGM samples FB_USED once per
# scrape, so a peak between samples goes unseen, and PyTorch's caching allocator fragments: a
# free figure this small leaves no room for what the sample missed. Sized as the catalogue's
# estimate of what an engine holds outside its sized pools (CUDA context, NCCL buffers, graphs).
FB_MARGIN_GIB = NON_TORCH_GIB_PER_GPU


@dataclass(frozen=True)
class MemoryHeadroom:
    """Framebuffer headroom of a pool's fullest GPU and the batch-token ceiling it sets."""

    used_frac: float  # DCGM FB used / (used + free)
    total_gib: float  # the SKU's framebuffer
    free_gib: float
    act_bytes_per_token: float  # per GPU, controller.perf.catalogue.ModelArch.activation_bytes_per_token
    max_batched_tokens: int  # the largest max_num_batched_tokens whose extra activation fits

    def to_dict(self) -> dict[str, float | int]:
        return {"fb_used_frac": round(self.used_frac, 4), "fb_total_gib": round(self.total_gib, 2),
                "fb_free_gib": round(self.free_gib, 2), "activation_kib_per_token": round(self.act_bytes_per_token
                                                                                          / 1024, 1),
                "max_batched_tokens": self.max_batched_tokens}


def memory_headroom(spec: PoolSpec, po: PoolObservation | None, mbt: int) -> MemoryHeadroom | None:
    """The memory ceiling on raising a pool's max_num_batched_tokens (now `mbt`), from DCGM's FB
    used fraction of its fullest GPU; None without a reading or a catalogue entry (no ceiling).

    Why framebuffer, not KV: vLLM preallocates its KV cache to `gpu_memory_utilization` of the GPU
    at start, so FB used sits near that share in steady state whatever the load, and the engine's
    own KV gauge tells KV headroom. What FB tells is whether a replica can take more activation
    memory: a larger token budget per step (the planner's slow lever, applied by a rolling restart)
    holds (Δ tokens × activation bytes per token) more at each layer's peak. SGLang keeps its
    activations and CUDA-graph buffers outside `mem_fraction_static`, in the free FB, so the extra
    must fit there or the first full chunk runs out of memory. vLLM's start-up profile fits the
    larger peak inside its budget by shrinking the KV cache, but FB used above the budget is memory
    the profile did not see (another process, a leak, graphs, fragmentation), and the free FB is
    all that is left for it. So for both: a raise is allowed while its extra activation plus
    `FB_MARGIN_GIB` fits in the free FB of the fullest GPU. Example: Llama-3-8B on one A100 80 GB
    at the vLLM default 0.9 has 8 GiB free: 7 GiB over the margin at 88 KiB a token is ~83,000 tokens
    more than now (the ceiling never binds the 1,024-8,192 options); at 0.99 used, 0.8 GiB free is
    under the 1 GiB margin: no raise.
    """
    used = value(po.gpu_mem_used_frac) if po is not None else None
    if used is None or not 0.0 <= used <= 1.0:
        return None
    try:
        arch, sku = _CATALOGUE.model(spec.model), _CATALOGUE.sku(spec.sku)
    except EngineError:
        return None
    per_token = arch.activation_bytes_per_token(max(spec.gpus_per_replica, 1))
    free = (1.0 - used) * sku.memory_gib
    room = max(free - FB_MARGIN_GIB, 0.0) * GIB
    return MemoryHeadroom(used_frac=used, total_gib=sku.memory_gib, free_gib=free, act_bytes_per_token=per_token,
                          max_batched_tokens=int(mbt + room // per_token))


def activate(pools: list[PoolInput], arrivals: Mapping[str, float], demand: bool) -> list[PoolInput]:
    """Scale from zero: a route group that serves nothing (no replica ready or starting) while traffic
    for it is seen gets one replica on the cheapest pool of each of its hops (lo raised to 1).

    Traffic for a group is its pools' arrivals, or, in a fleet with one route group, `demand`: any
    demand at the router or requests it holds (a pool at zero has no engine to count arrivals; the
    router holds them while the first replica starts). The planner alone may rather lose those requests than pay
    for a replica that serves nothing through a long cold start (a 300 s start is ten of its twenty
    steps), and would leave the pool at zero for good. Pinned or frozen pools are left alone.
    Example: one group, pool at 0, 3 req/s at the router → the pool's minimum becomes 1 this tick.
    """
    single = len({p.group for p in pools}) == 1
    out = list(pools)
    for g in {p.group for p in pools}:
        members = [j for j, p in enumerate(pools) if p.group == g]
        if any(pools[j].ready + len(pools[j].starting_eta_s) > 0 for j in members):
            continue
        if not (arrivals.get(g, 0.0) > 0 or (single and demand)):
            continue
        for decode in (False, True):
            hop = [j for j in members if (pools[j].role == "decode") == decode and pools[j].hi >= 1
                   and not pools[j].frozen and pools[j].lo < pools[j].hi]
            if hop:
                j = min(hop, key=lambda i: (pools[i].usd_per_hour, pools[i].name))
                out[j] = replace(pools[j], lo=max(pools[j].lo, 1))
    return out


def memory_headrooms(inp: PolicyInput, mem: Mapping[str, MpcPoolMemory]) -> dict[str, MemoryHeadroom]:
    """`memory_headroom` of every pool with a framebuffer reading, at the batch caps in force."""
    out = {}
    for spec in inp.fleet.pools:
        m = mem.get(spec.name)
        caps = (m.caps if m is not None else None) or (spec.max_num_seqs, spec.max_num_batched_tokens)
        h = memory_headroom(spec, inp.observation.pools.get(spec.name), int(caps[1]))
        if h is not None:
            out[spec.name] = h
    return out


def pool_inputs_for_steps(fleet: FleetSpec) -> list[PoolInput]:
    return [PoolInput(name=p.name, model_index=j, group=p.group, role=p.role, usd_per_hour=0.0, lo=0, hi=0,
                      target=0, ready=0, startup_cold_s=p.startup_cold_s) for j, p in enumerate(fleet.pools)]


def safe_batch(model: PlanModel, j: int, m: MpcPoolMemory, spec: PoolSpec, tpot_slo: float, hit: float) -> int:
    """In-flight cap per replica at which predicted p95 TPOT stays within 90 % of the tightest SLO."""
    lam = np.linspace(0.02, 1.0, 60) * 40.0
    n = len(lam)
    caps = m.caps or (spec.max_num_seqs, spec.max_num_batched_tokens)
    a = model.latency(LatencyQuery(pool_index=np.full(n, j), rps_per_replica=lam,
                                   prompt_tokens=np.full(n, m.prompt_tokens or 1000.0),
                                   output_tokens=np.full(n, m.output_tokens or 200.0), hit_rate=np.full(n, hit),
                                   inflight_cap=np.zeros(n), max_num_seqs=np.full(n, float(caps[0])),
                                   max_num_batched_tokens=np.full(n, float(caps[1]))))
    ok = (a.tpot_p95_s <= 0.9 * tpot_slo) & (a.utilisation < 1.0)
    if not ok.any():
        return 8
    return int(max(8, math.ceil(float(a.batch[ok].max()))))


# Step of the in-flight batches `guard_batch` tries (from the planner's smallest cap, 8, by 4 up to
# max_num_seqs): a cap between two of them is at most 4 streams below the safe batch, under 10 % of the
# batches the guard binds at (40-120).
GUARD_BATCH_STEP = 4


def guard_tpot_s(fleet: FleetSpec, spec: PoolSpec) -> float | None:
    """The TPOT the stream guard keeps on `spec`: the tightest TPOT SLO among the protected classes the
    pool may serve (its tier rule's share above 0); None for a prefill-only pool, whose requests
    decode elsewhere (the decode pool's guard keeps their TPOT), or a pool no protected class reaches."""
    if spec.role == "prefill":
        return None
    eligible = dict(spec.eligible)
    slos = [s.tpot_s for c, s in fleet.slos.items() if c in PROTECTED and eligible.get(c, 1.0) > 0.0]
    return min(slos) if slos else None


def guard_batch(prior: QueueingPrior, j: int, m: MpcPoolMemory, spec: PoolSpec, tpot_slo: float,
                hit: float, min_batch: int) -> int | None:
    """The in-flight requests per replica at which pool j's engine, run full behind that cap, keeps its
    p95 request TPOT within 90 % of `tpot_slo` (as `safe_batch`'s target), on the calibrated engine
    figures alone; None when no batch from `min_batch` (the planner's smallest cap,
    `MpcConfig.min_inflight_cap`) does (a cap could not hold the SLO there, and would only cost
    throughput).

    Why behind the cap, full: the guard binds when more arrive than the engines serve, and then every
    stream that finishes is replaced at once, so each engine step carries its batch's decode plus the
    prefill of the requests replacing finished ones (batch / output tokens of them per step). That is
    the prior's answer at its concurrency limit (`QueueingPrior.latency` with the cap as the limit and
    an arrival rate far above it). Why the calibrated figures, not the online-corrected model: the
    corrections are learned from 60 s windows whose p95 carries bursts and backlogs of uncapped
    engines, effects the cap itself removes, so they would put the ceiling below what the engine
    sustains (a 70B pool's corrected model gave 36 where 100 streams ran at a p95 TPOT of 82 ms);
    nor the burst term (a burst's prefill arrives at once only where no cap holds it back).
    Example (Llama-3-8B on an A100, 1,260-token prompts, 152 output tokens, critical's 0.1 s TPOT, so
    a 90 ms target): at 20 % prefix hits the p95 is 73 ms at 48 streams and 91 ms at 64, and the guard
    is 60; at no hits 52, at 40 % hits 72 (less prefill per step leaves room for more streams)."""
    top = int(spec.max_num_seqs)
    if top < min_batch or not math.isfinite(tpot_slo):
        return None
    batches = np.arange(min_batch, top + 1, GUARD_BATCH_STEP, dtype=float)
    n = len(batches)
    k = len(prior.pools)
    calibrated = prior.with_corrections([1.0] * k, [1.0] * k, prior.base_confidence, [0.0] * k)
    caps = m.caps or (spec.max_num_seqs, spec.max_num_batched_tokens)
    a = calibrated.latency(LatencyQuery(pool_index=np.full(n, j), rps_per_replica=np.full(n, 1e4),
                                        prompt_tokens=np.full(n, m.prompt_tokens or 1000.0),
                                        output_tokens=np.full(n, m.output_tokens or 200.0),
                                        hit_rate=np.full(n, hit), inflight_cap=batches,
                                        max_num_seqs=np.full(n, float(caps[0])),
                                        max_num_batched_tokens=np.full(n, float(caps[1]))))
    ok = a.tpot_p95_s <= 0.9 * tpot_slo
    return int(batches[ok].max()) if ok.any() else None


def stream_guards(prior: QueueingPrior, fleet: FleetSpec, mem: Mapping[str, MpcPoolMemory],
                  obs_pools: Mapping[str, PoolObservation], min_batch: int) -> dict[str, int]:
    """The stream guard: per pool, a standing ceiling on the in-flight cap (requests per replica the
    router lets into the engines; critical passes it): `guard_batch` at the pool's measured prompt and
    output lengths and hit rate, never below a batch the pool is seen running on pace
    (`seen_safe_batch`).

    Why standing: a surge, a burst or a crash's rerouted load fills every engine up to max_num_seqs
    (256) within seconds, before any tick reads it, and every stream admitted then runs slow for its
    whole life; the critical requests among them miss their TPOT SLO while the standard ones, whose
    SLO is looser, still pass. Behind the ceiling the excess waits at the router in priority order
    instead: the engines keep every stream's TPOT within the tightest protected SLO, critical enters
    at once, and the wait falls on standard and sheddable requests, whose TTFT SLOs are longer. The
    design's order (sheddable before standard before critical) then holds for delay as it does for
    shedding. The planner still chooses the cap below the ceiling. What it costs: throughput in a
    burst (a smaller batch serves fewer requests per second), paid in standard's TTFT where the
    replicas are short; measured in docs/decisions/0014-stream-guard.md."""
    out: dict[str, int] = {}
    for j, spec in enumerate(fleet.pools):
        tpot = guard_tpot_s(fleet, spec)
        if tpot is None:
            continue
        po = obs_pools.get(spec.name)
        hit = (value(po.hit_rate) if po is not None else None) or 0.0
        b = guard_batch(prior, j, mem[spec.name], spec, tpot, hit, min_batch)
        if b is None:
            continue
        ready = value(po.replicas_ready) if po is not None else None
        out[spec.name] = max(b, seen_safe_batch(po, int(round(ready)) if ready is not None else 0, tpot))
    return out


def seen_safe_batch(po: PoolObservation | None, ready: int, tpot_slo: float) -> int:
    """The batch per replica the pool runs at now, if its measured p95 TPOT is within the same target as
    `safe_batch` (90 % of the tightest TPOT SLO); else 0.

    Why: a batch the pool is seen running at with its streams on pace is safe, whatever the model says.
    The model's TPOT carries correction factors learned in other regimes (a burst, a crash's backlog),
    and a cap below a batch that was safe only starves the pool: every request held behind it waits
    at the router, and a protected class's TTFT goes over its SLO for nothing. Seen on generated
    traffic (seed 1, case 38): after a crash the model's safe batch was 8 while the survivor ran 43
    streams at a p95 TPOT of 0.08 s (SLO 0.1 s), and standard requests waited 7-16 s behind the cap.
    Measured on seeds 1-3 in docs/decisions/0010-seen-safe-batch-and-router-queue-gauge.md."""
    if po is None or ready < 1:
        return 0
    tpot, running = value(po.request_tpot_p95_s), value(po.running)
    if tpot is None or running is None or not math.isfinite(tpot) or tpot > 0.9 * tpot_slo:
        return 0
    return int(math.ceil(running / ready - 1e-9))


def redundancy_floor(spec: PoolSpec, po: PoolObservation | None, min_serving: int) -> int | None:
    """The replicas a pool that carries traffic keeps whatever the plan needs (None: no floor).

    Why: the planner sizes a pool for its load, and a light load needs one replica. That replica is
    then a single point of failure: if it crashes, every request in flight fails and nothing serves
    the pool's traffic until a replacement has gone through its cold start (90-600 s); if it slows
    down (a bad GPU, a noisy neighbour, thermal throttling), every request runs slow and no router
    can steer around it. With two, the router moves the load to the survivor, which at a load one
    replica carries, carries it. This is the availability minimum of any replicated service (the
    Kubernetes guidance for a Deployment behind a PodDisruptionBudget), not a figure fitted to a
    trace; measured on generated cases of seeds 1-3 (docs/decisions/0013-redundancy-floor.md).

    Per pool, not per route group: a group's traffic is split over its pools by weight (the
    planner sets the weights once a tick), so between ticks the other pool does not take over the
    share of a pool whose one replica failed. Measured too: a per-group floor (none where a second
    pool of the group carries traffic) kept 19 of 40 generated cases of seed 1 against 23 per pool.
    A pool with no arrivals (scaled to zero, or its traffic moved away) gets no floor, and the pool's
    own maximum wins. Example: 0.8 replicas' worth of load, `min_serving_replicas` 2 → floor 2.

    Where it applies (`split_floors`): the only pool of its route group and hop has nowhere to send
    its traffic, so the floor is a lower bound of the plan. A pool that shares its hop with others
    could be emptied by the plan (its traffic moved to a sibling, its replicas then released); a
    lower bound over the whole horizon would hide that saving from the planner and pin the split,
    so there the floor applies to the decision, and only when the plan's first step still sends
    the pool traffic.
    """
    arr = value(po.arrival_rps) if po is not None else None
    if min_serving <= 1 or arr is None or arr <= 0:
        return None
    return min(min_serving, spec.max_replicas)


def redundancy_floors(fleet: FleetSpec, obs_pools: Mapping[str, PoolObservation], min_serving: int) -> dict[str, int]:
    """`redundancy_floor` of every pool that has one this tick."""
    out = {}
    for spec in fleet.pools:
        f = redundancy_floor(spec, obs_pools.get(spec.name), min_serving)
        if f is not None:
            out[spec.name] = f
    return out


def split_floors(fleet: FleetSpec, floors: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """`floors` → (the plan's lower bounds: pools alone on their route group's hop, the decision's floors:
    pools sharing it, applied only where the plan keeps sending them traffic; see `redundancy_floor`)."""
    count = Counter(hop(p) for p in fleet.pools)
    alone = {p.name for p in fleet.pools if count[hop(p)] == 1}
    return ({n: f for n, f in floors.items() if n in alone}, {n: f for n, f in floors.items() if n not in alone})


def build_problem(inp: PolicyInput, fleet: FleetSpec, mem: Mapping[str, MpcPoolMemory],
                  targets: Mapping[str, int], class_share: Mapping[str, float], fc: LoadForecast,
                  weights: ObjectiveWeights, action: BreakerAction, model: PlanModel, now: float, history_s: float, *,
                  min_history_s: float, batch_review_s: float, protect_streams: bool,
                  feedback: Feedback | None = None,
                  headroom: Mapping[str, MemoryHeadroom] | None = None,
                  redundancy: Mapping[str, int] | None = None,
                  guards: Mapping[str, int] | None = None) -> PlanProblem:
    """The problem of this tick. `feedback`: the floors and shed floor a measured backlog sets
    (feedback.py), lower bounds like the breaker's. `headroom`: each pool's framebuffer ceiling
    on raising its batch caps (`memory_headroom`; a pool without one has none). `redundancy`: the
    floors of `redundancy_floors`, lower bounds too. `guards`: the stream guard's ceilings on the
    in-flight cap (`stream_guards`), where the breaker or a measured backlog sets none."""
    obs = inp.observation
    fb = feedback or Feedback()
    pools: list[PoolInput] = []
    tpot_slo = min((s.tpot_s for s in fleet.slos.values()), default=math.inf)
    # the slow lever is reviewed only in steady state: enough history, a trusted model, no breaker
    steady = history_s >= min_history_s
    groups: dict[str, float] = {}
    for j, spec in enumerate(fleet.pools):
        m = mem[spec.name]
        po = obs.pools.get(spec.name)
        pd = inp.current.pools.get(spec.name) if inp.current is not None else None
        lo, hi, frozen = override_bounds(spec, inp.overrides, now)
        target = targets[spec.name]
        floors = [f for f in (action.min_replicas.get(spec.name), fb.floors.get(spec.name),
                              (redundancy or {}).get(spec.name)) if f is not None]
        floor = max(floors) if floors else None
        if floor is not None and lo < hi:
            lo = min(max(lo, floor), hi)
        if frozen:
            lo = hi = target
        ready = value(po.replicas_ready) if po is not None else None
        ready_n = int(round(ready)) if ready is not None else max(target - len(m.etas), 0)
        waiting = (value(po.waiting) or 0.0) if po is not None else 0.0
        arr = value(po.arrival_rps) if po is not None else None
        if arr is not None:
            groups[spec.group] = groups.get(spec.group, 0.0) + arr
        hit = (value(po.hit_rate) if po is not None else None) or 0.0
        inf_hit, ws = reuse(spec, m, po, pd, model, j, ready_n)
        caps = m.caps or (spec.max_num_seqs, spec.max_num_batched_tokens)
        max_cap = (guards or {}).get(spec.name)
        breaker_protects = action.protect_streams and spec.name in action.pools
        # a measured backlog protects the running streams at once too: with a prefill queue standing,
        # every engine step carries a full prefill chunk, and every stream's TPOT is that step's time
        if protect_streams and (breaker_protects or spec.name in fb.breaches):
            # Cap at the SLO-safe batch. A router cap must not lock critical requests out of a
            # priority-ordered engine queue that is still deep with older work (more than one
            # queued request per replica): then never below what the replicas already hold (it
            # bites as the backlog drains). With a shallow queue the streams already running are
            # what the cap protects, so it bites at once: a floor at the streams the survivors of
            # a crash hold would keep their TPOT above the SLO until those streams end.
            held = ((value(po.running) or 0.0) + waiting) / max(ready_n, 1) if po is not None else 0.0
            deep = standing_queue(waiting, ready_n)
            keep_held = deep and breaker_protects and spec.name not in fb.breaches
            max_cap = max(safe_batch(model, j, m, spec, tpot_slo, hit), int(math.ceil(held)) if keep_held else 0,
                          seen_safe_batch(po, ready_n, tpot_slo))
        pools.append(PoolInput(
            name=spec.name, model_index=j, group=spec.group, role=spec.role,
            usd_per_hour=spec.usd_per_replica_hour, lo=lo, hi=hi, target=min(max(target, lo), hi) if not frozen
            else target, ready=ready_n, starting_eta_s=tuple(max(e - now, 0.0) for e in m.etas),
            warm_slots=len(m.warm), startup_warm_s=spec.startup_warm_s, startup_cold_s=spec.startup_cold_s,
            standby=pd.warm_standby if pd else 0, prefix_weight=pd.prefix_weight if pd else 3.0,
            load_weight=(pd.queue_weight + pd.kv_weight) if pd else 4.0,
            inflight_cap=pd.inflight_cap if pd else 0,
            traffic_weight=pd.traffic_weight if pd else 1.0,
            max_num_seqs=int(caps[0]), max_num_batched_tokens=int(caps[1]),
            prompt_tokens=m.prompt_tokens or 1000.0, output_tokens=m.output_tokens or 200.0, hit_rate=hit,
            reuse_inf_hit=inf_hit, reuse_working_set=ws, backlog=waiting, frozen=frozen,
            max_prefix_weight=action.max_prefix_weight.get(spec.name), max_inflight_cap=max_cap,
            max_batched_tokens=h.max_batched_tokens if (h := (headroom or {}).get(spec.name)) else None,
            batch_review=batch_review_s > 0 and now - m.caps_changed_s >= batch_review_s
            and ready_n > 0 and steady and m.burst >= 0.2, eligible=spec.eligible))
    classes: list[ClassInput] = []
    total = sum(groups.values())
    gshare = {g: v / total for g, v in groups.items()} if total > 0 else {}
    # the reliability dial: that quantile of the forecast, held at what the reachable fleet carries (dial.py)
    reach = reachable_rps(pools, model, fc.lead_s, gshare) if pools else None
    plan_q = planned_quantile(fc, weights.reliability, reach)
    # the measured step profile (the core's estimate): what a lost request of each class loses with its task
    tasks = inp.estimate.tasks if inp.estimate is not None else None
    for c in PRIORITY_CLASSES:
        if c not in fleet.slos:
            continue
        s = fleet.slos[c]
        share = class_share.get(c, 0.0)
        co = obs.classes.get(c)
        shed_now = 0.0
        cur_adm = inp.current.admission.get(c) if inp.current is not None else None
        if cur_adm is not None:
            shed_now = cur_adm.shed_frac
        classes.append(ClassInput(
            name=c, ttft_slo_s=s.ttft_s, tpot_slo_s=s.tpot_s,
            p50_rps=tuple(float(x) * share for x in fc.p50), p90_rps=tuple(float(x) * share for x in plan_q),
            shed_now=shed_now, min_shed=max(float(action.min_shed.get(c, 0.0)), float(fb.min_shed.get(c, 0.0))),
            max_shed=1.0,
            backlog=(value(co.queue_depth) or 0.0) if co is not None else 0.0,
            task_loss=step_loss(prof) if tasks is not None and (prof := tasks.classes.get(c)) is not None else None))
    held = sum((value(co.queue_depth) or 0.0) for co in obs.classes.values())
    pools = activate(pools, groups, fc.level > 0 or held > 0)
    return PlanProblem(pools=tuple(pools), classes=tuple(classes), weights=weights, group_share=gshare)
