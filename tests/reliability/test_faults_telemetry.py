"""Telemetry faults on the closed loop: a daemon (as `governor run` builds it) governs a seeded loopback fleet
(tests/fakes/fault_fleet.py: real HTTP /metrics and discovery, real gRPC control) on a virtual clock, and
each fault is served on the wire. Each case runs next to a control run with the same seed and no fault,
which shows the scale-down the data would have asked for: what stops it under the fault is the guard.

Expected (issue 21): no scale-down on missing data, freeze when stale, recovery within two ticks of the
data returning, every state visible in status and in the daemon's own metrics, the read bounded by its
deadline inside the tick, and the operator's overrides applied while frozen.
"""

from __future__ import annotations

import time

import pytest

from controller.api.store import StateStore
from controller.config.tick_budget import scrape_round_s
from controller.types import Mode
from tests.fakes.fault_fleet import FaultFleet, Governed

TICK_S = 3.0  # the demo's period: the tightest budget a shipped config uses
POOLS = {"a": (10, 2.0), "b": (3, 8.0)}  # pool a is over-provisioned: the policy wants it smaller every tick
WARM, FAULTY, AFTER = 3, 3, 3  # ticks before, during and after the fault


def _run(tmp_path, fault: str | None, where: tuple[str, ...], *, seed: int = 7) -> list:
    """(tick, report, wall seconds, status, frozen gauge) for WARM + FAULTY + AFTER ticks."""
    out = []
    with FaultFleet(POOLS, seed=seed) as fleet:
        fleet.advance(TICK_S)
        with Governed(fleet, tmp_path / f"state-{fault}", tick_s=TICK_S) as g:
            for i in range(WARM + FAULTY + AFTER):
                for w in where:
                    if fault is not None and i == WARM:
                        fleet.set_fault(w, fault)
                    if fault is not None and i == WARM + FAULTY:
                        fleet.set_fault(w, None)
                t0 = time.monotonic()
                rep = g.tick()
                out.append((i, rep, time.monotonic() - t0, g.daemon.status(),
                            g.metric("governor_telemetry_frozen")))
    return out


def _replicas(run, pool: str) -> list[int]:
    return [rep.result.decision.pools[pool].replicas for _, rep, *_ in run]


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("control"), None, ())


def test_the_control_run_scales_the_idle_pool_down(control):
    """Without a fault the policy takes pool a down during the fault window: the guard has something to stop."""
    a = _replicas(control, "a")
    assert a[WARM + FAULTY - 1] < a[WARM - 1], a
    assert not any(rep.result.frozen for _, rep, *_ in control)


@pytest.mark.parametrize(("fault", "where"), [
    ("refused", ("a", "b")), ("error", ("a", "b")), ("hang", ("a", "b", "sd")), ("slow", ("a", "b", "sd")),
])
def test_a_fleet_that_stops_answering_freezes_and_recovers(tmp_path, control, fault, where):
    run = _run(tmp_path, fault, where)
    held = {p: _replicas(run, p)[WARM - 1] for p in POOLS}
    for i, rep, wall_s, status, frozen_gauge in run[WARM:WARM + FAULTY]:
        r = rep.result
        # freshness is when a page was read: the first tick without answers is already not ok, and frozen
        assert r.frozen, (fault, i, dict(r.telemetry))
        assert set(r.telemetry.values()) <= {"stale", "missing"}, (fault, i, dict(r.telemetry))
        assert {p: pd.replicas for p, pd in r.decision.pools.items()} == held  # the last safe decision
        assert any(a.code == "guard_telemetry_frozen" for a in r.guard_adjustments)
        assert status.telemetry_frozen and frozen_gauge == 1.0
        assert ("telemetry.frozen", "true") in status.details
        telemetry = next(c for c in status.components if c.name.startswith("telemetry:"))
        assert not telemetry.healthy and telemetry.detail
        # the read is cut at its deadline inside the tick, discovery included (no overrun, no skipped tick)
        assert wall_s < TICK_S, (fault, i, wall_s)
        assert wall_s < scrape_round_s(0.2) + 1.5
    a_control = _replicas(control, "a")
    assert a_control[WARM + FAULTY - 1] < held["a"]  # …where the control run had scaled down
    recovered = [i for i, rep, _w, status, g in run[WARM + FAULTY:]
                 if not rep.result.frozen and set(rep.result.telemetry.values()) == {"ok"}
                 and not status.telemetry_frozen and g == 0.0]
    assert recovered and recovered[0] <= WARM + FAULTY + 1, (fault, [dict(r.result.telemetry) for _, r, *_ in run])


