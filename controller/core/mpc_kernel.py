"""The planner's scoring hot spots as compiled loops (numba), beside the numpy formulas they mirror.

At the planner's batch sizes (10-40k rows per stage) the numpy stages spend their time on passes over
memory and temporaries, not on the arithmetic; these loops make one pass per row:

- `rows_loop` / `latency_rows`: `QueueingPrior._latency` (controller/core/mpc_model.py), with the load-
  independent half of a row reused across the load scenarios and the Halfin–Whitt wait evaluated only
  below β = `HW_WAIT_FREE_BETA`, as there;
- `queue_rows`: the fluid backlog and the priority re-weighing of the slot wait (mpc/latency.py);
- `dynamics_rows`: the replica dynamics (mpc/dynamics.py);
- `upper_tail_rows` / `cephes_ndtr`: 1 − Φ(z) (controller/core/distributions.py), Φ as scipy's ndtr computes it;
- `combine_rows`: the risk stage past its tail probabilities (mpc/risk.py).

Each is the same operations in the same order as its numpy formula, so the backlog, the dynamics, the
normal tails and the risk combination give the same values bit for bit. The latency answer differs only in the last bits
where numpy calls its own vectorised exp/log or pow (here the C library's exp/log, and u³, u⁴ as
products): within 1e-12 relative. tests/core/test_mpc_speedup_equivalence.py checks every loop
against its formula.

mpc_model.compiled_kernel() imports this module on first use and compiles the loops (`warm_up`;
seconds where numba's disk cache is cold, under a second from it); where numba cannot be imported or
compile, the numpy formulas answer and stay the reference.

Must not: change what a formula says (a change goes into the numpy formula and here together), do
I/O of its own (numba's cache aside), read the clock or draw randomness.
"""

from __future__ import annotations

import math

import numba
import numpy as np

# Compiled on first call, cached on disk where numba may write (else compiled once per process);
# no fast-math, so products and sums round as numpy's do.
_jit = numba.njit(cache=True, nogil=True, error_model="numpy")
_inline = numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")

# Constants of mpc_model.py the loop reads (passed in, so the two cannot drift: see `latency_rows`).
_SQRT_2PI = math.sqrt(2 * math.pi)
_SQRT1_2 = math.sqrt(0.5)


@_inline
def _nmax(a: float, b: float) -> float:
    """np.maximum of two floats (a NaN on either side propagates)."""
    if a != a or a >= b:
        return a
    return b


@_inline
def _nmin(a: float, b: float) -> float:
    """np.minimum of two floats (a NaN on either side propagates)."""
    if a != a or a <= b:
        return a
    return b


# --------------------------------------------------------------------------- normal tails
#
# Φ as scipy computes it (scipy.special.ndtr is Cephes' ndtr: erf near 0, erfc beyond, each a
# rational approximation; the coefficients are Cephes' published constants, S. L. Moshier), in the
# same operations and order and with the same C-library exp, so the same values (the tests compare
# them bit for bit on a million arguments); a compiled call costs a fraction of the ufunc's.

_ERFC_P = (2.46196981473530512524E-10, 5.64189564831068821977E-1, 7.46321056442269912687E0,
           4.86371970985681366614E1, 1.96520832956077098242E2, 5.26445194995477358631E2,
           9.34528527171957607540E2, 1.02755188689515710272E3, 5.57535335369399327526E2)
_ERFC_Q = (1.32281951154744992508E1, 8.67072140885989742329E1, 3.54937778887819891062E2,
           9.75708501743205489753E2, 1.82390916687909736289E3, 2.24633760818710981792E3,
           1.65666309194161350182E3, 5.57535340817727675546E2)
_ERFC_R = (5.64189583547755073984E-1, 1.27536670759978104416E0, 5.01905042251180477414E0,
           6.16021097993053585195E0, 7.40974269950448939160E0, 2.97886665372100240670E0)
