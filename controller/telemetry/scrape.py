"""Direct scrape of /metrics endpoints (sidecar mode, the demo), no Prometheus in between.

`ScrapeSource.read(now_s)` fetches every target's /metrics concurrently (a small
thread pool, urllib, a bounded timeout per request and for the whole round),
keeps only the metric families the window reads (`filter_exposition`: a vLLM page
has ~330 lines, of which ~80 are read), parses those lines (`parse_samples`: string
splits per line, each label block parsed once, falling back to `prometheus_client`'s
parser for anything unusual) and hands the samples, or the exception each fetch
raised, to a `FamiliesWindow`. Targets come from the static list and/or a
Prometheus HTTP service-discovery URL (a JSON list of
`{"targets": ["host:port"], "labels": {...}}` groups, as the simulator's /sd
serves): the `pool` label names the pool and `kind` says what the target is
(vllm, sglang, dcgm or router; default vllm). If discovery fails, the last list
that worked is kept and the failure is reported; before any list worked, every
reading is MISSING (an empty list would look like a fleet scaled to zero). One
deadline, `2 × timeout_s + 0.5 s` (controller/config/tick_budget.py), covers the whole
read, discovery included: a hung discovery endpoint gets `timeout_s` of it.

This is an edge: it never raises for fleet trouble, and it does not interpret
metrics itself (that is `window.py`).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from controller.config.tick_budget import scrape_round_s
from controller.telemetry.source import TARGET_KINDS, ScrapeTarget, describe_error
from controller.telemetry.window import FamiliesWindow, TargetSamples, read_sample_names
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
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # http(s) only, checked above
        body = resp.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise ScrapeError(f"response larger than {MAX_BODY_BYTES} bytes")
    return body.decode("utf-8", errors="replace")


_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def family_names(sample_names: Iterable[str]) -> frozenset[str]:
    """Names that HELP/TYPE lines and samples of the families holding `sample_names` may carry.

    A counter's TYPE line may name it with or without `_total`; a histogram's names
    the base: {"vllm:prompt_tokens_total", "x_bucket"} → those two plus
    "vllm:prompt_tokens" and "x".
    """
    out = set(sample_names)
    for n in list(out):
        for suffix in _SUFFIXES:
            if n.endswith(suffix):
                out.add(n[: -len(suffix)])
    return frozenset(out)


def _sample_name(line: str) -> str:
    return line.split("{", 1)[0].split(" ", 1)[0].strip()


def filter_exposition(text: str, families: frozenset[str]) -> str:
    """The text with only the families named in `families` (from `family_names`): their HELP and TYPE
    lines and all their samples (a histogram keeps _bucket, _sum and _count), nothing else.

    Cheap: the text format groups each family's lines after its HELP/TYPE lines, so the
    text is cut at every comment line ("\n# ") and each piece kept or dropped whole by
    the name its comment carries (~60 pieces per vLLM page, not ~330 lines). A comment
    other than HELP/TYPE keeps the decision of the family it sits in; samples before
    the first comment (untyped) are kept line by line by their name, and a line there
    that is no sample raises ValueError. Lines of dropped families are not checked.
    """
    pieces = text.split("\n# ")
    out: list[str] = []
    first = pieces[0]
    if first.startswith("# "):
        pieces[0] = first[2:]
    else:
        for i, line in enumerate(first.split("\n"), 1):
            name = _sample_name(line)
            if not line.strip():
                continue
            if not _METRIC_NAME.fullmatch(name):  # e.g. an HTML login page: not metrics at all
                raise ValueError(f"line {i}: {line[:60]!r} is not a sample")
            if name in families:
                out.append(line)
        pieces = pieces[1:]
    keep = False
    for piece in pieces:
        nl = piece.find("\n")
        head = piece if nl < 0 else piece[:nl]
        parts = head.split(" ", 2)
        if len(parts) >= 2 and parts[0] in ("HELP", "TYPE"):
            keep = parts[1] in families
        if keep:
            out.append("# " + piece)
    return "\n".join(out) + "\n" if out else ""


_PAIR = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(?:,[ \t]*|$)')
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPE = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_LABEL_CACHE_MAX = 50_000


class _NotPlainTextError(Exception):
    """A line the fast parser does not handle (quoted names, exotic syntax): use prometheus_client's."""


