"""Tasks, steps and tenants at the picker (controller/dataplane/task_book.py and the picker's use of them): the header
convention, the bounded task book, step-aware admission, tenant limits and the token-weighted fair share."""

from __future__ import annotations

import collections

import pytest

from controller.dataplane.picker import Picker, Route
from controller.dataplane.policy_store import ClassSettings, PoolSettings, Settings
from controller.dataplane.task_book import (
    OTHER_TENANT,
    STEP_HEADER,
    STEPS_HEADER,
    TASK_HEADER,
    TENANT_HEADER,
    Identity,
    IdentityError,
    TaskBook,
    TenantSettings,
    parse_identity,
)


def _ident(**headers: str):
    h = {k.replace("_", "-"): v for k, v in headers.items()}
    return parse_identity(h.get)


# ---------------------------------------------------------------------------- the header convention


def test_requests_without_headers_are_the_default_tenant_and_no_task():
    assert parse_identity(lambda _n: None) == Identity()


def test_headers_are_read():
    i = parse_identity({TENANT_HEADER: "acme", TASK_HEADER: "run-7f3a", STEP_HEADER: "2", STEPS_HEADER: "5"}.get)
    assert (i.tenant, i.task_id, i.step, i.steps) == ("acme", "run-7f3a", 2, 5)


@pytest.mark.parametrize("headers,named", [
    ({TASK_HEADER: "x" * 129}, TASK_HEADER),  # oversized
    ({TENANT_HEADER: "a" * 4096}, TENANT_HEADER),
    ({TASK_HEADER: "id with spaces"}, TASK_HEADER),
    ({TASK_HEADER: "t\x00"}, TASK_HEADER),
    ({TASK_HEADER: "t", STEP_HEADER: "-1"}, STEP_HEADER),
    ({TASK_HEADER: "t", STEP_HEADER: "1e9"}, STEP_HEADER),
    ({TASK_HEADER: "t", STEP_HEADER: "99999999999999999999"}, STEP_HEADER),
    ({TASK_HEADER: "t", STEPS_HEADER: "0"}, STEPS_HEADER),
    ({TASK_HEADER: "t", STEP_HEADER: "3", STEPS_HEADER: "3"}, STEP_HEADER),
    ({STEP_HEADER: "1"}, TASK_HEADER),  # a step of no task
])
def test_headers_that_break_the_convention_are_refused_naming_the_header(headers, named):
    with pytest.raises(IdentityError, match=named):
        parse_identity(headers.get)


# ---------------------------------------------------------------------------- the bounded book


def test_a_million_distinct_task_ids_keep_the_book_at_its_bound():
    book = TaskBook(max_tasks=1000, task_ttl_s=60.0)
    for i in range(200_000):  # the bench (governor bench tasks) sends the million
        book.advance(i * 1e-4)
        book.admit("default", "standard", f"t{i}", 0, 3, 10.0)
    assert len(book) == 1000
    assert book.counters.count("started") == 200_000
    assert book.counters.count("evicted") == 200_000 - 1000


def test_idle_tasks_expire_completed_when_their_length_is_unknown_abandoned_when_it_is():
    book = TaskBook(task_ttl_s=10.0)
    book.advance(0.0)
    a = book.admit("default", "standard", "open-ended", None, None, 5.0)
    b = book.admit("default", "standard", "three-steps", 0, 3, 5.0)
    book.finished(a, ok=True)
    book.finished(b, ok=True)
    book.advance(5.0)
    assert book.counters.count("completed") == 0 and len(book) == 2
    book.advance(10.5)
    assert book.counters.count("completed") == 1 and book.counters.count("abandoned") == 1
    assert len(book) == 0


def test_tenants_beyond_the_bound_share_one_name_but_named_ones_keep_theirs():
    book = TaskBook(max_tenants=3)
    named = {"vip": TenantSettings(weight=2.0)}
    got = set()
    for i in range(50):
        t = book.tenant_of(f"tenant-{i}", named)
        book.state(t)
        got.add(t)
    assert got == {"tenant-0", "tenant-1", "tenant-2", OTHER_TENANT}
    assert book.tenant_of("vip", named) == "vip"


