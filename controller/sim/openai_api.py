"""The engines' HTTP API on a live simulated replica: OpenAI-compatible completions, health and models.

Each live replica (live.py) serves, next to its `/metrics`, what a vLLM server serves to a
router or a proxy:

- `POST /v1/completions` and `POST /v1/chat/completions`: non-streaming (one JSON body with
  `usage`) or streaming (`"stream": true`: Server-Sent Events, one `data: {...}` chunk per
  generated token, a last chunk with `finish_reason`, an optional usage chunk with
  `stream_options.include_usage`, then `data: [DONE]`);
- `GET /health` (200 while the engine is up), `GET /v1/models` (the served model).

The request is injected into the simulated engine (`Replica.add`) and the reply follows the
engine in real time × speed: the first token when the engine's prefill step ends, then each
token as the engine's decode steps produce it (seen at the live fleet's advance granularity,
`step_wall_s`). A crash of the replica ends the stream (500, or a cut stream after the first
token, as a dying vLLM server does); a replica that is draining or gone answers 503.

Token counts. The simulated engine needs token counts, not text: the prompt's length is
estimated from its text by the common rule of thumb of ~4 characters per token (each
whitespace-separated word counts ceil(len / 4) tokens; chat messages are joined with their
roles), unless the request carries the extension field `prompt_tokens` (an int: an exact
count from a real tokenizer, which a replayer of token-count traces sends). Prefix caching
works on blocks of those pseudo-tokens: block k's id is a hash chained over blocks 0..k, so
two prompts sharing their first N blocks of text share N cached blocks. Output length is
`max_tokens` (default 16, vLLM's default for completions); generation never stops early.
The priority class is the `x-governor-class` header (critical | standard | sheddable; default
standard), which the engine's priority scheduling uses.

Must not: route (the proxy in front chose this replica), model the engine (engine.py), or
hold the fleet's lock while writing to a socket.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from controller.sim.engine_records import DONE, RUNNING, SEG_DEAD, SEG_JUMP, WAITING, ReplicaBase, Req
from controller.sim.fleet_records import Inst
from controller.types import PRIORITY_CLASSES

if TYPE_CHECKING:
    from controller.sim.engine import Replica
    from controller.sim.fleet import Fleet

log = logging.getLogger(__name__)

CLASS_HEADER = "x-governor-class"
REPLICA_HEADER = "x-governor-replica"
DEFAULT_MAX_TOKENS = 16
CHARS_PER_TOKEN = 4
MAX_BODY_BYTES = 8 << 20
# Requests that cannot finish in this many wall seconds are aborted (a stuck client, a stalled clock).
REQUEST_TIMEOUT_S = 600.0
_WORDS = ("the", "fleet", "serves", "tokens", "on", "time", "and", "within", "its", "budget")


class ApiError(Exception):
    """A request the API refuses: HTTP status and an OpenAI-style message naming what was wrong."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


# =========================================================================== tokens


def pseudo_tokens(text: str) -> list[str]:
    """Split text into ~4-character pseudo-tokens (each word: ceil(len / 4) of them)."""
    out: list[str] = []
    for word in text.split():
        out.extend(word[i:i + CHARS_PER_TOKEN] for i in range(0, len(word), CHARS_PER_TOKEN))
    return out