def _labels(block: str) -> dict[str, str]:
    out: dict[str, str] = {}
    pos, end = 0, len(block.rstrip())
    while pos < end:
        m = _PAIR.match(block, pos)
        if m is None or m.end() == pos:
            raise _NotPlainTextError(block)
        value = m.group(2)
        if "\\" in value:
            value = _ESCAPE.sub(lambda e: _UNESCAPE[e.group(0)], value)
        out[m.group(1)] = value
        pos = m.end()
    return out


def parse_samples(text: str, label_cache: dict[str, dict[str, str]] | None = None) -> dict[str, list[Sample]]:
    """Sample name → samples of exposition text, as prometheus_client's parser would give them.

    Several times faster than `text_string_to_metric_families` (string splits per line
    instead of a character loop, and each distinct label block parsed once: pass the same
    `label_cache` every scrape and the blocks seen before, e.g. `model_name="m",le="0.5"`,
    cost a dict lookup; the dicts are shared, so callers must not mutate them). Same names
    (a counter sample typed without `_total` gets it, as prometheus_client does), labels
    (escapes undone) and values; timestamps are dropped (the window does not use them).
    A line it does not recognise (UTF-8 quoted names, a malformed line) hands the whole
    text to prometheus_client's parser, which decides (and raises on junk).
    """
    cache = {} if label_cache is None else label_cache
    if len(cache) > _LABEL_CACHE_MAX:
        cache.clear()
    out: dict[str, list[Sample]] = {}
    counter = ""  # name of the family whose TYPE line said "counter", while its samples follow
    try:
        for line in text.split("\n"):
            line = line.strip()
            if not line:
                continue
            if line[0] == "#":
                parts = line.split(None, 3)
                if len(parts) >= 4 and parts[1] == "TYPE":
                    counter = parts[2] if parts[3].strip() == "counter" else ""
                continue
            brace = line.find("{")
            if brace < 0:
                name, _, tail = line.partition(" ")
                labels: dict[str, str] = {}
            else:
                name = line[:brace].rstrip()
                close = line.rfind("}")  # the value and timestamp cannot hold a brace
                if close < brace:
                    raise _NotPlainTextError(line)
                block = line[brace + 1:close]
                cached = cache.get(block)
                if cached is None:
                    cached = cache[block] = _labels(block)
                labels = cached
                tail = line[close + 1:]
            fields = tail.split()
            if not 1 <= len(fields) <= 2 or not _METRIC_NAME.fullmatch(name):
                raise _NotPlainTextError(line)
            if counter and name == counter and not name.endswith("_total"):
                name += "_total"
            smp = Sample(name, labels, float(fields[0]))
            got = out.get(name)
            if got is None:
                out[name] = [smp]
            else:
                got.append(smp)
    except (_NotPlainTextError, ValueError):
        out = {}
        for fam in text_string_to_metric_families(text):
            for smp in fam.samples:
                out.setdefault(smp.name, []).append(smp)
    return out


def scrape_families(url: str, timeout_s: float, families: frozenset[str] | None = None) -> dict[str, list[Sample]]:
    """Fetch and parse one target (sample name → samples); with `families`, only those families are parsed."""
    return _scrape(url, timeout_s, families)[0]


