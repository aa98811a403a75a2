"""A streaming OpenAI-style replica on loopback for the data-plane tests through real Envoy, and a client call.

`StreamingReplica` streams TOKENS server-sent events per completion, TOKEN_S apart (an engine's decode pace); with
`cut_after` it closes the connection after that many (no terminating chunk: the stream is cut); with
`reset_after_read` it reads the whole request and then resets the connection (TCP RST) before any response byte —
an engine that may have begun work. It counts the completions it received and the scrapes of its /metrics;
`close()` stops it listening (a replica gone: connections refused).
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from http.client import IncompleteRead
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKENS = 6
TOKEN_S = 0.05  # between tokens, as an engine decodes: the response has begun at the client before a cut


class StreamingReplica:
    def __init__(self, cut_after: int | None = None, reset_after_read: bool = False) -> None:
        self.started = 0
        self.scrapes = 0
        self._lock = threading.Lock()
        replica = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # http.server's method name; the picker's scrape
                body = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n"
                if self.path == "/metrics":
                    with replica._lock:
                        replica.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # http.server's method name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with replica._lock:
                    replica.started += 1
                if reset_after_read:
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()  # linger 0: the close is a reset
                    self.close_connection = True
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i in range(TOKENS):
                    time.sleep(TOKEN_S)  # a decode step's pace (the replica's own, not a wait for a condition)
                    if cut_after is not None and i == cut_after:
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                        return
                    ev = f"data: {json.dumps({'choices': [{'text': f't{i} '}]})}\n\n".encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(ev), ev))
                    self.wfile.flush()
                done = b"data: [DONE]\n\n"
                self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
                self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        self._closed = False

    def close(self) -> None:
        """Stop listening: new connections to its address are refused (its port stays unused by this process)."""
        if not self._closed:
            self._closed = True
            self._server.shutdown()
            self._server.server_close()

    stop = close


def post(url: str, group: str, headers: dict[str, str], prompt: str = "plan the next step",
         timeout_s: float = 15.0) -> tuple[int, bytes, bool]:
    """(status, body, complete) of one streaming completion through Envoy to route group `group`."""
    body = json.dumps({"prompt": prompt, "max_tokens": TOKENS, "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, method="POST",
                                 headers={"content-type": "application/json", "x-governor-route-group": group,
                                          **headers})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            try:
                return r.status, r.read(), True
            except IncompleteRead as exc:
                return r.status, exc.partial, False
    except urllib.error.HTTPError as e:
        return e.code, e.read(), True
