"""Knative KPA: stable vs panic mode, panic entry at 200 %, no scale-down while panicking, rate limits."""

from __future__ import annotations

import pytest

from controller.policies.kpa import KpaPolicy, KpaPoolMemory, KpaState
from tests.policies.builders import codes, decide, drive, fleet, inp, spec

NOW = 600.0


def memory(history: list[float], *, panic_since: float | None = None, max_panic: int = 0) -> KpaState:
    """Samples 15 s apart ending 15 s before NOW (the tick under test adds the newest)."""
    n = len(history)
    samples = tuple((NOW - 15.0 * (n - k), v) for k, v in enumerate(history))
    return KpaState(pools={"p": KpaPoolMemory(samples=samples, panic_since_s=panic_since, max_panic_pods=max_panic,
                                              seen=True)})


# Default target: 100 × 0.7 = 70 in-flight per replica.
# label, prior samples, (running, waiting) now, ready, current, panic state, expected replicas,
# codes (subset), panicking
ROWS = [
    ("stable: 280 in flight on 4 ready at 70 each → hold 4", [280, 280, 280], (280, 0), 4, 4, None, 4, set(), False),
    ("stable scale-up: avg 420 → 6; panic 6/4 = 1.5 < 2 → no panic", [420, 420, 420], (400, 20), 4, 4, None, 6,
     {"scale_up"}, False),
    ("panic entry at 200 %: panic wants ceil(560/70) = 8 = 2 × 4 ready", [280, 280, 280], (500, 60), 4, 4, None, 8,
     {"panic_enter", "scale_up"}, True),
    ("just below the panic threshold: 7/4 = 1.75 → stable ceil(332.5/70) = 5", [280, 280, 280], (490, 0), 4, 4, None, 5,
     {"scale_up"}, False),
    ("no scale-down while panicking: low load, held at max panic pods 8", [70, 70, 70], (70, 0), 8, 8, NOW - 20, 8,
     {"panic_hold"}, True),
    ("panic ends a full stable window after the last over-threshold tick; then at most halves",
     [70, 70, 70], (70, 0), 8, 8, NOW - 61, 4, {"panic_exit", "scale_down"}, False),
    ("panic continues within the stable window", [70, 70, 70], (70, 0), 8, 8, NOW - 59, 8, {"panic_hold"}, True),
    ("max scale-down rate 2: 10 ready at 70 total → floor(10/2) = 5, not 1", [70, 70, 70], (70, 0), 10, 10, None, 5,
     {"scale_down"}, False),
    ("max scale-down rate 2, odd count: 5 → floor(2.5) = 2", [10, 10, 10], (10, 0), 5, 5, None, 2,
     {"scale_down"}, False),
    ("stable window 60 s: samples older than 60 s do not count", [7000, 70, 70, 70], (70, 0), 4, 4, None, 2,
     {"scale_down"}, False),
]


@pytest.mark.parametrize("label,history,now_sample,ready,current,panic_since,expected,expected_codes,panicking", ROWS,
                         ids=[r[0] for r in ROWS])
def test_kpa_rows(label, history, now_sample, ready, current, panic_since, expected, expected_codes, panicking):
    pol = KpaPolicy()
    st = memory(history, panic_since=panic_since, max_panic=current if panic_since is not None else 0)
    running, waiting = now_sample
    state, out = decide(pol, st, inp(NOW, {"p": dict(ready=ready, running=running, waiting=waiting)},
                                     current={"p": current}))
    assert out.pools["p"].replicas == expected, (label, out.diagnostics["pools"]["p"])
    assert expected_codes <= set(codes(out)), (label, codes(out))
    assert out.diagnostics["pools"]["p"]["panicking"] is panicking
    assert (state.pools["p"].panic_since_s is not None) is panicking


def test_panic_window_is_10_percent_of_stable_and_defaults_match_knative():
    pol = KpaPolicy()
    p = pol.params
    assert (p.target, p.stable_window_s, p.panic_window_s, p.panic_threshold, p.max_scale_up_rate,
            p.max_scale_down_rate) == pytest.approx((70.0, 60.0, 6.0, 2.0, 1000.0, 2.0))


def test_first_sight_with_several_ready_starts_in_panic_and_does_not_scale_down():
    pol = KpaPolicy()
    _, out = decide(pol, pol.initial_state(), inp(0.0, {"p": dict(ready=6, running=10, waiting=0)}, current={"p": 6}))
    assert out.pools["p"].replicas == 6
    assert "panic_hold" in codes(out)


def test_closed_loop_burst_then_quiet_scales_up_fast_and_down_slowly():
    pol = KpaPolicy()
    fl = fleet(spec())
    steps = []
    for k in range(0, 20):  # 15 s ticks: 70 in flight on 1 replica, a 30 s burst of 700, then quiet again
        c = 700 if k in (4, 5) else 70
        steps.append((15.0 * k, {"p": dict(ready=1, running=c, waiting=0)}))
    outs = drive(pol, fl, steps, start={"p": 1})
    got = [o.pools["p"].replicas for o in outs]
    assert got[:4] == [1, 1, 1, 1]
    assert got[4] == 10 and "panic_enter" in codes(outs[4])  # ceil(700/70) = 10 ≥ 2 × 1 ready
    assert got[5:10] == [10] * 5  # panicking: no scale-down until 60 s after the last burst tick (t=75)
    assert "panic_exit" in codes(outs[10]) and got[10] < 10  # t=150 > 75 + 60


def test_missing_concurrency_holds_and_partial_data_never_scales_down():
    pol = KpaPolicy()
    _, out = decide(pol, pol.initial_state(),
                    inp(0.0, {"p": dict(ready=4, running=None, waiting=None)}, current={"p": 4}))
    assert out.pools["p"].replicas == 4 and "missing_data_hold" in codes(out)
    _, out = decide(pol, pol.initial_state(),
                    inp(0.0, {"p": dict(ready=None, running=10, waiting=0)}, current={"p": 4}))
    assert out.pools["p"].replicas == 4 and "missing_data_hold" in codes(out)
    # waiting missing, running low, not panicking: no scale-down on partial data ...
    st = memory([70, 70, 70])
    _, out = decide(pol, st, inp(NOW, {"p": dict(ready=8, running=70, waiting=None)}, current={"p": 8}))
    assert out.pools["p"].replicas == 8 and "partial_data_no_scale_down" in codes(out)
    # ... but partial data may scale up (the missing part counts as 0).
    st = memory([700, 700, 700])
    _, out = decide(pol, st, inp(NOW, {"p": dict(ready=8, running=700, waiting=None)}, current={"p": 8}))
    assert out.pools["p"].replicas == 10


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="target_utilization"):
        KpaPolicy(target_utilization=1.5)
    with pytest.raises(ValueError, match="max_scale_down_rate"):
        KpaPolicy(max_scale_down_rate=1.0)
