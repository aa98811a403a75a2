"""The picker's pure decision: admission, pool split, affinity, in-flight cap and holds, policy rules."""

from __future__ import annotations

import collections
from dataclasses import replace

import pytest

from controller.dataplane.picker import Endpoint, Picker, Route, prefix_key, rendezvous_home
from controller.dataplane.policy_store import ClassSettings, PolicyStore, PoolSettings, Settings
from controller.dataplane.task_book import TenantSettings
from controller.gen.governor.v1 import control_pb2 as pb

POOLS = {"a": ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"], "b": ["10.0.1.1:8000", "10.0.1.2:8000"]}


def _picker(**kw) -> Picker:
    p = Picker({"g": ["a", "b"]}, block_chars=16, affinity_blocks=2, **kw)
    for pool, addrs in POOLS.items():
        p.set_endpoints(pool, addrs)
    return p


def _settings(a: PoolSettings | None = None, b: PoolSettings | None = None, **admission: ClassSettings) -> Settings:
    return Settings({"a": a or PoolSettings(), "b": b or PoolSettings()}, admission)


def _ep(r: Route) -> Endpoint:
    assert r.endpoint is not None, r
    return r.endpoint


def _finish_all(p: Picker, s: Settings) -> None:
    for eps in p.endpoints.values():
        for e in eps:
            while e.inflight:
                p.finish(e, s)


@pytest.mark.parametrize("wa,wb", [(3.0, 1.0), (1.0, 0.0), (0.7, 0.3), (0.0, 0.0)])
def test_pool_split_follows_the_weights_exactly(wa, wb):
    p = _picker()
    s = _settings(PoolSettings(traffic_weight=wa), PoolSettings(traffic_weight=wb))
    n = 1000
    pools: collections.Counter[str] = collections.Counter()
    for i in range(n):
        r = p.route("standard", f"prompt {i}", s, float(i))
        pools[_ep(r).pool] += 1
        p.finish(_ep(r), s)
    share = (wa / (wa + wb)) if wa + wb else 0.5
    assert abs(pools["a"] - n * share) <= 1


def test_pools_without_a_healthy_endpoint_get_no_traffic():
    p = _picker()
    s = _settings()
    for e in p.endpoints["b"]:
        e.healthy = False
    got = {_ep(p.route("standard", "x", s, 0.0)).pool for _ in range(10)}
    assert got == {"a"}


def test_an_ejected_endpoint_gets_no_new_requests_unless_every_endpoint_is_ejected():
    p = _picker()
    slow = POOLS["a"][0]
    s = _settings(PoolSettings(prefix_weight=0.0, ejected=frozenset({slow})), PoolSettings(traffic_weight=0.0))
    got: collections.Counter[str] = collections.Counter()
    for i in range(60):
        e = _ep(p.route("standard", f"prompt {i}", s, float(i)))
        got[e.address] += 1
        p.finish(e, s)
    assert got[slow] == 0 and set(got) == set(POOLS["a"][1:])
    every = _settings(PoolSettings(prefix_weight=0.0, ejected=frozenset(POOLS["a"])), PoolSettings(traffic_weight=0.0))
    assert {_ep(p.route("standard", f"q {i}", every, 0.0)).address for i in range(30)} == set(POOLS["a"])


def test_policy_store_carries_the_ejected_endpoints_and_a_bad_name_is_refused():
    store = PolicyStore(Settings({"a": PoolSettings(), "b": PoolSettings()}))
    msg = pb.RoutingPolicy(meta=pb.CommandMeta(decision_id="d-1", generation=1, valid_until_unix_s=100.0))
    msg.pools.add(pool="a", traffic_weight=1.0, ejected_replicas=["10.0.0.1:8000"])
    assert store.apply(msg, 10.0).status == pb.ACK_STATUS_APPLIED
    assert store.settings(10.0).settings.pools["a"].ejected == frozenset({"10.0.0.1:8000"})
    assert list(store.to_message(10.0).pools[0].ejected_replicas) == ["10.0.0.1:8000"]
    assert store.settings(200.0).settings.pools["a"].ejected == frozenset()  # expired: the defaults
    bad = pb.RoutingPolicy(meta=pb.CommandMeta(decision_id="d-2", generation=2, valid_until_unix_s=100.0))
    bad.pools.add(pool="a", ejected_replicas=["10.0.0.1:8000", "10.0.0.1:8000"])
    ack = store.apply(bad, 10.0)
    assert ack.status == pb.ACK_STATUS_INVALID and "pools[0].ejected_replicas[1]" in ack.message


def test_shared_prefix_lands_on_one_replica_at_high_affinity_and_spreads_at_zero():
    p = _picker()
    prefix = "system prompt shared by everyone, long enough for two blocks. "
    high = _settings(PoolSettings(traffic_weight=1, prefix_weight=10), PoolSettings(traffic_weight=0))
    got: collections.Counter[str] = collections.Counter()
    for i in range(30):
        r = p.route("standard", prefix + f"user {i}", high, 0.0)
        got[_ep(r).address] += 1  # in flight: the queue score pulls the other way, affinity wins
    assert len(got) == 1
    _finish_all(p, high)
    zero = _settings(PoolSettings(traffic_weight=1, prefix_weight=0), PoolSettings(traffic_weight=0))
    got = collections.Counter()
    for i in range(30):
        r = p.route("standard", prefix + f"user {i}", zero, 0.0)
        got[_ep(r).address] += 1
    assert sorted(got.values()) == [10, 10, 10]


def test_affinity_yields_to_a_much_longer_queue():
    p = _picker()
    s = _settings(PoolSettings(traffic_weight=1, prefix_weight=1, queue_weight=2), PoolSettings(traffic_weight=0))
    prompt = "a prompt prefix that is long enough to hash"
    home = _ep(p.route("standard", prompt, s, 0.0))
    home.engine_queue = 50.0  # its engine is swamped (another picker's traffic)
    assert p.route("standard", prompt, s, 0.0).endpoint is not home


def test_consistent_hashing_moves_few_keys_when_a_replica_joins():
    addrs = [f"10.0.0.{i}:8000" for i in range(8)]
    keys = [k for i in range(2000) if (k := prefix_key(f"prompt number {i} " * 4, 16, 2)) is not None]
    assert len(keys) == 2000
    before = [rendezvous_home(k, addrs) for k in keys]
    after = [rendezvous_home(k, [*addrs, "10.0.0.99:8000"]) for k in keys]
    moved = sum(x != y for x, y in zip(before, after, strict=True))
    assert all(y in (x, "10.0.0.99:8000") for x, y in zip(before, after, strict=True))
    assert 0.05 < moved / len(keys) < 0.2  # ~1/9 of the keys move, all of them to the new replica
    assert prefix_key("short", 16, 2) is None


def test_beyond_the_cap_standard_and_sheddable_are_held_and_critical_passes():
    p = _picker()
    s = _settings(PoolSettings(traffic_weight=1, inflight_cap=1), PoolSettings(traffic_weight=0))
    first = [_ep(p.route("standard", f"p{i}", s, 0.0)) for i in range(3)]
    assert len({e.address for e in first}) == 3
    held_std = p.route("standard", "wait", s, 0.0).held
    held_shed = p.route("sheddable", "wait too", s, 0.0).held
    assert held_std is not None and held_shed is not None
    crit = p.route("critical", "urgent", s, 0.0)
    assert crit.endpoint is not None  # passes the cap
    held_std2 = p.route("standard", "wait 2", s, 0.0).held
    assert p.finish(_ep(crit), s) == []  # its replica is still at the cap with its first request
    # slots free one by one: held standard requests go first (class order, then FCFS), sheddable last
    assert p.finish(first[0], s) == [held_std] and held_std.endpoint is first[0]
    assert p.finish(first[1], s) == [held_std2]
    assert p.finish(first[2], s) == [held_shed]
    assert p.held_count("standard") == 0 and p.held_count("sheddable") == 0
    assert p.counters.held == {"critical": 0, "standard": 2, "sheddable": 1}


def test_queue_budget_rejects_beyond_it_and_abandon_frees_the_budget():
    p = _picker()
    s = _settings(PoolSettings(traffic_weight=1, inflight_cap=1), PoolSettings(traffic_weight=0),
                  standard=ClassSettings(queue_budget=1))
    for i in range(3):
        assert p.route("standard", f"p{i}", s, 0.0).endpoint is not None
    h = p.route("standard", "held", s, 0.0).held
    assert h is not None
    r = p.route("standard", "over budget", s, 0.0)
    assert (r.status, r.reason) == (503, "queue_budget") and r.retry_after_s >= 1
    assert p.abandon(h) and not p.abandon(h)
    assert p.counters.rejected[("standard", "hold_timeout")] == 1
    h2 = p.route("standard", "room again", s, 0.0).held
    assert h2 is not None and p.abandon(h2, "client_gone")
    assert p.counters.rejected[("standard", "hold_timeout")] == 1  # a client that left is not a rejection


def test_shed_fraction_is_exact_and_per_class():
    p = _picker()
    s = _settings(sheddable=ClassSettings(shed_frac=0.25))
    codes: collections.Counter[int] = collections.Counter()
    for i in range(100):
        r = p.route("sheddable", "x", s, float(i))
        codes[r.status] += 1
        if r.endpoint is not None:
            p.finish(r.endpoint, s)
        assert p.route("standard", "y", s, float(i)).status == 0
    assert codes == {429: 25, 0: 75}


def test_rate_limit_is_a_token_bucket_with_retry_after():
    p = _picker()
    s = _settings(standard=ClassSettings(rate_limit_rps=2.0))
    got = [p.route("standard", "x", s, 0.0).status for _ in range(3)]
    assert got == [0, 0, 429]
    assert p.route("standard", "x", s, 0.25).status == 429
    assert p.route("standard", "x", s, 0.5).status == 0  # one token back after 0.5 s
    assert p.counters.rejected[("standard", "rate_limit")] == 2


def test_arrivals_per_second_are_counted_per_class():
    p = _picker()
    s = _settings()
    for t in (10.1, 10.2, 10.9, 11.5):
        p.route("critical", "x", s, t)
    assert p.counters.last_second_rate("critical", 11.7) == 3
    assert p.counters.last_second_rate("critical", 12.1) == 1
    assert p.counters.last_second_rate("standard", 11.7) == 0
    assert p.counters.arrivals["critical"] == 4


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="one route group only"):
        Picker({"g": ["a"], "h": ["a"]})
    p = _picker()
    with pytest.raises(ValueError, match="unknown priority class 'gold'"):
        p.route("gold", "x", _settings(), 0.0)
    with pytest.raises(ValueError, match="unknown route group 'nope'"):
        p.route("standard", "x", _settings(), 0.0, "nope")
    with pytest.raises(ValueError, match="unknown pool 'c'"):
        p.set_endpoints("c", ["1.2.3.4:1"])