_ERFC_S = (2.26052863220117276590E0, 9.39603524938001434673E0, 1.20489539808096656605E1,
           1.70814450747565897222E1, 9.60896809063285878198E0, 3.36907645100081516050E0)
_ERF_T = (9.60497373987051638749E0, 9.00260197203842689217E1, 2.23200534594684319226E3,
          7.00332514112805075473E3, 5.55923013010394962768E4)
_ERF_U = (3.35617141647503099647E1, 5.21357949780152679795E2, 4.59432382970980127987E3,
          2.26290000613890934246E4, 4.92673942608635921086E4)
_MAXLOG = 7.09782712893383996843E2


@_inline
def _erfc_pos(x: float) -> float:
    """Cephes erfc for 1 ≤ x (the only arguments ndtr gives it)."""
    z = -x * x
    if z < -_MAXLOG:
        return 0.0
    z = math.exp(z)
    if x < 8.0:
        p = _ERFC_P[0]
        for i in range(1, 9):
            p = p * x + _ERFC_P[i]
        q = x + _ERFC_Q[0]
        for i in range(1, 8):
            q = q * x + _ERFC_Q[i]
    else:
        p = _ERFC_R[0]
        for i in range(1, 6):
            p = p * x + _ERFC_R[i]
        q = x + _ERFC_S[0]
        for i in range(1, 6):
            q = q * x + _ERFC_S[i]
    return (z * p) / q


@_inline
def _erf_small(x: float) -> float:
    """Cephes erf for |x| < 1 (odd: the sign of x carries through)."""
    neg = x < 0.0
    if neg:
        x = -x
    z = x * x
    p = _ERF_T[0]
    for i in range(1, 5):
        p = p * z + _ERF_T[i]
    q = z + _ERF_U[0]
    for i in range(1, 5):
        q = q * z + _ERF_U[i]
    y = x * p / q
    return -y if neg else y


@_inline
def cephes_ndtr(a: float) -> float:
    """Φ(a) as scipy.special.ndtr."""
    if a != a:
        return a
    x = a * _SQRT1_2
    z = abs(x)
    if z < 1.0:
        return 0.5 + 0.5 * _erf_small(x)
    y = 0.5 * _erfc_pos(z)
    return 1.0 - y if x > 0 else y


@_jit
def upper_tail_rows(z: np.ndarray) -> None:
    """controller.core.distributions.upper_tail in place on a contiguous array: 1 − Φ(z), exactly 0 / 1 beyond ±9."""
    flat = z.reshape(-1)
    for i in range(flat.size):
        x = flat[i]
        if x > 9.0:
            flat[i] = 0.0
        elif x < -9.0:
            flat[i] = 1.0
        else:
            flat[i] = 1.0 - cephes_ndtr(x)


@_jit
def ndtr_rows(x: np.ndarray, out: np.ndarray) -> None:
    """scipy.special.ndtr of a contiguous array into out (the tests' hook on cephes_ndtr)."""
    a, o = x.reshape(-1), out.reshape(-1)
    for i in range(a.size):
        o[i] = cephes_ndtr(a[i])


# slots of the per-row work array `st` (what does not depend on the load: computed once per distinct
# pool, mix, hit rate and levers, and reused across the load scenarios)
_A, _D, _E, _DEC, _KT, _KP, _BURST, _O, _U, _PH, _PC2, _BETA, _WORK, _NLIM, _CAP, _CS, _SQCS, _U50, _U95, _SK, \
    _SKP = range(21)
ST_SIZE = 21


