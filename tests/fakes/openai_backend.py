"""A tiny OpenAI-like replica on loopback: `/health`, `/v1/models` (with LoRA adapters), `/metrics` (the vLLM
queue and KV series a picker reads), `/v1/completions` (non-streaming, JSON).

Stands in for an engine behind a real router in the router-adapter tests. It counts the completions it
served and answers after `delay_s`, so requests are in flight while a router's membership changes.
`stop()` is a graceful shutdown: it stops accepting, lets the requests in flight finish, then closes.
Every response closes its connection, so a stopped replica holds no idle keep-alive connection.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins the handlers: requests in flight finish first
    block_on_close = True


class OpenAIBackend:
    def __init__(self, host: str, port: int, *, delay_s: float = 0.01, model: str = "m",
                 adapters: tuple[str, ...] = ()) -> None:
        self.adapters = adapters  # LoRA adapters listed at /v1/models (parent: the model)
        self.served = 0
        self.in_flight = 0
        self._lock = threading.Lock()
        self._delay = delay_s
        self._model = model
        self._server = _Server((host, port), self._handler())
        self.url = f"http://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        self.stopped = False

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)
                self.close_connection = True

            def do_GET(self) -> None:  # http.server's method name
                if self.path.startswith("/health"):
                    self._send(200, {})
                elif self.path.startswith("/v1/models"):
                    self._send(200, {"object": "list", "data": [{"id": backend._model, "object": "model"}]
                                     + [{"id": a, "object": "model", "parent": backend._model}
                                        for a in backend.adapters]})
                elif self.path.startswith("/metrics"):  # the vLLM series the picker reads
                    label = f'{{model_name="{backend._model}"}}'
                    text = (f"vllm:num_requests_running{label} {backend.in_flight}\n"
                            f"vllm:num_requests_waiting{label} 0\nvllm:kv_cache_usage_perc{label} 0.1\n").encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(text)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(text)
                    self.close_connection = True
                else:
                    self._send(404, {"error": f"no route {self.path}"})

            def do_POST(self) -> None:  # http.server's method name
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                if not self.path.startswith("/v1/completions"):
                    self._send(404, {"error": f"no route {self.path}"})
                    return
                with backend._lock:
                    backend.in_flight += 1
                time.sleep(backend._delay)  # the "generation": keeps the request in flight for a moment
                with backend._lock:
                    backend.in_flight -= 1
                    backend.served += 1
                self._send(200, {"id": "cmpl-1", "object": "text_completion", "model": backend._model,
                                 "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

        return Handler