def test_task_outcomes_counted_once():
    book = TaskBook()
    book.advance(0.0)
    for step in range(3):
        book.finished(book.admit("acme", "standard", "ok-task", step, 3, 1.0), ok=True)
    t0 = book.admit("acme", "standard", "bad-task", 0, 3, 1.0)
    book.finished(t0, ok=True)
    t1 = book.admit("acme", "standard", "bad-task", 1, 3, 1.0)
    book.finished(t1, ok=False)  # a stream cut: the task failed, once
    book.rejected("acme", "standard", "bad-task", later=True)
    c = book.counters
    assert (c.count("started"), c.count("completed"), c.count("failed")) == (2, 1, 1)
    assert c.count("completed", tenant="acme", cls="standard") == 1
    assert c.tokens == {"completed": 3.0, "failed": 2.0}


# ---------------------------------------------------------------------------- admission at the picker


def _picker(n_endpoints: int = 1) -> Picker:
    p = Picker({"g": ["a"]})
    p.set_endpoints("a", [f"10.0.0.{i}:8000" for i in range(1, n_endpoints + 1)])
    return p


def _s(step_aware: bool = True, cap: int = 0, tenants: dict | None = None, **adm: ClassSettings) -> Settings:
    return Settings({"a": PoolSettings(inflight_cap=cap)}, adm, tenants=tenants or {}, step_aware=step_aware)


def _first(task: str, tenant: str = "default") -> Identity:
    return Identity(tenant=tenant, task_id=task, step=0, steps=3)


def _later(task: str, tenant: str = "default") -> Identity:
    return Identity(tenant=tenant, task_id=task, step=1, steps=3)


def _admitted(r: Route) -> bool:
    return r.endpoint is not None or r.held is not None


@pytest.mark.parametrize("step_aware", [True, False])
def test_shedding_takes_new_tasks_first_steps_not_later_steps(step_aware):
    p = _picker()
    s = _s(step_aware, standard=ClassSettings(shed_frac=0.5))
    for i in range(20):  # tasks under way
        p.book.admit("default", "standard", f"old{i}", 0, 3, 1.0)
    later_ok = first_ok = 0
    for i in range(0, 20, 2):  # two later steps, two first steps: step-blind sheds one of each
        for j in (i, i + 1):
            later_ok += _admitted(p.route("standard", "", s, float(i), ident=_later(f"old{j}")))
        for j in (i, i + 1):
            first_ok += _admitted(p.route("standard", "", s, float(i), ident=_first(f"new{j}")))
    assert later_ok + first_ok == 20  # the class sheds its half either way
    if step_aware:
        assert later_ok == 20 and first_ok == 0
    else:
        assert later_ok == first_ok == 10
    failed = p.book.counters.count("failed")
    assert failed == (0 if step_aware else 10)  # a later step refused fails its task


@pytest.mark.parametrize("step_aware", [True, False])
def test_rate_limit_lets_later_steps_borrow_and_new_tasks_wait(step_aware):
    p = _picker()
    s = _s(step_aware, standard=ClassSettings(rate_limit_rps=4.0))
    firsts = [p.route("standard", "", s, 0.0, ident=_first(f"n{i}")) for i in range(4)]
    assert all(_admitted(r) for r in firsts)  # one second of tokens
    later = [p.route("standard", "", s, 0.0, ident=_later(f"n{i}")) for i in range(4)]
    assert sum(map(_admitted, later)) == (4 if step_aware else 0)
    assert not _admitted(p.route("standard", "", s, 0.0, ident=_first("late")))


def _saturate(p: Picker, s: Settings) -> None:
    r = p.route("standard", "", s, 0.0)
    assert r.endpoint is not None


def test_queue_budget_refuses_first_steps_but_holds_later_steps():
    p = _picker()
    s = _s(True, cap=1, standard=ClassSettings(queue_budget=2))
    _saturate(p, s)
    assert all(p.route("standard", "", s, 0.0, ident=_first(f"n{i}")).held is not None for i in range(2))
    refused = p.route("standard", "", s, 0.0, ident=_first("n9"))
    assert refused.status == 503 and refused.reason == "queue_budget"
    p.book.admit("default", "standard", "old", 0, 3, 1.0)
    assert p.route("standard", "", s, 0.0, ident=_later("old")).held is not None


def test_held_later_steps_go_before_first_steps_held_earlier():
    p = _picker()
    s = _s(True, cap=1)
    _saturate(p, s)
    first = p.route("standard", "", s, 0.0, ident=_first("n"))
    p.book.admit("default", "standard", "old", 0, 3, 1.0)
    later = p.route("standard", "", s, 0.0, ident=_later("old"))
    assert first.held is not None and later.held is not None
    ep = p.endpoints["a"][0]
    assert p.finish(ep, s) == [later.held]


