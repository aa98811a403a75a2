"""Fake Lease stores with the API server's optimistic concurrency: an in-memory one for the elector's
narrow interface, and a loopback HTTP server speaking the coordination.k8s.io/v1 Lease REST paths
for the real `kubernetes` client.

Both bump resourceVersion on every write and refuse a write carrying a stale one (409 Conflict),
as the API server does. The in-memory store hands out per-client views that can be partitioned
(every call fails) or lose the response of a write that did land.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from controller.runtime.leader import LeaseConflictError, LeaseRecord, LeaseUnavailableError


class FakeLeaseServer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: dict[str, LeaseRecord] = {}
        self._rv = 0
        self.writes = 0
        self.conflicts = 0

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def get(self, name: str) -> LeaseRecord | None:
        with self._lock:
            return self._leases.get(name)

    def create(self, name: str, record: LeaseRecord) -> LeaseRecord:
        with self._lock:
            if name in self._leases:
                self.conflicts += 1
                raise LeaseConflictError(f"leases {name!r} already exists")
            stored = replace(record, resource_version=self._next_rv())
            self._leases[name] = stored
            self.writes += 1
            return stored

    def update(self, name: str, record: LeaseRecord) -> LeaseRecord:
        with self._lock:
            cur = self._leases.get(name)
            if cur is None or record.resource_version != cur.resource_version:
                self.conflicts += 1
                raise LeaseConflictError(f"the object has been modified (rv {record.resource_version!r})")
            stored = replace(record, resource_version=self._next_rv())
            self._leases[name] = stored
            self.writes += 1
            return stored

    def client(self) -> FakeLeaseClient:
        return FakeLeaseClient(self)


class FakeLeaseClient:
    """One instance's connection to the fake API: `partitioned` fails every call; `lose_responses` lets
    writes land but reports them as failed (the reply was lost)."""

    def __init__(self, server: FakeLeaseServer) -> None:
        self.server = server
        self.partitioned = False
        self.lose_responses = False

    def _check(self) -> None:
        if self.partitioned:
            raise LeaseUnavailableError("partitioned from the API server")

    def get(self, name: str) -> LeaseRecord | None:
        self._check()
        return self.server.get(name)

    def create(self, name: str, record: LeaseRecord) -> LeaseRecord:
        self._check()
        out = self.server.create(name, record)
        if self.lose_responses:
            raise LeaseUnavailableError("reply lost")
        return out

    def update(self, name: str, record: LeaseRecord) -> LeaseRecord:
        self._check()
        out = self.server.update(name, record)
        if self.lose_responses:
            raise LeaseUnavailableError("reply lost")
        return out


_PATH = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases(?:/([^/?]+))?(?:\?.*)?$")


class LeaseApiServer:
    """coordination.k8s.io/v1 Leases over HTTP on 127.0.0.1: GET, POST (create) and PUT (replace) with
    resourceVersion checks, the paths and status codes of the API server. Stores the JSON bodies."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict] = {}
        self.rv = 0
        self.requests: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                with outer.lock:
                    outer.requests.append((self.command, self.path, code))

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                                  "reason": reason, "code": code})

            def _body(self) -> dict:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"{}")

            def _route(self) -> tuple[str, str | None] | None:
                m = _PATH.match(self.path)
                if m is None:
                    self._status(404, "NotFound", f"no route {self.path}")
                    return None
                return m.group(1), m.group(2)

            def do_GET(self) -> None:
                r = self._route()
                if r is None:
                    return
                with outer.lock:
                    obj = outer.objects.get((r[0], r[1] or ""))
                if obj is None:
                    self._status(404, "NotFound", f'leases.coordination.k8s.io "{r[1]}" not found')
                else:
                    self._send(200, obj)

            def do_POST(self) -> None:
                r = self._route()
                if r is None:
                    return
                body = self._body()
                name = body["metadata"]["name"]
                with outer.lock:
                    exists = (r[0], name) in outer.objects
                    if not exists:
                        outer.rv += 1
                        body["metadata"]["resourceVersion"] = str(outer.rv)
                        body["metadata"]["namespace"] = r[0]
                        outer.objects[(r[0], name)] = body
                if exists:
                    self._status(409, "AlreadyExists", f'leases.coordination.k8s.io "{name}" already exists')
                else:
                    self._send(201, body)

            def do_PUT(self) -> None:
                r = self._route()
                if r is None:
                    return
                body = self._body()
                key = (r[0], r[1] or "")
                with outer.lock:
                    cur = outer.objects.get(key)
                    sent_rv = body.get("metadata", {}).get("resourceVersion")
                    ok = cur is not None and (sent_rv is None or sent_rv == cur["metadata"]["resourceVersion"])
                    if ok:
                        outer.rv += 1
                        body["metadata"]["resourceVersion"] = str(outer.rv)
                        outer.objects[key] = body
                if cur is None:
                    self._status(404, "NotFound", f'leases.coordination.k8s.io "{r[1]}" not found')
                elif not ok:
                    self._status(409, "Conflict", "Operation cannot be fulfilled on leases.coordination.k8s.io "
                                 f'"{r[1]}": the object has been modified; please apply your changes to the '
                                 "latest version and try again")
                else:
                    self._send(200, body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> LeaseApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
