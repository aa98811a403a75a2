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

`Replica` is the one class the fleet uses; each concern is a mixin in its own module (mixins,
not helper objects, because the scheduler and the step end run once per segment and call each
other's methods: a method on `self` is one cached lookup):

- engine_records: states, modes, event and segment kinds, `Req`, and `ReplicaBase` (the slots);
- engine_schedule: batch formation, admission, prefix-cache lookup, preemption (`_plan`);
- engine_kv: KV-block release, preemption, the implicit decoders' blocks;
- engine_steps: segment timing, jumps, interrupts, applying a step and its stats.

Must not: route, retry, decide what a failure means for the client, or read the
wall clock. It reports first tokens, finishes and rejections to a sink.
"""

from __future__ import annotations

from collections import deque

from controller.sim.cache import PrefixCache
from controller.sim.engine_kv import KvMixin
from controller.sim.engine_records import (
    EV_KICK,
    IDLE,
    MODE_DECODE_ONLY,
    MODE_FULL,
    MODE_PREFILL_ONLY,
    RUNNING,
    SEG_DEAD,
    SEG_IDLE,
    SEG_JUMP,
    WAITING,
    EngineSink,
    Req,
    StepModel,
)
from controller.sim.engine_schedule import ScheduleMixin
from controller.sim.engine_steps import StepsMixin
from controller.sim.stats import ReplicaStats


class Replica(ScheduleMixin, StepsMixin, KvMixin):
    """A vLLM V1 engine on `tp` GPUs. Time advances only through `on_segment_end` / `kick` calls.

    Public API: `add`, `abort`, `crash`, `kick`, `set_slow`, `settle`, views (`inflight`,
    `capacity_tokens`, `alive`, `refresh_gauges`, `request_view`), defined here; `interrupt`,
    `on_segment_end` from engine_steps. Its slots are declared in engine_records.ReplicaBase.
    """

    __slots__ = ()

    def __init__(self, rid: str, pool: str, model: StepModel, *, kv_blocks: int, block_size: int,
                 unit_tokens: int, max_num_seqs: int, max_batched_tokens: int, stats: ReplicaStats,
                 sink: EngineSink, enable_prefix_caching: bool = True) -> None:
        if max_batched_tokens < max_num_seqs:
            raise ValueError(f"replica {rid}: max_num_batched_tokens ({max_batched_tokens}) must be >= "
                             f"max_num_seqs ({max_num_seqs})")
        # each slot's type and meaning: engine_records.ReplicaBase
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
        self.seg_dt = 0.0
        self.seg_dd = 0.0
        self.seg_k = 0
        self.seg_end = 0.0
        self.seg_sched = []
        self.kick_pending = False
        self.waiting = (deque(), deque(), deque())
        self.n_waiting = 0
        self.running = {}
        self.prefilling = []
        self.draining = False
        self._seq = 0
        self.max_running_seen = 0
        self.max_tokens_seen = 0
        self.owner = None
        self.dstep = 0
        self.d_res = 0
        self.n_dec = 0
        self.dec_k0_sum = 0
        self.dec_blocks = 0
        self.dec_cnt = [0] * block_size
        self.fin_heap = []
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
