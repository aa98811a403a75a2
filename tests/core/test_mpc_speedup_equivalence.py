"""The planner's fast paths give the same numbers as the plain formulas they replace.

The MPC planner's score was made cheaper per candidate (issue: planner time per tick) without
changing a single decision: saturated normal tails set directly, per-pool quantities computed
once and broadcast, the class axis moved first, work arrays reused, pools whose replica plan is
the same in every candidate simulated once, the burst bisection re-evaluating only the burst
term. Each test here checks one of those against its straightforward reference on seeded random
inputs, bit for bit where the arithmetic is the same (assert_array_equal), since a last-bit
change could flip a near-tie between plans.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy.special import ndtr

from controller.core.distributions import lognormal_quantile, ndtr_saturated, upper_tail
from controller.core.mpc import ClassInput, MpcConfig, PlanProblem, PoolInput, plan_steps
from controller.core.mpc.risk import sum_pools
from controller.core.mpc.score import Evaluator
from controller.core.mpc.tails import lognormal_exceed, lognormal_exceed_into, lognormal_exceed_ref
from controller.core.mpc_model import LatencyQuery, QueueingPrior, _halfin_whitt_wait, compiled_kernel
from controller.core.objective import resolve_weights
from controller.perf.engine_figures import EngineFigures

FIG_70B = EngineFigures(32.688e-3, 0.2948e-3, 35.395e-9, 66.44e-6, 1554.0e-12, 484_800)
FIG_8B = EngineFigures(9.398e-3, 0.3586e-3, 92.671e-9, 65.31e-6, 3368.1e-12, 452_464)


def _z(rng: np.random.Generator, n: int, saturated_share: float) -> np.ndarray:
    z = rng.normal(0.0, 3.0, n)
    k = int(saturated_share * n)
    z[:k] = rng.choice([-1.0, 1.0], k) * rng.uniform(8.5, 60.0, k)
    z[: k // 10] = rng.choice([-np.inf, np.inf, 9.0, -9.0, np.nextafter(9.0, 10.0)], k // 10)
    z[k // 10: k // 10 + 5] = np.nan
    rng.shuffle(z)
    return z


@pytest.mark.parametrize("saturated_share", [0.0, 0.05, 0.5, 0.95])
def test_saturated_normal_tails_equal_ndtr(saturated_share):
    rng = np.random.default_rng(1)
    z = _z(rng, 20_000, saturated_share)
    np.testing.assert_array_equal(upper_tail(z.copy()), 1.0 - ndtr(z))
    np.testing.assert_array_equal(ndtr_saturated(z), ndtr(z))


def test_lognormal_quantile_is_the_formula():
    mean = np.array([1_000.0, 250.0])
    np.testing.assert_allclose(lognormal_quantile(mean, 0.95), mean * np.exp(1.6448536269514722 - 0.5))
    np.testing.assert_allclose(lognormal_quantile(mean, 0.5, sigma=0.5), mean * np.exp(-0.125))


@pytest.mark.parametrize("tail", [0.5, 1.0, 5.0])
def test_lognormal_exceedance_in_place_equals_the_formula(tail):
    rng = np.random.default_rng(2)
    K, C, H, P = 3, 7, 5, 4
    p50 = np.exp(rng.normal(-1.0, 1.5, (K, C, 2, H, P)))
    p95 = p50 * np.exp(rng.uniform(-0.2, 3.0, p50.shape))  # some p95 below the p50 (clamped)
    bound = rng.uniform(0.05, 5.0, K).reshape(K, 1, 1, 1, 1)
    want = lognormal_exceed_ref(p50, p95, bound, tail)
    np.testing.assert_array_equal(lognormal_exceed(p50, p95, bound, tail_sigma=tail), want)
    # owned inputs, overwritten; z written over the p50
    a, b, scratch = p50.copy(), p95.copy(), np.empty_like(p50)
    np.testing.assert_array_equal(lognormal_exceed_into(a, b, bound, tail, z=a, scratch=scratch, own=True), want)
    # per-pool (C,2,H,P) quantiles against per-class bounds, as the TPOT call
    q50, q95 = p50[0], p95[0]
    z, scratch = np.empty_like(p50), np.empty_like(p50)
    np.testing.assert_array_equal(lognormal_exceed_into(q50, q95, bound, tail, z=z, scratch=scratch),
                                  lognormal_exceed_ref(q50, q95, bound, tail))
    # scalars go through the formula
    assert lognormal_exceed(2.0, 4.0, np.array([4.0]))[0] == pytest.approx(0.05, abs=1e-3)


@pytest.mark.parametrize("K", [1, 2, 3, 4])
@pytest.mark.parametrize("P", [1, 3, 8, 10, 12])
def test_sum_over_pools_in_the_order_of_the_class_last_layout(K, P):
    rng = np.random.default_rng(K * 100 + P)
    x = rng.random((K, 6, 2, 5, P)) * 10.0 ** rng.integers(-9, 3, (K, 6, 2, 5, P))
    class_last = np.ascontiguousarray(np.moveaxis(x, 0, -1))  # (C,2,H,P,K): how the score laid it out before
    np.testing.assert_array_equal(sum_pools(x), np.moveaxis(class_last.sum(axis=3), -1, 0))


def _prior() -> QueueingPrior:
    m = QueueingPrior(pools=("m", "pf", "dc"), figures=(FIG_70B, FIG_8B, FIG_8B),
                      roles=("mixed", "prefill", "decode"))
    return m.with_corrections([1.3, 0.9, 1.1], [1.2, 1.0, 0.8], 0.4, burst=[0.0, 1.5, 0.7])


def test_latency_of_broadcast_inputs_equals_latency_of_full_rows():
    """The planner passes per-pool constants as (P,), levers as (C,1,1,P), the hit rate as (C,1,H,P)."""
    rng = np.random.default_rng(3)
    C, H, P = 5, 6, 3
    m = _prior()
    small = dict(pool_index=np.arange(P), rps_per_replica=rng.uniform(0.0, 12.0, (C, 2, H, P)),
                 prompt_tokens=np.array([1100.0, 2400.0, 900.0]), output_tokens=np.array([210.0, 1.0, 350.0]),
                 hit_rate=rng.uniform(0.0, 0.9, (C, 1, H, P)), inflight_cap=rng.choice([0.0, 32.0, 96.0], (C, 1, 1, P)),
                 max_num_seqs=rng.choice([128.0, 256.0], (C, 1, 1, P)),
                 max_num_batched_tokens=rng.choice([1024.0, 8192.0], (C, 1, 1, P)))
    shape = (C, 2, H, P)
    full = {k: np.broadcast_to(v, shape).ravel().copy() for k, v in small.items()}
    a, b = m.latency(LatencyQuery(**small)), m.latency(LatencyQuery(**full))
    for f in ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s", "capacity_rps", "utilisation", "batch",
              "confidence", "slot_wait_p50_s", "slot_wait_p95_s"):
        got = getattr(a, f)
        assert got.shape == shape, f
        np.testing.assert_array_equal(got.ravel(), getattr(b, f), err_msg=f)


@pytest.mark.parametrize("target", [0.03, 0.06, 0.2, 5.0])
def test_burst_bisection_equals_rebuilding_the_model_per_step(target):
    m = _prior()
    for j in range(3):
        q = LatencyQuery(pool_index=np.array([j]), rps_per_replica=np.array([3.0]), prompt_tokens=np.array([1300.0]),
                         output_tokens=np.array([220.0]), hit_rate=np.array([0.2]), inflight_cap=np.array([0.0]),
                         max_num_seqs=np.array([256.0]), max_num_batched_tokens=np.array([2048.0]))
        base = replace(m, ttft_correction=(1.0,) * 3, tpot_correction=(1.0,) * 3, _arr={})
        lo, top = 0.0, 50.0
        for _ in range(30):  # the bisection as written before: a new model per step
            mid = 0.5 * (lo + top)
            b = list(base.burst)
            b[j] = mid
            if float(replace(base, burst=tuple(b), _arr={}).latency(q).tpot_p95_s[0]) < target:
                lo = mid
            else:
                top = mid
        assert m.burst_for(q, target, hi=50.0) == lo


# --------------------------------------------------------------------------- the evaluator


def _problem(K: int = 3) -> PlanProblem:
    cfg = MpcConfig()
    pools = (
        PoolInput("a", 0, "g0", "mixed", 49.16, 1, 12, 4, 3, starting_eta_s=(20.0, 200.0), warm_slots=1,
                  startup_warm_s=60.0, startup_cold_s=300.0, standby=1, backlog=30.0, hit_rate=0.3,
                  reuse_inf_hit=0.4, reuse_working_set=2e6),
        PoolInput("b", 1, "g0", "prefill", 12.29, 1, 10, 3, 3, startup_warm_s=20.0, startup_cold_s=90.0,
                  prompt_tokens=2400.0, output_tokens=1.0, traffic_weight=0.7),
        PoolInput("c", 2, "g0", "decode", 12.29, 0, 10, 2, 2, starting_eta_s=(5.0,), startup_warm_s=20.0,
                  startup_cold_s=90.0, output_tokens=350.0),
        PoolInput("d", 0, "g1", "mixed", 49.16, 1, 8, 5, 5, warm_slots=2, startup_warm_s=60.0, startup_cold_s=300.0),
    )
    H = plan_steps(cfg, pools)
    names = ("critical", "standard", "sheddable")[:K]
    cls = tuple(ClassInput(n, 2.5 * (k + 1), 0.1 * (k + 1), tuple(np.linspace(8.0, 30.0, H) / K),
                           tuple(np.linspace(9.0, 36.0, H) / K), shed_now=0.1 * k, backlog=3.0)
                for k, n in enumerate(names))
    return PlanProblem(pools=pools, classes=cls, weights=resolve_weights("balanced"),
                       group_share={"g0": 0.6, "g1": 0.4})


def _evaluator(K: int = 3) -> Evaluator:
    prob = _problem(K)
    model = QueueingPrior(pools=("a", "b", "c"), figures=(FIG_70B, FIG_8B, FIG_8B),
                          roles=("mixed", "prefill", "decode")).with_corrections([1.2, 1.0, 0.9], [1.1, 1.0, 1.0], 0.3,
                                                                                 burst=[0.5, 0.0, 0.0])
    ev = Evaluator(prob, model, MpcConfig())
    ev.need = np.full((len(prob.pools), ev.H), 4.0)
    return ev


def _candidates(ev: Evaluator, rng: np.random.Generator, n: int, vary: tuple[int, ...]):
    c = ev.cur.tile(n)
    c.repl, c.standby = c.repl.copy(), c.standby.copy()
    for j in vary:
        p = ev.prob.pools[j]
        steps = rng.integers(p.lo, p.hi + 1, (n, 3))
        at = np.sort(rng.integers(0, ev.H, (n, 2)), axis=1)
        c.repl[:, j, :] = steps[:, :1]
        for i in range(n):
            c.repl[i, j, at[i, 0]:] = steps[i, 1]
            c.repl[i, j, at[i, 1]:] = steps[i, 2]
        c.standby[:, j] = rng.integers(0, 3, n)
    c.pw = rng.uniform(0.0, 8.0, c.pw.shape)
    c.cap = rng.choice([8.0, 64.0, 256.0], c.cap.shape)
    c.tw = rng.uniform(0.05, 1.0, c.tw.shape)
    c.shed = np.maximum.accumulate(rng.uniform(0.0, 0.6, c.shed.shape) * (rng.random(c.shed.shape) < 0.5), axis=1)
    return c


def _dynamics_reference(ev: Evaluator, repl: np.ndarray, standby: np.ndarray):
    """The replica dynamics rules one pool and candidate at a time, in plain Python (as the planner's
    docstring states them): starting replicas removed latest first, then ready ones drained."""
    C, P, H = repl.shape
    dyn = ev.dynamics
    ready_mid, billed, fresh = np.empty((C, P, H)), np.empty((C, P, H)), np.empty((C, P, H))
    for c in range(C):
        for p in range(P):
            ready, warm = float(dyn.ready0[p]), float(dyn.warm0[p] + standby[c, p])
            pend, new_pend, new_ready = list(dyn.pend0[p]), [0.0] * (H + 1), 0.0
            for h in range(H):
                if h > 0:
                    ready += pend[h - 1]
                    new_ready += new_pend[h - 1]
                    pend[h - 1] = new_pend[h - 1] = 0.0
                serving, tgt = ready + sum(pend), float(repl[c, p, h])
                add = max(tgt - serving, 0.0)
                if add > 0:
                    n_w = min(add, warm)
                    warm -= n_w
                    bw, bc = min(h + int(dyn.bin_warm[p]), H), min(h + int(dyn.bin_cold[p]), H)
                    for b, n in ((bw, n_w), (bc, add - n_w)):
                        pend[b] += n
                        new_pend[b] += n
                cut = max(serving - tgt, 0.0)
                if cut > 0:
                    for b in range(H, h - 1, -1):
                        take = min(pend[b], cut)
                        pend[b] -= take
                        new_pend[b] -= min(new_pend[b], take)
                        cut -= take
                    drained = min(cut, ready)
                    ready -= drained
                    new_ready = min(new_ready, ready)
                    warm += drained
                ready_mid[c, p, h] = ready + pend[h]
                fresh[c, p, h] = (new_ready + new_pend[h]) / max(ready_mid[c, p, h], 1e-9)
                billed[c, p, h] = ready + sum(pend) + standby[c, p] * dyn.standby_cost_frac
    return ready_mid, billed, np.clip(fresh, 0.0, 1.0)


@pytest.mark.parametrize("vary", [(), (0,), (1, 3), (0, 1, 2, 3)])
def test_replica_dynamics_equal_the_rules_pool_by_pool(vary):
    """Pools whose plan is the same in every candidate are simulated once; the rest row by row."""
    ev = _evaluator()
    c = _candidates(ev, np.random.default_rng(len(vary)), 9, vary)
    got = ev.dynamics.run(c.repl, c.standby)
    want = _dynamics_reference(ev, c.repl, c.standby)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("K", [1, 3])
def test_a_batch_scores_as_its_rows_and_reused_work_arrays_leave_no_trace(K):
    ev = _evaluator(K)
    rng = np.random.default_rng(10 + K)
    big = _candidates(ev, rng, 12, (0, 2))
    small = _candidates(ev, rng, 3, ())
    J_big, _ = ev.score(big)
    J_small, _ = ev.score(small)
    assert np.isfinite(J_big).all() and np.isfinite(J_small).all()
    np.testing.assert_array_equal(ev.score(big)[0], J_big)  # after a smaller batch reused the arrays
    singles = np.array([ev.score(big.take(np.array([i])))[0][0] for i in range(big.n)])
    np.testing.assert_allclose(singles, J_big, rtol=1e-12)
    J1, info = ev.score(big.take(np.array([4])), detail=True)
    assert info is not None and info["wait"].shape == (1, 2, ev.H, len(ev.prob.pools), K)
    assert J1[0] == pytest.approx(J_big[4], rel=1e-12)


# --------------------------------------------------------------------------- the compiled loops (numba)
#
# controller/core/mpc_kernel.py computes the queueing prior's answer, the backlog stage and the replica
# dynamics as compiled loops. The backlog and the dynamics are plain arithmetic in the numpy's order:
# equal bit for bit. The latency answer calls the C library's exp/log/erf/erfc where numpy calls its own
# vectorised exp/log and scipy's ndtr, and takes u³, u⁴ as products where numpy calls pow: equal within
# 1e-12 relative (the slot waits, ln(P(wait) / tail) with P(wait) just above the tail, within 1e-9
# relative or 1 ns).


def test_the_compiled_loops_are_in_use_here():
    """numba is a pinned dependency: the fast path must not silently fall back to numpy in the tests."""
    assert compiled_kernel() is not None


def _hw_formula(util, servers, service_s, qs):
    """The Halfin–Whitt wait evaluated on every row (the reference of the β ≥ 3 shortcut)."""
    u = np.clip(util, 0.0, 0.995)
    c = np.maximum(servers, 1.0)
    idle = 1.0 - u
    beta = idle * np.sqrt(c)
    phi = np.exp(-0.5 * beta * beta) / np.sqrt(2 * np.pi)
    p_wait = np.where(u <= 0.0, 0.0, 1.0 / (1.0 + beta * ndtr(beta) / np.maximum(phi, 1e-300)))
    rate = c * idle / np.maximum(service_s, 1e-9)
    return tuple(np.where(p_wait > 1.0 - q, np.log(np.maximum(p_wait, 1.0 - q) / (1.0 - q)) / rate, 0.0) for q in qs)


@pytest.mark.parametrize("qs", [(0.95, 0.5), (0.99,), (0.999, 0.5)])
def test_halfin_whitt_wait_skips_only_rows_that_wait_zero(qs):
    rng = np.random.default_rng(20)
    n = 5_000
    util = np.concatenate([rng.uniform(0.0, 1.2, n), [0.0, -0.1, np.nan, 0.98, 1.0]])
    servers = rng.choice([1.0, 2.0, 4.0, 8.0, 64.0, 256.0], util.shape)
    service = rng.uniform(0.5, 30.0, util.shape)
    for got, want in zip(_halfin_whitt_wait(util, servers, service, qs), _hw_formula(util, servers, service, qs),
                         strict=True):
        np.testing.assert_array_equal(got, want)


def _latency_inputs(rng: np.random.Generator, C: int = 6, H: int = 7, P: int = 3) -> dict[str, np.ndarray]:
    return dict(pool_index=np.arange(P), rps_per_replica=rng.uniform(0.0, 14.0, (C, 2, H, P)),
                prompt_tokens=np.array([1100.0, 2400.0, 900.0]), output_tokens=np.array([210.0, 1.0, 350.0]),
                hit_rate=rng.uniform(-0.1, 1.0, (C, 1, H, P)),
                inflight_cap=rng.choice([0.0, 2.0, 32.0, 96.0], (C, 1, 1, P)),
                max_num_seqs=rng.choice([0.0, 8.0, 128.0, 256.0], (C, 1, 1, P)),
                max_num_batched_tokens=rng.choice([0.0, 512.0, 1024.0, 8192.0], (C, 1, 1, P)))


@pytest.mark.parametrize("burst", [(0.0, 0.0, 0.0), (0.0, 1.5, 0.7)])
def test_compiled_latency_equals_the_numpy_formula(burst):
    m = QueueingPrior(pools=("m", "pf", "dc"), figures=(FIG_70B, FIG_8B, FIG_8B), roles=("mixed", "prefill", "decode"))
    m = m.with_corrections([1.3, 0.9, 1.1], [1.2, 1.0, 0.8], 0.4, burst=list(burst))
    ref = replace(m, compiled=False, _arr={})
    rng = np.random.default_rng(21)
    for q in (LatencyQuery(**_latency_inputs(rng)),  # the planner's broadcast shapes
              LatencyQuery(**{k: np.broadcast_to(v, (6, 2, 7, 3)).ravel() for k, v in _latency_inputs(rng).items()})):
        got, want = m.latency(q), ref.latency(q)
        for f in ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s", "capacity_rps", "utilisation", "batch",
                  "confidence", "tpot_max_s"):
            g, w = getattr(got, f), np.broadcast_to(getattr(want, f), np.shape(getattr(got, f)))
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=0.0, err_msg=f)
        for f in ("slot_wait_p50_s", "slot_wait_p95_s"):
            g, w = getattr(got, f), np.broadcast_to(getattr(want, f), np.shape(getattr(got, f)))
            assert (g > 0).any(), f  # the inputs reach the waiting regime
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9, err_msg=f)


def test_compiled_latency_keeps_nan_rows_nan():
    m = QueueingPrior(pools=("m",), figures=(FIG_8B,))
    q = LatencyQuery(pool_index=np.zeros(3, dtype=np.intp), rps_per_replica=np.array([np.nan, 2.0, 2.0]),
                     prompt_tokens=np.full(3, 1000.0), output_tokens=np.full(3, 200.0),
                     hit_rate=np.array([0.2, np.nan, 0.2]), inflight_cap=np.zeros(3), max_num_seqs=np.full(3, 256.0),
                     max_num_batched_tokens=np.full(3, 8192.0))
    got, want = m.latency(q), replace(m, compiled=False, _arr={}).latency(q)
    for f in ("ttft_p95_s", "tpot_p95_s", "utilisation", "capacity_rps"):
        np.testing.assert_array_equal(np.isnan(getattr(got, f)), np.isnan(getattr(want, f)), err_msg=f)


@pytest.mark.parametrize("K", [1, 3])
def test_compiled_backlog_and_risk_stages_equal_the_numpy_stages(K):
    """Same model answers into both: the backlog's wait, the priority re-weighing, the timeouts and each
    class's late share agree bit for bit (wide loads, so backlogs build and some waits pass the client's
    timeout)."""
    ev_c = _evaluator(K)
    prob = ev_c.prob
    ev_n = Evaluator(prob, ev_c.model, MpcConfig(), compiled=False)
    ev_n.need = ev_c.need
    rng = np.random.default_rng(30 + K)
    c = _candidates(ev_c, rng, 11, (0, 1, 3))
    c.cap[:4] = 8.0  # small in-flight caps: the slot wait and the backlog both matter
    for ev in (ev_c, ev_n):
        ev.traffic.lam = ev.traffic.lam * 6.0
    out = []
    for ev in (ev_c, ev_n):
        ready, _, fresh = ev.dynamics.run(c.repl, c.standby)
        flow = ev.traffic.admit(c, ready, ev.need, ev.work)
        pl = ev.latency.predict(c, flow, fresh, ev.work)
        t50, t95, timed_out = pl.t50.copy(), pl.t95.copy(), pl.timed_out.copy()
        out.append((t50, t95, timed_out, ev.risk.late_share(pl, flow.share)))
    assert out[0][2].any() and not out[0][2].all()
    assert ((out[0][3] > 0) & (out[0][3] < 1)).any()
    for g, w in zip(out[0], out[1], strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("vary", [(), (0,), (0, 1, 2, 3)])
def test_compiled_dynamics_equal_the_numpy_dynamics(vary):
    ev = _evaluator()
    ref = Evaluator(ev.prob, ev.model, MpcConfig(), compiled=False)
    c = _candidates(ev, np.random.default_rng(40 + len(vary)), 13, vary)
    for g, w in zip(ev.dynamics.run(c.repl, c.standby), ref.dynamics.run(c.repl, c.standby), strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("K", [1, 3])
def test_compiled_scores_equal_the_numpy_scores(K):
    """The whole score, compiled loops against the numpy stages (model included; the normal tails are
    the compiled ones either way, equal to scipy's bit for bit, see below), within 1e-12."""
    ev = _evaluator(K)
    assert isinstance(ev.model, QueueingPrior)
    model = replace(ev.model, compiled=False, _arr={})
    ref = Evaluator(ev.prob, model, MpcConfig(), compiled=False)
    ref.need = ev.need
    c = _candidates(ev, np.random.default_rng(50 + K), 17, (0, 2, 3))
    J, Jr = ev.score(c)[0], ref.score(c)[0]
    assert np.isfinite(Jr).all()
    np.testing.assert_allclose(J, Jr, rtol=1e-12, atol=0.0)


def test_compiled_normal_cdf_is_scipys_to_the_bit():
    """mpc_kernel.cephes_ndtr mirrors scipy's (Cephes) ndtr: same branches, coefficients and C-library exp."""
    kern = compiled_kernel()
    assert kern is not None
    rng = np.random.default_rng(60)
    x = np.concatenate([rng.normal(0.0, 3.0, 200_000), rng.uniform(-40.0, 40.0, 20_000),
                        [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-300, -1e-300, 38.0, -38.0]])
    edges = np.sqrt(2.0) * np.array([1.0, 8.0])  # the branch points of erf / erfc in ndtr's argument
    x = np.concatenate([x, edges, -edges, np.nextafter(edges, 0.0), -np.nextafter(edges, 0.0)])
    out = np.empty_like(x)
    kern.ndtr_rows(x, out)
    np.testing.assert_array_equal(out, ndtr(x))


@pytest.mark.parametrize("saturated_share", [0.0, 0.5, 0.95])
def test_compiled_upper_tail_equals_upper_tail(saturated_share):
    kern = compiled_kernel()
    assert kern is not None
    z = _z(np.random.default_rng(61), 30_000, saturated_share).reshape(3, 10, 1000)
    got = z.copy()
    kern.upper_tail_rows(got)
    np.testing.assert_array_equal(got, upper_tail(z.copy()))


def test_without_numba_the_planner_answers_with_the_numpy_formulas():
    """numba blocked in a fresh interpreter: the planner plans, with the numpy formulas' scores."""
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "import numpy as np\n"
        "from tests.core.test_mpc_speedup_equivalence import _evaluator, _candidates\n"
        "from controller.core.mpc_model import compiled_kernel\n"
        "assert compiled_kernel() is None\n"
        "ev = _evaluator(3)\n"
        "c = _candidates(ev, np.random.default_rng(70), 9, (0, 2))\n"
        "print(repr(ev.score(c)[0].tolist()))\n")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr
    ev = _evaluator(3)
    c = _candidates(ev, np.random.default_rng(70), 9, (0, 2))
    np.testing.assert_allclose(np.array(ast.literal_eval(out.stdout.strip())), ev.score(c)[0], rtol=1e-12, atol=0.0)


def test_compiled_risk_stage_without_decode_pools_equals_the_numpy_stage():
    prob = _problem(3)
    prob = replace(prob, pools=tuple(replace(p, role="mixed") for p in prob.pools))
    model = QueueingPrior(pools=("a", "b", "c"), figures=(FIG_70B, FIG_8B, FIG_8B))
    evs = [Evaluator(prob, model, MpcConfig(), compiled=flag) for flag in (True, False)]
    c = _candidates(evs[0], np.random.default_rng(80), 10, (0, 3))
    got = []
    for ev in evs:
        ev.need = np.full((len(prob.pools), ev.H), 4.0)
        ready, _, fresh = ev.dynamics.run(c.repl, c.standby)
        flow = ev.traffic.admit(c, ready, ev.need, ev.work)
        got.append(ev.risk.late_share(ev.latency.predict(c, flow, fresh, ev.work), flow.share))
    assert ((got[1] > 0) & (got[1] < 1)).any()
    np.testing.assert_array_equal(got[0], got[1])