# --------------------------------------------------------------------------- policy


def _policy(gen: int, did: str, until: float, **pools: float) -> pb.RoutingPolicy:
    msg = pb.RoutingPolicy(meta=pb.CommandMeta(decision_id=did, generation=gen, valid_until_unix_s=until))
    for name, w in pools.items():
        msg.pools.add(pool=name, traffic_weight=w, inflight_cap=4,
                      weights=pb.ScorerWeights(prefix=1.0, queue=0.5, kv_usage=0.25))
    msg.admission.add(priority_class="sheddable", shed_fraction=0.5)
    return msg


def test_policy_store_generations_replay_stale_invalid_and_deadline():
    defaults = _settings()
    st = PolicyStore(defaults)
    assert st.settings(0.0).fallback and st.settings(0.0).settings is defaults
    ack = st.apply(_policy(1, "d1", 100.0, a=3.0), now_unix_s=10.0)
    assert ack.status == pb.ACK_STATUS_APPLIED
    live = st.settings(50.0)
    assert not live.fallback
    assert live.settings.pools["a"] == PoolSettings(3.0, 4, 1.0, 0.5, 0.25)
    assert live.settings.pools["b"] == PoolSettings()  # left out: keeps what was in force
    assert live.settings.admission_of("sheddable").shed_frac == 0.5
    assert st.apply(_policy(1, "d1", 100.0, a=3.0), 20.0).status == pb.ACK_STATUS_REPLAY
    assert st.apply(_policy(1, "other", 100.0, a=3.0), 20.0).status == pb.ACK_STATUS_STALE_GENERATION
    assert st.apply(_policy(0, "d0", 100.0, a=3.0), 20.0).status == pb.ACK_STATUS_INVALID
    bad = st.apply(_policy(2, "d2", 100.0, c=1.0), 20.0)
    assert bad.status == pb.ACK_STATUS_INVALID and "pools[0].pool: unknown pool 'c'" in bad.message
    bad = st.apply(_policy(2, "d2", 100.0, a=-1.0), 20.0)
    assert "pools[0].traffic_weight: -1.0" in bad.message
    assert st.apply(_policy(2, "d2", 15.0, a=1.0), 20.0).status == pb.ACK_STATUS_INVALID  # already expired
    assert st.settings(99.9).settings.pools["a"].traffic_weight == 3.0
    after = st.settings(100.0)
    assert after.fallback and after.settings is defaults and after.generation == 1
    msg = st.to_message(100.0)
    assert msg.meta.decision_id == "d1" and {p.pool: p.traffic_weight for p in msg.pools} == {"a": 1.0, "b": 1.0}
    assert st.apply(_policy(1, "d1b", 200.0, a=3.0), 150.0).status == pb.ACK_STATUS_STALE_GENERATION
    assert st.apply(_policy(2, "d2", 200.0, a=2.0), 150.0).status == pb.ACK_STATUS_APPLIED


