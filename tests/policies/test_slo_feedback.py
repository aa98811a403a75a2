"""SLO feedback: breach → scale-up, starting replicas counted, predicted queue growth, stabilised
scale-down, missing data."""

from __future__ import annotations

import pytest

from controller.policies.slo_feedback import FeedbackPoolMemory, FeedbackState, SloFeedbackPolicy
from tests.policies.builders import codes, decide, drive, fleet, inp, spec

NOW = 1000.0
# Fleet SLOs (builders.SLOS): the tightest TTFT is critical's 2.0 s. Queue target: 2 waiting per replica.


def settled(cur: int, ready: int | None = None, *, rec_ago: float = 400.0, waiting=()) -> FeedbackState:
    """A pool seen for a while: `cur` recommended rec_ago s ago, ready count unchanged, prior waiting samples."""
    return FeedbackState(pools={"p": FeedbackPoolMemory(recommendations=((NOW - rec_ago, cur),),
                                                        waiting=tuple((NOW - ago, w) for ago, w in waiting),
                                                        last_ready=ready if ready is not None else cur)})


# label, state kwargs, signals now, current, expected replicas, expected codes (subset)
ROWS = [
    ("TTFT breach 1.8× → ceil(4 × 1.8) = 8", dict(cur=4), dict(ready=4, starting=0, ttft=3.6, waiting=8, rps=10), 4, 8,
     {"scale_up", "slo_breach"}),
    ("queue breach 3× → ceil(4 × 3) = 12 capped at max(4 × 2, 4 + 4) = 8", dict(cur=4),
     dict(ready=4, starting=0, ttft=1.0, waiting=24, rps=10), 4, 8, {"scale_up", "queue_breach"}),
    ("within the 10 % tolerance → hold", dict(cur=4), dict(ready=4, starting=0, ttft=2.1, waiting=4, rps=10),
     4, 4, set()),
    ("starting replicas are capacity on the way: need 8, 8 ordered → wait", dict(cur=8, ready=4),
     dict(ready=4, starting=4, ttft=3.6, waiting=8, rps=10), 8, 8, {"scale_up_pending_startup"}),
    ("starting replicas credited, the rest ordered: need 8, 6 ordered → 8", dict(cur=6, ready=4),
     dict(ready=4, starting=2, ttft=3.6, waiting=8, rps=10), 6, 8, {"scale_up"}),
    ("low ratio: scale-down held by the 300 s window", dict(cur=8, rec_ago=100.0),
     dict(ready=8, starting=0, ttft=0.5, waiting=0, rps=10), 8, 8, {"scale_down_stabilised"}),
    ("low ratio after the window: ceil(8 × 0.25) = 2", dict(cur=8, rec_ago=310.0),
     dict(ready=8, starting=0, ttft=0.5, waiting=0, rps=10), 8, 2, {"scale_down"}),
    ("both signals missing → hold", dict(cur=4), dict(ready=4, ttft=None, waiting=None, rps=10), 4, 4,
     {"missing_data_hold"}),
    ("ready count missing → hold", dict(cur=4), dict(ready=None, ttft=9.0, waiting=50, rps=10), 4, 4,
     {"missing_data_hold"}),
    ("TTFT missing, queue low → never scale down on partial data", dict(cur=8, rec_ago=310.0),
     dict(ready=8, ttft="nan", waiting=0, rps=10), 8, 8, {"partial_data_no_scale_down"}),
    ("TTFT missing, queue high → may scale up", dict(cur=4), dict(ready=4, ttft=None, waiting=16, rps=10), 4, 8,
     {"scale_up", "queue_breach"}),
    ("idle (no traffic, TTFT NaN) is ratio 0, not missing data", dict(cur=4, rec_ago=310.0),
     dict(ready=4, ttft="nan", waiting=0, running=0, rps=0), 4, 1, {"scale_down", "idle"}),
    ("max replicas bound the scale-up", dict(cur=4), dict(ready=4, ttft=3.6, waiting=8, rps=10), 4, 6,
     {"scale_up", "clamped_max"}),
]


@pytest.mark.parametrize("label,st,signals,current,expected,expected_codes", ROWS, ids=[r[0] for r in ROWS])
def test_slo_feedback_rows(label, st, signals, current, expected, expected_codes):
    pol = SloFeedbackPolicy()
    fl = fleet(spec(max_replicas=6 if "max replicas" in label else 64))
    _, out = decide(pol, settled(**st), inp(NOW, {"p": signals}, fl=fl, current={"p": current}))
    assert out.pools["p"].replicas == expected, (label, out.diagnostics["pools"]["p"])
    assert expected_codes <= set(codes(out)), (label, codes(out))


