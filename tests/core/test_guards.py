"""Guardrails, one row per case: inputs → replicas after guards and the reason codes recorded."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from controller.core.guards import GuardConfig, GuardState, apply_guards, pool_telemetry_status
from controller.types import ClassAdmission, FleetSpec, Override, PoolDecision, PoolSpec, SloSpec
from tests.fakes.observations import fleet_obs, pool_obs

FLEET = FleetSpec(
    pools=(PoolSpec("a", "llama-3-8b", "a100-80gb", usd_per_replica_hour=4.0, min_replicas=1, max_replicas=10),
           PoolSpec("b", "llama-3-8b", "h100-80gb", usd_per_replica_hour=8.0, min_replicas=0, max_replicas=6)),
    slos={"standard": SloSpec(5.0, 0.15)},
)


def ovr(kind, value=0.0, pool="a", cls="", ttl=(0, 1e9)):
    return Override(f"o-{kind}", kind, value=value, pool=pool, priority_class=cls, author="sre",
                    created_s=ttl[0], expires_s=ttl[1])


@dataclass
class Row:
    label: str
    current: dict[str, int]
    proposal: dict[str, int]
    want: dict[str, int]
    codes: set[str] = field(default_factory=set)
    config: GuardConfig = GuardConfig()
    overrides: tuple = ()
    stale: bool = False
    missing: tuple = ()


ROWS = [
    Row("passes through", {"a": 2, "b": 2}, {"a": 3, "b": 1}, {"a": 3, "b": 1}),
    Row("pool minimum", {"a": 2, "b": 1}, {"a": 0, "b": 0}, {"a": 1, "b": 0}, {"guard_min_replicas"}),
    Row("pool maximum", {"a": 2, "b": 1}, {"a": 30, "b": 1}, {"a": 10, "b": 1}, {"guard_max_replicas"}),
    Row("max step up", {"a": 2, "b": 1}, {"a": 9, "b": 1}, {"a": 4, "b": 1}, {"guard_max_step_up"},
        GuardConfig(max_step_up=2)),
    Row("max step down", {"a": 8, "b": 1}, {"a": 2, "b": 1}, {"a": 7, "b": 1}, {"guard_max_step_down"},
        GuardConfig(max_step_down=1)),
    Row("missing data never scales down", {"a": 5, "b": 2}, {"a": 2, "b": 1}, {"a": 5, "b": 1},
        {"guard_missing_data_hold"}, missing=("a",)),
    Row("missing data may scale up", {"a": 5, "b": 2}, {"a": 7, "b": 2}, {"a": 7, "b": 2}, missing=("a",)),
    Row("all stale freezes everything", {"a": 5, "b": 2}, {"a": 9, "b": 0}, {"a": 5, "b": 2},
        {"guard_telemetry_frozen"}, stale=True),
    Row("pin", {"a": 2, "b": 2}, {"a": 5, "b": 2}, {"a": 3, "b": 2}, {"guard_override_pin"},
        overrides=(ovr("pin_replicas", 3),)),
    Row("floor", {"a": 2, "b": 2}, {"a": 2, "b": 2}, {"a": 4, "b": 2}, {"guard_override_min"},
        overrides=(ovr("min_replicas", 4),)),
    Row("ceiling", {"a": 2, "b": 2}, {"a": 8, "b": 2}, {"a": 5, "b": 2}, {"guard_override_max"},
        overrides=(ovr("max_replicas", 5),)),
    Row("freeze holds the pool", {"a": 2, "b": 2}, {"a": 8, "b": 0}, {"a": 2, "b": 0}, {"guard_override_freeze"},
        overrides=(ovr("freeze"),)),
    Row("expired override ignored", {"a": 2, "b": 2}, {"a": 5, "b": 2}, {"a": 5, "b": 2},
        overrides=(ovr("pin_replicas", 3, ttl=(0, 50)),)),
    Row("budget trims the expensive scale-up first", {"a": 2, "b": 2}, {"a": 4, "b": 4}, {"a": 4, "b": 2},
        {"guard_budget_cap"}, GuardConfig(budget_usd_per_hour=32.0)),
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.label)
def test_guard_table(row: Row):
    obs = fleet_obs(100.0, *[pool_obs(p, ready=None if p in row.missing else 2,
                                      arrival=None if p in row.missing else 3, stale=row.stale)
                             for p in ("a", "b")])
    res = apply_guards(now_s=100.0, fleet=FLEET, proposal={p: PoolDecision(n) for p, n in row.proposal.items()},
                       admission={}, current={p: PoolDecision(n) for p, n in row.current.items()}, observation=obs,
                       overrides=row.overrides, config=row.config, state=GuardState())
    assert {p: d.replicas for p, d in res.pools.items()} == row.want
    assert {r.code for r in res.adjustments} == row.codes


def test_scale_down_stabilisation_keeps_the_highest_recent_proposal():
    cfg = GuardConfig(scale_down_stabilization_s=300)
    state, current = GuardState(), {"a": PoolDecision(6), "b": PoolDecision(1)}
    seen = []
    for t, proposed in [(0, 6), (60, 3), (120, 2), (301, 2), (361, 2), (421, 2)]:
        res = apply_guards(now_s=t, fleet=FLEET, proposal={"a": PoolDecision(proposed), "b": PoolDecision(1)},
                           admission={}, current=current, observation=fleet_obs(t, pool_obs("a"), pool_obs("b")),
                           overrides=(), config=cfg, state=state)
        state, current = res.state, dict(res.pools)
        seen.append(current["a"].replicas)
    # 6 stays the highest proposal until it leaves the window at t=300; then 3 until t=360; then 2.
    assert seen == [6, 6, 6, 3, 2, 2]


def test_forced_admission_override():
    res = apply_guards(now_s=1, fleet=FLEET, proposal={}, admission={"sheddable": ClassAdmission(shed_frac=0.1)},
                       current={"a": PoolDecision(2), "b": PoolDecision(1)},
                       observation=fleet_obs(1, pool_obs("a"), pool_obs("b")),
                       overrides=(ovr("admission", 0.7, pool="", cls="sheddable"),), config=GuardConfig(),
                       state=GuardState())
    assert res.admission["sheddable"].shed_frac == 0.7
    assert "guard_override_admission" in {r.code for r in res.adjustments}


@pytest.mark.parametrize("kwargs,want", [
    ({}, "ok"),
    ({"ttft": None}, "partial"),
    ({"ready": None, "arrival": None, "ttft": None, "running": None, "waiting": None}, "missing"),
    ({"stale": True}, "stale"),
    ({"arrival": 0.0, "ttft": float("nan")}, "ok"),  # idle pool: no latency to measure
    ({"arrival": 2.0, "ttft": float("nan")}, "partial"),
])
def test_pool_telemetry_status(kwargs, want):
    assert pool_telemetry_status(pool_obs("a", **kwargs)) == want


# --------------------------------------------------------------------------- confidence hold and drains


def _run(proposal, current, *, config, confidence=None, draining=0.0, pin=()):
    obs = fleet_obs(100.0, pool_obs("a", replicas_draining=draining), pool_obs("b"))
    return apply_guards(now_s=100.0, fleet=FLEET, proposal=proposal,
                        admission={"sheddable": ClassAdmission(shed_frac=1.0)}, current=current, observation=obs,
                        overrides=pin, config=config, state=GuardState(), confidence=confidence)


CONF_ROWS = [
    # label, confidence, proposal a, want a (replicas, prefix weight), codes
    ("confident: passes", 0.9, PoolDecision(2, prefix_weight=8.0), (2, 8.0), set()),
    ("unsure: no scale-down, levers held", 0.1, PoolDecision(2, prefix_weight=8.0), (5, 3.0),
     {"guard_low_confidence_hold"}),
    ("unsure: a scale-up still passes", 0.1, PoolDecision(7, prefix_weight=3.0), (7, 3.0), set()),
    ("no confidence reported: passes", None, PoolDecision(2, prefix_weight=8.0), (2, 8.0), set()),
]


@pytest.mark.parametrize("label,conf,prop,want,codes", CONF_ROWS, ids=[r[0] for r in CONF_ROWS])
def test_low_confidence_holds_the_last_safe_decision(label, conf, prop, want, codes):
    cur = {"a": PoolDecision(5, prefix_weight=3.0), "b": PoolDecision(2)}
    res = _run({"a": prop, "b": PoolDecision(2)}, cur, config=GuardConfig(min_confidence=0.5), confidence=conf)
    assert (res.pools["a"].replicas, res.pools["a"].prefix_weight) == want
    assert {r.code for r in res.adjustments} == codes
    assert res.admission["sheddable"].shed_frac == 1.0  # protection (shedding) is never held back


DRAIN_ROWS = [
    # label, replicas draining now, proposal (from 5), want, codes
    ("nothing draining: two may leave", 0.0, 3, 3, set()),
    ("nothing draining: not three at once", 0.0, 2, 3, {"guard_drain_in_progress"}),
    ("one draining: only one more may leave", 1.0, 2, 4, {"guard_drain_in_progress"}),
    ("two draining: none may leave", 2.0, 2, 5, {"guard_drain_in_progress"}),
    ("scale-ups are not drains", 2.0, 7, 7, set()),
]


@pytest.mark.parametrize("label,draining,prop,want,codes", DRAIN_ROWS, ids=[r[0] for r in DRAIN_ROWS])
def test_drain_before_removal_bounds_concurrent_drains(label, draining, prop, want, codes):
    cur = {"a": PoolDecision(5), "b": PoolDecision(2)}
    res = _run({"a": PoolDecision(prop), "b": PoolDecision(2)}, cur, config=GuardConfig(max_concurrent_drains=2),
               draining=draining)
    assert res.pools["a"].replicas == want
    assert {r.code for r in res.adjustments} == codes


@pytest.mark.parametrize("bad", [dict(min_confidence=1.5), dict(max_concurrent_drains=0),
                                 dict(max_concurrent_drains=True)])
def test_new_guard_config_is_validated(bad):
    with pytest.raises(ValueError):
        GuardConfig(**bad)