@pytest.mark.parametrize("fault", ["partial", "nan", "vanish"])
def test_missing_or_unusable_series_never_scale_a_pool_down(tmp_path, control, fault):
    run = _run(tmp_path, fault, ("a",))
    a, a_control = _replicas(run, "a"), _replicas(control, "a")
    during = run[WARM:WARM + FAULTY]
    for i, rep, _w, status, _g in during:
        assert rep.result.telemetry["a"] != "ok", (fault, i)
        assert rep.result.telemetry["b"] == "ok", (fault, i)  # the other pool is still governed
        assert not rep.result.frozen
        view = next(p for p in status.pools if p.pool == "a")
        assert view.telemetry == rep.result.telemetry["a"]
        assert ("telemetry.not_ok", f"a={rep.result.telemetry['a']}") in status.details
    assert a[WARM:WARM + FAULTY] == [a[WARM - 1]] * FAULTY, (fault, a)  # held: no scale-down on missing data
    assert a_control[WARM + FAULTY - 1] < a[WARM - 1]  # the control run scaled down in the same ticks
    assert run[-1][1].result.telemetry["a"] == "ok"


def test_a_counter_reset_is_an_engine_restart_not_a_negative_rate(tmp_path, control):
    """Counters drop to zero (engines restarted): rate() treats the drop as a restart, the rate stays near the
    true 2 requests/s and no decision jumps."""
    run = _run(tmp_path, "reset", ("a",))
    for i, rep, *_ in run[WARM:]:
        rps = rep.observation.pools["a"].arrival_rps
        assert rps.ok and 0.0 <= rps.value <= 2 * POOLS["a"][1], (i, rps)
        assert rep.result.telemetry["a"] == "ok"
    a = _replicas(run, "a")
    assert all(abs(x - y) <= 4 for x, y in zip(a, a[1:], strict=False))  # within the step guards


def test_skewed_sample_timestamps_change_nothing(tmp_path, control):
    """Exporters with a clock an hour off: freshness is when the daemon read the page, so the loop is exactly
    the control run's."""
    run = _run(tmp_path, "skew", ("a",))
    assert _replicas(run, "a") == _replicas(control, "a")
    assert [dict(rep.result.telemetry) for _, rep, *_ in run] == [dict(rep.result.telemetry) for _, rep, *_ in control]


