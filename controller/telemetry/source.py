"""The telemetry-source interface and the description of one scrape target.

A source turns whatever the fleet exposes into one `FleetObservation` per read.
It never raises for bad or absent data: a failed query, a refused connection or
an old sample becomes a Reading with the matching SignalStatus and, for
transport problems, an entry in `FleetObservation.errors`. This module holds
types only; it must not do I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

from controller.names import ENGINE_KINDS, TARGET_KINDS
from controller.types import FleetObservation

__all__ = ["ENGINE_KINDS", "TARGET_KINDS", "ScrapeTarget", "TelemetrySource", "describe_error"]


@runtime_checkable
class TelemetrySource(Protocol):
    """Where observations come from (Prometheus, direct scrape, or the in-process simulator)."""

    name: str

    def read(self, now_s: float) -> FleetObservation:
        """One observation of the fleet at `now_s` (the caller's clock). Never raises for fleet trouble."""
        ...

    def health(self) -> tuple[bool, str]:
        """(healthy, one-line description) as of the last read; does no I/O."""
        ...

    def set_pools(self, pools: Sequence[str]) -> None:
        """The configured pools changed (a config reload): report these from the next read on."""
        ...


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    """One /metrics endpoint: an engine replica, a DCGM exporter or the router.

    `url` is the full metrics URL (in-process readers may use any unique string);
    `pool` is empty for the router; `labels` carries whatever discovery said
    about the target (replica id, node, …), for error messages and diagnostics.
    """

    url: str
    pool: str
    kind: str  # vllm | sglang | dcgm | router
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.kind not in TARGET_KINDS:
            raise ValueError(f"ScrapeTarget.kind: {self.kind!r} is not one of {list(TARGET_KINDS)}")
        if self.kind != "router" and not self.pool:
            raise ValueError(f"ScrapeTarget.pool: a {self.kind} target ({self.url}) needs a pool")

    @property
    def replica_id(self) -> str:
        """The replica this target is: discovery's `replica` label, else the address (host:port) of its URL
        (what the picker's endpoints and a pod's IP and port name too)."""
        rid = self.labels.get("replica")
        if rid:
            return rid
        return urlsplit(self.url).netloc or self.url

    @property
    def is_engine(self) -> bool:
        return self.kind in ENGINE_KINDS

    def describe(self) -> str:
        where = f"pool {self.pool}, " if self.pool else ""
        return f"{self.url} ({where}{self.kind})"


def describe_error(exc: BaseException) -> str:
    """A short, one-line description of a transport or parse failure, for FleetObservation.errors."""
    text = str(exc) or type(exc).__name__
    reason = getattr(exc, "reason", None)  # urllib's URLError wraps the socket error
    if reason is not None and str(reason) not in text:
        text = f"{text} ({reason})"
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:297] + "..."