def test_step_blind_holds_in_arrival_order():
    p = _picker()
    s = _s(False, cap=1)
    _saturate(p, s)
    first = p.route("standard", "", s, 0.0, ident=_first("n"))
    p.book.admit("default", "standard", "old", 0, 3, 1.0)
    p.route("standard", "", s, 0.0, ident=_later("old"))
    assert p.finish(p.endpoints["a"][0], s) == [first.held]


def test_tenant_rate_and_concurrency_limits():
    p = _picker(4)
    s = _s(tenants={"acme": TenantSettings(rate_limit_rps=2.0), "*": TenantSettings(max_inflight=1)})
    acme = [p.route("standard", "", s, 0.0, ident=Identity(tenant="acme")) for _ in range(3)]
    assert [_admitted(r) for r in acme] == [True, True, False]
    assert acme[2].status == 429 and acme[2].reason == "tenant_rate_limit"
    other = [p.route("standard", "", s, 0.0, ident=Identity(tenant="zeta")) for _ in range(2)]
    assert _admitted(other[0]) and other[1].reason == "tenant_concurrency"
    assert other[0].endpoint is not None
    p.finish(other[0].endpoint, s, other[0].ticket, ok=True)
    assert _admitted(p.route("standard", "", s, 0.0, ident=Identity(tenant="zeta")))


def test_token_weighted_fair_share_of_held_requests():
    """Heavy sends 10x light's tokens (5x the requests, 2x the length) into a saturated replica; of the requests
    dispatched while both wait, each tenant gets tokens in proportion to its weight (1:1 here)."""
    p = _picker()
    s = _s(True, cap=4)
    for _ in range(4):
        _saturate(p, s)
    held: list[Route] = []
    for i in range(200):
        held.append(p.route("standard", "", s, 0.0, ident=Identity(tenant="heavy"), tokens=200.0))
        if i % 5 == 0:
            held.append(p.route("standard", "", s, 0.0, ident=Identity(tenant="light"), tokens=100.0))
    assert all(r.held is not None for r in held)
    ep = p.endpoints["a"][0]
    tokens: dict[str, float] = collections.defaultdict(float)
    for _ in range(60):
        for h in p.finish(ep, s):
            tokens[h.tenant] += h.ticket.tokens if h.ticket else 0
    assert tokens["light"] == pytest.approx(tokens["heavy"], rel=0.05)
    # weights 3:1 for heavy: three times light's tokens
    p2 = _picker()
    s2 = _s(True, cap=4, tenants={"heavy": TenantSettings(weight=3.0)})
    for _ in range(4):
        _saturate(p2, s2)
    for _ in range(200):
        p2.route("standard", "", s2, 0.0, ident=Identity(tenant="heavy"), tokens=100.0)
        p2.route("standard", "", s2, 0.0, ident=Identity(tenant="light"), tokens=100.0)
    tokens = collections.defaultdict(float)
    for _ in range(80):
        for h in p2.finish(p2.endpoints["a"][0], s2):
            tokens[h.tenant] += 100
    assert tokens["heavy"] == pytest.approx(3 * tokens["light"], rel=0.05)


# ---------------------------------------------------------------------------- the flags


def _cfg(*flags: str):
    from controller.cli import build_parser
    from controller.dataplane.cli import config_from_args

    return config_from_args(build_parser().parse_args(["picker", "--pool", "a=127.0.0.1:8000", *flags]))


def test_tenant_flags_reach_the_defaults_and_bad_ones_are_named():
    cfg = _cfg("--tenant", "acme=2,4,3", "--tenant", "*=0,8", "--step-blind", "--max-tasks", "50")
    assert cfg.defaults is not None and not cfg.defaults.step_aware and cfg.max_tasks == 50
    assert cfg.defaults.tenant_limits("acme") == TenantSettings(2.0, 4, 3.0)
    assert cfg.defaults.tenant_limits("zeta") == TenantSettings(0.0, 8, 1.0)
    for bad in ("acme=x", "acme=1,2,3,4", "acme=1,2,0"):
        with pytest.raises(ValueError, match="--tenant acme"):
            _cfg("--tenant", bad)


