"""The fleet's event queue: event kinds, `push`, and the loop that pops events and arrivals in time order.

One heapq of (time, seq, kind, a, b) plus a cursor over the trace's first steps
(arrivals are already sorted, so they never enter the heap). `seq` breaks ties in
push order, which keeps runs deterministic. `_advance` is the simulator's hot loop:
it dispatches on `kind` with an if-chain and calls the other concerns' handlers on
the Fleet directly (they are mixins of one class, so each is one method lookup).

Must not: read the wall clock, use unseeded randomness, or decide what an event means
beyond calling its handler (the handlers live in fleet_clients, fleet_lifecycle,
fleet_faults and fleet_accounting).
"""

from __future__ import annotations

import heapq
import itertools

from controller.sim.engine_records import EV_KICK, EV_SEG_END, IDLE
from controller.sim.fleet_records import INF, STARTING, FleetBase

# event kinds (1 and 2 are the engine's)
(EV_SEND, EV_RETRY, EV_READY, EV_TIMEOUT, EV_HOLD_EXPIRE, EV_TRANSFER, EV_FAULT, EV_SLOW_END, EV_SAMPLE,
 EV_ADMIT) = range(3, 13)


class EventsMixin(FleetBase):
    """The event queue of a Fleet (state: `now_s`, `_heap`, `_seq`; it walks the arrival cursor `_arr_*`
    that fleet_clients builds from the workload)."""

    def _init_events(self) -> None:
        self.now_s = 0.0
        self._heap: list = []
        self._seq = itertools.count()

    def push(self, t_s: float, kind: int, a: object, b: object) -> None:
        """Schedule event `kind` with payload (a, b) at `t_s` (the engines push through this too)."""
        heapq.heappush(self._heap, (t_s, next(self._seq), kind, a, b))

    _push = push

    def _advance(self, t_end: float, stop_when_done: bool) -> None:
        heap = self._heap
        pop = heapq.heappop
        arr_t = self._arr_t
        arr_i = self._arr_i
        n_arr = len(arr_t)
        k = self._arr_pos
        n_tasks = self._n_tasks
        while True:
            ta = arr_t[k] if k < n_arr else INF
            if heap and heap[0][0] < ta:
                ev = heap[0]
                t = ev[0]
                if t > t_end:
                    break
                pop(heap)
                self.now_s = t
                kind = ev[2]
                if kind == EV_SEG_END:
                    ev[3].on_segment_end(ev[4])
                elif kind == EV_KICK:
                    ev[3].kick(t)
                elif kind == EV_SEND:
                    self._send(self._new_req(ev[3]))
                elif kind == EV_TIMEOUT:
                    self._on_timeout(ev[3], ev[4])
                elif kind == EV_RETRY:
                    r = ev[3]
                    if r.attempt == ev[4] and r.state == IDLE:
                        self._send(r)
                elif kind == EV_READY:
                    inst = ev[3]
                    if inst.version == ev[4] and inst.phase == STARTING:
                        self._make_ready(inst)
                elif kind == EV_HOLD_EXPIRE:
                    self._on_hold_expire(ev[3], ev[4])
                elif kind == EV_TRANSFER:
                    self._on_transfer(ev[3], ev[4])
                elif kind == EV_FAULT:
                    self._on_fault_event(ev[3])
                elif kind == EV_SLOW_END:
                    inst = ev[3]
                    if inst.slow_version == ev[4] and inst.engine is not None and inst.engine.alive:
                        inst.engine.set_slow(1.0, t)
                elif kind == EV_SAMPLE:
                    self._sample()
                elif kind == EV_ADMIT:
                    self._on_admit(ev[3], ev[4])
            else:
                if ta > t_end or ta == INF:
                    break
                self.now_s = ta
                k += 1
                self._arr_pos = k
                self._send(self._new_req(arr_i[k - 1]))
            if stop_when_done and self._n_resolved >= n_tasks:
                break
        self._arr_pos = k