def test_queue_growth_triggers_before_the_queue_is_over_target():
    # 2 ready, waiting 0 → 3 over 15 s (0.2/s); now 1.5 per replica (ratio 0.75, under target), but in the
    # 30 s warm start-up it reaches 3 + 0.2 × 30 = 9 → 4.5 per replica → ratio 2.25 → ceil(2 × 2.25) = 5.
    pol = SloFeedbackPolicy()
    st = settled(2, waiting=[(15.0, 0.0)])
    _, out = decide(pol, st, inp(NOW, {"p": dict(ready=2, ttft=1.0, waiting=3, rps=5)}, current={"p": 2}))
    d = out.diagnostics["pools"]["p"]
    assert d["predicted_waiting"] == pytest.approx(9.0)
    assert out.pools["p"].replicas == 5
    assert "queue_growth_predicted" in codes(out)


def test_uses_the_pool_start_up_delay_for_the_prediction():
    pol = SloFeedbackPolicy()
    st = settled(2, waiting=[(15.0, 0.0)])
    fl = fleet(spec(startup_warm_s=5.0))  # 3 + 0.2 × 5 = 4 → 2 per replica → ratio 1.0: no action
    _, out = decide(pol, st, inp(NOW, {"p": dict(ready=2, ttft=1.0, waiting=3, rps=5)}, fl=fl, current={"p": 2}))
    assert out.pools["p"].replicas == 2


def test_ttft_does_not_drive_a_second_scale_up_while_it_settles():
    # Ready rose 4 → 8 this tick; p95 TTFT still shows the old overload (3.6 s) but the queue is fine.
    pol = SloFeedbackPolicy()
    st = settled(8, ready=4)
    _, out = decide(pol, st, inp(NOW, {"p": dict(ready=8, starting=0, ttft=3.6, waiting=16, rps=10)}, current={"p": 8}))
    assert out.pools["p"].replicas == 8
    assert out.diagnostics["pools"]["p"]["ttft_settling"] is True
    # 61 s later it counts again.
    st2 = FeedbackState(pools={"p": FeedbackPoolMemory(recommendations=((NOW, 8),), last_ready=8, ready_rise_s=NOW)})
    _, out = decide(pol, st2, inp(NOW + 61, {"p": dict(ready=8, starting=0, ttft=3.6, waiting=16, rps=10)},
                                  current={"p": 8}))
    assert out.pools["p"].replicas == 15  # ceil(8 × 1.8)


def test_first_sight_never_scales_down_at_once():
    pol = SloFeedbackPolicy()
    _, out = decide(pol, pol.initial_state(),
                    inp(0.0, {"p": dict(ready=8, ttft=0.2, waiting=0, rps=5)}, current={"p": 8}))
    assert out.pools["p"].replicas == 8 and "scale_down_stabilised" in codes(out)


def test_closed_loop_does_not_stack_scale_ups_during_start_up():
    # Overload on 2 ready; the ordered replicas take 60 s to become ready. The target must not keep climbing.
    pol = SloFeedbackPolicy()
    fl = fleet(spec())
    steps = []
    for k in range(5):  # t = 0 … 60 s, still 2 ready, 4 more starting after the first decision
        steps.append((15.0 * k, {"p": dict(ready=2, starting=0 if k == 0 else 2, ttft=4.0, waiting=8, rps=10)}))
    outs = drive(pol, fl, steps, start={"p": 2})
    got = [o.pools["p"].replicas for o in outs]
    assert got == [4, 4, 4, 4, 4]  # 2 × 2.0 = 4 once; then "pending start-up"
    assert all("scale_up_pending_startup" in codes(o) for o in outs[1:])


def test_slo_class_picks_the_budget():
    pol = SloFeedbackPolicy(slo_class="standard")  # TTFT SLO 5 s: 3.6 s is fine
    _, out = decide(pol, settled(4), inp(NOW, {"p": dict(ready=4, ttft=3.6, waiting=0, rps=10)}, current={"p": 4}))
    assert out.diagnostics["pools"]["p"]["ttft_ratio"] == pytest.approx(0.72)
    assert "slo_breach" not in codes(out)


def test_admission_and_routing_are_left_at_defaults():
    pol = SloFeedbackPolicy()
    _, out = decide(pol, settled(4), inp(NOW, {"p": dict(ready=4, ttft=3.6, waiting=8, rps=10)}, current={"p": 4}))
    pd = out.pools["p"]
    assert out.admission == {}
    assert (pd.prefix_weight, pd.queue_weight, pd.kv_weight) == (3.0, 2.0, 2.0)


def test_a_queue_trend_over_a_few_seconds_is_not_trusted():
    # Same growth rate as above, but read off two samples 3 s apart (e.g. right after start): no prediction.
    pol = SloFeedbackPolicy()
    st = settled(2, waiting=[(3.0, 2.4)])  # 3 s ago
    _, out = decide(pol, st, inp(NOW, {"p": dict(ready=2, ttft=1.0, waiting=3, rps=5)}, current={"p": 2}))
    assert "predicted_waiting" not in out.diagnostics["pools"]["p"]
    assert out.pools["p"].replicas == 2