def _scrape(url: str, timeout_s: float, families: frozenset[str] | None,
            label_cache: dict[str, dict[str, str]] | None = None) -> tuple[dict[str, list[Sample]], int, int]:
    """(samples by name, lines parsed, lines received)."""
    text = fetch_text(url, timeout_s)
    total = text.count("\n")
    try:
        if families is not None:
            text = filter_exposition(text, families)
        return parse_samples(text, label_cache), text.count("\n"), total
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
                 stale_after_s: float = 60.0, max_workers: int = 4, filter_families: bool = True) -> None:
        if not targets and not discovery_url:
            raise ValueError("ScrapeSource needs static targets, a discovery_url, or both")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: {timeout_s} must be > 0")
        self.pools = tuple(pools)
        self.static_targets = tuple(targets)
        self.discovery_url = discovery_url
        self.timeout_s = float(timeout_s)
        # urllib's timeout bounds each socket operation (connect, each read), not the whole
        # request; a target that trickles bytes is cut off when the round ends. The round covers the
        # discovery fetch too (controller/config/tick_budget.py): a hung discovery endpoint costs at most
        # timeout_s of it, and the targets get what is left.
        self.round_timeout_s = scrape_round_s(self.timeout_s)
        self._discovery_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scrape-sd")
        self._discovery_pending: Future[str] | None = None  # a discovery fetch still running from an earlier read
        self.window = FamiliesWindow(self.pools, window_s, stale_after_s, source_name=self.name)
        # Fetching and parsing hold the GIL most of the time: more threads than ~4 only add contention.
        self._pool = ThreadPoolExecutor(max_workers=max(1, max_workers), thread_name_prefix="scrape")
        self._discovered: list[ScrapeTarget] | None = None
        self._lock = threading.Lock()  # read() may be called from the tick thread and a health probe
        self._health = _Health(False, "not read yet")
        # Parse only what the window reads (False: parse whole pages, a reference for tests and benches).
        self._families = ({kind: family_names(read_sample_names(kind)) for kind in TARGET_KINDS}
                          if filter_families else None)
        self.filter_stats = (0, 0)  # (lines parsed, lines received) over all reads, for the bench
        self._label_cache: dict[str, dict[str, dict[str, str]]] = {}  # per target: label block → labels

    # ------------------------------------------------------------------ discovery

    def _discover(self) -> tuple[list[ScrapeTarget] | None, str | None]:
        if not self.discovery_url:
            return [], None
        pending = self._discovery_pending
        if pending is None or pending.done():
            pending = self._discovery_pending = self._discovery_pool.submit(fetch_text, self.discovery_url,
                                                                            self.timeout_s)
        wait([pending], timeout=self.timeout_s)
        if not pending.done():  # hung or trickling: keep the last list, try again next read
            return self._discovered, (f"discovery {self.discovery_url}: no answer within {self.timeout_s:g} s "
                                      "(the last list is kept)")
        self._discovery_pending = None
        try:
            found = parse_discovery(pending.result())
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

    def _scrape_all(self, targets: Sequence[ScrapeTarget], budget_s: float | None = None,
                    ) -> list[tuple[ScrapeTarget, TargetSamples | BaseException]]:
        fams = self._families
        futures = {t.url: self._pool.submit(_scrape, t.url, self.timeout_s, None if fams is None else fams[t.kind],
                                            self._label_cache.setdefault(t.url, {}))
                   for t in targets}
        for url in [u for u in self._label_cache if u not in futures]:  # targets gone: forget their labels
            del self._label_cache[url]
        budget = self.round_timeout_s if budget_s is None else max(0.0, budget_s)
        wait(futures.values(), timeout=budget)
        out: list[tuple[ScrapeTarget, TargetSamples | BaseException]] = []
        for t in targets:
            f = futures[t.url]
            if not f.done():
                f.cancel()
                out.append((t, TimeoutError(f"no answer within the read deadline ({budget:g} s)")))
                continue
            exc = f.exception()
            if exc is not None:
                out.append((t, exc))
                continue
            parsed, kept, total = f.result()
            self.filter_stats = (self.filter_stats[0] + kept, self.filter_stats[1] + total)
            out.append((t, parsed))
        return out

    def read(self, now_s: float) -> FleetObservation:
        with self._lock:
            started = time.monotonic()  # the read's own deadline is wall time: it bounds real I/O
            discovered, discovery_error = self._discover()
            if self.discovery_url and discovered is None and not self.static_targets:
                # Discovery never worked: we do not know the fleet, which is not the same as an empty fleet.
                obs = FleetObservation(at_s=now_s, pools={p: PoolObservation(pool=p) for p in self.pools},
                                       source=self.name, errors=(discovery_error or "discovery: no targets yet",))
                self._health = _Health(False, obs.errors[0])
                return obs
            targets = self.targets()
            scraped = self._scrape_all(targets, self.round_timeout_s - (time.monotonic() - started))
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

    def set_pools(self, pools: Sequence[str]) -> None:
        """The configured pools changed (a config reload): targets of a new pool count from the next read."""
        with self._lock:
            self.pools = tuple(pools)
            self.window.pools = self.pools

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._discovery_pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["ScrapeError", "ScrapeSource", "family_names", "fetch_text", "filter_exposition", "parse_discovery",
           "parse_samples", "scrape_families"]
