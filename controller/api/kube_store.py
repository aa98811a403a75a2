"""The state operators set, in the Kubernetes API server: one GovernorState object per Lease.

Under leader election the replicas of a shard share one namespaced custom resource
(`governorstates.governor.llm-d.ai`, deploy/kubernetes/governorstate-crd.yaml) named after the shard's
Lease. It holds what must survive a failover: the mode, the objective profile, the overrides (active and
the expired ones still listed), the newest AUDIT_KEEP audit entries and the refit gate's last verdict.
`kubectl get governorstates` lists it; RBAC decides who may read or edit it.

`KubeStateStore` is the SQLite `StateStore` (generation and decision records stay per pod) whose
replicated part is a copy of that object:

- every mutation (override set/delete/expiry, mode, profile, audit, refit verdict) runs in one SQLite
  transaction that, before it commits, writes the whole replicated state to the object with the
  resourceVersion it last read. A 409 Conflict rolls the transaction back, re-reads the object and runs
  the mutation again (at most CONFLICT_RETRIES times): nothing is half-applied, on either side;
- fencing: the object records its writer's term (`spec.writer.epoch`, the Lease's epoch of
  controller/runtime/leader.py). A replica writes only while it leads, and never over an object a later
  term has written: a deposed leader's write either carries a stale resourceVersion (409, then it reads
  the later epoch) or reads it first, and is refused with `FencedError`. So two replicas never both win;
- `sync()` (every tick, and before every mutation) reads the object and, when its resourceVersion moved,
  replaces the local overrides, audit trail, mode and profile with it. A follower serves reads from that
  copy; the replica that takes the Lease syncs, then `claim()`s the object for its term.

Must not: decide anything, or talk to anything but the API server (through the official client).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from controller.api.store import StateStore, StoreError

GROUP, VERSION, PLURAL, KIND = "governor.llm-d.ai", "v1alpha1", "governorstates", "GovernorState"
AUDIT_KEEP = 1000  # audit entries kept in the object (~250 bytes each: 0.25 MB of etcd's 1.5 MB object limit)
CONFLICT_RETRIES = 3


class StateUnavailableError(StoreError):
    """The API server could not be reached or refused the call (5xx, 403, timeout)."""


class StateConflictError(StoreError):
    """The object changed since it was read (409) on every attempt."""


class FencedError(StoreError):
    """This replica does not lead, or a later term has written the object: it may not write."""


class GovernorStateApi:
    """GET, create and replace of one GovernorState through `kubernetes.client.CustomObjectsApi`."""

    def __init__(self, namespace: str, name: str, api: Any = None, *, timeout_s: float = 5.0) -> None:
        from kubernetes import client

        self.namespace = namespace
        self.name = name
        self.api = api if api is not None else client.CustomObjectsApi()
        self.timeout_s = timeout_s

    @classmethod
    def from_environment(cls, namespace: str, name: str, kubeconfig: str | None,
                         timeout_s: float) -> GovernorStateApi:
        """In-cluster service account config, or a kubeconfig file when one is named."""
        from kubernetes import client

        from controller.rpc.kubeclient import api_client_for

        api_client = api_client_for(kubeconfig, "leader_election")
        return cls(namespace, name, client.CustomObjectsApi(api_client), timeout_s=timeout_s)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        where = f"{KIND} {self.namespace}/{self.name}"
        try:
            return fn(GROUP, VERSION, self.namespace, PLURAL, *args, _request_timeout=self.timeout_s)
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status == 409:
                raise StateConflictError(f"{where} changed concurrently ({exc.reason})") from None
            hint = " (is deploy/kubernetes/governorstate-crd.yaml applied, and does the Role grant it?)" \
                if exc.status in (403, 404) else ""
            raise StateUnavailableError(f"{where}: the API server answered {exc.status} {exc.reason}{hint}") from None
        except (HTTPError, OSError) as exc:
            raise StateUnavailableError(f"{where}: the API server is unreachable ({exc})") from None

    def get(self) -> dict | None:
        return self._call(self.api.get_namespaced_custom_object, self.name)

    def create(self, spec: dict) -> dict:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec}
        out = self._call(self.api.create_namespaced_custom_object, body)
        if out is None:
            raise StateUnavailableError(f"{KIND} {self.namespace}/{self.name}: create answered 404 (is the CRD "
                                        "deploy/kubernetes/governorstate-crd.yaml applied?)")
        return out

    def replace(self, seen: dict, spec: dict) -> dict:
        """Replace the object last seen as `seen`; 409 (StateConflictError) when it changed since."""
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": seen["metadata"]["resourceVersion"]}, "spec": spec}
        out = self._call(self.api.replace_namespaced_custom_object, self.name, body)
        if out is None:
            raise StateConflictError(f"{KIND} {self.namespace}/{self.name} was deleted since it was read")
        return out


def _override_row(o: dict) -> tuple:
    return (str(o["id"]), str(o["kind"]), str(o.get("pool", "")), str(o.get("priorityClass", "")),
            float(o.get("value", 0.0)), str(o.get("text", "")), str(o.get("author", "")), str(o.get("reason", "")),
            float(o["createdAt"]), float(o["expiresAt"]), 1 if o.get("expiryLogged") else 0)


class KubeStateStore(StateStore):
    """StateStore whose overrides, mode, profile, audit trail and refit verdict are replicated in a GovernorState."""

    replicated = True

    def __init__(self, path: str, api: GovernorStateApi, *, identity: str, audit_keep: int = AUDIT_KEEP,
                 **kwargs: Any) -> None:
        self._writing = False  # inside a mutation: the transaction is written to the object before it commits
        super().__init__(path, **kwargs)
        self.api = api
        self.identity = identity
        self.audit_keep = audit_keep
        self._epoch: Callable[[], int] = lambda: 0  # the term this replica leads (0: not leading)
        self._seen: dict | None = None  # the object as last read or written

    def bind(self, epoch: Callable[[], int]) -> None:
        """The leader elector's term: writes are allowed while it is > 0 and no later term has written."""
        self._epoch = epoch

    # ------------------------------------------------------------------ reading the object

    @property
    def writer(self) -> tuple[str, int]:
        """(identity, epoch) of the last write as last seen; ("", 0) before any."""
        w = ((self._seen or {}).get("spec") or {}).get("writer") or {}
        return str(w.get("identity", "")), int(w.get("epoch", 0))

    def sync(self) -> bool:
        """Read the object; when it changed since last seen, make the local copy equal to it. True if it changed.

        The read happens under the store's lock, as every mutation's read-write-commit does: a read that
        left before a mutation's write and answered after it would otherwise put the older object back."""
        with self._lock:
            obj = self.api.get()
            if obj is None or (self._seen is not None and
                               obj["metadata"]["resourceVersion"] == self._seen["metadata"]["resourceVersion"]):
                return False
            self._seen = obj
            self._import(obj.get("spec") or {})
            return True

    def claim(self, now_s: float) -> bool:
        """The leader marks the object with its term (once per term, audited), so a deposed leader's writes are
        fenced. True when it wrote."""
        epoch = self._epoch()
        if epoch <= 0 or self.writer == (self.identity, epoch):
            return False
        self._mutate(lambda: self.add_audit(self.identity, "leader.claim", f"term {epoch} takes the state over "
                                            f"(last written by {self.writer[0] or 'nobody'}, term {self.writer[1]})",
                                            now_s=now_s))
        return True

    def _import(self, spec: dict) -> None:
        with StateStore._tx(self) as c:
            c.execute("DELETE FROM overrides")
            c.executemany("INSERT INTO overrides (id, kind, pool, priority_class, value, text, author, reason, "
                          "created_s, expires_s, expiry_logged) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                          [_override_row(o) for o in spec.get("overrides") or []])
            c.execute("DELETE FROM audit")
            c.executemany("INSERT INTO audit (seq, at_s, author, action, detail, caller) VALUES (?, ?, ?, ?, ?, ?)",
                          [(int(a["seq"]), float(a["at"]), str(a.get("author", "")), str(a.get("action", "")),
                            str(a.get("detail", "")), str(a.get("caller", ""))) for a in spec.get("audit") or []])
            for key, value in (("mode", spec.get("mode")), ("profile", spec.get("profile")),
                               ("override_seq", str(spec.get("overrideSeq") or 0)),
                               ("refit", json.dumps(spec["refit"]) if spec.get("refit") else None)):
                if value:
                    self._set_meta(c, key, str(value))
                else:
                    c.execute("DELETE FROM meta WHERE key=?", (key,))

    # ------------------------------------------------------------------ writing it

    def _export(self, c: sqlite3.Connection) -> dict:
        overrides = [{"id": r[0], "kind": r[1], "pool": r[2], "priorityClass": r[3], "value": r[4], "text": r[5],
                      "author": r[6], "reason": r[7], "createdAt": r[8], "expiresAt": r[9],
                      "expiryLogged": bool(r[10])}
                     for r in c.execute(f"SELECT {self._OVERRIDE_COLS}, expiry_logged FROM overrides "
                                        "ORDER BY created_s, id")]
        audit = [{"seq": r[0], "at": r[1], "author": r[2], "action": r[3], "detail": r[4], "caller": r[5]}
                 for r in c.execute("SELECT seq, at_s, author, action, detail, caller FROM audit ORDER BY seq DESC "
                                    "LIMIT ?", (self.audit_keep,))][::-1]
        refit = self._get_meta(c, "refit")
        spec: dict[str, Any] = {"overrideSeq": int(self._get_meta(c, "override_seq") or 0), "overrides": overrides,
                                "audit": audit}
        for key in ("mode", "profile"):
            value = self._get_meta(c, key)
            if value:
                spec[key] = value
        if refit:
            spec["refit"] = json.loads(refit)
        return spec

    def _push(self, c: sqlite3.Connection) -> None:
        spec = self._export(c)
        seen_spec = dict((self._seen or {}).get("spec") or {})
        seen_spec.pop("writer", None)
        if self._seen is not None and spec == seen_spec:
            return  # the mutation changed nothing that is replicated (e.g. no override expired)
        epoch = self._epoch()
        if epoch <= 0:
            raise FencedError("this replica does not lead its shard: only the leader writes the shared state")
        if self.writer[1] > epoch:
            raise FencedError(f"term {self.writer[1]} ({self.writer[0]}) has written the shared state since this "
                              f"replica led (term {epoch}): it no longer leads")
        spec["writer"] = {"identity": self.identity, "epoch": epoch}
        self._seen = self.api.create(spec) if self._seen is None else self.api.replace(self._seen, spec)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock, super()._tx() as c:
            yield c
            if self._writing:
                self._push(c)  # raises before the commit: the local transaction rolls back with it

    def _mutate(self, fn: Callable[[], Any]) -> Any:
        """Run one mutation so that it lands in the object and the local copy together, or in neither."""
        for attempt in range(CONFLICT_RETRIES + 1):
            self.sync()
            with self._lock:
                self._writing = True
                try:
                    return fn()
                except StateConflictError:
                    if attempt == CONFLICT_RETRIES:
                        raise
                finally:
                    self._writing = False
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ the mutations, replicated

    def add_override(self, kind: str, **kwargs: Any):
        return self._mutate(lambda: StateStore.add_override(self, kind, **kwargs))

    def delete_override(self, override_id: str, **kwargs: Any) -> bool:
        return self._mutate(lambda: StateStore.delete_override(self, override_id, **kwargs))

    def set_mode(self, mode, **kwargs: Any):
        return self._mutate(lambda: StateStore.set_mode(self, mode, **kwargs))

    def set_profile(self, profile: str, **kwargs: Any):
        return self._mutate(lambda: StateStore.set_profile(self, profile, **kwargs))

    def add_audit(self, author: str, action: str, detail: str, **kwargs: Any) -> None:
        if self._writing:  # already inside a mutation (claim)
            return StateStore.add_audit(self, author, action, detail, **kwargs)
        return self._mutate(lambda: StateStore.add_audit(self, author, action, detail, **kwargs))

    def expire_overrides(self, now_s: float):
        """The leader audits expiries (and the object keeps them); a follower only reads."""
        if self._epoch() <= 0:
            return []
        return self._mutate(lambda: StateStore.expire_overrides(self, now_s))

    def set_refit(self, verdict: dict) -> None:
        """The refit gate's last verdict (RefitOutcome.to_dict() and who ran it), replicated."""
        def write() -> None:
            with self._tx() as c:
                self._set_meta(c, "refit", json.dumps(verdict, sort_keys=True))
        self._mutate(write)

    def get_refit(self) -> dict | None:
        with self._lock:
            raw = self._get_meta(self._conn, "refit")
        return json.loads(raw) if raw else None