@_inline
def _static(pool: int, p_in: float, o_in: float, hit_in: float, cap_in: float, mns: float, fig: np.ndarray,
            consts: np.ndarray, st: np.ndarray) -> None:
    """The load-independent half of one row of `QueueingPrior._latency` (the names are its names), into st."""
    a, b, c, d, e, kv = fig[pool, 0], fig[pool, 1], fig[pool, 2], fig[pool, 3], fig[pool, 4], fig[pool, 5]
    pre_only, dec_only = fig[pool, 6] != 0.0, fig[pool, 7] != 0.0
    m2, m3, m4, kv_free = consts[0], consts[1], consts[2], consts[3]
    p50_of_mean, p95_of_mean = consts[5], consts[6]
    P = _nmax(p_in, 1.0)
    hit = _nmin(_nmax(hit_in, 0.0), 0.99)
    O = _nmax(o_in, 1.0)  # noqa: E741  O: output tokens, the formulas' symbol
    if pre_only:
        O = 1.0  # noqa: E741
    u = P * (1.0 - hit)
    if dec_only:
        u = 0.0
    uu = u * u
    u2 = uu * m2
    u3 = uu * u * m3  # numpy's u**3 and u**4 call pow; products are far cheaper and within 2 ulp
    u4 = uu * uu * m4
    ph = P * hit
    pc = d * u + e * (u * ph + 0.5 * u2)
    dep = d + e * ph
    pc2 = dep * dep * u2 + dep * e * u3 + 0.25 * e * e * u4
    ctx = P + 0.5 * O
    beta = b + c * ctx
    work = pc + O * beta
    seq_cap = mns if mns > 0 else 256.0
    n_lim = _nmin(seq_cap, kv_free * kv / ctx)
    if cap_in > 0:
        n_lim = _nmin(n_lim, cap_in)
    n_lim = _nmax(n_lim, 1.0)
    cs = _nmax(n_lim, 1.0)
    st[_A], st[_D], st[_E] = a, d, e  # (b is in beta)
    st[_DEC] = 1.0 if dec_only else 0.0
    st[_KT], st[_KP], st[_BURST] = fig[pool, 8], fig[pool, 9], fig[pool, 10]
    st[_O], st[_U], st[_PH], st[_PC2], st[_BETA], st[_WORK], st[_NLIM] = O, u, ph, pc2, beta, work, n_lim
    st[_CAP] = n_lim / (O * a + n_lim * work)
    st[_CS], st[_SQCS] = cs, math.sqrt(cs)
    st[_U50], st[_U95] = u * p50_of_mean, u * p95_of_mean
    st[_SK], st[_SKP] = fig[pool, 11], fig[pool, 12]  # √k_ttft, √k_tpot (numpy's sqrt: correctly rounded)


