"""Cost per successful task, live (issue 35, part 4): spend integrated over ticks, the pickers' task counters read
from a real picker's /metrics text, the daemon's series on its real /metrics, and the status lines."""

from __future__ import annotations

import math

import pytest
from prometheus_client import generate_latest

from controller.dataplane.server import PickerConfig, PickerService
from controller.dataplane.task_book import Identity
from controller.obs.daemon_metrics import DaemonMetrics
from controller.obs.task_cost import (
    CostTracker,
    PickerProfile,
    PickerTasks,
    PickerTasksReader,
    TaskCost,
    TaskProfileWindow,
    parse_picker_tasks,
)
from controller.runtime.daemon import cost_details
from controller.types import FleetObservation, PoolObservation, Reading

K_OK = ("standard", "acme", "completed")
K_START = ("standard", "acme", "started")


def test_spend_integrates_the_replicas_price_between_ticks_and_caps_a_gap():
    c = TaskCost({"a": 4.0, "b": 10.0}, max_gap_s=300.0)
    c.observe(0.0, {"a": 2, "b": 1}, None)  # 18 $/h from now on
    snap = c.observe(3600.0 * 0.5, {"a": 2, "b": 0}, None)  # half an hour at 18 $/h
    assert snap.spend_usd == pytest.approx(9.0 * 300.0 / 1800.0)  # capped: a 30 min gap is charged 5 min
    c2 = TaskCost({"a": 4.0})
    c2.observe(0.0, {"a": 3}, None)
    snap = c2.observe(60.0, {"a": 3}, None)
    assert snap.spend_usd == pytest.approx(12.0 / 60.0) and snap.spend_usd_per_hour == {"a": 12.0}
    assert snap.basis == "none" and snap.cost_per_success_usd is None


def test_task_counts_since_the_first_reading_survive_a_picker_restart():
    c = TaskCost({"a": 3.6})
    c.observe(0.0, {"a": 1}, PickerTasks({K_OK: 100.0, K_START: 120.0}))  # the baseline: not ours
    c.observe(10.0, {"a": 1}, PickerTasks({K_OK: 104.0, K_START: 130.0}))
    snap = c.observe(20.0, {"a": 1}, PickerTasks({K_OK: 3.0, K_START: 5.0}))  # restarted: from zero again
    assert snap.count("completed") == 7 and snap.count("started") == 15
    assert snap.basis == "tasks"
    assert snap.cost_per_success_usd == pytest.approx(3.6 * 20 / 3600 / 7)


def test_without_task_ids_the_basis_is_requests_and_says_so():
    c = TaskCost({"a": 1.0})
    c.observe(0.0, {"a": 1}, PickerTasks({}, 0.0))
    snap = c.observe(60.0, {"a": 1}, PickerTasks({("standard", "default", "started"): 10.0,
                                                  ("standard", "default", "completed"): 9.0}, 10.0))
    assert snap.basis == "requests"
    lines = dict(cost_details(snap))
    assert "per request" in lines["cost.per_successful_task"] and "x-governor-task-id" in \
        lines["cost.per_successful_task"]
    assert lines["tasks"].startswith("started 10, completed 9")


def _picker_page() -> str:
    svc = PickerService(PickerConfig(groups={"g": ["a"]}, endpoints={"a": ["10.0.0.1:8000"]}))
    p, s = svc.picker, svc.settings()
    for step in range(2):
        r = p.route("standard", "", s, 0.0, ident=Identity("acme", "t1", step, 2), tokens=10.0)
        assert r.endpoint is not None
        p.finish(r.endpoint, s, r.ticket, ok=True)
    r = p.route("critical", "", s, 0.0)
    assert r.endpoint is not None
    p.finish(r.endpoint, s, r.ticket, ok=False)
    return generate_latest(svc.registry).decode()


