"""One simulated inference engine (a vLLM V1 replica): continuous batching on a KV budget.

Scheduling follows vLLM V1's scheduler with the priority policy:

- a waiting queue ordered by priority class (critical > standard > sheddable),
  FCFS within a class; preempted requests go back to the *front* of their class;
- each step first gives every running decode one token, then running prefills a
  chunk, then admits waiting requests while `max_num_seqs` and the per-step
  token budget `max_num_batched_tokens` allow (chunked prefill: a long prompt is
  split across steps). vLLM requires max_num_batched_tokens >= max_num_seqs, so
  every running decode always fits in the budget;
- KV blocks are allocated per step; when they run out, the lowest-priority,
  latest-arrived running request is preempted by recompute: its blocks are
  freed and it returns to the waiting queue, to recompute prompt + generated
  tokens later (vllm:num_preemptions);
- a request's first scheduling looks its prompt up in the prefix cache; hit
  tokens skip prefill (vllm:prefix_cache_queries / hits, in tokens);
- step time comes from the calibrated IterationModel.

Speed. One event per engine step would be ~10^7 events per trace-hour, and a
per-request loop per step ~10^9 operations for a busy batch. Two ideas avoid both:

1. Decoding requests are kept *implicitly*. Every step advances every decoding
   request by exactly one token, so the replica keeps one decode-step counter D
   and each decoding request stores offsets (tokens = offset + D). Aggregates
   make a step O(1) in the number of decoders: Σ context = Σ offsets + n × D;
   new KV blocks needed for the next k steps come from a count of decoders per
   (own tokens mod block_size) class; a min-heap of finishing step counts gives
   the next completion. Only prefilling requests are handled one by one.
2. Segments. A step with prefill work is one segment. When no request is
   prefilling and no waiting request can be admitted, nothing about the batch
   changes until its first request finishes, so the replica jumps k steps at
   once: k = steps to the first completion, cut short if the KV blocks for k
   more tokens are not available. The batch of a jump is fixed, so its step
   time grows linearly with the context (n_dec more tokens each step): step i
   takes dt + i × dd, with dt and dd from two IterationModel calls, and step
   boundaries are known in closed form (exact when step time is linear in
   decode context, as the calibrated model is): 8 sequences at 1,000 tokens of
   context jumping 200 steps take 200 × dt(8,000) + dd × 200 × 199 / 2. An arrival (or abort, slow-down) during a jump
   truncates it at the next step boundary; the stale end event is ignored through
   a per-replica version counter. KV blocks for a jump are reserved at its start
   (and given back if it is truncated).

Must not: route, retry, decide what a failure means for the client, or read the
wall clock. It reports first tokens, finishes and rejections to a sink.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING, Protocol

from controller.sim.cache import PrefixCache
from controller.sim.stats import ReplicaStats

if TYPE_CHECKING:  # the fleet's records the requests and engines carry (the engine never reads them)
    from controller.sim.fleet_records import Inst, PoolRT
    from controller.sim.router import PoolRoute
    from controller.sim.stats import ClassStepStats

# request states (Req.state)
IDLE, HELD, WAITING, RUNNING, TRANSFER, DONE, FAILED = range(7)
# request modes on a replica
MODE_FULL, MODE_PREFILL_ONLY, MODE_DECODE_ONLY = 0, 1, 2
# replica segment kinds
SEG_IDLE, SEG_STEP, SEG_JUMP, SEG_DEAD = 0, 1, 2, 3
# event kinds the engine schedules through its sink (the fleet owns the event queue)
EV_SEG_END, EV_KICK = 1, 2


class StepModel(Protocol):
    def step_time_s(self, prefill_tokens: int, prefill_attention_work: float, decode_seqs: int,
                    decode_context_tokens: int) -> float: ...


class EngineSink(Protocol):
    """What the engine tells its owner (the fleet)."""

    def push(self, t_s: float, kind: int, a: object, b: object) -> None: ...

    def on_first_token(self, r: Req, t_s: float) -> None: ...

    def on_finish(self, r: Req, t_s: float, rep: Replica) -> None: ...

    def on_reject(self, r: Req, t_s: float, rep: Replica) -> None: ...

    def on_empty(self, rep: Replica, t_s: float) -> None: ...


class Req:
    """One request of the workload, reused across its attempts (retries) and hops (P/D).

    Engine fields, per hop: e_ntok = prompt + generated tokens; e_ncomp = tokens whose KV is
    computed; e_cov = tokens covered by the cached units it pins (its first e_pinned units);
    e_held = KV blocks it owns; e_out = tokens to generate on this replica. While decoding the
    values live as offsets from the replica's decode-step counter D: computed = d_k0 + D,
    generated = d_g0 + D, own tokens = d_a + D; it finishes at D = d_fin.
    """

    __slots__ = (
        # identity (from the workload)
        "idx", "prio", "task", "step", "prompt", "output", "units", "group",
        # client / router
        "attempt", "state", "t_first_send", "t_send", "t_queued", "streamed", "t_first_tok",
        "pool", "rep", "held_pool", "cell",
        # engine, explicit (reset on every hop to a replica; stale while the request is decoding)
        "e_mode", "e_out", "e_ntok", "e_ncomp", "e_gen", "e_cov", "e_pinned", "e_held", "e_seq",
        "t_engine", "t_sched", "e_first", "e_last",
        # engine, implicit while decoding: value = offset + the replica's decode-step counter
        "d_in", "d_k0", "d_g0", "d_a", "d_fin",
    )
    # set by the fleet when it creates the request, before the request is sent (the engine never reads it)
    cell: ClassStepStats

    def __init__(self, idx: int, prio: int, task: int, step: int, prompt: int, output: int,
                 units: tuple[int, ...] = (), group: int = 0) -> None:
        self.idx = idx
        self.prio = prio
        self.task = task
        self.step = step
        self.prompt = prompt
        self.output = output
        self.units = units  # full hash blocks of the prompt, in order
        self.group = group  # index of the route group
        self.attempt = 0
        self.state = IDLE
        self.t_first_send = -1.0
        self.t_send = -1.0
        self.t_queued = -1.0
        self.streamed = False
        self.t_first_tok = -1.0
        self.pool: PoolRT | None = None  # the pool the router sent the request to
        self.rep: Replica | None = None
        self.held_pool: PoolRoute | None = None
        self.e_mode = MODE_FULL
        self.e_out = output
        self.e_ntok = prompt
        self.e_ncomp = 0
        self.e_gen = 0
        self.e_cov = 0
        self.e_pinned = 0
        self.e_held = 0
        self.e_seq = 0
        self.t_engine = 0.0
        self.t_sched = -1.0
        self.e_first = -1.0
        self.e_last = -1.0
        self.d_in = False
        self.d_k0 = 0
        self.d_g0 = 0
        self.d_a = 0
        self.d_fin = 0


class Replica:
    """A vLLM V1 engine on `tp` GPUs. Time advances only through `on_segment_end` / `kick` calls."""

    __slots__ = (
        "rid", "pool", "model", "cache", "max_num_seqs", "max_batched_tokens", "block_size", "unit_tokens",
        "stats", "sink", "slow_factor", "version", "seg_kind", "seg_t0", "seg_dt", "seg_dd", "seg_k", "seg_end",
        "seg_sched", "kick_pending", "waiting", "n_waiting", "running", "prefilling", "draining", "_seq", "caching",
        "max_running_seen", "max_tokens_seen", "owner",
        # implicit decoders
        "dstep", "d_res", "n_dec", "dec_k0_sum", "dec_blocks", "dec_cnt", "fin_heap", "t_last_step",
    )

    def __init__(self, rid: str, pool: str, model: StepModel, *, kv_blocks: int, block_size: int,
                 unit_tokens: int, max_num_seqs: int, max_batched_tokens: int, stats: ReplicaStats,
                 sink: EngineSink, enable_prefix_caching: bool = True) -> None:
        if max_batched_tokens < max_num_seqs:
            raise ValueError(f"replica {rid}: max_num_batched_tokens ({max_batched_tokens}) must be >= "
                             f"max_num_seqs ({max_num_seqs})")
        self.rid = rid
        self.pool = pool
        self.model = model
        self.cache = PrefixCache(kv_blocks, block_size, unit_tokens, enabled=enable_prefix_caching)
        self.caching = enable_prefix_caching
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.block_size = block_size
        self.unit_tokens = unit_tokens
        self.stats = stats
        self.sink = sink
        self.slow_factor = 1.0
        self.version = 0
        self.seg_kind = SEG_IDLE
        self.seg_t0 = 0.0
        self.seg_dt = 0.0  # duration of the segment's next step
        self.seg_dd = 0.0  # growth of the step time per step (decode context grows by n_dec tokens a step)
        self.seg_k = 0
        self.seg_end = 0.0
        self.seg_sched: list[tuple[Req, int]] = []
        self.kick_pending = False
        self.waiting: tuple[deque[Req], ...] = (deque(), deque(), deque())
        self.n_waiting = 0
        self.running: dict[Req, None] = {}  # every running request (decoding or prefilling), insertion order
        self.prefilling: list[Req] = []  # running requests handled explicitly, in scheduling order
        self.draining = False
        self._seq = 0
        self.max_running_seen = 0  # invariant checks in tests
        self.max_tokens_seen = 0
        self.owner: Inst | None = None  # the fleet's lifecycle record for this engine
        self.dstep = 0  # decode steps executed so far
        self.d_res = 0  # decode step up to which decoders' KV blocks are allocated (>= dstep)
        self.n_dec = 0
        self.dec_k0_sum = 0  # Σ d_k0 over decoders: Σ context = dec_k0_sum + n_dec × dstep
        self.dec_blocks = 0  # KV blocks held by decoders (as of d_res)
        self.dec_cnt = [0] * block_size  # decoders per (d_a mod block_size)
        self.fin_heap: list[tuple[int, int, Req]] = []  # (decode step at which it finishes, seq, request)
        self.t_last_step = 0.0

    # ------------------------------------------------------------------ views

    @property
    def inflight(self) -> int:
        return self.n_waiting + len(self.running)

    @property
    def capacity_tokens(self) -> int:
        """Tokens of KV the whole cache holds: a longer request can never run here."""
        return self.cache.total_blocks * self.block_size

    @property
    def alive(self) -> bool:
        return self.seg_kind != SEG_DEAD

    def refresh_gauges(self) -> None:
        s = self.stats
        s.num_requests_running = len(self.running)
        s.num_requests_waiting = self.n_waiting
        s.kv_cache_usage_perc = self.cache.usage_frac

    def request_view(self, r: Req) -> tuple[int, int, int]:
        """(prompt+generated tokens, computed tokens, generated tokens) of a request on this replica."""
        if r.d_in:
            d = self.dstep
            return r.d_k0 + d + 1, r.d_k0 + d, r.d_g0 + d
        return r.e_ntok, r.e_ncomp, r.e_gen

    # ------------------------------------------------------------------ inputs

    def add(self, r: Req, now: float, mode: int = MODE_FULL) -> None:
        """A request arrives at the engine (from the router)."""
        r.rep = self
        r.state = WAITING
        r.e_mode = mode
        r.e_out = 1 if mode == MODE_PREFILL_ONLY else r.output
        r.e_gen = 0
        r.e_ntok = r.prompt
        # decode-only: the prompt's KV arrives over the wire; one step samples the first token
        r.e_ncomp = r.prompt - 1 if mode == MODE_DECODE_ONLY else 0
        r.e_cov = 0
        r.e_pinned = 0
        r.e_held = 0
        r.d_in = False
        self._seq += 1
        r.e_seq = self._seq
        r.t_engine = now
        r.t_sched = -1.0
        r.e_first = -1.0
        r.e_last = -1.0
        self.waiting[r.prio].append(r)
        self.n_waiting += 1
        self._poke(now)

    def _poke(self, now: float) -> None:
        """Something new for the scheduler: start a step if idle, cut a decode jump short."""
        kind = self.seg_kind
        if kind == SEG_IDLE:
            if not self.kick_pending:
                self.kick_pending = True
                self.sink.push(now, EV_KICK, self, 0)
        elif kind == SEG_JUMP:
            self.interrupt(now)

    def set_slow(self, factor: float, now: float) -> None:
        self.slow_factor = factor
        if self.seg_kind == SEG_JUMP:
            self.interrupt(now)

    def kick(self, now: float) -> None:
        self.kick_pending = False
        if self.seg_kind == SEG_IDLE:
            self._plan(now)

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

    def abort(self, r: Req, now: float, reason: str = "abort") -> None:
        """Remove a request (client timeout, cancelled hop). Frees its KV; counts finished_reason."""
        if r.state == WAITING:
            self.waiting[r.prio].remove(r)
            self.n_waiting -= 1
            self._release(r)
        elif r.state == RUNNING:
            if self.seg_kind == SEG_JUMP:
                self.interrupt(now)
            self._leave_running(r)
            self._release(r)
        else:
            return
        r.state = IDLE
        r.rep = None
        self.stats.request_success[reason] = self.stats.request_success.get(reason, 0.0) + 1.0
        if self.draining and not self.running and not self.n_waiting and self.seg_kind == SEG_IDLE:
            self.sink.on_empty(self, now)

    def crash(self) -> list[Req]:
        """The engine dies: return every request it held (the caller fails them). Cache is gone."""
        reqs = list(self.running)
        for q in self.waiting:
            reqs.extend(q)
            q.clear()
        self.running = {}
        self.prefilling = []
        self.n_waiting = 0
        self.n_dec = 0
        self.fin_heap = []
        self.version += 1
        self.seg_kind = SEG_DEAD
        self.seg_sched = []
        for r in reqs:
            r.rep = None
            r.state = IDLE
            r.d_in = False
        return reqs

    # ------------------------------------------------------------------ implicit decoders

    def _blocks_between(self, d1: int, d2: int) -> int:
        """KV blocks decoders need to grow from decode step d1 to d2 (>= d1).

        A decoder owning y tokens at d1 needs ceil((y + k) / bs) − ceil(y / bs) more
        blocks for k more tokens, which depends only on y mod bs: with bs = 16 and
        k = 20, y ≡ 0 needs 2 blocks, y ≡ 5 needs ceil(25 / 16) − 1 = 1, y ≡ 13 needs 2.
        """
        k = d2 - d1
        if k <= 0 or not self.n_dec:
            return 0
        bs = self.block_size
        if k == 1:  # only decoders whose own tokens fill their last block exactly: y ≡ 0
            return self.dec_cnt[-d1 % bs]
        total = 0
        for alpha, c in enumerate(self.dec_cnt):
            if c:
                rho = (alpha + d1) % bs
                total += c * (-(-(rho + k) // bs) - (1 if rho else 0))
        return total

    def _dec_enter(self, r: Req) -> None:
        """A running request just sampled a token and continues decoding: make it implicit."""
        d = self.dstep
        if not self.n_dec:
            self.d_res = d
        if r.e_ncomp < r.e_cov:  # a fully cached prompt: its last token's KV sits in a cached block
            r.e_cov = r.e_ncomp
        r.d_k0 = r.e_ncomp - d
        r.d_g0 = r.e_gen - d
        r.d_a = r.d_k0 - r.e_cov
        r.d_fin = d + r.e_out - r.e_gen
        r.d_in = True
        self.n_dec += 1
        self.dec_k0_sum += r.d_k0
        # its blocks join the decoders' pool, which is sized as of d_res (== d at a step end)
        extra = -(-(r.d_a + self.d_res) // self.block_size) - r.e_held
        if extra > 0 and not self.cache.allocate(extra):
            raise RuntimeError(f"replica {self.rid}: KV accounting out of step (d_res {self.d_res}, dstep {d})")
        self.dec_blocks += r.e_held + max(extra, 0)
        if extra < 0:
            self.cache.release(-extra)
            self.dec_blocks += extra
        r.e_held = 0
        self.dec_cnt[r.d_a % self.block_size] += 1
        self._seq += 1
        heapq.heappush(self.fin_heap, (r.d_fin, self._seq, r))

    def _dec_leave(self, r: Req) -> None:
        """Make a decoder explicit again (finish, preempt, abort); its blocks move back to e_held."""
        d = self.dstep
        r.e_ncomp = r.d_k0 + d
        r.e_ntok = r.e_ncomp + 1
        r.e_gen = r.d_g0 + d
        r.e_last = self.t_last_step
        held = -(-(r.d_a + self.d_res) // self.block_size)
        r.e_held = held
        self.dec_blocks -= held
        self.dec_cnt[r.d_a % self.block_size] -= 1
        self.dec_k0_sum -= r.d_k0
        self.n_dec -= 1
        r.d_in = False

    def _leave_running(self, r: Req) -> None:
        del self.running[r]
        if r.d_in:
            self._dec_leave(r)
        else:
            self.prefilling.remove(r)

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

    # ------------------------------------------------------------------ the scheduler

    def _release(self, r: Req) -> None:
        if r.e_pinned:
            self.cache.unpin(r.units[: r.e_pinned])
            r.e_pinned = 0
        if r.e_held:
            self.cache.release(r.e_held)
            r.e_held = 0
        r.e_cov = 0

    def _preempt(self, r: Req) -> None:
        self._leave_running(r)
        self._release(r)
        r.e_ncomp = 0
        r.state = WAITING
        self.waiting[r.prio].appendleft(r)
        self.n_waiting += 1
        self.stats.num_preemptions += 1

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


def _victim_key(r: Req) -> tuple[int, int]:
    """vLLM V1 priority policy: preempt the lowest priority, then the latest arrival."""
    return (r.prio, r.e_seq)