def test_policy_store_tenant_limits_and_step_awareness_from_a_command_over_the_pickers_own():
    own = TenantSettings(rate_limit_rps=50.0, max_inflight=8, weight=2.0)
    defaults = replace(_settings(), tenants={"acme": own, "beta": own}, step_aware=True)
    st = PolicyStore(defaults)
    msg = _policy(1, "d1", 100.0, a=1.0)
    msg.tenants.add(tenant="acme", rate_limit_rps=5.0, max_inflight=2, weight=0.5)
    msg.tenants.add(tenant="*", max_inflight=1, weight=1.0)
    msg.step_aware = False
    assert st.apply(msg, 10.0).status == pb.ACK_STATUS_APPLIED
    s = st.settings(50.0).settings
    assert s.tenant_limits("acme") == TenantSettings(5.0, 2, 0.5)  # the command's
    assert s.tenant_limits("beta") == own  # left out: the picker's own
    assert s.tenant_limits("anyone") == TenantSettings(0.0, 1, 1.0) and s.step_aware is False
    # the next command says nothing of tenants or steps: the picker's own again, not the last command's
    assert st.apply(_policy(2, "d2", 100.0, a=1.0), 20.0).status == pb.ACK_STATUS_APPLIED
    s = st.settings(50.0).settings
    assert s.tenant_limits("acme") == own and s.step_aware is True and "*" not in s.tenants
    # expiry: the picker's own settings
    st.apply(pb.RoutingPolicy(meta=pb.CommandMeta(decision_id="d3", generation=3, valid_until_unix_s=100.0),
                              tenants=[pb.TenantLimits(tenant="acme", max_inflight=1, weight=1.0)], step_aware=False),
             30.0)
    assert st.settings(99.0).settings.tenant_limits("acme").max_inflight == 1
    assert st.settings(100.0).settings.tenant_limits("acme") == own and st.settings(100.0).settings.step_aware


