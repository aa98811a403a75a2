"""What the picker reads from outside: engine readings from each replica's /metrics, and membership.

- `parse_engine_metrics`: `vllm:num_requests_running` + `vllm:num_requests_waiting` (the queue
  score) and `vllm:kv_cache_usage_perc` (KV usage) from Prometheus text (sums over the series,
  one engine per endpoint); SGLang's `sglang:num_running_reqs`, `sglang:num_queue_reqs` and
  `sglang:token_usage` are read as the same three.
- `fetch` (blocking; the server runs it in a worker thread) GETs a URL with a timeout.
- `parse_http_sd`: Prometheus HTTP service discovery JSON (the live simulator's `/sd`, or any
  service that serves it): targets with `kind: vllm` (or no kind) and a `pool` label, except those
  labelled `draining: "true"` (the simulator marks replicas that are draining).

Must not: decide anything or keep state.
"""

from __future__ import annotations

import json
import math
import urllib.request
from collections.abc import Iterable

from controller.metrics.series import every_engine
from controller.names import ENGINE_KINDS

_RUNNING = every_engine("running")
_WAITING = every_engine("waiting")
_KV = every_engine("kv_usage")


class ScrapeError(ValueError):
    """A reading that could not be fetched or parsed; the message names the URL and what was wrong."""


def fetch(url: str, timeout_s: float = 1.0) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.read()
    except OSError as exc:
        raise ScrapeError(f"{url}: {exc}") from None


def parse_engine_metrics(text: str) -> tuple[float, float]:
    """(running + waiting, KV usage 0..1) from an engine's Prometheus text exposition."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end <= 0:
            continue
        name = line[:name_end]
        if name not in _RUNNING and name not in _WAITING and name not in _KV:
            continue
        parts = line.rsplit("}", 1)[-1].split() if "{" in line else line.split()[1:]
        if not parts:
            continue
        try:
            v = float(parts[0])
        except ValueError:
            continue
        if math.isfinite(v):
            found[name] = found.get(name, 0.0) + v
    if not any(n in found for n in _RUNNING + _WAITING):
        raise ScrapeError("no vllm:num_requests_running / vllm:num_requests_waiting (or SGLang's) series")
    queue = sum(found.get(n, 0.0) for n in _RUNNING + _WAITING)
    kv = next((found[n] for n in _KV if n in found), 0.0)
    return queue, min(max(kv, 0.0), 1.0)


def parse_http_sd(body: bytes, pools: Iterable[str]) -> dict[str, list[str]]:
    """pool → addresses from Prometheus HTTP SD JSON; targets of other kinds or unknown pools are skipped."""
    try:
        groups = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ScrapeError(f"service discovery: not JSON ({exc})") from None
    if not isinstance(groups, list):
        raise ScrapeError("service discovery: expected a JSON list of {targets, labels}")
    out: dict[str, list[str]] = {p: [] for p in pools}
    for g in groups:
        if not isinstance(g, dict):
            continue
        labels = g.get("labels") or {}
        if labels.get("kind", "vllm") not in ENGINE_KINDS or labels.get("pool") not in out:
            continue
        if str(labels.get("draining", "")).lower() == "true":
            continue  # finishing its requests, taking no new ones
        out[labels["pool"]].extend(str(t) for t in g.get("targets") or [])
    return out