@_inline
def _loaded(lam_in: float, mbt: float, st: np.ndarray, consts: np.ndarray, out: np.ndarray, n: int) -> None:
    """The load-dependent half of one row of `QueueingPrior._latency`, written to out[:, n]: ttft50,
    ttft95, tpot50, tpot95, capacity, utilisation, batch, confidence, slot waits p50/p95, TPOT bound."""
    a, d, e = st[_A], st[_D], st[_E]
    dec_only = st[_DEC] != 0.0
    k_ttft, k_tpot, burst = st[_KT], st[_KP], st[_BURST]
    O, u, ph, pc2, beta, work = st[_O], st[_U], st[_PH], st[_PC2], st[_BETA], st[_WORK]  # noqa: E741
    cap_rps, cs = st[_CAP], st[_CS]
    util_clip, ttft_f, tpot_f, conf0 = consts[4], consts[7], consts[8], consts[9]
    hw_beta, tail95, tail50, any_burst = consts[10], consts[11], consts[12], consts[13] != 0.0
    lam = _nmax(lam_in, 0.0)
    util = lam / _nmax(cap_rps, 1e-12)
    lam_eff = _nmin(lam, cap_rps * util_clip)
    rho = lam_eff * work
    free = _nmax(1.0 - rho, 1e-3)
    t = a / free
    batch = lam_eff * O * t
    service = O * t
    # Halfin–Whitt (mpc_model._halfin_whitt_wait at the quantiles 0.95 and 0.5)
    uq = _nmin(_nmax(_nmin(util, 0.98), 0.0), util_clip)
    idle = 1.0 - uq
    hb = idle * st[_SQCS]
    w95 = 0.0
    w50 = 0.0
    if hb < hw_beta:
        phi = math.exp(-0.5 * hb * hb) / _SQRT_2PI
        p_wait = 1.0 / (1.0 + hb * cephes_ndtr(hb) / _nmax(phi, 1e-300))
        if uq <= 0.0:
            p_wait = 0.0
        rate = cs * idle / _nmax(service, 1e-9)
        if p_wait > tail95:
            w95 = math.log(_nmax(p_wait, tail95) / tail95) / rate
        if p_wait > tail50:
            w50 = math.log(_nmax(p_wait, tail50) / tail50) / rate
    lam_pc2 = lam_eff * pc2
    w_pk = lam_pc2 / (2.0 * free)
    budget = mbt if mbt > 0 else 8192.0
    budget = _nmax(budget - batch, 256.0)
    u50, u95 = st[_U50], st[_U95]
    pf50 = math.ceil(u50 / budget) * t + d * u50 + e * u50 * (ph + 0.5 * u50)
    pf95 = math.ceil(u95 / budget) * t + d * u95 + e * u95 * (ph + 0.5 * u95)
    t_dec = a + beta * batch
    t_burst = t_dec
    if any_burst:
        chunk = _nmin(budget, burst * lam_eff * u)
        t_burst = t_dec + d * chunk + e * chunk * (ph + 0.5 * chunk)
    sk = st[_SK]
    ttft50 = (0.5 * t + pf50 + 0.7 * w_pk + w50) * sk
    ttft95 = (ttft_f * (0.95 * t + pf95) + 3.0 * w_pk + w95) * k_ttft
    if dec_only:
        ttft50 = 1.5 * t + w50
        ttft95 = 1.95 * t + w95
    spread = math.sqrt(lam_eff * service * pc2) / O
    tpot50 = t * st[_SKP]
    tpot95 = _nmax(t * tpot_f + 1.645 * spread, t_burst) * k_tpot
    t_hi = a + beta * (batch + 1.645 * math.sqrt(batch))
    tpot_max = _nmax((t_hi + d * budget + e * budget * (ph + 0.5 * budget)) * k_tpot, tpot95)
    if dec_only:
        tpot_max = math.inf
    out[0, n] = ttft50
    out[1, n] = ttft95
    out[2, n] = tpot50
    out[3, n] = tpot95
    out[4, n] = cap_rps
    out[5, n] = util
    out[6, n] = batch
    out[7, n] = conf0 if util < 0.95 else conf0 * 0.5
    out[8, n] = w50 * sk
    out[9, n] = w95 * k_ttft
    out[10, n] = tpot_max


_RO4 = numba.types.Array(numba.types.float64, 4, "A", readonly=True)  # any 4-d float view, broadcast or not


# one signature for every layout of the inputs (contiguous, broadcast, read-only): compiled once
@numba.njit(numba.void(numba.types.Array(numba.types.intp, 4, "A", readonly=True), _RO4, _RO4, _RO4, _RO4, _RO4, _RO4,
                       _RO4, numba.float64[:, ::1], numba.float64[::1], numba.float64[:, ::1]),
            cache=True, nogil=True, error_model="numpy")