@pytest.mark.parametrize(("tenant", "fields", "named"), [
    ("", {}, "tenants[0].tenant: must be non-empty"),
    ("a b", {}, "tenants[0].tenant: 'a b' has characters outside"),
    ("x" * 200, {}, "tenants[0].tenant: 200 bytes, at most 128"),
    ("acme", {"weight": 0.0}, "tenants[0].weight: 0.0 must be a finite number > 0"),
    ("acme", {"max_inflight": -1, "weight": 1.0}, "tenants[0].max_inflight: -1 must be >= 0 (0 = unlimited)"),
    ("acme", {"rate_limit_rps": float("inf"), "weight": 1.0}, "tenants[0].rate_limit_rps: inf must be a finite"),
])
def test_a_bad_tenant_limit_is_refused_naming_it_and_nothing_is_applied(tenant, fields, named):
    st = PolicyStore(_settings())
    msg = _policy(1, "d1", 100.0, a=2.0)
    msg.tenants.add(tenant=tenant, **fields)
    ack = st.apply(msg, 10.0)
    assert ack.status == pb.ACK_STATUS_INVALID and named in ack.message, ack.message
    assert st.settings(10.0).fallback and st.generation == 0
    msg = _policy(1, "d1", 100.0, a=2.0)
    msg.tenants.add(tenant="acme", weight=1.0)
    msg.tenants.add(tenant="acme", weight=2.0)
    assert "tenants[1].tenant: tenant 'acme' appears more than once" in st.apply(msg, 10.0).message


