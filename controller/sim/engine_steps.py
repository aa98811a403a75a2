"""Step execution and timing of one Replica: segment boundaries, jumps, and applying a step's results.

A segment is one step, or a jump of k decode-only steps whose step time grows linearly with the
context (step i lasts dt + i × dd); its boundaries are in closed form (`_seg_time`), so an
interrupt can cut a jump at the next boundary. `on_segment_end` applies the tokens of the
segment, records the per-request stats and hands finished requests to the sink. Must not: choose
the next batch (engine_schedule) or read the clock.
"""

from __future__ import annotations

import heapq

from controller.sim.engine_records import (
    DONE,
    EV_SEG_END,
    MODE_DECODE_ONLY,
    MODE_PREFILL_ONLY,
    RUNNING,
    SEG_DEAD,
    SEG_IDLE,
    SEG_JUMP,
    SEG_STEP,
    ReplicaBase,
    Req,
)


class StepsMixin(ReplicaBase):
    """Segments of a Replica (state: seg_*, version, dstep, t_last_step)."""

    __slots__ = ()

    def interrupt(self, now: float) -> None:
        """Cut the current decode jump at the step boundary after `now` (stale end event dropped)."""
        if self.seg_kind != SEG_JUMP or self.seg_k <= 1:
            return
        j = self._steps_done(now)
        if j + 1 >= self.seg_k:
            return
        if j > 0:
            self._advance(j)
        self.seg_k = 1
        self.seg_end = max(self.seg_t0 + self.seg_dt, now)
        # give back the blocks reserved for the steps that will not run
        end = self.dstep + 1
        if self.d_res > end:
            extra = self._blocks_between(end, self.d_res)
            self.cache.release(extra)
            self.dec_blocks -= extra
            self.d_res = end
        self.version += 1
        self.sink.push(self.seg_end, EV_SEG_END, self, self.version)

    def settle(self, now: float) -> None:
        """Apply the decode steps of the current jump completed by `now` (for up-to-date stats)."""
        if self.seg_kind != SEG_JUMP:
            return
        j = self._steps_done(now)
        if j >= self.seg_k:
            j = self.seg_k - 1
        if j > 0:
            self._advance(j)

    def _seg_time(self, j: int) -> float:
        """Time of the j-th step boundary of the current segment.

        Step i of a jump lasts dt + i × dd (the batch is fixed; its context grows by
        n_dec tokens a step and step time is linear in context), so boundary j is at
        t0 + j × dt + dd × j (j − 1) / 2. E.g. dt = 20 ms, dd = 0.01 ms: boundary 100
        is at t0 + 2 s + 49.5 ms.
        """
        return self.seg_t0 + j * self.seg_dt + self.seg_dd * j * (j - 1) * 0.5

    def _steps_done(self, now: float) -> int:
        """How many steps of the current segment have completed by `now`."""
        x = now - self.seg_t0
        if x <= 0:
            return 0
        dt, dd = self.seg_dt, self.seg_dd
        if dd > 0:
            b = dt - 0.5 * dd  # solve dd/2 j² + (dt − dd/2) j = x
            j = int((-b + (b * b + 2.0 * dd * x) ** 0.5) / dd)
        else:
            j = int(x / dt)
        while j > 0 and self._seg_time(j) > now:
            j -= 1
        while j < self.seg_k and self._seg_time(j + 1) <= now:
            j += 1
        return j

    def _advance(self, j: int, jump: bool = True) -> None:
        """Run j steps of the current segment for the decoders (tokens land at each step's end)."""
        n = self.n_dec
        self.dstep += j
        t = self._seg_time(j)
        span = t - self.seg_t0
        s = self.stats
        if n:
            s.generation_tokens += n * j
            s.itl_s.observe(span / j, n * j)  # the steps' mean duration (they differ by dd)
            if jump:
                s.iteration_tokens.observe(n, j)
        s.busy_s += span
        self.seg_t0 = t
        self.seg_dt += j * self.seg_dd
        self.t_last_step = t
        self.seg_k -= j

    def on_segment_end(self, version: int) -> None:
        """The scheduled end of a step or jump (ignored if a newer plan replaced it)."""
        if version != self.version or self.seg_kind in (SEG_IDLE, SEG_DEAD):
            return
        t = self.seg_end
        stats = self.stats
        finished: list[Req] = []
        kind = self.seg_kind
        n_dec = self.n_dec
        # decoders: every remaining step of the segment gives each one a token
        self._advance(self.seg_k, kind == SEG_JUMP)
        self.t_last_step = t
        if kind == SEG_STEP:
            sched = self.seg_sched
            self.seg_sched = []
            tokens = n_dec
            for r, c in sched:
                tokens += c
                if r.state != RUNNING or r.rep is not self:
                    continue  # aborted during the step
                r.e_ncomp += c
                if r.e_ncomp < r.e_ntok:
                    continue  # prefill chunk, no token yet
                if r.e_gen == 0:
                    r.e_first = t
                    stats.ttft_s.observe(t - r.t_engine)
                    stats.prefill_time_s.observe(t - r.t_sched)
                    stats.prompt_tokens += r.prompt
                    if self.caching and r.e_mode != MODE_DECODE_ONLY and len(r.units) > r.e_pinned:
                        new = r.units[r.e_pinned:]
                        r.e_held -= self.cache.insert_owned(new)
                        if r.e_held < 0:  # only if unit size is not a multiple of the block size
                            self.cache.free_blocks += r.e_held
                            r.e_held = 0
                        r.e_pinned = len(r.units)
                        r.e_cov = r.e_pinned * self.unit_tokens
                else:
                    stats.itl_s.observe(t - r.e_last)
                r.e_gen += 1
                r.e_ntok += 1
                r.e_last = t
                stats.generation_tokens += 1
                if r.e_gen == 1 and r.e_mode != MODE_PREFILL_ONLY:
                    self.sink.on_first_token(r, t)
                self.prefilling.remove(r)
                if r.e_gen >= r.e_out:
                    del self.running[r]
                    finished.append(r)
                else:
                    self._dec_enter(r)
            stats.iteration_tokens.observe(tokens)
        # decoders that reached their last token
        heap = self.fin_heap
        d = self.dstep
        while heap and heap[0][0] <= d:
            fd, _, r = heapq.heappop(heap)
            if r.d_in and r.rep is self and r.d_fin == fd:
                del self.running[r]
                self._dec_leave(r)
                finished.append(r)
        self.seg_kind = SEG_IDLE
        if not self.n_dec:
            self.d_res = self.dstep
        if finished:
            for r in finished:
                self._release(r)
                r.state = DONE
                r.rep = None
                stats.request_success["stop"] += 1.0
                stats.e2e_s.observe(t - r.t_engine)
                stats.inference_time_s.observe(t - r.t_sched)
                stats.decode_time_s.observe(t - r.e_first)
                if r.e_gen > 1:
                    stats.tpot_s.observe((t - r.e_first) / (r.e_gen - 1))
                stats.request_prompt_tokens.observe(r.prompt)
                stats.request_generation_tokens.observe(r.e_gen)
            for r in finished:
                self.sink.on_finish(r, t, self)
        if self.seg_kind == SEG_IDLE:  # a callback may have started a step already
            self._plan(t)
