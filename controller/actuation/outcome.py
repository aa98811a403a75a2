"""What an actuator reports back: one ActuationOutcome per decision, and the fleet state it sees.

Values only (frozen dataclasses) plus the `Actuator` protocol the runtime drives.
This module does no I/O and imports no gRPC, so the runtime, the bench and the
API can depend on it cheaply.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from controller.types import Decision

# Outcome statuses, per target and for the whole decision.
APPLIED = "applied"  # the target accepted and applied the command
REPLAY = "replay"  # the target had already applied this generation and decision id: nothing changed
STALE = "stale"  # the target has applied a newer generation: rejected
INVALID = "invalid"  # the target rejected the command as a whole (nothing applied)
FAILED = "failed"  # transport failure after the bounded retries, or the validity deadline passed
SHADOW = "shadow"  # recorded, deliberately not sent
SKIPPED = "skipped"  # no target configured for this part of the decision

STATUSES: tuple[str, ...] = (APPLIED, REPLAY, STALE, INVALID, FAILED, SHADOW, SKIPPED)

# When targets disagree, the whole decision takes the worst status (first in this list).
_SEVERITY: tuple[str, ...] = (FAILED, INVALID, STALE, APPLIED, REPLAY, SHADOW, SKIPPED)


@dataclass(frozen=True, slots=True)
class TargetResult:
    """The result of sending one command (routing policy or scaling plan) to one target."""

    target: str  # "router" | "autoscaler"
    status: str  # one of STATUSES
    attempts: int = 0  # calls made (0 when skipped or shadow)
    applied_generation: int = 0  # the generation the target reports as applied (0 = unknown)
    detail: str = ""
    code: str = ""  # last gRPC status code name on failure, e.g. "UNAVAILABLE"; "" otherwise

    def __str__(self) -> str:
        """The status alone, so `str(result)` is a safe metric label or log word."""
        return self.status


@dataclass(frozen=True, slots=True)
class ActuationOutcome:
    decision_id: str
    generation: int
    status: str  # one of STATUSES: the worst of the per-target statuses
    detail: str = ""
    attempts: int = 0  # total calls over all targets
    duration_s: float = 0.0  # clock time spent, including backoff waits
    targets: Mapping[str, TargetResult] = field(default_factory=dict)  # by target name, in sending order

    @property
    def ok(self) -> bool:
        """True when nothing went wrong (applied, an idempotent replay, shadow or nothing to send)."""
        return self.status in (APPLIED, REPLAY, SHADOW, SKIPPED)

    def target(self, name: str) -> TargetResult | None:
        return self.targets.get(name)


def combine_status(statuses: list[str] | tuple[str, ...]) -> str:
    """The worst status of several targets; SKIPPED when there is none.

    Example: ("applied", "replay") → "applied"; ("applied", "failed") → "failed".
    """
    present = [s for s in statuses if s != SKIPPED]
    if not present:
        return SKIPPED
    return min(present, key=_SEVERITY.index)


@dataclass(frozen=True, slots=True)
class PoolStateView:
    """One pool as the autoscaler reports it."""

    pool: str
    target_replicas: int
    ready: int
    starting: int
    draining: int
    standby: int
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    unavailable: int = 0  # asked for and not coming: pending past the pool's start-up time (core/capacity.py)


@dataclass(frozen=True, slots=True)
class FleetStateView:
    applied_generation: int
    applied_decision_id: str = ""
    fallback_active: bool = False  # the last command expired; the fleet runs its own defaults
    pools: Mapping[str, PoolStateView] = field(default_factory=dict)


class Actuator(Protocol):
    """Turns a Decision into commands to the fleet. One ActuationOutcome per decision, never an exception
    for transport problems."""

    def apply(self, decision: Decision) -> ActuationOutcome: ...

    def fleet_state(self) -> FleetStateView | None:
        """What the autoscaler reports now; None when unknown (no autoscaler, or it did not answer)."""
        ...

    def health(self) -> tuple[bool, str]: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class TargetHealth:
    """Health of one actuation target, for the daemon's status (ComponentHealth in policy.proto)."""

    name: str  # e.g. "actuator:router"
    healthy: bool
    detail: str
    last_ok_s: float = 0.0  # clock time of the last applied/replayed command (0 = never)
