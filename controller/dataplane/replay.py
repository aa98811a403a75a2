"""`governor replay TRACE --url URL`: a small, bounded async client that replays a trace over HTTP.

Each trace request becomes an OpenAI-compatible streaming request (`/v1/completions`, or
`/v1/chat/completions` with `--chat`) sent at its arrival time (÷ `--time-scale`), with
`max_tokens` = its output length (capped by `--max-output`) and a priority class drawn from
`--class-mix` (header `x-governor-class`). Its prompt text is synthetic: ~4 characters per token
(the simulated engine's estimate, openai_api.py); the trace's prefix-block ids become shared
text blocks, so requests sharing hash ids share a prompt prefix; the body also carries the
exact count as `prompt_tokens` (a Governor extension a real engine ignores).

Client-side measures per request: TTFT (send → first streamed token), TPOT ((last − first
token) / (tokens − 1)), end-to-end time and the HTTP status. Bounds: `--concurrency` in flight
(later arrivals wait, and that wait counts in their TTFT, as a real client's would),
`--max-requests`, `--duration` (no new sends after it) and a per-request `--timeout`. Stopped
early (SIGINT or SIGTERM; the demo stopping), it prints the summary of the requests that finished.

The HTTP/1.1 client is asyncio streams, one connection per request (no third-party client is a
dependency). Must not: retry (a rejected request is counted, as the simulator's clients see it),
or send anywhere but the URL given.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from controller.types import PRIORITY_CLASSES


@dataclass
class Result:
    cls: str
    status: int = 0  # 0: no response (connection error or timeout)
    ttft_s: float = math.nan
    tpot_s: float = math.nan
    e2e_s: float = math.nan
    tokens: int = 0
    error: str = ""
    replica: str = ""


@dataclass
class ReplayRequest:
    at_s: float
    cls: str
    body: bytes


@dataclass
class Summary:
    results: list[Result] = field(default_factory=list)
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        ok = [r for r in self.results if r.status == 200 and not r.error]
        codes: dict[str, int] = {}
        for r in self.results:
            if r.status != 200 or r.error:
                k = str(r.status) if r.status else "no_response"
                codes[k] = codes.get(k, 0) + 1

        def pct(vals: list[float], q: float) -> float | None:
            v = [x for x in vals if math.isfinite(x)]
            return round(float(np.percentile(v, q)), 6) if v else None

        rps = round(len(self.results) / self.wall_s, 2) if self.wall_s else 0.0
        out = {"requests": len(self.results), "ok": len(ok), "errors": sum(codes.values()), "errors_by_status": codes,
               "wall_s": round(self.wall_s, 3), "rps": rps}
        for name, vals in (("ttft_s", [r.ttft_s for r in ok]), ("tpot_s", [r.tpot_s for r in ok]),
                           ("e2e_s", [r.e2e_s for r in ok])):
            out[name] = {"p50": pct(vals, 50), "p95": pct(vals, 95), "p99": pct(vals, 99)}
        out["by_class"] = {c: {"requests": sum(r.cls == c for r in self.results),
                               "ok": sum(r.cls == c for r in ok)} for c in PRIORITY_CLASSES}
        return out


def block_text(block_id: int, tokens: int) -> str:
    """`tokens` 4-character words derived from a prefix-block id (the same id → the same text)."""
    words = []
    for i in range((tokens + 7) // 8):
        words.append(hashlib.blake2b(f"{block_id}:{i}".encode(), digest_size=16).hexdigest())
    text = " ".join(w[j:j + 4] for w in words for j in range(0, 32, 4))
    return " ".join(text.split()[:tokens])


def synth_prompt(prompt_tokens: int, block_ids: tuple[int, ...], block_tokens: int, rng: random.Random) -> str:
    parts = [block_text(b, block_tokens) for b in block_ids[: prompt_tokens // block_tokens]]
    rest = prompt_tokens - len(parts) * block_tokens
    if rest > 0:
        parts.append(block_text(rng.getrandbits(62), rest))
    return " ".join(parts)


def build_requests(trace, *, chat: bool, model: str, max_requests: int, time_scale: float, start_s: float,
                   class_mix: tuple[float, float, float], max_output: int, seed: int,
                   until_s: float = math.inf) -> list[ReplayRequest]:
    """The first `max_requests` trace requests from `start_s` on, sent before `until_s`, as HTTP bodies."""
    rng = random.Random(seed)
    out: list[ReplayRequest] = []
    weights = list(class_mix)
    for i in range(len(trace)):
        t = float(trace.arrival_s[i])
        if t < start_s:
            continue
        if len(out) >= max_requests or (t - start_s) / time_scale > until_s:
            break
        n_prompt = int(trace.prompt_tokens[i])
        ids = trace.block_hashes[i] if trace.block_hashes is not None else ()
        text = synth_prompt(n_prompt, tuple(ids), int(trace.hash_block_tokens), rng)
        req: dict = {"max_tokens": max(1, min(int(trace.output_tokens[i]), max_output)), "stream": True,
                     "prompt_tokens": n_prompt}
        if model:
            req["model"] = model
        if chat:
            req["messages"] = [{"role": "user", "content": text}]
        else:
            req["prompt"] = text
        cls = rng.choices(PRIORITY_CLASSES, weights)[0]
        out.append(ReplayRequest((t - start_s) / time_scale, cls, json.dumps(req).encode()))
    return out


async def _read_headers(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    line = await reader.readline()
    parts = line.decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ConnectionError(f"bad status line {line!r}")
    headers: dict[str, str] = {}
    while True:
        h = await reader.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers


async def _body_chunks(reader: asyncio.StreamReader, headers: dict[str, str]):
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise ConnectionError("stream cut before its last chunk")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return
            data = await reader.readexactly(size)
            await reader.readline()
            yield data
    elif "content-length" in headers:
        n = int(headers["content-length"])
        if n:
            yield await reader.readexactly(n)
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


async def send_one(url: str, path: str, body: bytes, headers: dict[str, str], timeout_s: float,
                   t_send: float | None = None) -> Result:
    """POST one streaming request and measure it (t_send: when it should have gone, for TTFT)."""
    r = Result(headers.get("x-governor-class", "standard"))
    u = urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    t0 = time.monotonic() if t_send is None else t_send
    writer = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            head = [f"POST {path} HTTP/1.1", f"Host: {u.netloc}", "Content-Type: application/json",
                    f"Content-Length: {len(body)}", "Connection: close"]
            head += [f"{k}: {v}" for k, v in headers.items()]
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            await writer.drain()
            r.status, rh = await _read_headers(reader)
            r.replica = rh.get("x-governor-replica", "")
            buf = b""
            first = last = math.nan
            done = False
            async for chunk in _body_chunks(reader, rh):
                if r.status != 200:
                    continue
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    if not event.startswith(b"data:"):
                        continue
                    data = event[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        continue
                    msg = json.loads(data)
                    ch = (msg.get("choices") or [{}])[0]
                    piece = ch.get("text") or (ch.get("delta") or {}).get("content")
                    if piece:
                        now = time.monotonic()
                        if r.tokens == 0:
                            first = now
                        last = now
                        r.tokens += 1
            if r.status == 200 and not done:
                r.error = "stream ended without [DONE]"
            r.e2e_s = time.monotonic() - t0
            if r.tokens:
                r.ttft_s = first - t0
                r.tpot_s = (last - first) / (r.tokens - 1) if r.tokens > 1 else 0.0
    except TimeoutError:
        r.error = f"timed out after {timeout_s:g} s"
    except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
        r.error = f"{type(exc).__name__}: {exc}"
    finally:
        if writer is not None:
            writer.close()
    return r


async def replay(url: str, requests: list[ReplayRequest], *, chat: bool, concurrency: int, duration_s: float,
                 timeout_s: float, class_header: str = "x-governor-class") -> Summary:
    """Send each request at its time, at most `concurrency` at once, none after `duration_s`."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    sem = asyncio.Semaphore(concurrency)
    t0 = time.monotonic()
    tasks: list[asyncio.Task[Result]] = []

    async def one(rq: ReplayRequest, due: float) -> Result:
        async with sem:
            res = await send_one(url, path, rq.body, {class_header: rq.cls}, timeout_s, t_send=due)
        res.cls = rq.cls
        return res

    try:
        for rq in requests:
            due = t0 + rq.at_s
            if rq.at_s > duration_s:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)  # the trace's own inter-arrival time
            tasks.append(asyncio.create_task(one(rq, due)))
        results = list(await asyncio.gather(*tasks))
    except asyncio.CancelledError:
        # stopped early (the demo ends): what finished is the summary; requests still in flight are dropped
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        results = [t.result() for t in tasks if not t.cancelled() and t.exception() is None]
    return Summary(results, time.monotonic() - t0)