def test_the_fallback_is_the_best_other_replica_of_the_same_pool_and_none_for_a_lone_one():
    p = _picker()
    s = _settings(PoolSettings(traffic_weight=1.0), PoolSettings(traffic_weight=0.0))
    a = {e.address: e for e in p.endpoints["a"]}
    a["10.0.0.1:8000"].engine_queue, a["10.0.0.2:8000"].engine_queue, a["10.0.0.3:8000"].engine_queue = 0, 4, 8
    r = p.route("standard", "x", s, 0.0)
    assert (_ep(r).address, r.fallback and r.fallback.address) == ("10.0.0.1:8000", "10.0.0.2:8000")
    # the fallback is not counted in flight: only the primary is, until the edge says the fallback served it
    assert [e.inflight for e in p.endpoints["a"]] == [1, 0, 0]
    assert r.fallback is not None
    p.moved(_ep(r), r.fallback)
    assert [e.inflight for e in p.endpoints["a"]] == [0, 1, 0] and p.counters.fallbacks == {"a": 1}
    # a fallback below the cap only (critical passes it), healthy only, never the primary
    s_cap = _settings(PoolSettings(traffic_weight=1.0, inflight_cap=5), PoolSettings(traffic_weight=0.0))
    a["10.0.0.2:8000"].healthy = False
    r = p.route("standard", "x", s_cap, 1.0)
    assert _ep(r).address == "10.0.0.1:8000" and r.fallback is None  # .3 is at the cap, .2 is not ready
    r = p.route("critical", "x", s_cap, 2.0)
    assert r.fallback is not None and r.fallback.address == "10.0.0.3:8000" and r.fallback.pool == "a"
    lone = Picker({"g": ["solo"]})
    lone.set_endpoints("solo", ["10.0.2.1:8000"])
    r = lone.route("standard", "x", Settings({"solo": PoolSettings()}), 0.0)
    assert r.endpoint is not None and r.fallback is None


def test_a_held_request_gets_its_fallback_when_dispatched():
    p = _picker()
    s = _settings(PoolSettings(traffic_weight=1.0, inflight_cap=1), PoolSettings(traffic_weight=0.0))
    first = [_ep(p.route("standard", "x", s, 0.0)) for _ in range(3)]
    held = [p.route("standard", "x", s, 0.0).held for _ in range(2)]
    assert all(h is not None and h.endpoint is None for h in held)
    p.finish(first[0], s)  # one replica has room: the oldest held request goes there, with no fallback (none has room)
    assert held[0] is not None and held[0].endpoint is first[0] and held[0].fallback is None
    # a policy raises the cap: the other held request goes out with another replica of its pool as its fallback
    wider = _settings(PoolSettings(traffic_weight=1.0, inflight_cap=3), PoolSettings(traffic_weight=0.0))
    p.dispatch_held(wider)
    assert held[1] is not None and held[1].endpoint is not None and held[1].fallback is not None
    assert held[1].fallback is not held[1].endpoint and held[1].fallback.pool == held[1].endpoint.pool == "a"
