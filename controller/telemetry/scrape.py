"""Direct scrape of /metrics endpoints (sidecar mode, the demo), no Prometheus in between.

`ScrapeSource.read(now_s)` fetches every target's /metrics concurrently (a small
thread pool, urllib, a bounded timeout per request and for the whole round),
parses the text with `prometheus_client`'s parser and hands the families, or the
exception each fetch raised, to a `FamiliesWindow`. Targets come from the static
list and/or a Prometheus HTTP service-discovery URL (a JSON list of
`{"targets": ["host:port"], "labels": {...}}` groups, as the simulator's /sd
serves): the `pool` label names the pool and `kind` says what the target is
(vllm, sglang, dcgm or router; default vllm). If discovery fails, the last list
that worked is kept and the failure is reported; before any list worked, every
reading is MISSING (an empty list would look like a fleet scaled to zero).

This is an edge: it never raises for fleet trouble, and it does not interpret
metrics itself (that is `window.py`).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from controller.telemetry.source import TARGET_KINDS, ScrapeTarget, describe_error
from controller.telemetry.window import FamiliesWindow
from controller.types import FleetObservation, PoolObservation

MAX_BODY_BYTES = 32 * 1024 * 1024  # a vLLM /metrics page is ~100 KB; refuse anything absurd
ACCEPT = "text/plain;version=0.0.4;q=0.9,*/*;q=0.1"  # the classic text format, which the parser reads


class ScrapeError(RuntimeError):
    """A target answered, but not with usable metrics (HTTP error, oversize or unparsable body)."""


def fetch_text(url: str, timeout_s: float) -> str:
    """GET `url` and return the body as text; raises on any failure (the caller turns it into a Reading)."""
    if not url.startswith(("http://", "https://")):
        raise ScrapeError(f"only http(s) URLs can be scraped, got {url!r}")
    req = urllib.request.Request(url, headers={"Accept": ACCEPT, "User-Agent": "governor-scrape"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - URLs come from config/discovery
        body = resp.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise ScrapeError(f"response larger than {MAX_BODY_BYTES} bytes")
    return body.decode("utf-8", errors="replace")


def scrape_families(url: str, timeout_s: float) -> list[Metric]:
    text = fetch_text(url, timeout_s)
    try:
        return list(text_string_to_metric_families(text))
    except Exception as exc:  # noqa: BLE001 - the parser raises ValueError/TypeError/IndexError on junk
        raise ScrapeError(f"cannot parse the metrics text: {exc}") from None


def parse_discovery(body: str, base_labels: dict[str, str] | None = None) -> list[ScrapeTarget]:
    """Targets from a Prometheus HTTP-SD document; raises ValueError naming the bad group."""
    try:
        groups = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"discovery: not JSON ({exc})") from None
    if not isinstance(groups, list):
        raise ValueError(f"discovery: expected a JSON list of target groups, got {type(groups).__name__}")
    targets: list[ScrapeTarget] = []
    for i, g in enumerate(groups):
        if not isinstance(g, dict) or not isinstance(g.get("targets"), list):
            raise ValueError(f"discovery: group {i} has no 'targets' list")
        labels = {**(base_labels or {}), **{str(k): str(v) for k, v in (g.get("labels") or {}).items()}}
        kind = labels.get("kind", "vllm")
        if kind not in TARGET_KINDS:
            raise ValueError(f"discovery: group {i}: kind {kind!r} is not one of {list(TARGET_KINDS)}")
        scheme = labels.get("__scheme__", "http")
        path = labels.get("__metrics_path__", "/metrics")
        pool = "" if kind == "router" else labels.get("pool", "")
        public = {k: v for k, v in labels.items() if not k.startswith("__")}
        for address in g["targets"]:
            url = str(address) if "://" in str(address) else f"{scheme}://{address}{path}"
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"discovery: group {i}: target {address!r} is not an http(s) address")
            try:
                targets.append(ScrapeTarget(url=url, pool=pool, kind=kind, labels=public))
            except ValueError as exc:
                raise ValueError(f"discovery: group {i}: {exc}") from None
    return targets


@dataclass(frozen=True, slots=True)
class _Health:
    ok: bool
    message: str


class ScrapeSource:
    """Telemetry straight from the targets' /metrics (implements TelemetrySource)."""

    name = "scrape"

    def __init__(self, pools: Sequence[str], *, targets: Sequence[ScrapeTarget] = (),
                 discovery_url: str | None = None, timeout_s: float = 2.0, window_s: float = 60.0,
                 stale_after_s: float = 60.0, max_workers: int = 8) -> None:
        if not targets and not discovery_url:
            raise ValueError("ScrapeSource needs static targets, a discovery_url, or both")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: {timeout_s} must be > 0")
        self.pools = tuple(pools)
        self.static_targets = tuple(targets)
        self.discovery_url = discovery_url
        self.timeout_s = float(timeout_s)
        # urllib's timeout bounds each socket operation (connect, each read), not the whole
        # request; a target that trickles bytes is cut off when the round ends.
        self.round_timeout_s = 2.0 * self.timeout_s + 0.5
        self.window = FamiliesWindow(self.pools, window_s, stale_after_s, source_name=self.name)
        self._pool = ThreadPoolExecutor(max_workers=max(1, max_workers), thread_name_prefix="scrape")
        self._discovered: list[ScrapeTarget] | None = None
        self._lock = threading.Lock()  # read() may be called from the tick thread and a health probe
        self._health = _Health(False, "not read yet")

    # ------------------------------------------------------------------ discovery

    def _discover(self) -> tuple[list[ScrapeTarget] | None, str | None]:
        if not self.discovery_url:
            return [], None
        try:
            found = parse_discovery(fetch_text(self.discovery_url, self.timeout_s))
        except Exception as exc:  # noqa: BLE001 - any failure keeps the last good list
            return self._discovered, f"discovery {self.discovery_url}: {describe_error(exc)}"
        self._discovered = found
        return found, None

    def targets(self) -> list[ScrapeTarget]:
        """The targets of the next read: static ones plus the last discovered list (no duplicates by URL)."""
        seen: dict[str, ScrapeTarget] = {t.url: t for t in self.static_targets}
        for t in self._discovered or ():
            seen.setdefault(t.url, t)
        return list(seen.values())

    # ------------------------------------------------------------------ read

    def _scrape_all(self, targets: Sequence[ScrapeTarget]) -> list[tuple[ScrapeTarget, Sequence[Metric] | BaseException]]:
        futures = {t.url: self._pool.submit(scrape_families, t.url, self.timeout_s) for t in targets}
        wait(futures.values(), timeout=self.round_timeout_s)
        out: list[tuple[ScrapeTarget, Sequence[Metric] | BaseException]] = []
        for t in targets:
            f = futures[t.url]
            if not f.done():
                f.cancel()
                out.append((t, TimeoutError(f"no answer within {self.round_timeout_s:g} s")))
                continue
            exc = f.exception()
            out.append((t, exc if exc is not None else f.result()))
        return out

    def read(self, now_s: float) -> FleetObservation:
        with self._lock:
            discovered, discovery_error = self._discover()
            if self.discovery_url and discovered is None and not self.static_targets:
                # Discovery never worked: we do not know the fleet, which is not the same as an empty fleet.
                obs = FleetObservation(at_s=now_s, pools={p: PoolObservation(pool=p) for p in self.pools},
                                       source=self.name, errors=(discovery_error or "discovery: no targets yet",))
                self._health = _Health(False, obs.errors[0])
                return obs
            targets = self.targets()
            scraped = self._scrape_all(targets)
            obs = self.window.update(now_s, scraped)
            if discovery_error:
                obs = FleetObservation(at_s=obs.at_s, pools=obs.pools, classes=obs.classes, source=obs.source,
                                       errors=(discovery_error, *obs.errors))
            failed = sum(1 for _, r in scraped if isinstance(r, BaseException))
            ok = not discovery_error and (failed < len(scraped) or not scraped)
            detail = f"{len(scraped) - failed}/{len(scraped)} targets answered"
            if discovery_error:
                detail += f"; {discovery_error}"
            self._health = _Health(ok, detail)
            return obs

    def health(self) -> tuple[bool, str]:
        h = self._health
        return h.ok, h.message

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["ScrapeError", "ScrapeSource", "fetch_text", "parse_discovery", "scrape_families"]
