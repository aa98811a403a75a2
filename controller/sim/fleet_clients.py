"""Clients of the simulated fleet: requests, admission, routing to a pool, retries, timeouts, holds, completion.

A request is sent at its trace arrival (step 0) or `think_time_s` after its task's
previous step finished; the router admits or sheds it, picks a pool of its route
group and a replica, or holds it until one frees up (fleet.py's docstring states the
retry, timeout and task rules). The engine reports first tokens, finishes and
rejections back here (the `EngineSink` methods `on_first_token`, `on_finish`,
`on_reject`).

Must not: read the wall clock, draw random numbers itself (the router's seeded
generator chooses), or change replicas' lifecycle (fleet_lifecycle does).
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from controller.sim.engine import Replica
from controller.sim.engine_records import (
    DONE,
    FAILED,
    HELD,
    IDLE,
    MODE_DECODE_ONLY,
    MODE_FULL,
    MODE_PREFILL_ONLY,
    RUNNING,
    TRANSFER,
    WAITING,
    ReplicaBase,
    Req,
)
from controller.sim.fleet_events import EV_ADMIT, EV_HOLD_EXPIRE, EV_RETRY, EV_SEND, EV_TIMEOUT, EV_TRANSFER
from controller.sim.fleet_records import INF, FleetBase, Inst, PoolRT
from controller.sim.router import PoolRoute, TenantQuotaState
from controller.sim.scenario import Scenario
from controller.sim.stats import ClassStepStats
from controller.types import PRIORITY_CLASSES


class ClientsMixin(FleetBase):
    """Requests and tasks of a Fleet (state: the client settings, the workload as Python lists, task outcomes).

    ~270 lines, kept in one class: it is one path (send → dispatch → assign → first token → finish)
    with its failure branches (shed, hold expiry, timeout, retry, fail), and splitting it would
    scatter a request's life over two files."""

    def _init_clients(self, scenario: Scenario) -> None:
        rs = scenario.router
        self._kv_transfer_bytes_per_s = rs.kv_transfer_gbps * 1e9 / 8.0
        self._hold_timeout_s = rs.hold_timeout_s
        cl = scenario.clients
        self._timeout_s = cl.timeout_s
        self._max_retries = cl.max_retries
        self._backoff_s = cl.retry_backoff_s
        self._retry_on_shed = cl.retry_on_shed

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
                        f"trace.hash_block_tokens ({self._hbt}) must be a multiple of "
                        f"pools[{p.name}].engine.block_size ({e.block_size}) when prefix caching is enabled")
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
        # per class: list indexed by step (grown on demand)
        self._cells: list[list[ClassStepStats | None]] = [[None] * 1 for _ in PRIORITY_CLASSES]
        self._init_tiers(scenario)
        self._init_tenants(scenario)

    def _init_tiers(self, scenario: Scenario) -> None:
        """Tier rules: per route group, hop and class, the eligible pools for each range of the task's draw u.

        For one (group, hop, class) the pools' eligible shares sorted ascending are the cuts; a
        request with draw u may use the pools whose share is > u, i.e. those with share >= the
        first cut above u: `lists[bisect_right(cuts, u)]` (validation guarantees a share of 1)."""
        wl = self.workload
        self._tier_u: list[float] | None = wl.tier_u.tolist() if wl.tier_u is not None else None
        self._tier_tables: list[tuple[list[tuple[list[float], list[list[PoolRoute]]]], ...]] = []
        if self._tier_u is None:
            return
        for g in self._groups:
            hops = []
            for routes in (g.first, g.decode):
                per_class = []
                for c in PRIORITY_CLASSES:
                    share = {id(rt): self._pool_of_route[rt].spec.eligible_share(c) for rt in routes}
                    cuts = sorted({v for v in share.values() if v > 0.0})
                    lists = [[rt for rt in routes if share[id(rt)] >= cut] for cut in cuts]
                    per_class.append((cuts, lists))
                hops.append(per_class)
            self._tier_tables.append(tuple(hops))

    def _eligible(self, r: Req, hop: int, routes: list[PoolRoute]) -> list[PoolRoute]:
        """The routes of `routes` (the group's first-hop or decode pools) request `r` may use."""
        if self._tier_u is None:
            return routes
        cuts, lists = self._tier_tables[r.group][hop][r.prio]
        k = bisect_right(cuts, self._tier_u[r.idx])
        return lists[k] if k < len(lists) else routes  # k == len only if validation was bypassed

    def _init_tenants(self, scenario: Scenario) -> None:
        wl = self.workload
        self._tenant: list[int] | None = wl.tenant.astype(np.int64).tolist() if wl.tenant is not None else None
        self.router.tenants = []
        for name in wl.tenant_names:
            t = scenario.tenants[name]
            queue = tuple(t.over_quota.get(c, "shed") == "queue" for c in PRIORITY_CLASSES)
            # a queued request waits at most its class's TTFT SLO (later, it has missed it) and never
            # past the client's timeout (the client would have given up)
            max_wait = tuple(min(slo, self._timeout_s) for slo in self._slo_ttft)
            self.router.tenants.append(TenantQuotaState(t.quota_rps, t.quota_burst_s, queue, max_wait))

    def _new_req(self, i: int) -> Req:
        prompt = self._prompt[i]
        units: tuple[int, ...] = ()
        if self._hashes is not None:
            units = tuple(self._hashes[i][: prompt // self._hbt])
        task = self._task[i]
        r = Req(i, self._prio[i], task, self._step[i], prompt, self._output[i], units,
                task % len(self._groups) if len(self._groups) > 1 else 0)
        r.cell = self._cell(r.prio, r.step)
        return r

    def _cell(self, prio: int, step: int) -> ClassStepStats:
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
        r.cell.arrivals += 1
        tenant = self._tenant
        if tenant is not None:
            wait = self.router.tenants[tenant[r.idx]].admit(r.prio, now)
            if wait < 0.0:
                self._on_shed(r, 429)
                return
            if wait > 0.0:
                self.push(now + wait, EV_ADMIT, r, r.attempt)
                return
        self._admit_and_route(r)

    def _on_admit(self, r: Req, attempt: int) -> None:
        """A request queued for its tenant's quota token: its token is due now."""
        if r.attempt == attempt and r.state == IDLE:
            self._admit_and_route(r)

    def _admit_and_route(self, r: Req) -> None:
        cell = r.cell
        code = self.router.admit(r.prio, self.now_s, self.router.later(r))
        if code:
            self._on_shed(r, code)
            return
        cell.admitted += 1
        g = self._groups[r.group]
        route = self.router.choose(self._eligible(r, 0, g.first) if self._tier_u is not None else g.first)
        p = self._pool_of_route[route]
        p.requests += 1
        p.win_arrivals += 1
        r.pool = p
        self._dispatch(r, p, MODE_PREFILL_ONLY if p.role == "prefill" else MODE_FULL)

    def _dispatch(self, r: Req, p: PoolRT, mode: int) -> None:
        route = p.route
        rep = route.pick(r)
        if rep is None:
            later = self.router.later(r)
            if not self.router.can_hold(r.prio, later):
                self._on_shed(r, 503)
                return
            r.e_mode = mode
            route.hold(r, later)
            self.router.held_in(r, later)
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
        router = self.router
        while route.n_held:
            r = route.peek_held()
            if r is None:
                break
            rep = route.pick(r)
            if rep is None:
                break
            route.pop_held()
            router.held_out(r)
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
            route = r.held_pool
            assert route is not None  # a held request names the route holding it
            route.unhold(r)
            self.router.held_out(r)
        elif st in (WAITING, RUNNING):
            rep = r.rep
            assert rep is not None and isinstance(rep.owner, Inst)  # on a replica the fleet started
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
        route = r.held_pool
        assert route is not None  # a held request names the route holding it
        route.unhold(r)
        self.router.held_out(r)
        self._on_shed(r, 503)

    def _on_transfer(self, r: Req, attempt: int) -> None:
        if r.attempt != attempt or r.state != TRANSFER:
            return
        route = self.router.choose(self._eligible(r, 1, self._groups[r.group].decode))
        r.t_queued = self.now_s
        self._dispatch(r, self._pool_of_route[route], MODE_DECODE_ONLY)

    def on_first_token(self, r: Req, t_s: float) -> None:
        r.streamed = True
        if r.t_first_tok < 0:
            r.t_first_tok = t_s
        r.cell.ttft_s.observe(t_s - r.t_send)
        pool = r.pool
        assert pool is not None  # set when the request was sent
        pool.win_ttft.append(t_s - r.t_first_send)

    def on_finish(self, r: Req, t_s: float, rep: ReplicaBase) -> None:
        inst = rep.owner
        assert isinstance(inst, Inst)  # set when the fleet started the engine
        p = inst.pool
        if r.e_mode == MODE_PREFILL_ONLY:
            r.state = TRANSFER
            xfer = r.prompt * p.arch.kv_bytes_per_token / self._kv_transfer_bytes_per_s
            self.push(t_s + xfer, EV_TRANSFER, r, r.attempt)
        else:
            self._complete(r, t_s)
        if p.route.n_held:
            self._dispatch_held(p)

    def on_reject(self, r: Req, t_s: float, rep: ReplicaBase) -> None:
        self._count_error(r, "400")
        self._fail(r)

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
