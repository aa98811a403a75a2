"""Batch formation of one Replica: the vLLM V1 scheduler step with the priority policy (`_plan`).

Each plan gives every decoder a token, running prefills a chunk, then admits waiting requests
(prefix-cache lookup on first scheduling) while seats, the token budget and KV blocks last,
preempting the lowest-priority, latest-arrived request when blocks run out; then it either runs
one step or, when nothing can change the batch, jumps to the first completion. Must not: apply a
step's results (engine_steps does, at the segment's end) or read the clock (time is `now`).
"""

from __future__ import annotations

import heapq

from controller.sim.engine_records import (
    EV_SEG_END,
    IDLE,
    MODE_DECODE_ONLY,
    RUNNING,
    SEG_IDLE,
    SEG_JUMP,
    SEG_STEP,
    ReplicaBase,
    Req,
)


class ScheduleMixin(ReplicaBase):
    """The scheduler of a Replica. `_plan` is one method on purpose: it is the simulator's hot loop
    and its three phases share the step's token budget and preemption flag."""

    __slots__ = ()

    def _plan(self, now: float) -> None:
        """Decide the next step (or jump) at `now` and schedule its end."""
        cache = self.cache
        bs = self.block_size
        stats = self.stats
        running = self.running
        preempted = False
        d = self.dstep

        # 1) every decoder gets one token: blocks for the decoders that cross a block boundary
        if self.n_dec:
            while True:
                need = self._blocks_between(self.d_res, d + 1) if self.d_res < d + 1 else 0
                if need <= 0 or cache.allocate(need):
                    break
                self._preempt(max(running, key=_victim_key))
                preempted = True
                if not self.n_dec:
                    need = 0
                    break
            if need > 0:
                self.dec_blocks += need
            if self.n_dec and self.d_res < d + 1:
                self.d_res = d + 1
        budget = self.max_batched_tokens - self.n_dec

        # 2) running prefills get a chunk each, in scheduling order
        sched: list[tuple[Req, int]] = []
        if self.prefilling:
            for r in list(self.prefilling):
                if budget <= 0:
                    break
                if r.state != RUNNING:
                    continue  # preempted earlier in this loop
                pending = r.e_ntok - r.e_ncomp
                c = pending if pending < budget else budget
                need = -(-(r.e_ncomp + c - r.e_cov) // bs) - r.e_held
                while need > 0 and not cache.allocate(need):
                    victim = max(running, key=_victim_key)
                    for k, (s, sc) in enumerate(sched):
                        if s is victim:
                            del sched[k]
                            budget += sc
                            break
                    was_dec = victim.d_in
                    self._preempt(victim)
                    preempted = True
                    if was_dec:
                        budget += 1
                        if not self.n_dec:
                            self.d_res = self.dstep
                    if victim is r:
                        break
                if r.state != RUNNING:
                    continue
                if need > 0:
                    r.e_held += need
                sched.append((r, c))
                budget -= c

        # 3) waiting requests, by priority then arrival, while seats, budget and blocks last
        admitted = False
        if not preempted:
            waiting = self.waiting
            while self.n_waiting and budget > 0 and len(running) < self.max_num_seqs:
                q = waiting[0] or waiting[1] or waiting[2]
                r = q[0]
                m = 0
                if r.e_ncomp == 0 and r.e_mode != MODE_DECODE_ONLY:
                    # prefix-cache lookup (first scheduling, or after a preemption)
                    if self.caching and r.units:
                        m = cache.match(r.units, len(r.units))
                    hit = m * self.unit_tokens
                    if hit > r.e_ntok - 1:
                        hit = r.e_ntok - 1
                    if m:
                        cache.pin(r.units[:m])
                    r.e_pinned = m
                    r.e_cov = m * self.unit_tokens
                    r.e_ncomp = hit
                else:
                    hit = -1
                pending = r.e_ntok - r.e_ncomp
                c = pending if pending < budget else budget
                need = -(-(r.e_ncomp + c - r.e_cov) // bs) - r.e_held
                if need > 0 and not cache.allocate(need):
                    if hit >= 0:  # undo the lookup; it is repeated when the request fits
                        if m:
                            cache.unpin(r.units[:m])
                        r.e_pinned = 0
                        r.e_cov = 0
                        r.e_ncomp = 0
                    if not running and need > cache.total_blocks - cache.pinned_blocks:
                        # can never fit, even in an empty cache: vLLM rejects such a request
                        q.popleft()
                        self.n_waiting -= 1
                        r.state = IDLE
                        r.rep = None
                        stats.request_success["error"] = stats.request_success.get("error", 0.0) + 1.0
                        self.sink.on_reject(r, now, self)
                        continue
                    break
                if hit >= 0:
                    stats.prefix_cache_queries += r.e_ntok
                    stats.prefix_cache_hits += hit
                if need > 0:
                    r.e_held += need
                q.popleft()
                self.n_waiting -= 1
                r.state = RUNNING
                running[r] = None
                self.prefilling.append(r)
                if r.t_sched < 0:
                    r.t_sched = now
                    stats.queue_time_s.observe(now - r.t_engine)
                sched.append((r, c))
                budget -= c
                admitted = True

        n_dec = self.n_dec
        if not sched and not n_dec:
            self.seg_kind = SEG_IDLE
            if self.n_waiting and not running:
                if preempted:  # the last running request preempted itself: admit again
                    self._plan(now)
                    return
                # blocked with nothing running: impossible with consistent accounting; never stall silently
                raise RuntimeError(f"replica {self.rid}: {self.n_waiting} waiting requests cannot be scheduled")
            if self.draining and not running and not self.n_waiting:
                self.sink.on_empty(self, now)
            return

        n_run = len(running)
        if n_run > self.max_running_seen:
            self.max_running_seen = n_run
        dec_ctx = self.dec_k0_sum + n_dec * (d + 1)
        pf_tokens = 0
        pf_work = 0.0
        for r, c in sched:
            pf_tokens += c
            pf_work += c * (r.e_ncomp + c / 2.0)
        tokens = n_dec + pf_tokens
        if tokens > self.max_tokens_seen:
            self.max_tokens_seen = tokens
        model = self.model
        if not sched and not self.prefilling and not admitted and not preempted:
            # pure decode, nothing admissible: jump to the first completion (or KV exhaustion)
            heap = self.fin_heap
            while heap:
                fd, _, r = heap[0]
                if r.d_in and r.rep is self and r.d_fin == fd:
                    break
                heapq.heappop(heap)
            k = heap[0][0] - d if heap else 1
            if k > 1:
                avail = cache.available_blocks
                need = self._blocks_between(self.d_res, d + k)
                if need > avail:
                    lo, hi = 1, k  # d + lo is reserved already; d + hi does not fit
                    while hi - lo > 1:
                        mid = (lo + hi) // 2
                        if self._blocks_between(self.d_res, d + mid) <= avail:
                            lo = mid
                        else:
                            hi = mid
                    k = lo
                    need = self._blocks_between(self.d_res, d + k)
                if need > 0:
                    cache.allocate(need)
                    self.dec_blocks += need
                if d + k > self.d_res:
                    self.d_res = d + k
            if k > 1:
                dt = model.step_time_s(0, 0.0, n_dec, dec_ctx) * self.slow_factor
                dd = model.step_time_s(0, 0.0, n_dec, dec_ctx + n_dec) * self.slow_factor - dt
                self.seg_kind = SEG_JUMP
                self.seg_t0 = now
                self.seg_dt = dt
                self.seg_dd = dd if dd > 0.0 else 0.0
                self.seg_k = k
                self.seg_end = self._seg_time(k)
                self.version += 1
                self.sink.push(self.seg_end, EV_SEG_END, self, self.version)
                return
        dt = model.step_time_s(pf_tokens, pf_work, n_dec, dec_ctx) * self.slow_factor
        self.seg_kind = SEG_STEP
        self.seg_t0 = now
        self.seg_dt = dt
        self.seg_dd = 0.0
        self.seg_k = 1
        self.seg_end = now + dt
        self.seg_sched = sched
        self.version += 1
        self.sink.push(self.seg_end, EV_SEG_END, self, self.version)


def _victim_key(r: Req) -> tuple[int, int]:
    """vLLM V1 priority policy: preempt the lowest priority, then the latest arrival."""
    return (r.prio, r.e_seq)