def block_ids(tokens: list[str], block_tokens: int) -> tuple[int, ...]:
    """Chained 63-bit ids of the full `block_tokens`-token blocks of a prompt (id k covers blocks 0..k)."""
    ids: list[int] = []
    h = hashlib.blake2b(digest_size=8)
    for k in range(len(tokens) // block_tokens):
        h.update("\x1f".join(tokens[k * block_tokens:(k + 1) * block_tokens]).encode())
        h.update(b"\x1e")
        ids.append(int.from_bytes(h.copy().digest(), "big") >> 1)
    return tuple(ids)


def chat_text(messages: object) -> str:
    """The text a chat template would feed the engine: `role: content` per message."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages: must be a non-empty list of {role, content} objects")
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}]: must be an object with a string 'role'")
        content = m.get("content", "")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content: must be a string or a list of text parts")
        parts.append(f"{m['role']}: {content}")
    return "\n".join(parts)


@dataclass(frozen=True)
class CompletionRequest:
    """What the engine needs from a parsed request body."""

    chat: bool
    model: str
    prompt_tokens: int
    units: tuple[int, ...]
    max_tokens: int
    stream: bool
    include_usage: bool
    prio: int


def parse_request(body: bytes, *, chat: bool, served_model: str, block_tokens: int,
                  priority_class: str | None) -> CompletionRequest:
    """Validate a completions / chat completions body. Raises ApiError naming the bad field."""
    try:
        req = json.loads(body or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"body: not valid JSON ({exc})") from None
    if not isinstance(req, dict):
        raise ApiError(400, "body: must be a JSON object")
    model = req.get("model", served_model)
    if not isinstance(model, str) or (model and model != served_model):
        raise ApiError(404, f"model: the model {model!r} does not exist; this server serves {served_model!r}",
                       "NotFoundError")
    if chat:
        text = chat_text(req.get("messages"))
    else:
        prompt = req.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ApiError(400, "prompt: must be a string (batched prompts are not supported)")
        text = prompt
    toks = pseudo_tokens(text)
    n_prompt = req.get("prompt_tokens", len(toks))
    if type(n_prompt) is not int or n_prompt < 1:
        raise ApiError(400, f"prompt_tokens: {n_prompt!r} must be an int >= 1 (the prompt's token count)")
    max_tokens = req.get("max_tokens", req.get("max_completion_tokens", DEFAULT_MAX_TOKENS))
    if type(max_tokens) is not int or max_tokens < 1:
        raise ApiError(400, f"max_tokens: {max_tokens!r} must be an int >= 1")
    stream = req.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, f"stream: {stream!r} must be true or false")
    opts = req.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise ApiError(400, "stream_options: must be an object")
    cls = (priority_class or "standard").strip().lower()
    if cls not in PRIORITY_CLASSES:
        raise ApiError(400, f"{CLASS_HEADER}: unknown priority class {cls!r}; allowed: {list(PRIORITY_CLASSES)}")
    # An explicit count larger than the text: the cacheable blocks are those the text has.
    units = block_ids(toks, block_tokens)[: n_prompt // block_tokens]
    return CompletionRequest(chat, served_model, n_prompt, units, max_tokens, stream,
                             bool(opts.get("include_usage", False)), PRIORITY_CLASSES.index(cls))


# =========================================================================== engine side


class ExternalRequest(Req):
    """A request that came in over HTTP, not from the scenario's workload (idx < 0).

    The fleet's client logic never sees it: the replica's sink (`ReplicaSink`) hands its first
    token and finish to these fields instead, and a crash leaves it to its HTTP handler.
    """

    __slots__ = ("first_s", "finish_s", "failure")

    def __init__(self, prio: int, prompt: int, output: int, units: tuple[int, ...]) -> None:
        super().__init__(-1, prio, -1, 0, prompt, output, units)
        self.first_s = -1.0
        self.finish_s = -1.0
        self.failure = ""


class Progress:
    """A counter the live fleet bumps after every advance of its clock; HTTP handlers wait on it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.seq = 0

    def bump(self) -> None:
        with self._cond:
            self.seq += 1
            self._cond.notify_all()

    def wait(self, seen: int, timeout_s: float) -> None:
        """Return once the counter moved past `seen` (read it before looking at the fleet) or after timeout_s."""
        with self._cond:
            self._cond.wait_for(lambda: self.seq != seen, timeout_s)


class ReplicaSink:
    """The engine's sink for one live replica: HTTP requests end here, workload requests go to the fleet.

    It runs under the fleet's lock, inside the advance; the handlers see its effects after the
    live fleet's next `Progress.bump`.
    """

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def push(self, t_s: float, kind: int, a: object, b: object) -> None:
        self.fleet.push(t_s, kind, a, b)

    def on_first_token(self, r: Req, t_s: float) -> None:
        if isinstance(r, ExternalRequest):
            r.first_s = t_s
        else:
            self.fleet.on_first_token(r, t_s)

    def on_finish(self, r: Req, t_s: float, rep: ReplicaBase) -> None:
        if not isinstance(r, ExternalRequest):
            self.fleet.on_finish(r, t_s, rep)
            return
        r.finish_s = t_s
        # a slot freed up: workload requests the simulated router holds for this pool may go on
        inst = rep.owner
        if isinstance(inst, Inst) and inst.pool.route.n_held:
            self.fleet._dispatch_held(inst.pool)

    def on_reject(self, r: Req, t_s: float, rep: ReplicaBase) -> None:
        if isinstance(r, ExternalRequest):
            r.failure = "the request does not fit in the replica's KV cache"
        else:
            self.fleet.on_reject(r, t_s, rep)

    def on_empty(self, rep: ReplicaBase, t_s: float) -> None:
        self.fleet.on_empty(rep, t_s)


def generated_tokens(rep: Replica, r: ExternalRequest, now_s: float) -> int:
    """Tokens the engine has produced for `r` by simulated time `now_s` (call under the fleet's lock)."""
    if r.state == DONE:
        return r.e_out
    if r.rep is not rep or r.state not in (WAITING, RUNNING):
        return r.e_gen
    if not r.d_in:
        return r.e_gen
    g = r.d_g0 + rep.dstep
    if rep.seg_kind == SEG_JUMP:
        # the jump's steps done so far have produced tokens the engine applies at the jump's end
        g += min(rep._steps_done(now_s), rep.seg_k)
    return min(g, r.e_out)


# =========================================================================== HTTP side


class ReplicaApi:
    """The HTTP API of one live replica: parses, injects into `engine` under `lock`, streams the reply.

    `progress` is bumped by the live fleet after every advance of the clock; `on_served(replica
    id)` is called once per request the engine accepted (requests counted at the replica).
    """

    def __init__(self, fleet: Fleet, engine: Replica, lock: threading.RLock, progress: Progress,
                 *, served_model: str, max_model_len: int, on_served: Callable[[str], None]) -> None:
        self.fleet = fleet
        self.engine = engine
        self.lock = lock
        self.progress = progress
        self.served_model = served_model
        self.max_model_len = max_model_len
        self.on_served = on_served
        self.block_tokens = max(1, engine.unit_tokens)
        self.created = int(time.time())
        self._seq = 0
        self._seq_lock = threading.Lock()

    # ------------------------------------------------------------------ GET routes

    def health(self) -> tuple[int, bytes, str]:
        with self.lock:
            up = self.engine.seg_kind != SEG_DEAD and not self.engine.draining
        return (200, b"", "text/plain") if up else (503, b"replica is not serving\n", "text/plain")

    def models(self) -> tuple[int, bytes, str]:
        body = {"object": "list", "data": [{"id": self.served_model, "object": "model", "created": self.created,
                                            "owned_by": "governor-sim", "root": self.served_model,
                                            "max_model_len": self.max_model_len}]}
        return 200, json.dumps(body).encode(), "application/json"

    # ------------------------------------------------------------------ completions

    def handle(self, h: BaseHTTPRequestHandler, body: bytes, *, chat: bool) -> None:
        try:
            req = parse_request(body, chat=chat, served_model=self.served_model, block_tokens=self.block_tokens,
                                priority_class=h.headers.get(CLASS_HEADER))
            if req.prompt_tokens + req.max_tokens > self.max_model_len:
                raise ApiError(400, f"prompt ({req.prompt_tokens} tokens) + max_tokens ({req.max_tokens}) exceeds "
                                    f"the model's context length ({self.max_model_len})")
            r = self._inject(req)
        except ApiError as exc:
            send_json(h, exc.status, {"error": {"message": str(exc), "type": exc.kind, "code": exc.status}})
            return
        with self._seq_lock:
            self._seq += 1
            rid = f"cmpl-{self.engine.rid}-{self._seq}"
        try:
            if req.stream:
                self._stream(h, req, r, rid)
            else:
                self._unary(h, req, r, rid)
        except (BrokenPipeError, ConnectionResetError):
            log.debug("%s: client went away; aborting %s", self.engine.rid, rid)
        finally:
            with self.lock:
                if r.rep is self.engine and r.state in (WAITING, RUNNING):
                    self.engine.abort(r, float(self.fleet.now_s))

    def _inject(self, req: CompletionRequest) -> ExternalRequest:
        r = ExternalRequest(req.prio, req.prompt_tokens, req.max_tokens, req.units)
        with self.lock:
            eng = self.engine
            if eng.seg_kind == SEG_DEAD or eng.draining:
                raise ApiError(503, f"replica {eng.rid} is not serving (draining or gone)", "ServiceUnavailable")
            if req.prompt_tokens + req.max_tokens > eng.capacity_tokens:
                raise ApiError(400, f"prompt + max_tokens ({req.prompt_tokens + req.max_tokens} tokens) cannot fit "
                                    f"in this replica's KV cache ({eng.capacity_tokens} tokens)")
            eng.add(r, float(self.fleet.now_s))
        self.on_served(eng.rid)
        return r

    def _wait(self, r: ExternalRequest, have: int, deadline: float) -> tuple[int, bool, str]:
        """Block until the engine produced more than `have` tokens, finished or failed: (tokens, done, failure)."""
        while True:
            seen = self.progress.seq
            with self.lock:
                n = generated_tokens(self.engine, r, float(self.fleet.now_s))
                if r.failure:
                    return n, True, r.failure
                if r.state == DONE:
                    return r.e_out, True, ""
                if r.rep is not self.engine:
                    return n, True, f"replica {self.engine.rid} failed while serving the request"
            if n > have:
                return n, False, ""
            left = deadline - time.monotonic()
            if left <= 0:
                return n, True, f"timed out after {REQUEST_TIMEOUT_S:g} s"
            self.progress.wait(seen, min(left, 1.0))

    def _unary(self, h: BaseHTTPRequestHandler, req: CompletionRequest, r: ExternalRequest, rid: str) -> None:
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        n, done = 0, False
        failure = ""
        while not done:
            n, done, failure = self._wait(r, n, deadline)
        if failure:
            send_json(h, 500, {"error": {"message": failure, "type": "InternalServerError", "code": 500}},
                      self.engine.rid)
            return
        text = synthetic_text(0, r.e_out)
        choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text},
                                   "finish_reason": "length"} if req.chat else
                                  {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"})
        send_json(h, 200, {"id": rid, "object": "chat.completion" if req.chat else "text_completion",
                           "created": int(time.time()), "model": req.model, "choices": [choice],
                           "usage": usage(req.prompt_tokens, r.e_out)}, self.engine.rid)

    def _stream(self, h: BaseHTTPRequestHandler, req: CompletionRequest, r: ExternalRequest, rid: str) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Cache-Control", "no-cache")
        h.send_header("Transfer-Encoding", "chunked")
        h.send_header(REPLICA_HEADER, self.engine.rid)
        h.end_headers()
        created = int(time.time())
        kind = "chat.completion.chunk" if req.chat else "text_completion"
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        sent, done = 0, False
        while not done:
            n, done, failure = self._wait(r, sent, deadline)
            if failure:
                # a dying server cuts the stream: no finish_reason, no [DONE]
                log.info("%s: %s: %s", self.engine.rid, rid, failure)
                write_chunk(h, b"")
                return
            parts = []
            for i in range(sent, n):
                delta = ({"role": "assistant", "content": synthetic_text(i, i + 1)} if i == 0 else
                         {"content": synthetic_text(i, i + 1)}) if req.chat else None
                choice = ({"index": 0, "delta": delta, "finish_reason": None} if req.chat else
                          {"index": 0, "text": synthetic_text(i, i + 1), "logprobs": None, "finish_reason": None})
                parts.append(sse({"id": rid, "object": kind, "created": created, "model": req.model,
                                  "choices": [choice]}))
            sent = max(sent, n)
            if parts:
                write_chunk(h, b"".join(parts))
        tail = [sse({"id": rid, "object": kind, "created": created, "model": req.model,
                     "choices": [{"index": 0, **({"delta": {}} if req.chat else {"text": "", "logprobs": None}),
                                  "finish_reason": "length"}]})]
        if req.include_usage:
            tail.append(sse({"id": rid, "object": kind, "created": created, "model": req.model, "choices": [],
                             "usage": usage(req.prompt_tokens, r.e_out)}))
        tail.append(b"data: [DONE]\n\n")
        write_chunk(h, b"".join(tail))
        write_chunk(h, b"")


def synthetic_text(i0: int, i1: int) -> str:
    """The text of generated tokens i0..i1-1 (a fixed word cycle: the content is not the point)."""
    return "".join(" " + _WORDS[i % len(_WORDS)] for i in range(i0, i1))


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def write_chunk(h: BaseHTTPRequestHandler, data: bytes) -> None:
    """One HTTP/1.1 chunk (an empty one ends the body)."""
    h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    h.wfile.flush()


def send_json(h: BaseHTTPRequestHandler, status: int, obj: dict, replica: str = "") -> None:
    body = json.dumps(obj).encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(body)))
    if replica:
        h.send_header(REPLICA_HEADER, replica)
    h.end_headers()
    h.wfile.write(body)


def read_body(h: BaseHTTPRequestHandler) -> bytes:
    """The request body (Content-Length or chunked); ApiError 400/413 when it cannot be read."""
    if "chunked" in (h.headers.get("Transfer-Encoding") or "").lower():
        out = bytearray()
        while True:
            line = h.rfile.readline(64)
            try:
                size = int(line.split(b";", 1)[0].strip() or b"x", 16)
            except ValueError:
                raise ApiError(400, "body: malformed chunked encoding") from None
            if size == 0:
                h.rfile.readline(64)
                return bytes(out)
            if len(out) + size > MAX_BODY_BYTES:
                raise ApiError(413, f"body: larger than {MAX_BODY_BYTES} bytes")
            out += h.rfile.read(size)
            h.rfile.readline(64)
    try:
        n = int(h.headers.get("Content-Length") or 0)
    except ValueError:
        raise ApiError(400, "Content-Length: not an integer") from None
    if not (0 <= n <= MAX_BODY_BYTES):
        raise ApiError(413, f"body: {n} bytes; at most {MAX_BODY_BYTES}")
    return h.rfile.read(n) if n else b""
