"""A fake DaemonHandle for the PolicyService tests: fixed pools, a settable status, recorded calls."""

from __future__ import annotations

import threading
from dataclasses import replace

from controller.api.server import ComponentStatus, PoolStatusView, StatusView
from controller.types import Mode


class FakeDaemon:
    def __init__(self, pools: tuple[str, ...] = ("pool-a", "pool-b"), *, refuse_modes: tuple[Mode, ...] = ()) -> None:
        self.pools = pools
        self.refuse_modes = refuse_modes
        self.mode_calls: list[tuple[Mode, str, str]] = []
        self.override_changes = 0
        self.refusal: str | None = None  # set: the daemon is a follower and refuses writes
        self._lock = threading.Lock()
        self._status = StatusView(
            mode=Mode.ACTIVE, profile="balanced", policy="first", last_tick_s=1_700_000_000.0,
            last_decision_id="d-00000007", generation=7,
            components=(ComponentStatus("telemetry:prometheus", True, "ok", 1_700_000_000.0),
                        ComponentStatus("actuator:router", False, "UNAVAILABLE", 0.0)),
            pools=tuple(PoolStatusView(p, replicas_desired=3, replicas_ready=2, ttft_p95_s=0.42, slo_ttft_s=1.0,
                                       hit_rate=0.5, telemetry="ok", gpu_mem_used_frac=0.93) for p in pools),
        )

    def status(self) -> StatusView:
        with self._lock:
            return self._status

    def set_mode(self, mode: Mode, author: str, reason: str) -> None:
        if mode in self.refuse_modes:
            raise ValueError(f"{mode.value} is not allowed right now")
        with self._lock:
            self.mode_calls.append((mode, author, reason))
            self._status = replace(self._status, mode=mode)

    def pool_names(self) -> tuple[str, ...]:
        return self.pools

    def on_overrides_changed(self) -> None:
        with self._lock:
            self.override_changes += 1

    def write_refusal(self) -> str | None:
        return self.refusal
