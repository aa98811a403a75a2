"""Stage 1 of scoring a plan: replica dynamics, from replica targets per step to replicas serving and billed.

A target above what is serving orders new replicas at that step; they serve only after their
start-up delay — warm (`startup_warm_s`) while a warm slot or a standby replica is available,
cold (`startup_cold_s`) after; replicas already starting keep their expected ready times. A
lower target removes starting replicas first (latest first), then drains ready ones, whose
caches are lost (their slots become warm). Every replica that is starting, ready or on
standby is billed.

Must not: look at traffic, latency or the objective (later stages), or change its inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from controller.core.mpc.problem import PoolInput
from controller.core.mpc_model import compiled_kernel


class ReplicaDynamics:
    """Replicas ready, billed and freshly started per candidate, pool and step (per-tick constants
    precomputed from the pools as they are now)."""

    def __init__(self, pools: Sequence[PoolInput], H: int, step_s: float, standby_cost_frac: float,
                 compiled: bool = True) -> None:
        dt = step_s
        self.compiled = compiled  # False: the numpy below throughout (the reference)
        P = len(pools)
        self.standby_cost_frac = standby_cost_frac
        self.cols = np.arange(P)
        self.ready0 = np.array([p.ready for p in pools], dtype=float)
        self.warm0 = np.array([p.warm_slots for p in pools], dtype=float)
        self.d_warm = np.array([p.startup_warm_s for p in pools])
        self.d_cold = np.array([p.startup_cold_s for p in pools])
        self.bin_warm = np.minimum(np.ceil(self.d_warm / dt - 0.5), H).astype(np.intp)
        self.bin_cold = np.minimum(np.ceil(self.d_cold / dt - 0.5), H).astype(np.intp)
        pend = np.zeros((P, H + 1))
        for j, p in enumerate(pools):
            for eta in p.starting_eta_s:
                pend[j, int(min(max(math.ceil(eta / dt - 0.5), 0), H))] += 1
        self.pend0 = pend

    def run(self, repl: np.ndarray, standby: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ready during each step, billed replicas per step, share of ready replicas started in the plan)."""
        C, P, H = repl.shape
        if C == 1:
            return self._simulate(repl, standby, self.cols)
        # Pools are simulated independently, and a batch mostly varies one pool's replicas (a
        # replica sweep) or none (lever sweeps, cross-entropy): a pool whose replica plan is the
        # same in every candidate is simulated once, as one row, and copied.
        same = (repl == repl[:1]).all(axis=(0, 2)) & (standby == standby[:1]).all(axis=0)
        if not same.any():
            return self._simulate(repl, standby, self.cols)
        const, var = np.flatnonzero(same), np.flatnonzero(~same)
        nc, nv = len(const), len(var)
        units = np.concatenate([const, np.tile(var, C)])
        u_repl = np.concatenate([repl[0, const], repl[:, var].reshape(C * nv, H)])[None]
        u_standby = np.concatenate([standby[0, const], standby[:, var].reshape(C * nv)])[None]
        outs = []
        for x in self._simulate(u_repl, u_standby, units):
            full = np.empty((C, P, H))
            full[:, const] = x[0, :nc][None]
            full[:, var] = x[0, nc:].reshape(C, nv, H)
            outs.append(full)
        return outs[0], outs[1], outs[2]

    def _simulate(self, repl: np.ndarray, standby: np.ndarray,
                  pool: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`run` of (C, N, H) replica plans; column n is a plan of pool `pool[n]` (as one compiled loop
        where numba is installed and `compiled`: mpc_kernel.dynamics_rows, the same values)."""
        kern = compiled_kernel() if self.compiled else None
        if kern is not None:
            out = tuple(np.empty(repl.shape) for _ in range(3))
            kern.dynamics_rows(np.ascontiguousarray(repl, dtype=float), np.ascontiguousarray(standby, dtype=float),
                               self.ready0[pool], np.ascontiguousarray(self.pend0[pool]), self.warm0[pool],
                               self.bin_warm[pool], self.bin_cold[pool], float(self.standby_cost_frac), *out)
            return out[0], out[1], out[2]
        # Replica counts are whole numbers (targets, slots and start-ups are counts), so the sums
        # below are exact in floating point whatever their order: the running total of starting
        # replicas (`pend_tot`) equals a fresh sum over the ready-time bins.
        C, P, H = repl.shape
        ready = np.broadcast_to(self.ready0[pool], (C, P)).copy()
        pend = np.broadcast_to(self.pend0[pool], (C, P, H + 1)).copy()
        pend_tot = pend.sum(axis=2)
        warm = np.broadcast_to(self.warm0[pool], (C, P)).copy() + standby
        bin_warm, bin_cold = self.bin_warm[pool], self.bin_cold[pool]
        new_ready = np.zeros((C, P))
        new_pend = np.zeros((C, P, H + 1))
        ready_mid = np.empty((C, P, H))
        billed = np.empty((C, P, H))
        fresh_n = np.zeros((C, P, H))
        cols = np.arange(P)
        started = False  # any replica ordered in the plan yet (until then new_ready/new_pend stay 0)
        # (bins before the current step are never read again, so they are not cleared)
        for h in range(H):
            if h > 0:  # replicas whose ready time passed before this step starts
                landed = pend[:, :, h - 1]
                ready += landed
                pend_tot -= landed
                if started:
                    new_ready += new_pend[:, :, h - 1]
            serving = ready + pend_tot
            gap = repl[:, :, h] - serving  # target − serving: > 0 orders replicas, < 0 removes them
            if gap.max() > 0.0:
                add = np.maximum(gap, 0.0)
                n_w = np.minimum(add, warm)
                warm -= n_w
                n_c = add - n_w
                bw = np.minimum(h + bin_warm, H)
                bc = np.minimum(h + bin_cold, H)
                pend[:, cols, bw] += n_w  # one bin per pool: no repeated index within a statement
                pend[:, cols, bc] += n_c
                new_pend[:, cols, bw] += n_w
                new_pend[:, cols, bc] += n_c
                pend_tot += add
                started = True
            if gap.min() < 0.0:
                cut = np.maximum(-gap, 0.0)  # serving − target (negation is exact)
                # starting replicas go first, the latest first: bin b gives min(its count, what
                # the later bins did not cover); later = Σ of the bins after b
                seg = pend[:, :, h:]
                later = np.cumsum(seg[:, :, ::-1], axis=2)[:, :, ::-1] - seg
                take = np.minimum(seg, np.maximum(cut[:, :, None] - later, 0.0))
                seg -= take
                if started:
                    new_pend[:, :, h:] -= np.minimum(new_pend[:, :, h:], take)
                taken = take.sum(axis=2)
                pend_tot -= taken
                cut = cut - taken
                drained = np.minimum(cut, ready)
                ready -= drained
                new_ready = np.minimum(new_ready, ready)
                warm += drained  # a drained replica leaves its weights on the node
            ready_mid[:, :, h] = ready + pend[:, :, h]
            if started:
                fresh_n[:, :, h] = new_ready + new_pend[:, :, h]
            billed[:, :, h] = ready + pend_tot
        fresh = fresh_n / np.maximum(ready_mid, 1e-9)
        billed += standby[:, :, None] * self.standby_cost_frac
        return ready_mid, billed, np.clip(fresh, 0.0, 1.0)