def test_a_full_queue_budget_is_shared_by_the_tenants_weights():
    p = _picker()
    s = _s(True, cap=1, standard=ClassSettings(queue_budget=2))
    _saturate(p, s)
    heavy = [p.route("standard", "", s, 0.0, ident=_first(f"h{i}", "heavy")) for i in range(2)]
    assert all(r.held is not None for r in heavy)
    light = p.route("standard", "", s, 0.0, ident=_first("l0", "light"))
    assert light.held is not None  # heavy held the whole budget: its newest gives its place up
    evicted = p.take_evicted()
    assert evicted == [heavy[1].held] and evicted[0].rejected == "queue_budget" and p.take_evicted() == []
    again = p.route("standard", "", s, 0.0, ident=_first("l1", "light"))
    assert again.status == 503  # one each now: light's second would take more than its share
    assert p.held_count("standard") == 2
    # a tenant over its share holding only later steps gives one up to a first step of a tenant under its share
    # (many tasks under way do not buy a bigger share); a first step never displaces a later step of its own tenant
    q = _picker()
    s2 = _s(True, cap=1, standard=ClassSettings(queue_budget=2))
    _saturate(q, s2)
    later = []
    for t in ("hx", "hy"):
        q.book.admit("heavy", "standard", t, 0, 3, 1.0)
        later.append(q.route("standard", "", s2, 0.0, ident=_later(t, "heavy")))
    assert q.route("standard", "", s2, 0.0, ident=_first("h9", "heavy")).status == 503
    assert q.route("standard", "", s2, 0.0, ident=_first("l0", "light")).held is not None
    assert q.take_evicted() == [later[1].held]


def test_the_edge_answers_a_displaced_request_503_queue_budget():
    import asyncio

    from controller.dataplane.server import PickerConfig, PickerService

    async def run() -> list[int]:
        defaults = Settings({"a": PoolSettings(inflight_cap=1)}, {"standard": ClassSettings(queue_budget=2)})
        svc = PickerService(PickerConfig(groups={"g": ["a"]}, endpoints={"a": ["10.0.0.1:8000"]},
                                         defaults=defaults, hold_timeout_s=30.0))
        ep, _, _ = await svc.decide("standard", None, "", None, Identity("heavy", "h0", 0, 3))
        assert ep is not None
        held = [asyncio.create_task(svc.decide("standard", None, "", None, Identity("heavy", f"h{i}", 0, 3)))
                for i in (1, 2)]
        while svc.picker.held_count("standard") < 2:  # both parked on the loop (no timing: a condition)
            await asyncio.sleep(0)
        light = asyncio.create_task(svc.decide("standard", None, "", None, Identity("light", "l0", 0, 3)))
        _, resp, _ = await held[1]  # heavy's newest gave its place up
        assert not light.done()
        svc.release(ep)  # the replica frees up: heavy's older request goes first (level virtual times, FCFS)
        ep1, _, _ = await held[0]
        assert ep1 is not None and not light.done()
        svc.release(ep1)  # then light's
        ep2, _, _ = await light
        assert ep2 is not None
        return [resp.immediate_response.status.code, int(resp.immediate_response.details == "governor_queue_budget")]

    assert asyncio.run(run()) == [503, 1]


def test_fair_share_orders_tenants_before_step_kind_across_tenants():
    """Heavy's later steps wait behind light's first step once heavy is ahead of its share; within heavy, its later
    step still goes before its own first step."""
    p = _picker()
    s = _s(True, cap=1)
    r = p.route("standard", "", s, 0.0, ident=Identity(tenant="light"), tokens=10.0)
    assert r.endpoint is not None
    p.finish(r.endpoint, s, r.ticket)
    r = p.route("standard", "", s, 0.0, ident=Identity(tenant="heavy"), tokens=1000.0)  # heavy gets ahead in tokens
    assert r.endpoint is not None
    p.book.admit("heavy", "standard", "hx", 0, 3, 1.0)
    heavy_first = p.route("standard", "", s, 0.0, ident=_first("hy", "heavy"))
    heavy_later = p.route("standard", "", s, 0.0, ident=_later("hx", "heavy"))
    light_first = p.route("standard", "", s, 0.0, ident=_first("l0", "light"))
    ep = p.endpoints["a"][0]
    order = []
    for _ in range(3):
        order += p.finish(ep, s)
    assert order == [light_first.held, heavy_later.held, heavy_first.held]
