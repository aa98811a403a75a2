"""sglang-router (PyPI `sglang-router`, the `smg launch` gateway) as a MembershipRouter.

Admin API used: `GET /workers` → `{"workers": [{"id", "url", "is_healthy", ...}]}`,
`POST /workers` with `{"url": U}` and `DELETE /workers/{id}` (the id is the UUID from the list).
Both changes answer 202 and run in the background, so `add` and `remove` wait (polling the list,
bounded by the call timeout) until the change shows, and "remove before drain" really holds when
`remove` returns.

Metrics (its `--prometheus-host/--prometheus-port` listener): `smg_worker_health{worker}`,
`smg_worker_requests_active{worker}` (in flight) and `smg_worker_cb_outcomes_total{worker,outcome}`
(summed as the worker's requests so far).

Must not: start or stop the router, or decide anything.
"""

from __future__ import annotations

import json
import time
import urllib.parse

from controller.actuation.routers.membership import HttpRouter, RouterError, http_call

_POLL_S = 0.05


class SglangRouter(HttpRouter):
    kind = "sglang-router"

    healthy_metric = "smg_worker_health"
    requests_metric = "smg_worker_cb_outcomes_total"
    in_flight_metric = "smg_worker_requests_active"

    def _list(self) -> dict[str, str]:
        """url → worker id."""
        status, body = http_call("GET", self.url + "/workers", timeout_s=self.timeout_s,
                                 what="sglang-router list workers")
        text = body.decode(errors="replace")
        if status != 200:
            raise RouterError(f"sglang-router GET /workers at {self.url}: HTTP {status}: {text[:200]}")
        try:
            return {str(w["url"]).rstrip("/"): str(w["id"]) for w in json.loads(text)["workers"]}
        except (ValueError, KeyError, TypeError):
            raise RouterError(f"sglang-router GET /workers at {self.url}: not the expected "
                              f"{{\"workers\": [...]}}: {text[:200]}") from None

    def workers(self) -> set[str]:
        return set(self._list())

    def _wait(self, url: str, present: bool, what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while (url in self._list()) != present:
            if time.monotonic() >= deadline:
                raise RouterError(f"sglang-router {what} {url} at {self.url}: accepted (202) but not "
                                  f"{'listed' if present else 'gone'} after {self.timeout_s:g} s")
            time.sleep(_POLL_S)  # the router applies the change in the background: poll its list

    def add(self, url: str) -> None:
        if url in self._list():
            return
        status, body = http_call("POST", self.url + "/workers", timeout_s=self.timeout_s, body={"url": url},
                                 what=f"sglang-router add {url}")
        if status not in (200, 201, 202):
            raise RouterError(f"sglang-router POST /workers {url} at {self.url}: HTTP {status}: "
                              f"{body.decode(errors='replace')[:200]}")
        self._wait(url, True, "add")

    def remove(self, url: str) -> None:
        wid = self._list().get(url)
        if wid is None:
            return
        status, body = http_call("DELETE", f"{self.url}/workers/{urllib.parse.quote(wid)}",
                                 timeout_s=self.timeout_s, what=f"sglang-router remove {url}")
        if status not in (200, 202, 404):
            raise RouterError(f"sglang-router DELETE /workers/{wid} ({url}) at {self.url}: HTTP {status}: "
                              f"{body.decode(errors='replace')[:200]}")
        self._wait(url, False, "remove")
