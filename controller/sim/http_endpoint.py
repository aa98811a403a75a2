"""A small threaded HTTP/1.1 server for the live simulator: path → callable returning (body, content type).

Serves each replica's, node's and the router's `/metrics` (always Prometheus'
classic text format) and the router's `/sd`; a replica's OpenAI-compatible API
(openai_api.py) comes in as `handlers`: (method, path) → a callable that writes the
whole response itself (a stream, for SSE). Connections are kept alive (HTTP/1.1), so
a proxy in front reuses them. Must not: know the fleet (routes are callables handed
in) or hold a route's lock longer than one render.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

log = logging.getLogger(__name__)


def host_port(host: str, port: int) -> str:
    """host:port, with IPv6 hosts bracketed."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


Handler = Callable[[BaseHTTPRequestHandler], None]


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # a proxy opens many connections at once; the default backlog is 5
    daemon_threads = True

    def __init__(self, *args, **kwargs) -> None:
        self.open_sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address) -> None:
        with self.sockets_lock:
            self.open_sockets.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        with self.sockets_lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Cut kept-alive connections too (a stopped replica serves nothing more)."""
        with self.sockets_lock:
            socks = list(self.open_sockets)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


class HttpEndpoint:
    """A small threaded HTTP server: path → callable returning (body, content type), plus raw handlers."""

    def __init__(self, host: str, routes: dict[str, Callable[[], tuple[bytes, str]]], name: str,
                 handlers: dict[tuple[str, str], Handler] | None = None) -> None:
        routes = dict(routes)
        raw = dict(handlers or {})

        class RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # headers and body go out in separate writes: with Nagle on, a kept-alive connection waits
            # for the peer's delayed ACK (~40 ms) before sending the body
            disable_nagle_algorithm = True

            def _raw(self, method: str) -> bool:
                fn = raw.get((method, self.path.split("?", 1)[0]))
                if fn is None:
                    return False
                try:
                    fn(self)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                except Exception as exc:  # report as a 500, never kill the server
                    log.exception("%s: %s %s failed", name, method, self.path)
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.send_error(500, str(exc))
                return True

            def do_POST(self) -> None:  # http.server's method name
                if not self._raw("POST"):
                    path = self.path.split("?", 1)[0]
                    known = path in routes or any(p == path for _, p in raw)
                    self.send_error(405 if known else 404, "method not allowed" if known else "not found")

            def do_GET(self) -> None:  # http.server's method name
                if self._raw("GET"):
                    return
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

        self.server = _Server((host, 0), RequestHandler)
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
        self.server.close_connections()
        self.thread.join(2.0)


def metrics_route(registry: CollectorRegistry, lock: threading.RLock) -> Callable[[], tuple[bytes, str]]:
    def render() -> tuple[bytes, str]:
        # Always the classic text format (0.0.4), which every Prometheus and our own scraper accept.
        with lock:
            return generate_latest(registry), CONTENT_TYPE_PLAIN_0_0_4

    return render

