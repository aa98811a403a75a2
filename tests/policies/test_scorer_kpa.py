"""llm-d/AIBrix style: scorer weights and the KPA on KV usage with AIBrix's windows and limits."""

from __future__ import annotations

import pytest

from controller.policies.kpa import KpaPoolMemory
from controller.policies.scorer_kpa import ScorerKpaPolicy, ScorerKpaPoolMemory, ScorerKpaState
from tests.policies.builders import codes, decide, drive, fleet, inp, spec

NOW = 1000.0


def state_with(samples: list[tuple[float, float]], *, cur: int, panic_since: float | None = None,
               rec_ago: float = 400.0) -> ScorerKpaState:
    """Prior total-KV samples at (seconds before NOW, total); `cur` recommended `rec_ago` seconds before NOW."""
    kmem = KpaPoolMemory(samples=tuple((NOW - ago, v) for ago, v in samples), panic_since_s=panic_since,
                         max_panic_pods=cur if panic_since is not None else 0, seen=True)
    return ScorerKpaState(pools={"p": ScorerKpaPoolMemory(kpa=kmem, recommendations=((NOW - rec_ago, cur),))})


# Target 0.5 KV usage per replica; samples are the pool total (mean usage × ready).
# label, prior samples, (ready, kv now), current, expected, codes (subset)
ROWS = [
    ("within the 10 % up tolerance: 0.52 on 4 → hold", [(15, 2.08), (30, 2.08)], (4, 0.52), 4, 4, set()),
    ("above tolerance: 0.8 on 4 → ceil(3.2/0.5) = 7", [(15, 3.2), (30, 3.2)], (4, 0.8), 4, 7, {"scale_up"}),
    ("max scale-up rate 2: 1.0 on 2 vs 0.25 target would be 8, capped at ceil(2 × 2) = 4",
     [(15, 2.0), (30, 2.0)], (2, 1.0), 2, 4, {"scale_up"}),
    ("stable window 180 s: a sample 170 s old counts", [(170, 8.0), (15, 2.0)], (4, 0.5), 4, 8, {"scale_up"}),
    ("stable window 180 s: a sample 190 s old does not", [(190, 8.0), (15, 2.0)], (4, 0.5), 4, 4, set()),
    ("max scale-down rate 2: 0.05 on 8 → at most halves to 4", [(15, 0.4), (30, 0.4)], (8, 0.05), 8, 4, {"scale_down"}),
    ("within the 10 % down tolerance: 0.46 on 4 → hold", [(15, 1.84), (30, 1.84)], (4, 0.46), 4, 4, set()),
]


@pytest.mark.parametrize("label,samples,now,current,expected,expected_codes", ROWS, ids=[r[0] for r in ROWS])
def test_scorer_kpa_rows(label, samples, now, current, expected, expected_codes):
    pol = ScorerKpaPolicy(target_kv_usage=0.25 if "0.25 target" in label else 0.5)
    ready, kv = now
    _, out = decide(pol, state_with(samples, cur=current),
                    inp(NOW, {"p": dict(ready=ready, kv=kv)}, current={"p": current}))
    assert out.pools["p"].replicas == expected, (label, out.diagnostics["pools"]["p"])
    assert expected_codes <= set(codes(out)), (label, codes(out))


def test_panic_window_60s_and_threshold_2():
    pol = ScorerKpaPolicy(target_kv_usage=0.25)
    # Stable (180 s) average is low, but the panic (60 s) window holds 2 × 0.9 … → panic.
    st = state_with([(170, 0.2), (150, 0.2), (120, 0.2), (90, 0.2), (45, 1.8), (15, 1.8)], cur=2)
    _, out = decide(pol, st, inp(NOW, {"p": dict(ready=2, kv=0.9)}, current={"p": 2}))
    info = out.diagnostics["pools"]["p"]
    assert info["panicking"] and "panic_enter" in codes(out)
    assert info["panic_value"] == pytest.approx(1.8)  # only the last 60 s
    assert out.pools["p"].replicas == 4  # ceil(1.8/0.25) = 8, capped by the scale-up rate 2 → 4


@pytest.mark.parametrize("rec_ago,expected", [(290.0, 8), (310.0, 4)])
def test_scale_down_is_stabilised_for_300s(rec_ago, expected):
    # The KPA asks for 4 (0.05 KV on 8 ready, at most halved); 8 was recommended rec_ago seconds ago.
    pol = ScorerKpaPolicy()
    st = state_with([(15, 0.4), (30, 0.4)], cur=8, rec_ago=rec_ago)
    _, out = decide(pol, st, inp(NOW, {"p": dict(ready=8, kv=0.05)}, current={"p": 8}))
    assert out.pools["p"].replicas == expected
    assert ("scale_down_stabilised" in codes(out)) is (expected == 8)


def test_first_sight_starts_in_panic_and_holds_the_count():
    pol = ScorerKpaPolicy()
    fl = fleet(spec())
    steps = [(15.0 * k, {"p": dict(ready=8, kv=0.1)}) for k in range(0, 14)]
    outs = drive(pol, fl, steps, start={"p": 8})
    got = [o.pools["p"].replicas for o in outs]
    assert got[:13] == [8] * 13  # panicking from t=0 until a full 180 s stable window has passed
    assert "panic_exit" in codes(outs[13])  # t=195 > 0 + 180; the scale-down window still holds 8
    assert got[13] == 8 and "scale_down_stabilised" in codes(outs[13])


def test_routing_weights_are_the_llm_d_default_and_defaults_match_aibrix():
    pol = ScorerKpaPolicy()
    _, out = decide(pol, pol.initial_state(), inp(0.0, {"p": dict(ready=1, kv=0.5)}, current={"p": 1}))
    pd = out.pools["p"]
    assert (pd.prefix_weight, pd.queue_weight, pd.kv_weight) == (3.0, 2.0, 2.0)
    p = pol.params
    assert (p.stable_window_s, p.panic_window_s, p.panic_threshold, p.max_scale_up_rate, p.max_scale_down_rate,
            p.up_tolerance, p.down_tolerance, p.target) == (180.0, 60.0, 2.0, 2.0, 2.0, 0.1, 0.1, 0.5)
    assert pol.down_window_s == 300.0


def test_missing_kv_holds():
    pol = ScorerKpaPolicy()
    for signals in (dict(ready=4, kv=None), dict(ready=4, kv="nan"), dict(ready=None, kv=0.9)):
        _, out = decide(pol, pol.initial_state(), inp(0.0, {"p": signals}, current={"p": 4}))
        assert out.pools["p"].replicas == 4 and "missing_data_hold" in codes(out), signals
