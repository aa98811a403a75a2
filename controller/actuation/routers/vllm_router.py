"""vllm-router (PyPI `vllm-router`, a Rust proxy) as a MembershipRouter.

Admin API used: `GET /list_workers` → `{"urls": [...]}`, `POST /add_worker?url=U`,
`POST /remove_worker?url=U`. Adding a worker that is already there answers 400 "already exists"
(treated as done); removing an unknown one answers 200. vllm-router waits for a new worker's
health check before it answers `add_worker` (up to its `--worker-startup-timeout-secs`), so
Governor only adds replicas that are already ready and gives the call its own timeout.

Metrics (its `--prometheus-host/--prometheus-port` listener): `vllm_router_worker_health{worker}`
and `vllm_router_processed_requests_total{worker}`. It exports no per-worker in-flight gauge.

Must not: start or stop the router, or decide anything.
"""

from __future__ import annotations

import json
import urllib.parse

from controller.actuation.routers.membership import HttpRouter, RouterError, http_call


class VllmRouter(HttpRouter):
    kind = "vllm-router"

    healthy_metric = "vllm_router_worker_health"
    requests_metric = "vllm_router_processed_requests_total"
    in_flight_metric = None

    def _call(self, method: str, path: str, what: str) -> tuple[int, str]:
        status, body = http_call(method, self.url + path, timeout_s=self.timeout_s, what=f"vllm-router {what}")
        return status, body.decode(errors="replace").strip()

    def workers(self) -> set[str]:
        status, text = self._call("GET", "/list_workers", "list_workers")
        if status != 200:
            raise RouterError(f"vllm-router list_workers at {self.url}: HTTP {status}: {text[:200]}")
        try:
            urls = json.loads(text)["urls"]
        except (ValueError, KeyError, TypeError):
            raise RouterError(f"vllm-router list_workers at {self.url}: not the expected "
                              f"{{\"urls\": [...]}}: {text[:200]}") from None
        return {str(u).rstrip("/") for u in urls}

    def add(self, url: str) -> None:
        q = urllib.parse.urlencode({"url": url})
        status, text = self._call("POST", f"/add_worker?{q}", f"add_worker {url}")
        if status == 200 or (status == 400 and "already exists" in text):
            return
        raise RouterError(f"vllm-router add_worker {url} at {self.url}: HTTP {status}: {text[:200]}")

    def remove(self, url: str) -> None:
        q = urllib.parse.urlencode({"url": url})
        status, text = self._call("POST", f"/remove_worker?{q}", f"remove_worker {url}")
        if status != 200:
            raise RouterError(f"vllm-router remove_worker {url} at {self.url}: HTTP {status}: {text[:200]}")
