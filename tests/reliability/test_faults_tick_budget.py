"""Every phase of a tick has a deadline inside the tick (controller/config/tick_budget.py): `governor config validate`
and start-up refuse timeouts × attempts that cannot fit the period, naming the fields; the configs the
project ships fit; and at run time the actuation gets what is left of the tick, so a hung fleet costs one
bounded tick, not skipped ones (issue 21: read 5,010 ms + actuate 8,412 ms against a 3 s period)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from controller.config import ConfigError, Settings, load_settings
from controller.config.tick_budget import PLAN_SHARE, scrape_round_s, send_budget_s, tick_budget, tick_budget_problems
from controller.runtime.main import demo_settings
from controller.runtime.preflight import preflight
from controller.sim.scenario import load_scenario
from tests.fakes.fault_fleet import FaultFleet, Governed

ROOT = Path(__file__).resolve().parents[2]


def test_the_budget_arithmetic():
    assert scrape_round_s(2.0) == 4.5
    # 3 attempts of 2 s and backoffs 0.2 + 0.4 s: the shipped defaults
    assert send_budget_s(2.0, 2, 0.2) == pytest.approx(6.6)
    assert send_budget_s(1.0, 0, 5.0) == 1.0  # no retry, no wait


def test_validate_refuses_timeouts_that_cannot_fit_the_tick_and_names_the_fields(tmp_path):
    """The issue's configuration: a 3 s tick, scrape timeout 2 s, actuators at their defaults."""
    example = yaml.safe_load((ROOT / "deploy" / "governor.example.yaml").read_text())
    example.update(tick_interval_s=3, telemetry={"source": "scrape", "window_s": 20, "stale_after_s": 20,
                                                 "scrape": {"discovery_url": "http://127.0.0.1:1/sd", "timeout_s": 2}})
    example["actuators"]["router"]["address"] = "127.0.0.1:50061"
    example["actuators"]["autoscaler"]["address"] = "127.0.0.1:50062"
    path = tmp_path / "governor.yaml"
    path.write_text(yaml.safe_dump(example))
    load_settings(path)  # every field is valid on its own…
    with pytest.raises(ConfigError) as err:
        preflight(path)  # …but the phases cannot fit the period
    text = str(err.value)
    for name in ("tick_interval_s", "telemetry.scrape.timeout_s", "actuators.{router,autoscaler}.timeout_s",
                 "retries", "backoff_s", "4.5 s to read", "6.6 s to actuate"):
        assert name in text, (name, text)
    # the same file with timeouts sized to the tick passes
    example["telemetry"]["scrape"]["timeout_s"] = 0.5
    for which in ("router", "autoscaler"):
        example["actuators"][which].update(timeout_s=0.5, retries=1, backoff_s=0.1)
    path.write_text(yaml.safe_dump(example))
    assert preflight(path).tick_interval_s == 3


def test_the_shipped_configs_and_the_demo_fit_their_ticks(tmp_path):
    assert tick_budget_problems(load_settings(ROOT / "deploy" / "governor.example.yaml")) == []
    scenario = load_scenario(ROOT / "controller" / "sim" / "demo" / "demo.yaml")
    demo = demo_settings(scenario, {"discovery": "http://127.0.0.1:1/sd", "router_control": "127.0.0.1:1",
                                    "autoscaler_control": "127.0.0.1:2"}, str(tmp_path))
    budget, _read, _act = tick_budget(demo)
    assert budget.fits and budget.read_s + budget.actuate_s <= PLAN_SHARE * demo.tick_interval_s
    assert tick_budget_problems(Settings(**{**demo.model_dump(mode="json"), "tick_interval_s": 2.5})) != []


def test_a_fleet_that_hangs_everywhere_costs_one_bounded_tick(tmp_path):
    """Discovery, every /metrics page and both control services hang: the tick ends within its period, the
    read at its round deadline and the actuation at what is left of the tick."""
    with FaultFleet({"a": (3, 4.0), "b": (2, 4.0)}, seed=4) as fleet:
        fleet.advance(3.0)
        with Governed(fleet, tmp_path / "state", tick_s=3.0) as g:
            g.tick()
            g.tick()
            for where in ("a", "b", "sd"):
                fleet.set_fault(where, "hang")
            for gate in (fleet.control.router.gate, fleet.control.autoscaler.gate):
                gate.faults.extend(["hang"] * 4)
            # the first hung tick still holds the decision in force; a pin forces a new command to send
            g.services.store.add_override("pin_replicas", ttl_s=600, author="t", now_s=g.clock.now_s(), value=5,
                                          pool="a", known_pools=["a", "b"])
            t0 = time.monotonic()
            rep = g.tick()
            wall = time.monotonic() - t0
            assert rep.result.frozen
            assert rep.outcome.status == "failed"
            assert {t.code for t in rep.outcome.targets.values()} == {"DEADLINE_EXCEEDED"}
            # read 0.9 s (2 × 0.2 + 0.5) + actuate 2 × 0.5 s + 0.1 s backoff = 2.0 s of a 3 s tick
            assert wall < 3.0, wall
