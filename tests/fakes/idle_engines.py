"""Idle vLLM replicas as the picker scrapes them: only /metrics, nothing running or waiting, a tenth of the KV
cache used, so every request gets an endpoint. For picker tests that need real scrape targets on loopback."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Metrics(BaseHTTPRequestHandler):
    BODY = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n"

    def do_GET(self):  # http.server's method name
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.BODY)))
        self.end_headers()
        self.wfile.write(self.BODY)

    def log_message(self, *args):  # quiet
        pass


@contextmanager
def idle_engines(n: int) -> Iterator[list[str]]:
    """`n` idle replicas on free loopback ports; yields their "host:port" addresses, stops them on exit."""
    engines = [ThreadingHTTPServer(("127.0.0.1", 0), _Metrics) for _ in range(n)]
    for e in engines:
        threading.Thread(target=e.serve_forever, daemon=True).start()
    try:
        yield [f"127.0.0.1:{e.server_address[1]}" for e in engines]
    finally:
        for e in engines:
            e.shutdown()
            e.server_close()
