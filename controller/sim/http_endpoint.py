"""A small threaded HTTP server for the live simulator: path → callable returning (body, content type).

Serves each replica's, node's and the router's `/metrics` (always Prometheus'
classic text format) and the router's `/sd`. Must not: know the fleet (routes are
callables handed in) or hold a route's lock longer than one render.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

log = logging.getLogger(__name__)


def host_port(host: str, port: int) -> str:
    """host:port, with IPv6 hosts bracketed."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class HttpEndpoint:
    """A small threaded HTTP server: path → callable returning (body, content type)."""

    def __init__(self, host: str, routes: dict[str, Callable[[], tuple[bytes, str]]], name: str) -> None:
        routes = dict(routes)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's method name
                route = routes.get(self.path.split("?", 1)[0])
                if route is None:
                    self.send_error(404, "not found")
                    return
                try:
                    body, ctype = route()
                except Exception as exc:  # report as a 500, never kill the server
                    log.exception("%s: %s failed", name, self.path)
                    self.send_error(500, str(exc))
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args) -> None:
                log.debug("%s: " + fmt, name, *args)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.address = host_port(host, self.port)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name=f"http-{name}", daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://{self.address}{path}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(2.0)


def metrics_route(registry: CollectorRegistry, lock: threading.RLock) -> Callable[[], tuple[bytes, str]]:
    def render() -> tuple[bytes, str]:
        # Always the classic text format (0.0.4), which every Prometheus and our own scraper accept.
        with lock:
            return generate_latest(registry), CONTENT_TYPE_PLAIN_0_0_4

    return render

