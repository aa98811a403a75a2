"""The daemon's MPC budget counts wall time by default, or the thread's CPU time (`budget_clock: cpu`)."""

from __future__ import annotations

import time

import pytest

from controller.clock import budget_timer
from controller.config import Settings
from controller.policies.mpc import MpcPolicy
from controller.runtime.main import build_controller

POOLS = [{"name": "chat", "model": "llama-3-8b", "sku": "a100-80gb", "gpus_per_replica": 1, "usd_per_gpu_hour": 4.1,
          "min_replicas": 1, "max_replicas": 8, "startup_warm_s": 20, "startup_cold_s": 90}]


@pytest.mark.parametrize("params, want", [({}, "monotonic_s"), ({"budget_clock": "wall"}, "monotonic_s"),
                                          ({"budget_clock": "cpu"}, "thread_time")])
def test_the_daemon_hands_the_planner_the_clock_its_budget_counts(tmp_path, params, want) -> None:
    settings = Settings(policy="mpc", policy_params=params, state_dir=str(tmp_path), pools=POOLS)
    policy = build_controller(settings).policy
    assert isinstance(policy, MpcPolicy) and policy.timer is not None
    assert policy.timer.__name__ == want
    assert budget_timer("cpu") is time.thread_time


def test_an_unknown_budget_clock_is_refused_by_name(tmp_path) -> None:
    with pytest.raises(ValueError, match="budget_clock must be one of wall, cpu .got 'gpu'"):
        build_controller(Settings(policy="mpc", policy_params={"budget_clock": "gpu"}, state_dir=str(tmp_path),
                                  pools=POOLS))
