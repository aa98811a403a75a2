"""Accounting of the simulated fleet: cost, per-request outcomes, summaries, timelines, pool states, gauges.

GPU time is billed per replica from the moment it is placed until it is gone
(`_accrue` integrates billed GPUs over time); `_refresh` brings every gauge (engine,
node, router) up to `now_s` after a run; `_sample` closes one timeline window every
`timeline_interval_s`. The result values (`SimSummary`, `TimelinePoint`, `PoolState`)
are frozen dataclasses.

Must not: read the wall clock, draw random numbers, or move a request or a replica
(settling engines to `now_s` only brings their counters up to date).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import numpy as np

from controller.jsonsafe import json_safe
from controller.sim.fleet_events import EV_SAMPLE
from controller.sim.fleet_records import DRAINING, READY, STANDBY, STARTING, FleetBase, PoolRT
from controller.sim.stats import NodeStats, ReplicaStats
from controller.types import PRIORITY_CLASSES

TIMELINE_INTERVAL_S = 10.0


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
    unavailable: int = 0  # asked for, pending past the cold start-up time: not coming (no GPU)


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
class TenantSummary:
    """One tenant's outcome. Cost is the fleet's cost split by the prompt + output tokens of each
    tenant's completed requests (a token-share attribution, as a chargeback report would do it)."""

    tasks: int
    successful_tasks: int
    slo_attainment: Mapping[str, float]  # per class of its tasks: succeeded / tasks
    quota_shed: int  # over-quota requests shed (every attempt counted)
    quota_delayed: int  # over-quota requests queued for a token
    cost_share: float  # 0..1
    cost_usd: float
    cost_per_successful_task_usd: float


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
    per_tenant: Mapping[str, TenantSummary] = field(default_factory=dict)  # empty without tenants

    def to_dict(self) -> dict:
        """JSON-ready: NaN becomes None."""
        return json_safe(asdict(self))


class AccountingMixin(FleetBase):
    """Cost and outcomes of a Fleet (state: per-request outcome arrays and counters, written by fleet_clients;
    the timeline and its current window)."""

    timeline_interval_s: float = TIMELINE_INTERVAL_S

    def _init_accounting(self) -> None:
        n = self._n
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
        self._win_shed = [0] * len(PRIORITY_CLASSES)
        self._timeline: list[TimelinePoint] = []
        self._t_prev_sample = 0.0

    def _start_sampling(self) -> None:
        self._push(self.timeline_interval_s, EV_SAMPLE, 0, 0)

    def _accrue(self, p: PoolRT) -> None:
        now = self.now_s
        if now > p.t_acc:
            p.gpu_s += p.billed_gpus * (now - p.t_acc)
            p.t_acc = now

    @property
    def cost_usd(self) -> float:
        total = 0.0
        for p in self.pools.values():
            self._accrue(p)
            total += p.gpu_s * p.usd_per_gpu_hour / 3600.0
        return total

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
        """Replicas per phase, as an autoscaler reports them: a replica pending for want of a GPU counts as
        starting until its cold start-up time has passed, then as unavailable (it is not coming)."""
        out = {}
        now = self.now_s
        for name, p in self.pools.items():
            c = {STANDBY: 0, STARTING: 0, READY: 0, DRAINING: 0}
            for i in p.insts:
                c[i.phase] += 1
            stuck = sum(1 for t in p.pending_since if now - t >= p.spec.startup_cold_s)
            out[name] = PoolState(name, p.target, c[READY], c[STARTING] + len(p.pending_since) - stuck, c[DRAINING],
                                  c[STANDBY], p.max_num_seqs, p.max_batched_tokens, unavailable=stuck)
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
            scaling_actions=self._scaling_actions, per_pool=per_pool, per_tenant=self._tenant_summaries(cost))

    def _tenant_summaries(self, cost: float) -> dict[str, TenantSummary]:
        wl = self.workload
        if wl.tenant is None:
            return {}
        names = wl.tenant_names
        k = len(names)
        n_cls = len(PRIORITY_CLASSES)
        task_tenant = np.zeros(self._n_tasks, dtype=np.int64)
        task_tenant[wl.task_id] = wl.tenant
        cell = task_tenant * n_cls + self._task_prio
        tasks = np.bincount(cell, minlength=k * n_cls).reshape(k, n_cls)
        ok = self._task_ok & self._task_resolved
        succ = np.bincount(cell[ok], minlength=k * n_cls).reshape(k, n_cls)
        done = self._status == 1
        tokens = (wl.trace.prompt_tokens + wl.trace.output_tokens).astype(np.float64)
        used = np.bincount(wl.tenant[done], weights=tokens[done], minlength=k)
        shares = used / used.sum() if used.sum() > 0 else np.zeros(k)
        out = {}
        for j, name in enumerate(names):
            att = {c: float(succ[j, c_i]) / int(tasks[j, c_i]) if tasks[j, c_i] else math.nan
                   for c_i, c in enumerate(PRIORITY_CLASSES) if c in self.scenario.classes or tasks[j, c_i]}
            q = self.router.tenants[j]
            n_succ = int(succ[j].sum())
            c_usd = cost * float(shares[j])
            out[name] = TenantSummary(
                tasks=int(tasks[j].sum()), successful_tasks=n_succ, slo_attainment=att, quota_shed=q.shed,
                quota_delayed=q.delayed, cost_share=float(shares[j]), cost_usd=c_usd,
                cost_per_successful_task_usd=c_usd / n_succ if n_succ else math.nan)
        return out

    def resolved_attainment(self) -> tuple[dict[str, float], int]:
        """Per class, the share of the tasks resolved so far (every step done, or one failed or late)
        that met their SLOs, and how many tasks are resolved. What a run cut short reports: the
        summary's `slo_attainment` divides by every task of the trace, arrived or not."""
        resolved = np.bincount(self._task_prio[self._task_resolved], minlength=len(PRIORITY_CLASSES))
        att = {}
        for k, c in enumerate(PRIORITY_CLASSES):
            if c in self.scenario.classes or resolved[k]:
                att[c] = float(self._success_per_class[k]) / int(resolved[k]) if resolved[k] else math.nan
        return att, int(resolved.sum())

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
        held = [0] * len(PRIORITY_CLASSES)  # per class over every pool: the flow-control queue gauge
        for p in self.pools.values():
            self._accrue(p)
            running = 0
            for i in p.insts:
                e = i.engine
                if e is not None:
                    e.refresh_gauges()
                    running += e.inflight
            rs.queue_size[p.name] = p.route.n_held
            for k, n in enumerate(p.route.held_by_prio):
                held[k] += n
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
        rs.queue_by_priority = dict(zip(PRIORITY_CLASSES, held, strict=True))

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
            kv = sum(i.live_engine().cache.usage_frac for i in ready) / len(ready) if ready else math.nan
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