def test_a_real_pickers_page_is_read():
    got = parse_picker_tasks(_picker_page())
    assert got is not None and got.unlabelled == 1
    assert got.tasks[("standard", "acme", "completed")] == 1 and got.tasks[("critical", "default", "failed")] == 1
    assert parse_picker_tasks("vllm:num_requests_running 3\n") is None  # an engine: not a picker


def test_the_reader_sums_pickers_and_leaves_out_one_that_fails():
    page = _picker_page()

    def fetch(url: str, _timeout: float) -> str:
        if url == "bad":
            raise OSError("connection refused")
        return page

    r = PickerTasksReader(["p1", "p2", "bad"], fetch)
    got = r.read()
    assert got is not None and got.tasks[("standard", "acme", "completed")] == 2 and r.errors == 1
    assert PickerTasksReader(["bad"], fetch).read() is None


def test_daemon_metrics_export_spend_tasks_and_cost():
    m = DaemonMetrics()
    c = TaskCost({"a": 3.6})
    c.observe(0.0, {"a": 2}, PickerTasks({}))
    m.observe_costs(c.observe(100.0, {"a": 2}, PickerTasks({K_OK: 4.0, K_START: 5.0})))
    text = generate_latest(m.registry).decode()
    assert 'governor_spend_usd_per_hour{pool="a"} 7.2' in text
    assert "governor_spend_usd_total 0.2" in text
    assert 'governor_tasks_total{class="standard",outcome="completed",tenant="acme"} 4.0' in text
    value = next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith('governor_cost_per_successful_task_usd{basis="tasks"}'))
    assert math.isclose(value, 0.05)
    assert 'basis="requests"' not in text


def test_the_live_view_line_says_spend_tasks_and_cost_and_the_basis():
    from controller.runtime.view import cost_line

    c = TaskCost({"a": 3.6})
    c.observe(0.0, {"a": 2}, PickerTasks({}))
    snap = c.observe(100.0, {"a": 2}, PickerTasks({K_OK: 4.0, K_START: 5.0, ("standard", "acme", "failed"): 1.0}))
    line = cost_line(snap)
    assert line.startswith("spend $7.20/h · $0.2000 so far")
    assert "4 of 5 tasks completed (80% of settled)" in line and "$0.05000 per successful task" in line
    req = TaskCost({"a": 3.6})
    req.observe(0.0, {"a": 2}, PickerTasks({}, 0.0))
    snap = req.observe(100.0, {"a": 2}, PickerTasks({K_OK: 4.0, K_START: 5.0}, 5.0))
    assert "4 of 5 requests completed (no task ids: each request a task)" in cost_line(snap)
    assert "per successful request" in cost_line(snap)
    assert cost_line(TaskCost({"a": 1.0}).observe(0.0, {"a": 1}, None)).endswith("tasks: no picker counts")


# ---------------------------------------------------------------------------- the step profile for the planner


def _agent_page(svc: PickerService, tasks: range, tenant: str, steps: int, tokens0: float) -> str:
    """`tasks` tasks of `steps` steps whose contexts grow (step s: (s + 1) × tokens0), through a real picker."""
    p, s = svc.picker, svc.settings()
    for t in tasks:
        for step in range(steps):
            r = p.route("standard", "", s, 0.0, ident=Identity(tenant, f"{tenant}-{t}", step, steps),
                        tokens=tokens0 * (step + 1))
            assert r.endpoint is not None
            p.finish(r.endpoint, s, r.ticket, ok=True)
    return generate_latest(svc.registry).decode()