def test_operator_overrides_apply_while_telemetry_is_frozen(tmp_path):
    """Frozen holds the last safe decision, but a pin, a floor, a freeze and forced admission still reach the
    fleet (before, the freeze path returned before the overrides)."""
    with FaultFleet(POOLS, seed=3) as fleet:
        fleet.advance(TICK_S)
        with Governed(fleet, tmp_path / "state", tick_s=TICK_S) as g:
            for _ in range(WARM):
                g.tick()
            held = {p: pd.replicas for p, pd in g.reports[-1].result.decision.pools.items()}
            for p in POOLS:
                fleet.set_fault(p, "refused")
            rep = g.tick()
            assert rep.result.frozen
            store: StateStore = g.services.store
            now = g.clock.now_s()
            store.add_override("pin_replicas", ttl_s=600, author="oncall", now_s=now, value=held["a"] + 3, pool="a",
                               known_pools=list(POOLS))
            store.add_override("min_replicas", ttl_s=600, author="oncall", now_s=now, value=held["b"] + 1, pool="b",
                               known_pools=list(POOLS))
            store.add_override("admission", ttl_s=600, author="oncall", now_s=now, value=0.5,
                               priority_class="sheddable", known_pools=list(POOLS))
            rep = g.tick()
            r = rep.result
            assert r.frozen and rep.outcome.status == "applied"
            assert r.decision.pools["a"].replicas == held["a"] + 3
            assert r.decision.pools["b"].replicas == held["b"] + 1
            assert r.decision.admission["sheddable"].shed_frac == 0.5
            codes = {a.code for a in r.guard_adjustments}
            assert {"guard_telemetry_frozen", "guard_override_pin", "guard_override_min",
                    "guard_override_admission"} <= codes
            assert fleet.commanded() == {"a": held["a"] + 3, "b": held["b"] + 1}  # on the wire
            shed = {a.priority_class: a.shed_fraction for a in fleet.control.router.policy.admission}
            assert shed["sheddable"] == 0.5
            # a freeze override wins while frozen too: the pool keeps what is in force, the pin is not re-applied
            store.add_override("freeze", ttl_s=600, author="oncall", now_s=g.clock.now_s(), pool="b",
                               known_pools=list(POOLS))
            rep = g.tick()
            assert rep.result.decision.pools["b"].replicas == held["b"] + 1
            assert "guard_override_freeze" in {a.code for a in rep.result.guard_adjustments}
            assert g.daemon.mode is Mode.ACTIVE


# --------------------------------------------------------------------------- through the Prometheus HTTP API

class _PromFault:
    """A loopback stand-in for a broken Prometheus: "error" answers every query 503 with Prometheus' error
    JSON, "bad" answers 422 (a query Prometheus rejects), "hang" holds each request until released; "down"
    is a port nobody listens on. (A healthy Prometheus is tests/fixtures/prometheus.py's real binary.)"""

    def __init__(self, mode: str) -> None:
        import json as _json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.release = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                if mode == "hang":
                    owner.release.wait(20)
                    return
                code = 503 if mode == "error" else 422
                body = _json.dumps({"status": "error", "errorType": "unavailable" if code == 503 else "execution",
                                    "error": "injected"}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, fmt: str, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("mode", ["down", "error", "bad", "hang"])
def test_prometheus_down_failing_or_hung_freezes_within_its_timeout(tmp_path, mode):
    """The daemon reads through the Prometheus API; Prometheus is down, answers errors, or hangs past the
    tick: every reading MISSING, the controller frozen from its second tick on (nothing to hold before),
    never a scale-down, the read cut at telemetry.prometheus.timeout_s, and the error in status and metrics."""
    import socket

    prom = None
    if mode == "down":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed when the block ends: refused
    else:
        prom = _PromFault(mode)
        url = prom.url
    timeout_s = 1.0
    try:
        with FaultFleet(POOLS, seed=1) as fleet:
            telemetry = {"source": "prometheus", "prometheus": {"url": url, "timeout_s": timeout_s},
                         "window_s": 4 * TICK_S, "stale_after_s": 2 * TICK_S}
            with Governed(fleet, tmp_path / "state", tick_s=TICK_S, telemetry=telemetry) as g:
                reps = []
                for _ in range(3):
                    t0 = time.monotonic()
                    reps.append(g.tick())
                    assert time.monotonic() - t0 < timeout_s + 1.0  # the read's budget, plus the plan and send
                first = {p: pd.replicas for p, pd in reps[0].result.decision.pools.items()}
                for rep in reps:
                    assert set(rep.result.telemetry.values()) == {"missing"}
                    assert rep.observation.errors
                    assert {p: pd.replicas for p, pd in rep.result.decision.pools.items()} == first
                assert all(rep.result.frozen for rep in reps[1:])
                status = g.daemon.status()
                comp = next(c for c in status.components if c.name == "telemetry:prometheus")
                assert not comp.healthy and comp.detail
                assert status.telemetry_frozen and g.metric("governor_telemetry_frozen") == 1.0
                assert (g.metric("governor_telemetry_errors_total") or 0.0) >= 3
    finally:
        if prom is not None:
            prom.close()
