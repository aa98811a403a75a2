"""Small fakes for driving one simulated engine in tests.

- LinearStepModel: a step time linear in every input, so a decode jump timed at
  its mid-point context takes exactly as long as its steps one by one.
- Driver: the engine's sink with its own tiny event loop; records first tokens,
  finishes and rejections.
- NaiveEngine: a deliberately simple step-by-step reference of the same
  scheduling rules (explicit per-request state, one loop iteration per step, no
  jumps, no implicit decoders). test_engine.py checks the real engine against it.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from controller.sim.cache import PrefixCache
from controller.sim.engine import Replica
from controller.sim.engine_records import EV_KICK, EV_SEG_END, ReplicaBase, Req
from controller.sim.stats import ReplicaStats


@dataclass(frozen=True)
class LinearStepModel:
    base_s: float = 0.010
    per_prefill_token_s: float = 2e-5
    per_work_s: float = 1e-9
    per_seq_s: float = 1e-4
    per_ctx_token_s: float = 1e-7

    def step_time_s(self, prefill_tokens: int, prefill_attention_work: float, decode_seqs: int,
                    decode_context_tokens: int) -> float:
        if prefill_tokens + decode_seqs == 0:
            return 0.0
        return (self.base_s + self.per_prefill_token_s * prefill_tokens + self.per_work_s * prefill_attention_work
                + self.per_seq_s * decode_seqs + self.per_ctx_token_s * decode_context_tokens)


@dataclass
class Driver:
    """Event loop + sink for one Replica. Arrivals are (t_s, Req)."""

    first_token: dict[int, float] = field(default_factory=dict)
    finished: dict[int, float] = field(default_factory=dict)
    rejected: list[int] = field(default_factory=list)
    emptied: list[float] = field(default_factory=list)
    heap: list = field(default_factory=list)
    seq: itertools.count = field(default_factory=itertools.count)
    now_s: float = 0.0
    on_step: Callable[[Replica], None] | None = None  # after every processed event, for invariant checks

    def push(self, t_s: float, kind: int, a: object, b: object) -> None:
        heapq.heappush(self.heap, (t_s, next(self.seq), kind, a, b))

    def on_first_token(self, r: Req, t_s: float) -> None:
        self.first_token[r.idx] = t_s

    def on_finish(self, r: Req, t_s: float, rep: ReplicaBase) -> None:
        self.finished[r.idx] = t_s

    def on_reject(self, r: Req, t_s: float, rep: ReplicaBase) -> None:
        self.rejected.append(r.idx)

    def on_empty(self, rep: ReplicaBase, t_s: float) -> None:
        self.emptied.append(t_s)

    def run(self, rep: Replica, arrivals: list[tuple[float, Req]], until_s: float = 1e9) -> None:
        arrivals = sorted(arrivals, key=lambda x: (x[0], x[1].idx))
        k = 0
        while True:
            ta = arrivals[k][0] if k < len(arrivals) else float("inf")
            th = self.heap[0][0] if self.heap else float("inf")
            if min(ta, th) > until_s or (ta == th == float("inf")):
                break
            if ta <= th:
                self.now_s = ta
                rep.add(arrivals[k][1], ta)
                k += 1
            else:
                t, _, kind, a, b = heapq.heappop(self.heap)
                self.now_s = t
                if kind == EV_SEG_END:
                    a.on_segment_end(b)
                elif kind == EV_KICK:
                    a.kick(t)
            if self.on_step is not None:
                self.on_step(rep)


def make_replica(driver: Driver, *, kv_blocks: int = 4096, block_size: int = 16, unit_tokens: int = 64,
                 max_num_seqs: int = 256, max_batched_tokens: int = 2048, caching: bool = True,
                 model: LinearStepModel | None = None) -> Replica:
    stats = ReplicaStats(replica_id="r0", pool="p", model_name="m", node_id="n0", gpu_indices=(0,),
                         num_gpu_blocks=kv_blocks, block_size=block_size, gpu_memory_utilization=0.9)
    return Replica("r0", "p", model or LinearStepModel(), kv_blocks=kv_blocks, block_size=block_size,
                   unit_tokens=unit_tokens, max_num_seqs=max_num_seqs, max_batched_tokens=max_batched_tokens,
                   stats=stats, sink=driver, enable_prefix_caching=caching)


@dataclass
class _R:
    idx: int
    prio: int
    arrival_s: float
    prompt: int
    output: int
    units: tuple[int, ...]
    seq: int = 0
    ntok: int = 0
    ncomp: int = 0
    gen: int = 0
    held: int = 0
    pinned: int = 0
    cov: int = 0
    decoding: bool = False  # sampled a token last step and was not preempted since


class NaiveEngine:
    """Reference scheduler: one iteration per engine step, everything explicit."""

    def __init__(self, model: LinearStepModel, *, kv_blocks: int, block_size: int, unit_tokens: int,
                 max_num_seqs: int, max_batched_tokens: int, caching: bool = True) -> None:
        self.model = model
        self.cache = PrefixCache(kv_blocks, block_size, unit_tokens, enabled=caching)
        self.bs = block_size
        self.unit = unit_tokens
        self.mns = max_num_seqs
        self.mbt = max_batched_tokens
        self.caching = caching
        self.preemptions = 0

    def run(self, reqs: Sequence[tuple[float, int, int, int, int, tuple[int, ...]]]) -> tuple[dict, dict]:
        """reqs: (arrival_s, idx, prio, prompt, output, units). Returns (first_token, finished) by idx."""
        pending = sorted((_R(idx=i, prio=p, arrival_s=t, prompt=pr, output=o, units=u)
                          for t, i, p, pr, o, u in reqs), key=lambda r: (r.arrival_s, r.idx))
        waiting: list[list[_R]] = [[], [], []]
        running: list[_R] = []
        first: dict[int, float] = {}
        done: dict[int, float] = {}
        t = 0.0
        seq = 0
        cache = self.cache
        bs = self.bs

        def release(r: _R) -> None:
            if r.pinned:
                cache.unpin(r.units[: r.pinned])
            cache.release(r.held)
            r.pinned = r.held = r.cov = 0

        def preempt(r: _R) -> None:
            running.remove(r)
            release(r)
            r.ncomp = 0
            r.decoding = False
            waiting[r.prio].insert(0, r)
            self.preemptions += 1

        def victim() -> _R:
            return max(running, key=lambda x: (x.prio, x.seq))

        while pending or running or any(waiting):
            if not running and not any(waiting):
                t = max(t, pending[0].arrival_s)
            while pending and pending[0].arrival_s <= t:
                r = pending.pop(0)
                seq += 1
                r.seq = seq
                r.ntok = r.prompt
                waiting[r.prio].append(r)
            budget = self.mbt
            sched: list[tuple[_R, int]] = []
            preempted = False
            # decodes, then prefills, each in running order
            for want_decode in (True, False):
                for r in list(running):
                    if r not in running:
                        continue
                    if r.decoding != want_decode or budget <= 0:
                        continue
                    c = min(r.ntok - r.ncomp, budget)
                    while True:
                        need = -(-(r.ncomp + c - r.cov) // bs) - r.held
                        if need <= 0 or cache.allocate(need):
                            break
                        v = victim()
                        for k, (s, sc) in enumerate(sched):
                            if s is v:
                                del sched[k]
                                budget += sc
                                break
                        preempt(v)
                        preempted = True
                        if v is r:
                            break
                    if r not in running:
                        continue
                    if need > 0:
                        r.held += need
                    sched.append((r, c))
                    budget -= c
            if not preempted:
                while any(waiting) and budget > 0 and len(running) < self.mns:
                    q = next(w for w in waiting if w)
                    r = q[0]
                    m = 0
                    if self.caching and r.units:
                        m = cache.match(r.units, len(r.units))
                    hit = min(m * self.unit, r.ntok - 1)
                    if m:
                        cache.pin(r.units[:m])
                    r.pinned, r.cov, r.ncomp = m, m * self.unit, hit
                    c = min(r.ntok - r.ncomp, budget)
                    need = -(-(r.ncomp + c - r.cov) // bs) - r.held
                    if need > 0 and not cache.allocate(need):
                        if m:
                            cache.unpin(r.units[:m])
                        r.pinned = r.cov = r.ncomp = 0
                        break
                    if need > 0:
                        r.held += need
                    q.pop(0)
                    running.append(r)
                    sched.append((r, c))
                    budget -= c
            if not sched:
                continue
            pf = sum(c for r, c in sched if not r.decoding)
            work = sum(c * (r.ncomp + c / 2.0) for r, c in sched if not r.decoding)
            dec = [r for r, c in sched if r.decoding]
            dt = self.model.step_time_s(pf, work, len(dec), sum(r.ntok for r in dec))
            t += dt
            for r, c in sched:
                r.ncomp += c
                if r.ncomp < r.ntok:
                    continue
                if r.gen == 0:
                    first[r.idx] = t
                    if self.caching and len(r.units) > r.pinned:
                        r.held -= cache.insert_owned(r.units[r.pinned:])
                        r.pinned = len(r.units)
                        r.cov = r.pinned * self.unit
                r.gen += 1
                r.ntok += 1
                r.decoding = True
                if r.gen >= r.output:
                    done[r.idx] = t
                    running.remove(r)
                    release(r)
        return first, done
