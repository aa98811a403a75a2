"""Builders for FleetObservation rows in table tests."""

from __future__ import annotations

from typing import Any

from controller.types import FleetObservation, PoolObservation, Reading, SignalStatus


def ok(v: float) -> Reading:
    return Reading(float(v))


def pool_obs(name: str, *, ready: float | None = 2, starting: float = 0, arrival: float | None = 5.0,
             ttft: float | None = 0.5, running: float | None = 10, waiting: float | None = 0,
             stale: bool = False, **extra: float) -> PoolObservation:
    def r(v: float | None) -> Reading:
        if stale:
            return Reading(float(v) if v is not None else float("nan"), SignalStatus.STALE, 999.0)
        return Reading.of(v)

    fields: dict[str, Any] = {k: r(v) for k, v in extra.items()}
    return PoolObservation(pool=name, replicas_ready=r(ready), replicas_starting=r(starting), arrival_rps=r(arrival),
                           ttft_p95_s=r(ttft), running=r(running), waiting=r(waiting), **fields)


def fleet_obs(at_s: float, *pools: PoolObservation) -> FleetObservation:
    return FleetObservation(at_s=at_s, pools={p.pool: p for p in pools}, source="test")
