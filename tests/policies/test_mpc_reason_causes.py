"""The MPC's reasons name their true cause and say what changed and why (issue 35, part 4), each firing only for
its own cause: an override's pin is `binding_pin`; floors (the breaker's replacements, a measured backlog, the
redundancy floor) that raised the pool's lower bound to its maximum are `binding_floor`, naming them — never
"pinned by an override" when no override exists; `lever_move`, `lever_share`, `lever_avoid`, `lever_standby` say
what the lever's move does and what the plan predicts, not the quadrant's name."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from controller.policies.mpc.reasons import pin_cause, pool_reasons
from controller.types import BreakerAction, Override
from tests.policies.builders import spec

SPEC = spec("p", min_replicas=1, max_replicas=8)


def _pin(lo: int, hi: int) -> Any:
    return SimpleNamespace(lo=lo, hi=hi, frozen=False, max_num_seqs=256, max_num_batched_tokens=8192)


def _codes(pin: Any, pinned_by: str) -> dict[str, str]:
    result: Any = SimpleNamespace(terms={"pools": {"p": {"need_by_step_p90": [8, 8, 8], "hit_rate": [0.3] * 3}},
                                         "late_or_shed_frac_p90": {}})
    pp: Any = SimpleNamespace(prefix_weight=3.0, inflight_cap=0, traffic_weight=1.0, standby=0, max_num_seqs=256,
                              max_num_batched_tokens=8192)
    out = pool_reasons(SPEC, pin, 8, 8, pp, None, result, 15.0, pinned_by=pinned_by)
    return {r.code: r.message for r in out if r.code.startswith("binding_")}


def _inp(*overrides: Override) -> Any:
    return SimpleNamespace(overrides=list(overrides), now_s=100.0)


@pytest.mark.parametrize("label,overrides,breaker,backlog,redundancy,expect", [
    ("an override pins the pool", [Override("o1", "pin_replicas", 8, pool="p")], {}, {}, {}, "override"),
    ("a floor and a ceiling override meeting", [Override("o1", "min_replicas", 5, pool="p"),
                                                Override("o2", "max_replicas", 5, pool="p")], {}, {}, {}, "override"),
    ("the breaker's replacements reach the maximum", [], {"p": 8}, {}, {}, "the breaker's replacements"),
    ("a measured backlog reaches the maximum", [], {}, {"p": 9}, {}, "a measured backlog"),
    ("the redundancy floor and the breaker", [], {"p": 8}, {}, {"p": 8},
     "the breaker's replacements, the redundancy floor"),
    ("an override on another pool does not pin this one", [Override("o1", "pin_replicas", 3, pool="q")],
     {"p": 8}, {}, {}, "the breaker's replacements"),
])
def test_pin_cause_names_what_left_one_value(label, overrides, breaker, backlog, redundancy, expect):
    fb: Any = SimpleNamespace(floors=backlog)
    got = pin_cause(SPEC, _pin(8, 8) if expect != "override" else _pin(5, 5), _inp(*overrides),
                    BreakerAction(min_replicas=breaker), fb, redundancy)
    assert got == expect, label


def test_binding_pin_fires_only_for_an_override():
    codes = _codes(_pin(8, 8), "override")
    assert set(codes) >= {"binding_pin"} and "binding_floor" not in codes
    assert "by an override" in codes["binding_pin"]


def test_binding_floor_fires_only_for_floors_and_names_them():
    codes = _codes(_pin(8, 8), "the breaker's replacements")
    assert "binding_pin" not in codes
    assert "binding_floor" in codes and "override" not in codes["binding_floor"].split(":")[1]
    assert "the breaker's replacements raised its lower bound" in codes["binding_floor"]
    assert "the pool's maximum" in codes["binding_floor"]


def test_neither_fires_when_the_bounds_leave_room():
    for by in ("override", "a measured backlog"):
        codes = _codes(_pin(3, 8), by)
        assert "binding_pin" not in codes and "binding_floor" not in codes


# ---------------------------------------------------------------------------- the lever reasons


TERMS = {"need_by_step_p90": [3, 3, 3], "hit_rate": [0.3, 0.35, 0.42], "ttft_p95_s_p90": [0.8, 0.9, 0.9],
         "tpot_p95_s_p90": [0.045, 0.05, 0.05], "utilisation_p90": [0.72, 0.7, 0.7]}
BASE: dict[str, Any] = {"prefix_weight": 3.0, "inflight_cap": 0, "traffic_weight": 0.5, "warm_standby": 0}


def _lever_reasons(**changed: float) -> dict[str, str]:
    from controller.types import PoolDecision

    result: Any = SimpleNamespace(terms={"pools": {"p": TERMS}, "late_or_shed_frac_p90": {}})
    cur = PoolDecision(replicas=3, **BASE)
    after = {**BASE, **changed}
    pp: Any = SimpleNamespace(prefix_weight=after["prefix_weight"], inflight_cap=after["inflight_cap"],
                              traffic_weight=after["traffic_weight"], standby=after["warm_standby"],
                              warm_standby=after["warm_standby"], max_num_seqs=256, max_num_batched_tokens=8192)
    out = pool_reasons(SPEC, _pin(1, 8), 3, 3, pp, cur, result, 15.0)
    return {r.code: r.message for r in out if r.code.startswith("lever_")}


@pytest.mark.parametrize("label,changed,code,says", [
    ("traffic moves here", {"traffic_weight": 0.7}, "lever_move",
     "traffic weight 0.5→0.7: more of its route group's requests come here; the plan predicts p95 TTFT 0.80 s at "
     "72% busy here at p90 load"),
    ("traffic moves away", {"traffic_weight": 0.3}, "lever_move", "less of its route group's requests"),
    ("a cap where there was none", {"inflight_cap": 8}, "lever_share",
     "fewer requests run at once on each replica and the rest wait at the router, so the streams already running "
     "keep their pace (predicted p95 TPOT 45 ms)"),
    ("the cap lifted", {"inflight_cap": 0.0}, "", ""),  # no change: no reason at all
    ("affinity up", {"prefix_weight": 6.0}, "lever_avoid",
     "prompts that share a prefix go to the replica that caches it (predicted hit rate 0.42)"),
    ("affinity down", {"prefix_weight": 1.0}, "lever_avoid", "load spreads over the replicas ahead of cache affinity"),
    ("standby up", {"warm_standby": 1}, "lever_standby", "forecast's peaks start in seconds"),
])
def test_each_lever_reason_fires_only_for_its_lever_and_says_why(label, changed, code, says):
    got = _lever_reasons(**changed)
    if not code:
        assert got == {}, label
        return
    assert set(got) == {code}, (label, got)
    assert says in got[code], (label, got[code])


def test_a_cap_raised_says_the_engines_have_room():
    from controller.types import PoolDecision

    result: Any = SimpleNamespace(terms={"pools": {"p": TERMS}, "late_or_shed_frac_p90": {}})
    cur = PoolDecision(replicas=3, **{**BASE, "inflight_cap": 4})
    pp: Any = SimpleNamespace(prefix_weight=3.0, inflight_cap=8, traffic_weight=0.5, standby=0, warm_standby=0,
                              max_num_seqs=256, max_num_batched_tokens=8192)
    got = {r.code: r.message for r in pool_reasons(SPEC, _pin(1, 8), 3, 3, pp, cur, result, 15.0)}
    assert got["lever_share"].startswith("in-flight cap per replica 4→8: more requests may run at once")
