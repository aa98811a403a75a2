"""Stage 4 of scoring a plan: the late share of each class, from the pools' latencies.

Violation probability per pool and class: P(TTFT > SLO) and P(TPOT > SLO) from a log-normal
through the predicted p50 and p95, whose spread beyond the p95 is bounded (TTFT by the
prompt-length spread, TPOT by a request's averaging over its life; see tails.py), TPOT truncated
at the pool's full-chunk bound; a request whose backlog wait passes the client's timeout is late,
and lost (`lost_share`: the client gives up; the objective prices it as a rejected request too).
Per class, the hops of each route group are combined, weighted by traffic share.

Must not: price anything (score.py), or change its inputs (the latency stage's work arrays
excepted: t50, t95 and scratch are overwritten).
"""

from __future__ import annotations

import numpy as np

from controller.core.mpc.latency import PoolLatencies
from controller.core.mpc.problem import PlanProblem
from controller.core.mpc.tails import TPOT_TAIL_SIGMA, TTFT_TAIL_SIGMA, lognormal_exceed, lognormal_exceed_into
from controller.core.mpc.traffic import Traffic
from controller.core.mpc_model import compiled_kernel


def sum_pools(x: np.ndarray) -> np.ndarray:
    """Σ over the pool axis of (K, …, P) rows, in the order numpy sums the pool axis of the same
    rows laid out (…, P, K): one pool after another for K ≥ 2 (the pool axis is not the inner
    one there), numpy's own pairwise sum for K = 1 (the two layouts coincide in memory). So the
    planner's figures do not depend on the layout it computes in (floating-point sums do depend
    on their order)."""
    K, P = x.shape[0], x.shape[-1]
    if K == 1 or P == 0:
        return np.moveaxis(np.moveaxis(x, 0, -1).sum(axis=-2), -1, 0)
    out = x[..., 0].copy()
    for j in range(1, P):
        out += x[..., j]
    return out


