"""The composition root hands the Controller each pool's engine figures as data (the slow-replica detection
judges a replica's step time on them): the same figures the MPC plans with, for every policy."""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest

from controller.config import Settings
from controller.policies.mpc import MpcPolicy
from controller.runtime.main import build_controller

POOLS = [{"name": "chat", "model": "llama-3-8b", "sku": "a100-80gb", "gpus_per_replica": 1, "usd_per_gpu_hour": 4.1,
          "min_replicas": 1, "max_replicas": 8, "startup_warm_s": 20, "startup_cold_s": 90},
         {"name": "big", "model": "llama-3-70b", "sku": "h100-80gb", "gpus_per_replica": 4, "usd_per_gpu_hour": 6.0,
          "min_replicas": 1, "max_replicas": 4, "startup_warm_s": 30, "startup_cold_s": 180, "group": "big"}]


@pytest.mark.parametrize("policy", ["mpc", "slo-feedback", "hpa"])
def test_the_controller_gets_each_pools_resolved_engine_figures(tmp_path, policy) -> None:
    settings = Settings(policy=policy, state_dir=str(tmp_path), pools=POOLS)
    ctl = build_controller(settings)
    want = {n: e.figures for n, e in settings.engines().items()}
    assert set(want) == {"chat", "big"} and ctl.engine_figures == want
    if isinstance(ctl.policy, MpcPolicy):  # one set of figures: the planner's are the controller's
        assert ctl.policy.engine_figures == want


def test_figures_set_in_the_mpcs_parameters_win_for_the_controller_too(tmp_path) -> None:
    base = Settings(policy="mpc", state_dir=str(tmp_path), pools=POOLS).engines()["chat"].figures
    own = replace(base, a_s=base.a_s * 2.0)
    mine = {k: v for k, v in asdict(own).items() if k != "source"}
    ctl = build_controller(Settings(policy="mpc", policy_params={"engine_figures": {"chat": mine}},
                                    state_dir=str(tmp_path), pools=POOLS))
    assert ctl.engine_figures["chat"].a_s == pytest.approx(own.a_s)
    assert ctl.engine_figures["chat"] == ctl.policy.engine_figures["chat"]  # type: ignore[attr-defined]
    assert ctl.engine_figures["big"] == Settings(policy="mpc", state_dir=str(tmp_path), pools=POOLS).engines()[
        "big"].figures
