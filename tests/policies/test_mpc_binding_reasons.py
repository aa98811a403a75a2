"""The MPC's reason for a pool held at one replica count names its true cause (issue 35, part 4): an override's pin
is `binding_pin`; floors (the breaker's replacements, a measured backlog, the redundancy floor) that raised the
pool's lower bound to its maximum are `binding_floor`, naming them — never "pinned by an override" when no
override exists. Each reason fires only for its own cause."""

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
