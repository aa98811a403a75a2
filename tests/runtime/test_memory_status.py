"""Memory headroom where an operator looks: `governor status` and the daemon's /metrics.

A daemon ticks once on a fixed reading of a busy pool whose fullest GPU has its framebuffer used
to a given share; the status's pool row and details, the proto `governor status` reads, and the
metrics registry carry it. No reading: none of them invents one.
"""

from __future__ import annotations

import logging
import math

import pytest

from controller.actuation.shadow import ShadowActuator
from controller.api.server import status_to_proto
from controller.api.store import StateStore
from controller.clock import VirtualClock
from controller.config import Settings
from controller.obs.daemon_metrics import DaemonMetrics
from controller.runtime.daemon import Daemon
from controller.runtime.learning import Learning
from controller.runtime.main import build_controller
from controller.types import FleetObservation, Mode
from tests.policies.builders import obs_row

POOLS = [{"name": "chat", "model": "llama-3-8b", "sku": "a100-80gb", "gpus_per_replica": 1, "usd_per_gpu_hour": 4.1,
          "min_replicas": 1, "max_replicas": 8, "startup_warm_s": 20, "startup_cold_s": 90}]


class _Fixed:
    name = "fixed"

    def __init__(self, fb: float | None) -> None:
        self.fb = fb

    def read(self, now_s: float) -> FleetObservation:
        row = obs_row("chat", ready=2, rps=12.0, prompt=12.0 * 1100, gen=12.0 * 210, hit_rate=0.3, tpot=0.04,
                      ttft=0.4, waiting=0.0, running=40, kv=0.3, gpu_mem_used_frac=self.fb)
        return FleetObservation(at_s=now_s, pools={"chat": row})

    def health(self) -> tuple[bool, str]:
        return True, "ok"


def _tick(tmp_path, fb: float | None):
    settings = Settings(policy="mpc", state_dir=str(tmp_path), pools=POOLS)
    clock = VirtualClock(1000.0)
    learning = Learning(settings.fleet_spec(), tmp_path, clock=clock, logger=logging.getLogger("test"))
    store = StateStore(tmp_path / "governor.db")
    metrics = DaemonMetrics()
    try:
        daemon = Daemon(controller=build_controller(settings, learning), source=_Fixed(fb), actuator=None,
                        shadow=ShadowActuator(clock=clock), store=store, metrics=metrics, clock=clock,
                        logger=logging.getLogger("test"), mode=Mode.SHADOW, learning=learning)
        daemon.tick()
        return daemon.status(), metrics
    finally:
        store.close()


def _sample(metrics: DaemonMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"pool": "chat"})


@pytest.mark.parametrize("fb, free_gib", [(0.9, 8.0), (0.99, 0.8)])
def test_status_and_metrics_show_the_framebuffer_headroom(tmp_path, fb, free_gib):
    status, metrics = _tick(tmp_path, fb)
    (pool,) = status.pools
    assert pool.gpu_mem_used_frac == pytest.approx(fb)
    assert status_to_proto(status).pools[0].gpu_mem_used_frac == pytest.approx(fb)
    detail = dict(status.details)["memory.chat"]
    assert f"FB {fb:.0%} used, {free_gib:.1f} of 80 GiB free" in detail
    ceiling = 8192 + int(max(free_gib - 1.0, 0.0) * 2**30 // 90_112)  # the caps in force when FB is full
    assert f"max_num_batched_tokens may rise to {ceiling}" in detail
    assert _sample(metrics, "governor_pool_gpu_memory_used_fraction") == pytest.approx(fb)
    assert _sample(metrics, "governor_pool_gpu_memory_free_bytes") == pytest.approx(free_gib * 2**30, rel=1e-3)
    assert _sample(metrics, "governor_pool_max_batched_tokens_ceiling") == ceiling


def test_no_reading_shows_none(tmp_path):
    status, metrics = _tick(tmp_path, None)
    assert math.isnan(status.pools[0].gpu_mem_used_frac)
    assert status_to_proto(status).pools[0].gpu_mem_used_frac == 0.0  # 0 = not read, as the proto says
    assert "memory.chat" not in dict(status.details)
    for name in ("governor_pool_gpu_memory_used_fraction", "governor_pool_gpu_memory_free_bytes",
                 "governor_pool_max_batched_tokens_ceiling"):
        v = _sample(metrics, name)
        assert v is not None and math.isnan(v), name