def rows_loop(pool: np.ndarray, lam: np.ndarray, p: np.ndarray, o: np.ndarray, hit: np.ndarray, cap: np.ndarray,
              mns: np.ndarray, mbt: np.ndarray, fig: np.ndarray, consts: np.ndarray, out: np.ndarray) -> None:
    """`QueueingPrior._latency` over 4-d inputs of one broadcast shape (views with zero strides welcome),
    written to out[:, n] with n the row's C-order index. The second axis runs innermost: the planner
    broadcasts the hit rate and levers over it (the load scenarios), so a row's load-independent half
    is reused from the row before whenever its inputs are the same."""
    n0, n1, n2, n3 = lam.shape
    st = np.empty(ST_SIZE)
    last = np.full(6, np.nan)  # inputs of the load-independent half in `st` (NaN: none yet; NaN never equals)
    for i0 in range(n0):
        for i2 in range(n2):
            for i3 in range(n3):
                for i1 in range(n1):
                    pj, pp, oo = pool[i0, i1, i2, i3], p[i0, i1, i2, i3], o[i0, i1, i2, i3]
                    hh, cc, mm = hit[i0, i1, i2, i3], cap[i0, i1, i2, i3], mns[i0, i1, i2, i3]
                    if not (pj == last[0] and pp == last[1] and oo == last[2] and hh == last[3]
                            and cc == last[4] and mm == last[5]):
                        _static(pj, pp, oo, hh, cc, mm, fig, consts, st)
                        last[0], last[1], last[2], last[3], last[4], last[5] = pj, pp, oo, hh, cc, mm
                    _loaded(lam[i0, i1, i2, i3], mbt[i0, i1, i2, i3], st, consts, out,
                            ((i0 * n1 + i1) * n2 + i2) * n3 + i3)


def latency_rows(shape: tuple[int, ...], inputs: list[np.ndarray], fig: np.ndarray,
                 consts: np.ndarray) -> np.ndarray | None:
    """(11, *shape) answer rows (see `row_latency`) for the 8 query inputs broadcast to `shape`
    (at most 4-d), or None for more than 4 dimensions."""
    if len(shape) > 4:
        return None
    shape4 = (1,) * (4 - len(shape)) + tuple(shape)
    views = [np.broadcast_to(x, shape).reshape(shape4) for x in inputs]  # read-only views
    out = np.empty((11, math.prod(shape)))
    rows_loop(*views, fig, consts, out)  # type: ignore[call-arg]  # numba's Dispatcher is typed without arguments
    return out.reshape((11,) + tuple(shape))


# --------------------------------------------------------------------------- the backlog stage


@_jit
def queue_rows(cum_in: np.ndarray, cap_rps: np.ndarray, pool_rps: np.ndarray, ttft50: np.ndarray,
               ttft95: np.ndarray, sw50: np.ndarray, sw95: np.ndarray, q0_cum: np.ndarray, consts: np.ndarray,
               wait: np.ndarray, t50: np.ndarray, t95: np.ndarray, timed_out: np.ndarray) -> None:
    """The fluid backlog's wait and the priority re-weighing of the slot wait, per class: the numpy of
    mpc/latency.Latency.predict (see there for the model) as one loop, the same operations in the same
    order (no transcendental function: the same values).

    cum_in (K,C,2,H,P) arrivals cumulative over classes; the pool arrays (C,2,H,P); q0_cum (P,K);
    consts: step seconds, client timeout, slot waits given (0/1). Writes wait, t50, t95 (K,C,2,H,P)
    and timed_out (bool); t95 may be cum_in itself (each row is read before it is written)."""
    K, C, S, H, P = cum_in.shape
    dt, timeout, slot = consts[0], consts[1], consts[2] != 0.0
    cap_wait = 10 * timeout
    q = np.empty(P)
    rho = np.empty(P)
    idle = np.empty(P)
    cob_cap = np.empty(P)
    one_m_prev = np.empty(P)
    # pools innermost (the contiguous axis: the compiler vectorises it); steps in order for the backlog
    for c in range(C):
        for s in range(S):
            for k in range(K):
                for j in range(P):
                    q[j] = q0_cum[j, k]
                for h in range(H):
                    for j in range(P):
                        q_next = _nmax(q[j] + (cum_in[k, c, s, h, j] - cap_rps[c, s, h, j]) * dt, 0.0)
                        w = _nmin((q[j] + q_next) * 0.5 / _nmax(cap_rps[c, s, h, j], 1e-9), cap_wait)
                        wait[k, c, s, h, j] = w
                        timed_out[k, c, s, h, j] = w > timeout
                        q[j] = q_next
            for h in range(H):
                if slot:
                    for j in range(P):
                        r = _nmin(pool_rps[c, s, h, j] / _nmax(cap_rps[c, s, h, j], 1e-9), 0.98)
                        rho[j] = r
                        idle[j] = 1.0 - r
                        cob_cap[j] = 1.0 / _nmax(1.0 - r, 0.02)
                        one_m_prev[j] = 1.0
                for k in range(K):
                    for j in range(P):
                        w = wait[k, c, s, h, j]
                        if slot:
                            one_m = 1.0 - rho[j] * (cum_in[k, c, s, h, j] / _nmax(pool_rps[c, s, h, j], 1e-9))
                            cob = _nmin(idle[j] / _nmax(one_m * one_m_prev[j], 1e-3), cob_cap[j]) - 1.0
                            one_m_prev[j] = one_m
                            t50[k, c, s, h, j] = sw50[c, s, h, j] * cob + ttft50[c, s, h, j] + w
                            t95[k, c, s, h, j] = sw95[c, s, h, j] * cob + ttft95[c, s, h, j] + w
                        else:
                            t50[k, c, s, h, j] = ttft50[c, s, h, j] + w
                            t95[k, c, s, h, j] = ttft95[c, s, h, j] + w


