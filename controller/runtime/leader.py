"""Leader election per shard on a Kubernetes `coordination.k8s.io/v1` Lease.

Several daemons of one shard (a set of pools, `leader_election.shards` in the config) contend for
the shard's Lease; only the holder actuates and serves write RPCs, the others decide in shadow so
their telemetry windows, policy state and models stay warm. The algorithm is client-go's
leaderelection, on the Lease's optimistic concurrency (an update carrying a stale resourceVersion
is refused with 409 Conflict):

- a candidate reads the Lease; if another holder's record has not changed for `lease_duration_s`
  *as measured on the candidate's own monotonic clock since it first received that record*, the lease is
  free and the candidate writes itself as holder (leaseTransitions + 1). Wall-clock times in the
  Lease are informative only, so clock offsets between nodes do not matter, only clock rates;
- the holder renews every `retry_period_s`; it stops actuating (`leading()` turns False)
  `renew_deadline_s` after the start of its last successful renewal. Since any other candidate's
  expiry is measured from after that renewal was written, it cannot take over earlier than
  `lease_duration_s` after it, and `renew_deadline_s + clock_skew_margin_s < lease_duration_s`
  leaves a margin for clock-rate differences and for the check-then-send gap of the actuation;
- fencing: each term's epoch is its leaseTransitions; the daemon numbers its decisions from
  `generation_floor()` (epoch << 32) upwards, so every decision of a later term has a higher
  generation than any of an earlier term, and the actuators, which refuse a generation lower than
  the one they applied (protos/governor/v1/control.proto), drop a late command of a deposed leader
  (e.g. one paused between its `leading()` check and the send).

The holder publishes its address, its mode and its applied replica targets as Lease annotations,
so a follower can name the leader in a refusal, follow the leader's mode (and keep it after a
takeover) and serve KEDA the leader's targets.

This module must not decide or actuate anything: it answers "may I lead now?".
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from controller.clock import Clock

EPOCH_SHIFT = 32  # a term may issue up to 2**32 generations before it would reach the next term's floor
ANNOTATION_ADDRESS = "governor.llm-d.ai/leader-address"
ANNOTATION_TARGETS = "governor.llm-d.ai/replica-targets"
ANNOTATION_MODE = "governor.llm-d.ai/mode"


class LeaseConflictError(Exception):
    """The Lease changed since it was read (409), or it already exists on create."""


class LeaseUnavailableError(Exception):
    """The Lease API could not be reached or refused the call (network, 5xx, 403)."""


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    holder: str
    duration_s: int
    acquire_time_s: float
    renew_time_s: float
    transitions: int
    annotations: Mapping[str, str] = field(default_factory=dict)
    resource_version: str = ""  # set by the store; an update must carry the one it read


class LeaseStore(Protocol):
    """The narrow part of the Lease API the elector uses. Implementations raise LeaseConflictError on a
    stale resourceVersion (update) or an existing Lease (create), LeaseUnavailableError otherwise."""

    def get(self, name: str) -> LeaseRecord | None: ...

    def create(self, name: str, record: LeaseRecord) -> LeaseRecord: ...

    def update(self, name: str, record: LeaseRecord) -> LeaseRecord: ...


# --------------------------------------------------------------------------- Kubernetes


def _dt(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _ts(value: Any) -> float:
    return value.timestamp() if isinstance(value, datetime) else 0.0


class KubernetesLeaseStore:
    """Leases through the official client (`kubernetes.client.CoordinationV1Api`) in one namespace."""

    def __init__(self, namespace: str, api: Any = None, *, timeout_s: float = 5.0) -> None:
        from kubernetes import client

        self._client = client
        self.namespace = namespace
        self.api = api if api is not None else client.CoordinationV1Api()
        self.timeout_s = timeout_s

    @classmethod
    def from_environment(cls, namespace: str, kubeconfig: str | None, timeout_s: float) -> KubernetesLeaseStore:
        """In-cluster service account config, or a kubeconfig file when one is named."""
        from kubernetes import client

        from controller.rpc.kubeclient import api_client_for

        api_client = api_client_for(kubeconfig, "leader_election")
        return cls(namespace, client.CoordinationV1Api(api_client), timeout_s=timeout_s)

    def _record(self, lease: Any) -> LeaseRecord:
        spec = lease.spec
        return LeaseRecord(holder=spec.holder_identity or "", duration_s=int(spec.lease_duration_seconds or 0),
                           acquire_time_s=_ts(spec.acquire_time), renew_time_s=_ts(spec.renew_time),
                           transitions=int(spec.lease_transitions or 0),
                           annotations=dict(lease.metadata.annotations or {}),
                           resource_version=lease.metadata.resource_version or "")

    def _body(self, name: str, r: LeaseRecord) -> Any:
        c = self._client
        return c.V1Lease(
            api_version="coordination.k8s.io/v1", kind="Lease",
            metadata=c.V1ObjectMeta(name=name, namespace=self.namespace, annotations=dict(r.annotations),
                                    resource_version=r.resource_version or None),
            spec=c.V1LeaseSpec(holder_identity=r.holder, lease_duration_seconds=r.duration_s,
                               acquire_time=_dt(r.acquire_time_s), renew_time=_dt(r.renew_time_s),
                               lease_transitions=r.transitions))

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, _request_timeout=self.timeout_s)
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status == 409:
                raise LeaseConflictError(f"lease changed concurrently: {exc.reason}") from None
            raise LeaseUnavailableError(f"Lease API answered {exc.status} {exc.reason}") from None
        except (HTTPError, OSError) as exc:
            raise LeaseUnavailableError(f"Lease API unreachable: {exc}") from None

    def get(self, name: str) -> LeaseRecord | None:
        lease = self._call(self.api.read_namespaced_lease, name, self.namespace)
        return None if lease is None else self._record(lease)

    def create(self, name: str, record: LeaseRecord) -> LeaseRecord:
        lease = self._call(self.api.create_namespaced_lease, self.namespace,
                           self._body(name, replace(record, resource_version="")))
        if lease is None:
            raise LeaseUnavailableError(f"namespace {self.namespace!r} not found")
        return self._record(lease)

    def update(self, name: str, record: LeaseRecord) -> LeaseRecord:
        lease = self._call(self.api.replace_namespaced_lease, name, self.namespace, self._body(name, record))
        if lease is None:  # deleted since read
            raise LeaseConflictError(f"lease {name!r} was deleted")
        return self._record(lease)


# --------------------------------------------------------------------------- the elector


@dataclass(frozen=True, slots=True)
class ElectionTiming:
    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    clock_skew_margin_s: float = 2.0

    def __post_init__(self) -> None:
        if self.lease_duration_s < 1:
            raise ValueError(f"lease_duration_s must be >= 1 (got {self.lease_duration_s})")
        if not 0 < self.retry_period_s < self.renew_deadline_s:
            raise ValueError(f"retry_period_s ({self.retry_period_s:g}) must be > 0 and < renew_deadline_s "
                             f"({self.renew_deadline_s:g}): a leader must get several renewals in per deadline")
        if self.renew_deadline_s + self.clock_skew_margin_s >= self.lease_duration_s:
            raise ValueError(f"renew_deadline_s + clock_skew_margin_s ({self.renew_deadline_s:g} + "
                             f"{self.clock_skew_margin_s:g}) must be < lease_duration_s ({self.lease_duration_s}): "
                             "a leader must stop before its lease can expire elsewhere")


class LeaderElector:
    """One candidate for one Lease. `attempt()` is one acquire-or-renew round (the runtime calls it
    every retry period from a thread, tests call it directly); `leading()` is the actuation gate."""

    def __init__(self, store: LeaseStore, lease_name: str, identity: str, *, clock: Clock,
                 timing: ElectionTiming = ElectionTiming(), logger: logging.Logger | None = None,
                 annotations: Callable[[], Mapping[str, str]] | None = None,
                 on_change: Callable[[bool], None] | None = None) -> None:
        if not identity:
            raise ValueError("leader election needs a non-empty identity (e.g. the pod name)")
        self.store = store
        self.lease_name = lease_name
        self.identity = identity
        self.clock = clock
        self.timing = timing
        self.log = logger or logging.getLogger("governor")
        self._annotations = annotations
        self._on_change = on_change
        self._lock = threading.Lock()
        self._is_leader = False
        self._renewed_at = float("-inf")  # monotonic start of the last successful acquire/renew
        self._epoch = 0
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0  # monotonic time the observed record (its resourceVersion) was first seen
        self.transitions_seen = 0  # times this candidate became or stopped being the leader
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def set_annotations(self, annotations: Callable[[], Mapping[str, str]]) -> None:
        """What the holder publishes on every renewal (called from the election thread: must not block)."""
        self._annotations = annotations

    # ---------------------------------------------------------------- queries

    def leading(self, within_s: float = 0.0) -> bool:
        """True while this candidate holds the lease and will still be inside its renew deadline
        `within_s` seconds from now."""
        with self._lock:
            return self._is_leader and self.clock.monotonic_s() + within_s < (
                self._renewed_at + self.timing.renew_deadline_s)

    def generation_floor(self) -> int:
        """The lowest generation this term may issue (0 when not leading)."""
        with self._lock:
            return self._epoch << EPOCH_SHIFT if self._is_leader else 0

    def leader(self) -> tuple[str, Mapping[str, str]]:
        """The holder as last observed (identity, annotations); ("", {}) when none is known."""
        with self._lock:
            r = self._observed
            return (r.holder, dict(r.annotations)) if r is not None else ("", {})

    def leader_targets(self) -> dict[str, int]:
        """The replica targets the holder published (for a follower's KEDA answers)."""
        raw = self.leader()[1].get(ANNOTATION_TARGETS, "")
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            return {}
        return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}

    # ---------------------------------------------------------------- one round

    def attempt(self) -> bool:
        """One acquire-or-renew round. Returns whether this candidate leads afterwards."""
        t0 = self.clock.monotonic_s()
        try:
            ok = self._try(t0)
        except (LeaseConflictError, LeaseUnavailableError) as exc:
            self.log.debug(f"lease {self.lease_name}: {exc}", extra={"event": "leader_election"})
            ok = False
        if not ok:
            with self._lock:
                # Still inside the deadline of an earlier renewal: keep leading, retry next period.
                lost = self._is_leader and self.clock.monotonic_s() >= self._renewed_at + self.timing.renew_deadline_s
            if lost:
                self._set_leader(False, "could not renew within renew_deadline_s")
        return self.leading()

    def _observe(self, record: LeaseRecord, at: float) -> None:
        with self._lock:
            if self._observed is None or record.resource_version != self._observed.resource_version:
                self._observed, self._observed_at = record, at

    def _try(self, t0: float) -> bool:
        now_wall = self.clock.now_s()
        current = self.store.get(self.lease_name)
        ann = dict(self._annotations()) if self._annotations is not None else {}
        if current is None:
            new = LeaseRecord(self.identity, self.timing.lease_duration_s, now_wall, now_wall, 0, ann)
            written = self.store.create(self.lease_name, new)
            self._won(written, t0)
            return True
        # Observed when the answer arrived, not when the request left: the record may have been written
        # while the GET was in flight, and expiry must count from after the holder's renewal started.
        seen_at = self.clock.monotonic_s()
        self._observe(current, seen_at)
        with self._lock:
            observed_at = self._observed_at
            # Renewing our own term; a record naming us that this term did not write (we lost it, or
            # a restarted container with the same pod name) starts a new term, so the epoch moves on.
            mine = current.holder == self.identity and self._is_leader
        if current.holder and current.holder != self.identity and seen_at < observed_at + current.duration_s:
            if self._is_leader:
                self._set_leader(False, f"lease held by {current.holder}")
            return False
        new = LeaseRecord(
            holder=self.identity, duration_s=self.timing.lease_duration_s,
            acquire_time_s=current.acquire_time_s if mine else now_wall, renew_time_s=now_wall,
            transitions=current.transitions if mine else current.transitions + 1,
            annotations={**current.annotations, **ann}, resource_version=current.resource_version)
        written = self.store.update(self.lease_name, new)
        self._won(written, t0)
        return True

    def _won(self, written: LeaseRecord, t0: float) -> None:
        self._observe(written, t0)
        with self._lock:
            became = not self._is_leader
            self._renewed_at = t0
            if became:
                self._epoch = written.transitions + 1  # +1: the first term (transitions 0) is epoch 1
        if became:
            self._set_leader(True, f"acquired (leaseTransitions {written.transitions})")

    def _set_leader(self, leading: bool, why: str) -> None:
        with self._lock:
            if self._is_leader == leading:
                return
            self._is_leader = leading
            self.transitions_seen += 1
        level = logging.WARNING if not leading else logging.INFO
        self.log.log(level, f"lease {self.lease_name}: {'leading' if leading else 'following'} ({why})",
                     extra={"event": "leader", "lease": self.lease_name, "identity": self.identity,
                            "leading": leading})
        if self._on_change is not None:
            self._on_change(leading)

    def release(self) -> None:
        """Give the lease up (on shutdown) so a follower takes over at its next retry, not after expiry."""
        with self._lock:
            was = self._is_leader
            observed = self._observed
        if not was or observed is None or observed.holder != self.identity:
            return
        self._set_leader(False, "released on shutdown")
        try:
            self.store.update(self.lease_name, replace(observed, holder="", duration_s=1,
                                                       renew_time_s=self.clock.now_s()))
        except (LeaseConflictError, LeaseUnavailableError) as exc:
            self.log.warning(f"lease {self.lease_name}: release failed ({exc}); it expires on its own",
                             extra={"event": "leader"})

    # ---------------------------------------------------------------- thread

    def start(self) -> None:
        """Run `attempt()` every retry period on a thread (wall time), until `stop()`."""
        def run() -> None:
            while not self._stop.is_set():
                self.attempt()
                self._stop.wait(self.timing.retry_period_s)

        self._thread = threading.Thread(target=run, name=f"governor-lease-{self.lease_name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timing.retry_period_s + 10)
            self._thread = None
        self.release()
