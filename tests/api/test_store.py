"""StateStore on a real SQLite file: generation, overrides with TTL, audit, decisions, restart, validation."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest

from controller.api.store import InvalidRequestError, StateStore
from controller.clock import VirtualClock

T0 = 1_700_000_000.0
POOLS = {"pool-a", "pool-b"}


@pytest.fixture
def path(tmp_path):
    return tmp_path / "state" / "governor.db"


def test_generation_is_monotonic_and_survives_restart(path):
    with StateStore(path) as s:
        assert s.peek_generation() == 0
        assert [s.next_generation() for _ in range(3)] == [1, 2, 3]
    with StateStore(path) as s:
        assert s.peek_generation() == 3
        assert s.next_generation() == 4
        assert s.advance_generation_to(2) == 4  # never backwards
        assert s.advance_generation_to(40) == 40
        assert s.next_generation() == 41


def test_generation_is_unique_across_threads(path):
    with StateStore(path) as s:
        got: list[int] = []
        lock = threading.Lock()

        def issue() -> None:
            for _ in range(25):
                n = s.next_generation()
                with lock:
                    got.append(n)

        threads = [threading.Thread(target=issue) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(got) == list(range(1, 101))


def test_override_ttl_expiry_on_virtual_time(path):
    clock = VirtualClock(T0)
    with StateStore(path) as s:
        o = s.add_override("min_replicas", ttl_s=900, author="ana", now_s=clock.now_s(), value=4, pool="pool-a",
                           reason="launch", known_pools=POOLS)
        assert (o.override_id, o.created_s, o.expires_s) == ("ov-000001", T0, T0 + 900)
        clock.advance(899.9)
        assert [x.override_id for x in s.active_overrides(clock.now_s())] == ["ov-000001"]
        assert s.expire_overrides(clock.now_s()) == []
        clock.advance(0.1)
        assert s.active_overrides(clock.now_s()) == ()
        assert [x.override_id for x in s.expire_overrides(clock.now_s())] == ["ov-000001"]
        assert s.expire_overrides(clock.now_s() + 1) == []  # audited once
        assert [x.override_id for x in s.list_overrides(clock.now_s(), include_expired=True)] == ["ov-000001"]
        actions = [(e.action, e.author) for e in s.list_audit()]
        assert actions == [("override.expired", "governor"), ("override.set", "ana")]
        # expired overrides are purged keep_expired_s after expiry
        s.expire_overrides(T0 + 900 + s.keep_expired_s + 1)
        assert s.list_overrides(clock.now_s(), include_expired=True) == []


def test_restart_keeps_overrides_audit_generation_mode_and_profile(path):
    with StateStore(path) as s:
        s.next_generation()
        s.add_override("pin_replicas", ttl_s=3600, author="ana", now_s=T0, value=5, pool="pool-b")
        s.add_override("profile", ttl_s=60, author="bo", now_s=T0, text="cost")
        s.delete_override("ov-000002", author="bo", now_s=T0 + 1)
        s.set_mode("shadow", author="ana", now_s=T0 + 2, reason="trial")
        s.set_profile("latency", author="ana", now_s=T0 + 3)
    with StateStore(path) as s:
        assert s.peek_generation() == 1
        [o] = s.active_overrides(T0 + 10)
        assert (o.override_id, o.kind, o.pool, o.value, o.author) == ("ov-000001", "pin_replicas", "pool-b", 5.0, "ana")
        assert (s.get_mode(), s.get_profile()) == ("shadow", "latency")
        assert [e.action for e in s.list_audit()] == ["profile.set", "mode.set", "override.delete", "override.set",
                                                      "override.set"]
        assert "trial" in s.list_audit()[1].detail
        # ids keep counting after a restart
        assert s.add_override("freeze", ttl_s=60, author="cy", now_s=T0, pool="pool-a").override_id == "ov-000003"


# label, kwargs for add_override, field named in the error
BAD_OVERRIDES = [
    ("unknown kind", dict(kind="scale_to_moon"), "kind"),
    ("ttl zero", dict(ttl_s=0), "ttl_s"),
    ("ttl negative", dict(ttl_s=-5), "ttl_s"),
    ("ttl over a week", dict(ttl_s=7 * 86400 + 1), "ttl_s"),
    ("ttl NaN", dict(ttl_s=math.nan), "ttl_s"),
    ("no author", dict(author=""), "author"),
    ("blank author", dict(author="   "), "author"),
    ("no pool", dict(pool=""), "pool"),
    ("unknown pool", dict(pool="pool-z"), "pool"),
    ("negative replicas", dict(value=-1), "value"),
    ("fractional replicas", dict(value=2.5), "value"),
    ("infinite replicas", dict(value=math.inf), "value"),
    ("admission without class", dict(kind="admission", pool="", value=0.5), "priority_class"),
    ("admission unknown class", dict(kind="admission", pool="", priority_class="gold", value=0.5), "priority_class"),
    ("shed above 1", dict(kind="admission", pool="", priority_class="sheddable", value=1.5), "value"),
    ("shed below 0", dict(kind="admission", pool="", priority_class="sheddable", value=-0.1), "value"),
    ("admission with a pool", dict(kind="admission", priority_class="sheddable", value=0.5), "pool"),
    ("slo zero", dict(kind="slo_ttft", pool="", priority_class="critical", value=0), "value"),
    ("profile unknown", dict(kind="profile", pool="", text="fastest"), "text"),
    ("replicas with a class", dict(priority_class="critical"), "priority_class"),
    ("reason too long", dict(reason="x" * 1001), "reason"),
]


@pytest.mark.parametrize("label,changes,field", BAD_OVERRIDES, ids=[r[0] for r in BAD_OVERRIDES])
def test_invalid_override_names_the_field_and_changes_nothing(path, label, changes, field):
    args: dict[str, Any] = dict(kind="min_replicas", ttl_s=600, author="ana", now_s=T0, value=2, pool="pool-a",
                                known_pools=POOLS)
    args.update(changes)
    kind = args.pop("kind")
    with StateStore(path) as s:
        with pytest.raises(InvalidRequestError) as err:
            s.add_override(kind, **args)
        assert err.value.field == field
        assert field in str(err.value)
        assert s.list_overrides(T0, include_expired=True) == []
        assert s.list_audit() == []
        # the failed attempt did not consume an id
        assert s.add_override("freeze", ttl_s=60, author="ana", now_s=T0, pool="pool-a").override_id == "ov-000001"


def test_valid_override_kinds(path):
    with StateStore(path) as s:
        s.add_override("admission", ttl_s=60, author="a", now_s=T0, priority_class="sheddable", value=1.0)
        s.add_override("slo_tpot", ttl_s=60, author="a", now_s=T0, priority_class="critical", value=0.05)
        s.add_override("max_replicas", ttl_s=7 * 86400, author="a", now_s=T0, pool="pool-b", value=0, known_pools=POOLS)
        p = s.add_override("profile", ttl_s=60, author="a", now_s=T0, text="throughput", value=9)
        assert p.value == 0.0  # ignored for profile
        assert len(s.active_overrides(T0)) == 4


def test_delete_override(path):
    with StateStore(path) as s:
        s.add_override("freeze", ttl_s=60, author="ana", now_s=T0, pool="pool-a")
        with pytest.raises(InvalidRequestError) as err:
            s.delete_override("ov-000001", author="", now_s=T0)
        assert err.value.field == "author"
        assert s.delete_override("ov-000001", author="bo", now_s=T0 + 1) is True
        assert s.delete_override("ov-000001", author="bo", now_s=T0 + 2) is False
        assert s.active_overrides(T0 + 3) == ()
        assert [(e.action, e.author) for e in s.list_audit()] == [("override.delete", "bo"), ("override.set", "ana")]


def _record(i: int, pools=("pool-a",), **extra) -> dict:
    return {"decision_id": f"d-{i:08d}", "generation": i, "at_s": T0 + 15 * i, "mode": "active",
            "summary": f"scale {i}", "outcome": "applied", "pools": {p: {"replicas": i} for p in pools}, **extra}


def test_decisions_are_bounded_filtered_and_replaceable(path):
    with StateStore(path, max_decisions=5) as s:
        for i in range(1, 9):
            s.record_decision(_record(i, pools=("pool-a",) if i % 2 else ("pool-b", "pool-100%_x")))
        rows = s.list_decisions(limit=100)
        assert [r.decision_id for r in rows] == [f"d-{i:08d}" for i in (8, 7, 6, 5, 4)]
        assert s.get_decision("d-00000003") is None  # dropped: only the newest 5 are kept
        assert [r.generation for r in s.list_decisions(limit=100, pool="pool-a")] == [7, 5]
        assert [r.generation for r in s.list_decisions(limit=100, pool="pool-100%_x")] == [8, 6, 4]
        assert [r.generation for r in s.list_decisions(limit=100, pool="pool")] == []  # whole names only
        assert [r.generation for r in s.list_decisions(limit=100, since_s=T0 + 15 * 6)] == [8, 7, 6]
        assert [r.generation for r in s.list_decisions(limit=2)] == [8, 7]

        s.record_decision(_record(8, pools=("pool-b", "pool-100%_x"),
                                  outcome={"status": "failed", "detail": "router down"}, nan=math.nan))
        [row] = s.list_decisions(limit=1)
        assert (row.decision_id, row.outcome, row.pools) == ("d-00000008", "failed", ("pool-b", "pool-100%_x"))
        full = s.get_decision("d-00000008")
        assert full is not None
        assert full["outcome"] == {"status": "failed", "detail": "router down"}
        assert full["nan"] is None  # stored as strict JSON
        assert full["pools"]["pool-b"] == {"replicas": 8}

        with pytest.raises(InvalidRequestError):
            s.record_decision({"generation": 1})
    with StateStore(path, max_decisions=5) as s:
        assert len(s.list_decisions(limit=100)) == 5


def test_mode_and_profile_validation(path):
    with StateStore(path) as s:
        assert s.get_mode() is None
        with pytest.raises(InvalidRequestError) as err:
            s.set_mode("turbo", author="a", now_s=T0)
        assert err.value.field == "mode"
        with pytest.raises(InvalidRequestError) as err:
            s.set_profile("fastest", author="a", now_s=T0)
        assert err.value.field == "profile"
        assert s.set_mode("paused", author="a", now_s=T0) is None
        assert s.set_mode("active", author="a", now_s=T0) == "paused"
        assert s.list_audit(limit=1)[0].detail == "paused → active"


def test_audit_is_bounded(path):
    with StateStore(path, max_audit=3) as s:
        for i in range(5):
            s.add_audit("ops", "note", f"n{i}", now_s=T0 + i)
        assert [e.detail for e in s.list_audit()] == ["n4", "n3", "n2"]


def test_unreadable_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "not-a-db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(Exception) as err:
        StateStore(bad)
    assert str(bad) in str(err.value)