# --------------------------------------------------------------------------- replica dynamics


@_jit
def dynamics_rows(repl: np.ndarray, standby: np.ndarray, ready0: np.ndarray, pend0: np.ndarray, warm0: np.ndarray,
                  bin_warm: np.ndarray, bin_cold: np.ndarray, standby_cost_frac: float, ready_mid: np.ndarray,
                  billed: np.ndarray, fresh: np.ndarray) -> None:
    """mpc/dynamics.ReplicaDynamics._simulate one candidate and column at a time (see there for the
    rules): repl (C,N,H) targets of the pools whose per-pool figures (ready0, pend0 (N,H+1), warm0,
    start-up bins) are given per column; writes ready_mid, billed and fresh (C,N,H). Replica counts
    are whole numbers, so every sum is exact and the values are the numpy's."""
    C, N, H = repl.shape
    pend = np.empty(H + 1)
    new_pend = np.empty(H + 1)
    for c in range(C):
        for n in range(N):
            ready = ready0[n]
            pend_tot = 0.0
            for b in range(H + 1):
                pend[b] = pend0[n, b]
                pend_tot += pend0[n, b]
                new_pend[b] = 0.0
            warm = warm0[n] + standby[c, n]
            new_ready = 0.0
            for h in range(H):
                if h > 0:
                    ready += pend[h - 1]
                    pend_tot -= pend[h - 1]
                    new_ready += new_pend[h - 1]
                gap = repl[c, n, h] - (ready + pend_tot)
                if gap > 0.0:
                    n_w = min(gap, warm)
                    warm -= n_w
                    n_c = gap - n_w
                    bw = min(h + bin_warm[n], H)
                    bc = min(h + bin_cold[n], H)
                    pend[bw] += n_w
                    pend[bc] += n_c
                    new_pend[bw] += n_w
                    new_pend[bc] += n_c
                    pend_tot += gap
                elif gap < 0.0:
                    cut = -gap
                    later = 0.0  # starting replicas go first, the latest first
                    taken = 0.0
                    for b in range(H, h - 1, -1):
                        take = min(pend[b], max(cut - later, 0.0))
                        later += pend[b]
                        pend[b] -= take
                        new_pend[b] -= min(new_pend[b], take)
                        taken += take
                    pend_tot -= taken
                    cut -= taken
                    drained = min(cut, ready)
                    ready -= drained
                    new_ready = min(new_ready, ready)
                    warm += drained
                ready_mid[c, n, h] = ready + pend[h]
                fresh[c, n, h] = new_ready + new_pend[h]
                billed[c, n, h] = ready + pend_tot + standby[c, n] * standby_cost_frac
            for h in range(H):
                fresh[c, n, h] = min(max(fresh[c, n, h] / max(ready_mid[c, n, h], 1e-9), 0.0), 1.0)


