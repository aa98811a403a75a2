"""KV blocks of one Replica: release and preemption, and the implicit decoders' block accounting.

Decoding requests are implicit (see engine.py): the replica keeps one decode-step counter and
per-(own tokens mod block_size) counts, so the blocks the decoders need for k more steps are one
sum over block_size classes, whatever the number of decoders. This module moves a request in and
out of that implicit set and gives its blocks back to the cache. Must not: choose what runs (that
is engine_schedule) or advance time (engine_steps).
"""

from __future__ import annotations

import heapq

from controller.sim.engine_records import WAITING, ReplicaBase, Req


class KvMixin(ReplicaBase):
    """KV-block accounting of a Replica (state: the request's e_held/e_pinned, and dstep, d_res,
    n_dec, dec_k0_sum, dec_blocks, dec_cnt, fin_heap)."""

    __slots__ = ()

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