def test_the_step_profile_from_a_real_pickers_page_over_the_window():
    """A picker's step counters read at two ticks: the window's increase is each class's step profile and each
    tenant's offered tokens per second; the reading before the window is the base."""
    svc = PickerService(PickerConfig(groups={"g": ["a"]}, endpoints={"a": ["10.0.0.1:8000"]}))
    w = TaskProfileWindow(window_s=600.0)
    page0 = _agent_page(svc, range(0, 2), "acme", 3, 100.0)  # before the window: the base
    got0 = parse_picker_tasks(page0)
    assert got0 is not None
    w.observe(0.0, got0.profile)
    assert w.profile() is None  # one reading: no window yet
    _agent_page(svc, range(2, 6), "acme", 3, 100.0)
    page1 = _agent_page(svc, range(0, 4), "solo", 1, 50.0)  # unlabelled-like single steps of another tenant
    got1 = parse_picker_tasks(page1)
    assert got1 is not None
    w.observe(100.0, got1.profile)
    prof = w.profile()
    assert prof is not None
    std = prof.classes["standard"]
    # 4 tasks of 3 steps (acme) and 4 of 1 (solo) settled in the window; steps at index 0: 4 × 100 + 4 × 50
    assert std.tasks == pytest.approx((0.5, 0.0, 0.5)) and std.count == 8
    assert std.tokens == pytest.approx((75.0, 200.0, 300.0))
    # offered tokens per second over the 100 s: acme 4 × (100 + 200 + 300), solo 4 × 50
    assert prof.tenant_tokens_rps == pytest.approx({"acme": 24.0, "solo": 2.0})


def test_the_window_drops_readings_older_than_its_base_and_a_restart_counts_from_zero():
    w = TaskProfileWindow(window_s=60.0)
    one = PickerProfile(step_requests={("standard", 0): 10.0, ("standard", 1): 10.0},
                        step_tokens={("standard", 0): 1000.0, ("standard", 1): 3000.0},
                        task_steps={("standard", 2): 10.0}, tenant_tokens={"a": 4000.0})
    for t in (0.0, 30.0, 60.0, 90.0):
        w.observe(t, one)
    w.observe(120.0, PickerProfile(step_requests={("standard", 0): 2.0, ("standard", 1): 2.0},
                                   step_tokens={("standard", 0): 200.0, ("standard", 1): 600.0},
                                   task_steps={("standard", 2): 2.0}, tenant_tokens={"a": 800.0}))
    prof = w.profile()  # base: the reading at 60 s (the newest at least 60 s old); the picker restarted since
    assert prof is not None and prof.classes["standard"].tokens == pytest.approx((100.0, 300.0))
    assert prof.tenant_tokens_rps == pytest.approx({"a": 800.0 / 60.0})
    assert TaskProfileWindow(60.0).profile() is None


def test_without_labelled_tasks_or_tenants_there_is_no_profile():
    svc = PickerService(PickerConfig(groups={"g": ["a"]}, endpoints={"a": ["10.0.0.1:8000"]}))
    w = TaskProfileWindow()
    w.observe(0.0, parse_picker_tasks(generate_latest(svc.registry).decode()).profile)  # type: ignore[union-attr]
    w.observe(15.0, parse_picker_tasks(generate_latest(svc.registry).decode()).profile)  # type: ignore[union-attr]
    assert w.profile() is None


def test_the_cost_tracker_hands_the_pickers_profile_to_the_next_tick():
    """What the daemon passes as `TickInput.tasks` (runtime/daemon.py `_task_profile`): the pickers' profile as of
    the last tick's reading, None before two readings."""
    svc = PickerService(PickerConfig(groups={"g": ["a"]}, endpoints={"a": ["10.0.0.1:8000"]}))
    pages = [_agent_page(svc, range(0, 1), "acme", 3, 100.0)]

    def fetch(_url: str, _timeout: float) -> str:
        return pages[-1]

    tracker = CostTracker({"a": 1.0}, PickerTasksReader(["p1"], fetch))
    obs = FleetObservation(at_s=0.0, pools={"a": PoolObservation("a", replicas_ready=Reading(1.0))})
    tracker.observe(0.0, obs)
    assert tracker.task_profile() is None
    pages.append(_agent_page(svc, range(1, 5), "acme", 3, 100.0))
    tracker.observe(15.0, obs)
    prof = tracker.task_profile()
    assert prof is not None and prof.classes["standard"].tasks == pytest.approx((0.0, 0.0, 1.0))
    assert prof.tenant_tokens_rps == pytest.approx({"acme": 4 * 600.0 / 15.0})