# --------------------------------------------------------------------------- the risk stage's combination


@_jit
def combine_rows(pf: np.ndarray, pt: np.ndarray, p_c: np.ndarray, timed_out: np.ndarray, share: np.ndarray,
                 hops: np.ndarray, consts: np.ndarray, v: np.ndarray) -> None:
    """mpc/risk.Risk.late_share past the tail probabilities, as one loop (see there for the model):
    the TPOT truncation at the bound, the timeouts, each pool's late share and their traffic-weighted
    sum per class. pf, pt, timed_out (K,C,2,H,P); p_c (C,2,H,P), P(TPOT > bound); share (C,H,P);
    hops (P,3): prefill pool, first hop, decode hop (0/1); consts: TPOT bound given, decode hop
    present (0/1). Writes v (C,2,H,K), clipped to [0, 1]. The same operations in the same order as
    the numpy (pools summed one after another, as risk.sum_pools does for K ≥ 2): the same values."""
    K, C, S, H, P = pf.shape
    bounded, decode = consts[0] != 0.0, consts[1] != 0.0
    for c in range(C):
        for s in range(S):
            for h in range(H):
                for k in range(K):
                    acc = 0.0
                    acc_dec = 0.0
                    for j in range(P):
                        f = pf[k, c, s, h, j]
                        t = pt[k, c, s, h, j]
                        if bounded:
                            pcj = p_c[c, s, h, j]
                            t = _nmin(_nmax((t - pcj) / _nmax(1.0 - pcj, 1e-12), 0.0), 1.0)
                        if timed_out[k, c, s, h, j]:
                            f = 1.0
                        mixed = f + t - f * t
                        first_v = f if hops[j, 0] != 0.0 else mixed
                        if decode:
                            term = share[c, h, j] * hops[j, 1] * first_v
                            term_dec = share[c, h, j] * hops[j, 2] * mixed
                            acc = term if j == 0 else acc + term
                            acc_dec = term_dec if j == 0 else acc_dec + term_dec
                        else:
                            term = share[c, h, j] * first_v
                            acc = term if j == 0 else acc + term
                    x = 1.0 - (1.0 - acc) * (1.0 - acc_dec) if decode else 1.0 - (1.0 - acc)
                    v[c, s, h, k] = _nmin(_nmax(x, 0.0), 1.0)


def warm_up() -> None:
    """Compile (or load from numba's cache) every loop of this module on tiny inputs of the types the
    planner passes, so a failure shows at once (the caller falls back to numpy) and not mid-search."""
    fig = np.ones((1, 13))
    consts = np.ones(14)
    one = np.ones((1, 1, 1, 1))
    latency_rows((1,), [np.zeros(1, dtype=np.intp)] + [np.ones(1)] * 7, fig, consts)
    k5 = np.ones((2, 1, 1, 1, 1))
    queue_rows(k5, one, one, one, one, one, one, np.zeros((1, 2)), np.ones(3), np.empty_like(k5),
               np.empty_like(k5), np.empty_like(k5), np.empty(k5.shape, dtype=bool))
    for shape in ((1, 1, 1, 1), (1, 1, 1, 1, 1)):  # the planner's pool and class rows
        upper_tail_rows(np.zeros(shape))
    combine_rows(k5, k5, one, np.zeros(k5.shape, dtype=bool), np.ones((1, 1, 1)), np.ones((1, 3)), np.ones(2),
                 np.empty((1, 1, 1, 2)))
    r = np.ones((1, 1, 1))
    dynamics_rows(r, np.zeros((1, 1)), np.ones(1), np.zeros((1, 2)), np.zeros(1), np.zeros(1, dtype=np.intp),
                  np.zeros(1, dtype=np.intp), 1.0, np.empty_like(r), np.empty_like(r), np.empty_like(r))