def cmd_replay(args: argparse.Namespace) -> int:
    from controller.sim.trace_types import TraceError
    from controller.sim.traces import detect_format, read_trace_file

    try:
        mix = tuple(float(x) for x in args.class_mix.split(","))
        if len(mix) != 3 or min(mix) < 0 or sum(mix) <= 0:
            raise ValueError
    except ValueError:
        print(f"governor replay: --class-mix {args.class_mix!r}: expected three fractions >= 0, e.g. 0.2,0.6,0.2",
              file=sys.stderr)
        return 2
    for flag, v, lo in (("--concurrency", args.concurrency, 1), ("--max-requests", args.max_requests, 1),
                        ("--max-output", args.max_output, 1)):
        if v < lo:
            print(f"governor replay: {flag} {v}: must be >= {lo}", file=sys.stderr)
            return 2
    for flag, fv in (("--duration", args.duration), ("--time-scale", args.time_scale), ("--timeout", args.timeout)):
        if not (math.isfinite(fv) and fv > 0):
            print(f"governor replay: {flag} {fv!r}: must be a number > 0", file=sys.stderr)
            return 2
    try:
        path = Path(args.trace)
        fmt = detect_format(path)
        block = args.block_tokens or (512 if fmt == "mooncake" else 16)
        trace = read_trace_file(path, fmt, hash_block_tokens=block, servegen=None,
                                rng=np.random.default_rng(args.seed))
    except (TraceError, OSError) as exc:
        print(f"governor replay: {exc}", file=sys.stderr)
        return 2
    reqs = build_requests(trace, chat=args.chat, model=args.model, max_requests=args.max_requests,
                          time_scale=args.time_scale, start_s=args.start, class_mix=(mix[0], mix[1], mix[2]),
                          max_output=args.max_output, seed=args.seed, until_s=args.duration)
    async def run() -> Summary:
        task = asyncio.ensure_future(replay(args.url.rstrip("/"), reqs, chat=args.chat,
                                            concurrency=args.concurrency, duration_s=args.duration,
                                            timeout_s=args.timeout, class_header=args.class_header))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # stop early: the summary of what finished
            loop.add_signal_handler(sig, task.cancel)
        return await task

    summary = asyncio.run(run())
    print(json.dumps(summary.to_dict()), flush=True)
    return 0
