"""Router membership: which replica URLs a router sends to, kept equal to the replicas that are ready.

`Endpoint` is one replica as the autoscaler adapter sees it (pool, id, URL, phase). A
`MembershipRouter` is a router with an admin API to add and remove workers; `sync` makes its
worker list equal to the ready endpoints of the pools it fronts: it adds a replica once it is
ready and removes one as soon as it is chosen to go (draining) or gone. `remove` is called by
the actuator *before* a scale-down is sent, so no new request reaches a replica that is about to
stop ("remove before drain").

`HttpRouter` is what the routers of this folder share: construction (admin URL, metrics URL,
pools, call timeout) and `reading()` from their per-worker Prometheus series.

Every router call has a timeout; a failed call is reported in the `SyncResult` (and retried at the
next sync), never raised. This module decides nothing about replica counts; it must not talk to
Kubernetes or to the engines.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.parser import text_string_to_metric_families

READY = "ready"
STARTING = "starting"
DRAINING = "draining"
STANDBY = "standby"
PHASES = (STARTING, READY, DRAINING, STANDBY)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One replica: its pool, a stable id (the pod name), the engine's base URL and its phase."""

    pool: str
    id: str
    url: str  # e.g. http://10.0.3.7:8000 (no trailing slash)
    phase: str  # one of PHASES


class RouterError(RuntimeError):
    """A router's admin API refused a call or could not be reached; the message names the call."""


@dataclass(frozen=True, slots=True)
class RouterReading:
    """What a router's own metrics say about each worker (by URL); empty when it has no metrics URL."""

    healthy: Mapping[str, bool] = field(default_factory=dict)
    requests_total: Mapping[str, float] = field(default_factory=dict)  # processed/served so far, per worker
    in_flight: Mapping[str, float] = field(default_factory=dict)  # only routers that export it


class MembershipRouter(Protocol):
    """A router whose worker list can be read and changed over HTTP."""

    kind: str  # "vllm-router" | "sglang-router"
    url: str
    pools: tuple[str, ...]  # the pools whose replicas it fronts; () = every pool

    def workers(self) -> set[str]: ...

    def add(self, url: str) -> None: ...

    def remove(self, url: str) -> None: ...

    def reading(self) -> RouterReading: ...


@dataclass
class SyncResult:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        parts = []
        if self.added:
            parts.append(f"added {', '.join(self.added)}")
        if self.removed:
            parts.append(f"removed {', '.join(self.removed)}")
        parts.extend(self.errors)
        return "; ".join(parts) or "in sync"


def fronts(router: MembershipRouter, pool: str) -> bool:
    return not router.pools or pool in router.pools


def sync(router: MembershipRouter, endpoints: Iterable[Endpoint]) -> SyncResult:
    """Make the router's worker list the ready endpoints of its pools (adds after removals)."""
    out = SyncResult()
    mine = [e for e in endpoints if fronts(router, e.pool)]
    want = {e.url for e in mine if e.phase == READY}
    try:
        have = router.workers()
    except RouterError as exc:
        out.errors.append(str(exc))
        return out
    for url in sorted(have - want):
        try:
            router.remove(url)
            out.removed.append(url)
        except RouterError as exc:
            out.errors.append(str(exc))
    for url in sorted(want - have):
        try:
            router.add(url)
            out.added.append(url)
        except RouterError as exc:
            out.errors.append(str(exc))
    return out


def remove_leaving(router: MembershipRouter, leaving: Iterable[Endpoint]) -> SyncResult:
    """Take the replicas chosen to go out of the router before the scale-down is sent."""
    out = SyncResult()
    urls = {e.url for e in leaving if fronts(router, e.pool)}
    if not urls:
        return out
    try:
        have = router.workers()
    except RouterError as exc:
        out.errors.append(str(exc))
        return out
    for url in sorted(urls & have):
        try:
            router.remove(url)
            out.removed.append(url)
        except RouterError as exc:
            out.errors.append(str(exc))
    return out


class HttpRouter:
    """What the routers of routers/ share: the admin URL, the pools fronted, the call timeout, the metrics.

    A subclass sets `kind` and the names of its per-worker metrics, and implements workers/add/remove.
    """

    kind = ""
    healthy_metric = ""
    requests_metric = ""
    in_flight_metric: str | None = None  # None: the router exports no per-worker in-flight gauge

    def __init__(self, url: str, *, metrics_url: str | None = None, pools: tuple[str, ...] = (),
                 timeout_s: float = 5.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 (got {timeout_s})")
        self.url = url.rstrip("/")
        self.metrics_url = metrics_url
        self.pools = tuple(pools)
        self.timeout_s = float(timeout_s)

    def reading(self) -> RouterReading:
        if not self.metrics_url:
            return RouterReading()
        status, body = http_call("GET", self.metrics_url, timeout_s=self.timeout_s, what=f"{self.kind} metrics")
        if status != 200:
            raise RouterError(f"{self.kind} metrics at {self.metrics_url}: HTTP {status}")
        return parse_worker_metrics(body.decode(errors="replace"), healthy=self.healthy_metric,
                                    requests=self.requests_metric, in_flight=self.in_flight_metric)


# --------------------------------------------------------------------------- shared HTTP plumbing


def http_call(method: str, url: str, *, timeout_s: float, body: object | None = None,
              what: str = "") -> tuple[int, bytes]:
    """One HTTP call; returns (status, body) for any HTTP answer, raises RouterError when unreachable."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # the URL comes from the config
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RouterError(f"{what or method} {url}: unreachable: {reason}") from None


def parse_worker_metrics(text: str, *, healthy: str, requests: str, in_flight: str | None) -> RouterReading:
    """Per-worker series of a router's Prometheus page (label `worker` = the worker URL)."""
    h: dict[str, bool] = {}
    r: dict[str, float] = {}
    f: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            worker = s.labels.get("worker")
            if worker is None or not math.isfinite(s.value):
                continue
            if s.name == healthy:
                h[worker] = s.value > 0
            elif s.name == requests:
                r[worker] = r.get(worker, 0.0) + s.value
            elif in_flight is not None and s.name == in_flight:
                f[worker] = s.value
    return RouterReading(healthy=h, requests_total=r, in_flight=f)