class Risk:
    """Per-class SLOs (with the objective's margin) and the fleet's hops, and the late share of a batch."""

    def __init__(self, prob: PlanProblem, traffic: Traffic, compiled: bool = True) -> None:
        cls = prob.classes
        K = len(cls)
        margin = prob.weights.slo_margin
        self.slo_ttft = np.array([c.ttft_slo_s for c in cls]) * margin
        self.slo_tpot = np.array([c.tpot_slo_s for c in cls]) * margin
        self.slo_ttft_k = self.slo_ttft.reshape(K, 1, 1, 1, 1)  # per class, against (K,C,2,H,P) rows
        self.slo_tpot_k = self.slo_tpot.reshape(K, 1, 1, 1, 1)
        self.prefill_pool = traffic.prefill_pool
        self.first_hop = traffic.first_hop
        self.decode_hop = traffic.decode_hop
        self.hops = np.stack([self.prefill_pool, self.first_hop, self.decode_hop], axis=1).astype(float)  # (P,3)
        # past the tail probabilities, one compiled loop where numba is installed (the same values);
        # False = the numpy below (the reference)
        self.compiled = compiled

    def lost_sums(self, pl: PoolLatencies, share: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(C,2,H,K) Σ share × timed out over the first-hop pools and over the decode pools (a request whose
        backlog wait passes the client's timeout: the client gives up, it is lost as well as late), or None
        when no row times out. Weighted by traffic share per class as in `late_share`."""
        if not pl.timed_out.any():
            return None
        to = pl.timed_out.astype(float)  # (K,C,2,H,P)
        w_share = share[:, :, None, :, :] if share.ndim == 4 else share[None, :, None, :, :]
        first = np.moveaxis(sum_pools(w_share * self.first_hop * to), 0, -1)
        dec = (np.moveaxis(sum_pools(w_share * self.decode_hop * to), 0, -1) if self.decode_hop.any()
               else np.zeros_like(first))
        return first, dec

    @staticmethod
    def combine_lost(first: np.ndarray, dec: np.ndarray, decode: bool) -> np.ndarray:
        """The share lost at either hop, (C,2,H,K), clipped to [0, 1]."""
        lost = 1.0 - (1.0 - first) * (1.0 - dec) if decode else first
        return np.clip(lost, 0.0, 1.0)

    def lost_share(self, pl: PoolLatencies, share: np.ndarray) -> np.ndarray | None:
        """(C,2,H,K) share of each class's admitted requests that time out in a backlog, or None when no
        row times out. Example: two pools at equal share, one backlogged past the timeout for standard →
        0.5 of standard's admitted requests."""
        sums = self.lost_sums(pl, share)
        return None if sums is None else self.combine_lost(*sums, bool(self.decode_hop.any()))

    def late_share(self, pl: PoolLatencies, share: np.ndarray) -> np.ndarray:
        """(C,2,H,K) share of each class's admitted requests that is late, given each pool's share of
        the class traffic (C,H,P), or of each class's traffic (K,C,H,P) under tier rules."""
        t50, t95, tpot50, tpot95, scratch = pl.t50, pl.t95, pl.tpot50, pl.tpot95, pl.scratch
        pf = lognormal_exceed_into(t50, t95, self.slo_ttft_k, TTFT_TAIL_SIGMA, z=t50, scratch=scratch, own=True)
        pt = lognormal_exceed_into(tpot50, tpot95, self.slo_tpot_k, TPOT_TAIL_SIGMA, z=t95, scratch=scratch)
        kern = compiled_kernel() if self.compiled else None
        # the rest as one compiled loop (mpc_kernel.combine_rows), for one split of every class
        if kern is not None and pf.shape[0] >= 2 and share.ndim == 3:
            tmax = pl.lat.tpot_max_s
            bounded = tmax is not None
            p_c = (np.zeros(pl.shape) if tmax is None else
                   lognormal_exceed(tpot50, tpot95, np.minimum(np.reshape(tmax, pl.shape), 1e6), TPOT_TAIL_SIGMA))
            v_out = np.empty(share.shape[:1] + (2,) + share.shape[1:2] + pf.shape[:1])
            kern.combine_rows(pf, pt, np.ascontiguousarray(p_c, dtype=float), pl.timed_out,
                              np.ascontiguousarray(share, dtype=float), self.hops,
                              np.array([float(bounded), float(self.decode_hop.any())]), v_out)
            return v_out
        if pl.lat.tpot_max_s is not None:
            # No request's TPOT exceeds the full-chunk bound c (see mpc_model): the log-normal is
            # truncated there, P(T > s | T ≤ c) = (P(T > s) − P(T > c)) / (1 − P(T > c)), which falls
            # to 0 as s reaches c. Example: p50 0.03 s, p95 0.098 s, SLO 0.1 s: untruncated 4.6 %;
            # c = 0.12 s → 2.6 %, c = 0.1 s → 0. (An unbounded pool, c = inf, is read as c = 1e6 s.)
            c_max = np.minimum(np.reshape(pl.lat.tpot_max_s, pl.shape), 1e6)
            p_c = lognormal_exceed(tpot50, tpot95, c_max, TPOT_TAIL_SIGMA)
            pt -= p_c[None]
            pt /= np.maximum(1.0 - p_c, 1e-12)[None]
            np.clip(pt, 0.0, 1.0, out=pt)
        if pl.timed_out.any():
            pf[pl.timed_out] = 1.0
        # Per class: combine the hops of each group, weighted by traffic share.
        w_share = share[:, :, None, :, :] if share.ndim == 4 else share[None, :, None, :, :]  # per class: tier rules
        prod = np.multiply(pf, pt, out=scratch)
        mixed_v = np.add(pf, pt, out=pt)
        mixed_v -= prod  # 1 − (1 − pf)(1 − pt)
        # mixed/prefill pools: TTFT (and TPOT for mixed); decode pools: TPOT and their first step
        first_v = np.where(self.prefill_pool, pf, mixed_v) if self.prefill_pool.any() else mixed_v
        # Without decode pools every pool is a first hop (× 1 is exact) and the decode hop adds
        # nothing: (1 − v_first) × (1 − 0) is (1 − v_first) exactly (a NaN row is NaN in v_first too).
        if self.decode_hop.any():
            v_first = sum_pools(w_share * self.first_hop * first_v)
            v_dec = sum_pools(w_share * self.decode_hop * mixed_v)
            v = 1.0 - (1.0 - v_first) * (1.0 - v_dec)
        else:
            v = 1.0 - (1.0 - sum_pools(np.multiply(w_share, first_v, out=scratch)))
        v = np.ascontiguousarray(np.moveaxis(v, 0, -1))  # (C,2,H,K)
        return np.clip(v, 0.0, 1.0)  # (C,2,H,K) late share of admitted requests
