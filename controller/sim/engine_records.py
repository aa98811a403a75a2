"""The engine's vocabulary: request states, modes, segment and event kinds, the request record, and
`ReplicaBase`, the state the Replica's concern mixins share.

`Req` is the one mutable record of a request, shared by the fleet (client, router) and the
engine. `ReplicaBase` declares every slot of a Replica with its type, plus (for type checkers
only) the methods one mixin calls on another. Must not: hold behaviour, read the clock, or
import the Replica's concern modules (they import this one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections import deque

    from controller.sim.cache import PrefixCache
    from controller.sim.stats import ClassStepStats, ReplicaStats

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
    """What the engine tells its owner (the fleet); `rep` is the engine that calls."""

    def push(self, t_s: float, kind: int, a: object, b: object) -> None: ...

    def on_first_token(self, r: Req, t_s: float) -> None: ...

    def on_finish(self, r: Req, t_s: float, rep: ReplicaBase) -> None: ...

    def on_reject(self, r: Req, t_s: float, rep: ReplicaBase) -> None: ...

    def on_empty(self, rep: ReplicaBase, t_s: float) -> None: ...


class RouteHold(Protocol):
    """The router's queue that holds a request (controller/sim/router.py's PoolRoute), as a request
    sees it: declared here so that these records stay below the router, which imports them."""

    def unhold(self, r: Req) -> None: ...


class PoolWindow(Protocol):
    """The pool a request was sent to (controller/sim/fleet_records.py's PoolRT), as the fleet's
    first-token callback reads it through the request: its window of TTFTs."""

    win_ttft: list[float]


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
        "pool", "rep", "held_pool", "held_later", "cell",
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
        self.pool: PoolWindow | None = None  # the pool the router sent the request to
        self.rep: ReplicaBase | None = None  # the engine serving it
        self.held_pool: RouteHold | None = None
        self.held_later = False  # held as a later step of a task under way (step-aware admission)
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


class ReplicaBase:
    """The state of one Replica, declared once for readers and type checkers (engine.py's `__init__`
    sets every value).

    The slots live here so that every mixin (engine_kv, engine_schedule, engine_steps) and the
    Replica itself share one instance layout without a __dict__; the mixins declare empty
    `__slots__`. The methods under TYPE_CHECKING are the ones one mixin calls on another; they do
    not exist at run time, so the scheduler's lookups are exactly one cached method lookup each.
    """

    __slots__ = (
        "rid", "pool", "model", "cache", "max_num_seqs", "max_batched_tokens", "block_size", "unit_tokens",
        "stats", "sink", "slow_factor", "version", "seg_kind", "seg_t0", "seg_dt", "seg_dd", "seg_k", "seg_end",
        "seg_sched", "kick_pending", "waiting", "n_waiting", "running", "prefilling", "draining", "_seq", "caching",
        "max_running_seen", "max_tokens_seen", "owner",
        # implicit decoders
        "dstep", "d_res", "n_dec", "dec_k0_sum", "dec_blocks", "dec_cnt", "fin_heap", "t_last_step",
    )

    rid: str
    pool: str
    model: StepModel
    cache: PrefixCache
    caching: bool  # prefix caching enabled
    max_num_seqs: int
    max_batched_tokens: int
    block_size: int
    unit_tokens: int
    stats: ReplicaStats
    sink: EngineSink
    slow_factor: float
    version: int  # bumped on every new plan; a segment-end event of an older version is stale
    # the current segment (engine_steps)
    seg_kind: int
    seg_t0: float
    seg_dt: float  # duration of the segment's next step
    seg_dd: float  # growth of the step time per step (decode context grows by n_dec tokens a step)
    seg_k: int
    seg_end: float
    seg_sched: list[tuple[Req, int]]  # (prefilling request, chunk tokens) of the current step
    kick_pending: bool
    # the scheduler's queues (engine_schedule)
    waiting: tuple[deque[Req], ...]  # one FCFS queue per priority class
    n_waiting: int
    running: dict[Req, None]  # every running request (decoding or prefilling), insertion order
    prefilling: list[Req]  # running requests handled explicitly, in scheduling order
    draining: bool
    _seq: int
    max_running_seen: int  # invariant checks in tests
    max_tokens_seen: int
    owner: object | None  # the fleet's lifecycle record for this engine (fleet_records.Inst; only the fleet reads it)
    # implicit decoders (engine_kv)
    dstep: int  # decode steps executed so far
    d_res: int  # decode step up to which decoders' KV blocks are allocated (>= dstep)
    n_dec: int
    dec_k0_sum: int  # Σ d_k0 over decoders: Σ context = dec_k0_sum + n_dec × dstep
    dec_blocks: int  # KV blocks held by decoders (as of d_res)
    dec_cnt: list[int]  # decoders per (d_a mod block_size)
    fin_heap: list[tuple[int, int, Req]]  # (decode step at which it finishes, seq, request)
    t_last_step: float

    if TYPE_CHECKING:
        # engine_kv
        def _release(self, r: Req) -> None: ...
        def _preempt(self, r: Req) -> None: ...
        def _blocks_between(self, d1: int, d2: int) -> int: ...
        def _dec_enter(self, r: Req) -> None: ...
        def _dec_leave(self, r: Req) -> None: ...
        def _leave_running(self, r: Req) -> None: ...
        # engine_schedule
        def _plan(self, now: float) -> None: ...
        # engine (the Replica)
        def abort(self, r: Req, now: float, reason: str = "abort") -> None: ...
        # engine_steps
        def interrupt(self, now: float) -> None: ...
        def _seg_time(self, j: int) -> float: ...
        def _steps_done(self, now: float) -> int: ...
        def _advance(self, j: int, jump: bool = True) -> None: ...
