"""Windowed rates, quantiles and gauges from scraped metric families, per pool and class.

`FamiliesWindow` is what `ScrapeSource` delegates to, and what the in-process
bench calls directly with families from the simulator's collectors: it needs no
HTTP and no Prometheus. Each `update(now_s, scraped)` takes the families of every
target — prometheus_client metric families, or a `SampleMap` (sample name →
samples) as the scrape source's parser and the simulator's observer build — or
the exception its scrape raised, and returns a `FleetObservation` that means the
same as the PromQL in `promql.py`:

- counters and histogram buckets keep a per-target, per-series history over the
  last `window_s`; a rate is the increase between the first and last sample in
  the window divided by the time between them, with counter resets handled as
  in Prometheus' rate() (a drop means the counter restarted from 0, so the new
  value is all increase). Example: samples 100, 160, 20 at t = 0, 15, 30 s →
  increase 60 + 20 = 80 over 30 s → 2.67/s. Unlike rate(), nothing is
  extrapolated to the window's edges; for a steady counter both give the same.
- quantiles apply `histogram_quantile` to the summed bucket rates of the pool,
  exactly like `histogram_quantile(q, sum by (le, pool) (rate(..._bucket[w])))`;
- gauges are summed (running, waiting) or averaged (KV usage, GPU busy) over the
  targets that answered;
- `replicas_ready` counts the engine targets that answered this update;
- per replica (`PoolObservation.replicas`, keyed by `ScrapeTarget.replica_id`): its own mean ITL
  over the last scrape interval (the increase of the histogram's _sum over that of its _count), running
  batch, KV usage
  and the prompt tokens it computes a second (its prompt rate × (1 − its prefix-cache hit rate)).

Cost: per target, each scrape's samples are keyed once per label set (memoised)
and appended to per-series histories, so a tick costs O(series) and a rate
O(points in the window), with the same floats as recomputing from all snapshots.

Missing, NaN and stale data are Readings, never exceptions. A reading's freshness
comes from when it was read: a pool whose engine targets all failed this update
(refused, timed out, hung) keeps its last computed view for diagnosis, but every
reading of it is STALE at once, with its age (`now_s` minus when it was read).
A held view is never OK: a fleet that stopped answering must not look live
(issue 21: a frozen fleet was recorded as healthy telemetry for 30 s). The same
holds for a DCGM exporter and the router. `stale_after_s` is kept for the
callers' interface; with Prometheus (prometheus.py) it bounds sample ages. A pool
with no engine target at all (scaled to zero) has 0 ready, 0 running, 0 waiting.
Series names follow docs/TELEMETRY.md: current vLLM names first, renamed ones as
fallbacks, then SGLang; the router's request metrics are split by `priority`.

This module does no I/O and reads no clock: time is the `now_s` argument.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import cast

from prometheus_client.metrics_core import Metric

from controller.metrics.histogram import histogram_quantile
from controller.metrics.promql import CLASS_LABEL, SHED_ERROR_CODES
from controller.metrics.series import DCGM, ROUTER, every_engine
from controller.telemetry.source import ScrapeTarget, describe_error
from controller.types import (
    MISSING,
    PRIORITY_CLASSES,
    ClassObservation,
    FleetObservation,
    PoolObservation,
    Reading,
    ReplicaObservation,
    SignalStatus,
)

GAUGE, COUNTER, HIST = "gauge", "counter", "hist"


@dataclass(frozen=True, slots=True)
class _Signal:
    """One quantity read from a target: alternative sample names (first present wins), how it aggregates."""

    sid: str
    names: tuple[str, ...]
    kind: str  # GAUGE | COUNTER | HIST (names are the _bucket series)
    reduce: str = "sum"  # gauges: "sum" or "mean" over series and targets
    only: Mapping[str, tuple[str, ...]] | None = None  # label -> allowed values


def _suffixed(names: tuple[str, ...], suffix: str) -> tuple[str, ...]:
    return tuple(n + suffix for n in names)


# The engines' series (controller/metrics/series.py), engine by engine: the first name present wins.
_ENGINE_SIGNALS: tuple[_Signal, ...] = (
    _Signal("running", every_engine("running"), GAUGE),
    _Signal("waiting", every_engine("waiting"), GAUGE),
    _Signal("kv", every_engine("kv_usage"), GAUGE, "mean"),
    _Signal("hit_gauge", every_engine("hit_rate"), GAUGE, "mean"),
    _Signal("hits", every_engine("prefix_hits"), COUNTER),
    _Signal("queries", every_engine("prefix_queries"), COUNTER),
    _Signal("prompt", every_engine("prompt_tokens"), COUNTER),
    _Signal("generation", every_engine("generation_tokens"), COUNTER),
    _Signal("preemptions", every_engine("preemptions"), COUNTER),
    _Signal("first_tokens", _suffixed(every_engine("ttft"), "_count"), COUNTER),
    _Signal("ttft", _suffixed(every_engine("ttft"), "_bucket"), HIST),
    _Signal("itl", _suffixed(every_engine("itl"), "_bucket"), HIST),
    # each replica's mean ITL (its own step time: outlier detection, controller/core/outliers.py)
    _Signal("itl_sum", _suffixed(every_engine("itl"), "_sum"), COUNTER),
    _Signal("itl_count", _suffixed(every_engine("itl"), "_count"), COUNTER),
    _Signal("req_tpot", _suffixed(every_engine("request_tpot"), "_bucket"), HIST),
)

_ROUTER_SIGNALS: tuple[_Signal, ...] = (
    _Signal("arrivals", ROUTER.requests, COUNTER),
    _Signal("shed", ROUTER.shed, COUNTER),
    _Signal("admitted", ROUTER.admitted, COUNTER),
    _Signal("retries", ROUTER.retries, COUNTER),
    _Signal("errors_shed", ROUTER.errors, COUNTER, only={"error_code": SHED_ERROR_CODES}),
    _Signal("queue", ROUTER.queue, GAUGE),
    _Signal("ttft", _suffixed(ROUTER.ttft, "_bucket"), HIST),
    _Signal("tpot", _suffixed(ROUTER.tpot, "_bucket"), HIST),
)

_DCGM_ACTIVE = DCGM.engine_active  # ratio 0..1, needs profiling metrics
_DCGM_UTIL = DCGM.gpu_util  # percent 0..100, always collected

_DCGM_FB_USED = DCGM.fb_used  # MiB
_DCGM_FB_FREE = DCGM.fb_free  # MiB

_DCGM_NAMES = (_DCGM_ACTIVE, _DCGM_UTIL, _DCGM_FB_USED, _DCGM_FB_FREE)


def read_sample_names(kind: str) -> frozenset[str]:
    """Every sample name the window reads from a target of `kind` (vllm, sglang, dcgm, router).

    A reader may drop every other series before parsing (the scrape source does: a
    vLLM page has ~330 lines, of which ~60 are read); the observation is the same.
    """
    if kind == "router":
        signals: Sequence[_Signal] = _ROUTER_SIGNALS
    elif kind == "dcgm":
        return frozenset(_DCGM_NAMES)
    else:
        signals = _ENGINE_SIGNALS
    return frozenset(n for sig in signals for n in sig.names)


# A series key inside one target: (signal id, group, series labels without le, le bound or None).
_Key = tuple[str, str, tuple[tuple[str, str], ...], float | None]


SampleMap = Mapping[str, Sequence]
TargetSamples = Sequence[Metric] | SampleMap
"""What one target answered: prometheus_client families, or samples by name (the scrape fast path)."""
"""Sample name → samples (anything with `.labels` and `.value`, e.g. prometheus_client's Sample): what an
in-process reader may hand the window instead of metric families (the simulator's observer does)."""


def _flatten(families: Iterable[Metric] | SampleMap) -> Mapping[str, Sequence]:
    """Sample name → samples, whatever the family grouping (the text parser and collectors differ)."""
    if isinstance(families, Mapping):
        return families
    out: dict[str, list] = {}
    for fam in families:
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def _le(value: str) -> float | None:
    try:
        return float(value)  # "+Inf" → inf
    except (TypeError, ValueError):
        return None


_SKIP = object()  # memo value of a sample the signal does not count (label filter, bad `le`)
_MEMO_MAX = 20_000  # label sets remembered per target; a target with ever-new label values just recomputes


def _sample_key(sig: _Signal, labels: Mapping[str, str], group_label: str | None) -> object:
    """Where a sample of `sig` with `labels` is counted: (signal, group) for a gauge, the series key for
    counters and buckets, or _SKIP."""
    if sig.only is not None and any(labels.get(k) not in v for k, v in sig.only.items()):
        return _SKIP
    group = labels.get(group_label, "") if group_label else ""
    if sig.kind == GAUGE:
        return (sig.sid, group)
    le = None
    if sig.kind == HIST:
        le = _le(labels.get("le", ""))
        if le is None:
            return _SKIP
    series = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
    return (sig.sid, group, series, le)


def _snapshot(samples: Mapping[str, Sequence], signals: Sequence[_Signal], group_label: str | None,
              memo: dict) -> tuple[dict[_Key, float], dict[tuple[str, str], tuple[float, int]]]:
    """(per-series cumulative values, per-(signal, group) gauge sums and series counts) of one scrape.

    `memo` maps (signal, label items) to where the sample counts: a target shows
    the same label sets scrape after scrape, so the sorting and `le` parsing are
    done once per series, not once per sample and tick.
    """
    cumulative: dict[_Key, float] = {}
    gauges: dict[tuple[str, str], tuple[float, int]] = {}
    if len(memo) > _MEMO_MAX:
        memo.clear()
    for sig in signals:
        found = None
        for n in sig.names:
            found = samples.get(n)
            if found is not None:
                break
        if found is None:
            continue
        sid = sig.sid
        is_gauge = sig.kind == GAUGE
        for s in found:
            labels = s.labels
            mk = (sid, tuple(labels.items()))
            key = memo.get(mk)
            if key is None:
                key = memo[mk] = _sample_key(sig, labels, group_label)
            if key is _SKIP:
                continue
            if is_gauge:
                gauge_key = cast("tuple[str, str]", key)
                total, count = gauges.get(gauge_key, (0.0, 0))
                gauges[gauge_key] = (total + float(s.value), count + 1)
            else:
                series_key = cast(_Key, key)
                cumulative[series_key] = cumulative.get(series_key, 0.0) + float(s.value)
    return cumulative, gauges


class _Series:
    """The retained points of one counter or bucket series, and the increase between consecutive ones."""

    __slots__ = ("times", "values", "incs")

    def __init__(self) -> None:
        self.times: deque[float] = deque()
        self.values: deque[float] = deque()
        self.incs: deque[float] = deque()  # incs[i]: increase from point i to point i + 1


class _TargetHistory:
    """One target's samples over the window, kept per series: each scrape appends one point and one
    increase per series, so a rate costs O(points of that series), with no re-walk of every snapshot."""

    __slots__ = ("target", "signals", "group_label", "times", "series", "newest", "gauges", "memo")

    def __init__(self, target: ScrapeTarget, signals: Sequence[_Signal], group_label: str | None) -> None:
        self.target = target
        self.signals = signals
        self.group_label = group_label
        self.times: deque[float] = deque()  # scrape times kept (every series' points are among them)
        self.series: dict[_Key, _Series] = {}
        self.newest: dict[_Key, float] = {}  # the series of the newest scrape
        self.gauges: dict[tuple[str, str], tuple[float, int]] = {}  # the newest scrape's gauge sums
        self.memo: dict = {}

    def add(self, now_s: float, families: TargetSamples, window_s: float) -> None:
        if self.times and self.times[-1] >= now_s:  # same instant again, or the clock went back: replace
            while self.times and self.times[-1] >= now_s:
                self.times.pop()
            for old in self.series.values():
                while old.times and old.times[-1] >= now_s:
                    old.times.pop()
                    old.values.pop()
                    if old.incs:
                        old.incs.pop()
        cumulative, self.gauges = _snapshot(_flatten(families), self.signals, self.group_label, self.memo)
        series = self.series
        for key, v in cumulative.items():
            ser = series.get(key)
            if ser is None:
                ser = series[key] = _Series()
            elif ser.values:
                prev = ser.values[-1]
                ser.incs.append(v - prev if v >= prev else v)  # a drop is a restart from 0 (Prometheus' rule)
            ser.times.append(now_s)
            ser.values.append(v)
        self.newest = cumulative
        self.times.append(now_s)
        self.prune(now_s, window_s)

    def prune(self, now_s: float, window_s: float) -> None:
        cutoff = now_s - window_s
        if not self.times or self.times[0] >= cutoff:
            return  # nothing older than the window (series points are a subset of the scrape times)
        while self.times and self.times[0] < cutoff:
            self.times.popleft()
        gone = []
        for key, ser in self.series.items():
            while ser.times and ser.times[0] < cutoff:
                ser.times.popleft()
                ser.values.popleft()
                if ser.incs:
                    ser.incs.popleft()
            if not ser.times:
                gone.append(key)
        for key in gone:
            del self.series[key]

    def rates(self) -> dict[_Key, float]:
        """Per-series rate over the samples kept (needs two samples of the series).

        Example: points 100, 160, 20 at t = 0, 15, 30 s → increases 60 and 20 (the drop
        is a restart) → 80 / 30 s = 2.67/s.
        """
        if len(self.times) < 2:
            return {}
        out: dict[_Key, float] = {}
        series = self.series
        for key in self.newest:
            ser = series[key]
            times = ser.times
            if len(times) >= 2 and times[-1] > times[0]:
                inc = 0.0
                for d in ser.incs:  # summed in order (not sum(), which compensates on 3.12+): same floats
                    inc += d
                out[key] = inc / (times[-1] - times[0])
        return out


# --------------------------------------------------------------------------- aggregation helpers


class _Totals:
    """Sums over the targets of one pool (or the router) of gauges, rates and bucket rates."""

    def __init__(self) -> None:
        self.gauges: dict[tuple[str, str], tuple[float, int]] = {}
        self.rates: dict[tuple[str, str], float] = {}
        self.buckets: dict[tuple[str, str], dict[float, float]] = {}

    def add(self, history: _TargetHistory, rates: Mapping[_Key, float] | None = None) -> None:
        """Add one target (`rates`: its `history.rates()`, when the caller has them already)."""
        for k, (total, n) in history.gauges.items():
            t0, n0 = self.gauges.get(k, (0.0, 0))
            self.gauges[k] = (t0 + total, n0 + n)
        for (sid, group, _series, le), rate in (history.rates() if rates is None else rates).items():
            if le is None:
                self.rates[(sid, group)] = self.rates.get((sid, group), 0.0) + rate
            else:
                b = self.buckets.setdefault((sid, group), {})
                b[le] = b.get(le, 0.0) + rate

    def gauge(self, sid: str, group: str = "", mean: bool = False) -> float | None:
        got = self.gauges.get((sid, group))
        if got is None or got[1] == 0:
            return None
        return got[0] / got[1] if mean else got[0]

    def rate(self, sid: str, group: str = "") -> float | None:
        return self.rates.get((sid, group))

    def quantile(self, q: float, sid: str, group: str = "") -> float | None:
        b = self.buckets.get((sid, group))
        if not b:
            return None
        if math.inf not in b:  # no +Inf bucket: Prometheus returns NaN
            return math.nan
        bounds = sorted(le for le in b if le != math.inf)
        cumulative = [b[le] for le in bounds] + [b[math.inf]]
        # Buckets read at slightly different moments can dip (a series missing one sample); like
        # Prometheus, force the cumulative counts to be monotonic before interpolating.
        for i in range(1, len(cumulative)):
            cumulative[i] = max(cumulative[i], cumulative[i - 1])
        return histogram_quantile(q, bounds, cumulative)


def _newest_ratio(h: _TargetHistory, num: str, den: str) -> float | None:
    """The increase of counter `num` over that of `den` between the target's last two scrapes (summed over
    their series): a replica's mean ITL over the last interval, i.e. how it steps now. A slowdown shows in
    full one scrape after it starts, where a window's mean would take the window to catch up; hundreds of
    token gaps per replica and interval keep it steady. None without two scrapes; NaN when nothing moved."""
    inc = {num: 0.0, den: 0.0}
    seen = False
    for (sid, _group, _series, le), ser in h.series.items():
        if sid in inc and le is None and ser.incs and len(h.times) >= 2 and ser.times[-1] == h.times[-1] \
                and ser.times[-2] == h.times[-2]:
            inc[sid] += ser.incs[-1]
            seen = True
    return _ratio(inc[num], inc[den]) if seen else None


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None:
        return None
    return num / den if den != 0 else math.nan


def _aged(r: Reading, age_s: float) -> Reading:
    """A held reading `age_s` after it was read: not read this update, so STALE (never OK), with its age."""
    if r.status in (SignalStatus.OK, SignalStatus.STALE):
        return Reading(r.value, SignalStatus.STALE, age_s)
    return Reading(r.value, r.status, age_s)


def _age_all(obj, age_s: float):
    changes = {name: _aged(getattr(obj, name), age_s)
               for name in obj.__dataclass_fields__ if isinstance(getattr(obj, name), Reading)}
    return replace(obj, **changes)


def _r(value: float | None) -> Reading:
    if value is not None and math.isinf(value):
        return Reading(value, SignalStatus.NAN)  # an infinite quantile or ratio is not a usable number
    return Reading.of(value)


# --------------------------------------------------------------------------- the window


class FamiliesWindow:
    """Per-target history of scraped families over `window_s`, turned into one FleetObservation per update.

    `pools` are the configured pool names (targets naming another pool are
    reported in `errors` and ignored); `classes` the priority classes to report.
    """

    def __init__(self, pools: Sequence[str], window_s: float, stale_after_s: float, *,
                 classes: Sequence[str] = PRIORITY_CLASSES, source_name: str = "scrape") -> None:
        if not window_s > 0:
            raise ValueError(f"window_s: {window_s} must be > 0")
        if not stale_after_s > 0:
            raise ValueError(f"stale_after_s: {stale_after_s} must be > 0")
        self.pools = tuple(pools)
        self.window_s = float(window_s)
        self.stale_after_s = float(stale_after_s)
        self.classes = tuple(classes)
        self.source_name = source_name
        self._histories: dict[str, _TargetHistory] = {}
        self._last_seen_s: dict[str, float] = {}
        # last computed views, held (and aged) when every target behind them fails
        self._engine_views: dict[str, tuple[float, PoolObservation]] = {}
        self._gpu_views: dict[str, tuple[float, Reading, Reading]] = {}
        self._class_view: tuple[float, dict[str, ClassObservation]] | None = None

    def _history(self, target: ScrapeTarget) -> _TargetHistory:
        h = self._histories.get(target.url)
        if h is None or h.target.kind != target.kind or h.target.pool != target.pool:
            if target.is_engine:
                signals, group = _ENGINE_SIGNALS, None
            elif target.kind == "router":
                signals, group = _ROUTER_SIGNALS, CLASS_LABEL
            else:
                signals, group = (), None
            h = self._histories[target.url] = _TargetHistory(target, signals, group)
        return h

    def update(self, now_s: float,
               scraped: Sequence[tuple[ScrapeTarget, TargetSamples | BaseException]]) -> FleetObservation:
        errors: list[str] = []
        answered: dict[str, list[_TargetHistory]] = {}  # pool -> engine targets that answered
        listed_engines: dict[str, int] = {}
        dcgm_ok: dict[str, list[TargetSamples]] = {}
        dcgm_listed: dict[str, int] = {}
        routers_ok: list[_TargetHistory] = []
        routers_listed = 0

        for target, result in scraped:
            if target.kind != "router" and target.pool not in self.pools:
                errors.append(f"target {target.describe()}: pool {target.pool!r} is not configured; ignored")
                continue
            if isinstance(result, BaseException):
                errors.append(f"scrape {target.describe()}: {describe_error(result)}")
            if target.is_engine:
                listed_engines[target.pool] = listed_engines.get(target.pool, 0) + 1
            elif target.kind == "dcgm":
                dcgm_listed[target.pool] = dcgm_listed.get(target.pool, 0) + 1
            else:
                routers_listed += 1
            if isinstance(result, BaseException):
                continue
            self._last_seen_s[target.url] = now_s
            if target.kind == "dcgm":
                dcgm_ok.setdefault(target.pool, []).append(result)
                continue
            h = self._history(target)
            h.add(now_s, result, self.window_s)
            if target.is_engine:
                answered.setdefault(target.pool, []).append(h)
            else:
                routers_ok.append(h)
        self._forget(now_s)
        # "No engine listed for a pool" means the pool is at zero only if the scrape itself works:
        # when every listed target failed, it is no evidence of anything.
        blind = bool(scraped) and not answered and not dcgm_ok and not routers_ok

        pools = {}
        for pool in self.pools:
            obs = self._engine_view(now_s, pool, answered.get(pool, []), listed_engines.get(pool, 0), blind)
            gpu, mem = self._gpu_view(now_s, pool, dcgm_ok.get(pool, []), dcgm_listed.get(pool, 0))
            pools[pool] = replace(obs, gpu_util_frac=gpu, gpu_mem_used_frac=mem)
        classes = self._class_views(now_s, routers_ok, routers_listed)
        return FleetObservation(at_s=now_s, pools=pools, classes=classes, source=self.source_name,
                                errors=tuple(errors))

    # ------------------------------------------------------------------ pieces

    def _forget(self, now_s: float) -> None:
        """Drop the history of targets not heard from for a whole window (replicas come and go)."""
        for url in [u for u, t in self._last_seen_s.items() if t < now_s - self.window_s]:
            del self._last_seen_s[url]
            self._histories.pop(url, None)
        for h in self._histories.values():
            h.prune(now_s, self.window_s)

    def _held(self, view: tuple[float, PoolObservation] | None, pool: str, now_s: float) -> PoolObservation:
        if view is None:
            return PoolObservation(pool=pool)
        at_s, obs = view
        # a held view judges no replica: per-replica readings go (outlier detection needs fresh ones)
        return replace(_age_all(obs, now_s - at_s), replicas={})

    def _engine_view(self, now_s: float, pool: str, histories: list[_TargetHistory], listed: int,
                     blind: bool) -> PoolObservation:
        if listed == 0 and not blind:  # no engine is up in this pool (scaled to zero): known zeros, nothing else
            zero = Reading(0.0)
            obs = PoolObservation(pool=pool, replicas_ready=zero, running=zero, waiting=zero)
            self._engine_views[pool] = (now_s, obs)
            return obs
        if not histories:  # every engine target failed (or we are blind): hold the last view, aged
            return self._held(self._engine_views.get(pool), pool, now_s)
        t = _Totals()
        replicas: dict[str, ReplicaObservation] = {}
        for h in histories:
            rates = h.rates()
            t.add(h, rates)
            one = _Totals()
            one.add(h, rates)
            rid = h.target.replica_id
            prompt, hit = one.rate("prompt"), _ratio(one.rate("hits"), one.rate("queries"))
            prefill = None if prompt is None else prompt * (1.0 - (hit if hit is not None and math.isfinite(hit)
                                                                   else 0.0))
            replicas[rid] = ReplicaObservation(replica=rid, itl_mean_s=_r(_newest_ratio(h, "itl_sum", "itl_count")),
                                               running=_r(one.gauge("running")), prefill_tokens_rps=_r(prefill),
                                               kv_usage_frac=_r(one.gauge("kv", mean=True)))
        hit = _ratio(t.rate("hits"), t.rate("queries"))
        if hit is None:
            hit = t.gauge("hit_gauge", mean=True)
        obs = PoolObservation(
            pool=pool,
            replicas_ready=Reading(float(len(histories))),
            running=_r(t.gauge("running")),
            waiting=_r(t.gauge("waiting")),
            kv_usage_frac=_r(t.gauge("kv", mean=True)),
            hit_rate=_r(hit),
            ttft_p50_s=_r(t.quantile(0.5, "ttft")),
            ttft_p95_s=_r(t.quantile(0.95, "ttft")),
            tpot_p50_s=_r(t.quantile(0.5, "itl")),
            tpot_p95_s=_r(t.quantile(0.95, "itl")),
            request_tpot_p95_s=_r(t.quantile(0.95, "req_tpot")),
            arrival_rps=_r(t.rate("first_tokens")),
            prompt_tokens_rps=_r(t.rate("prompt")),
            generation_tokens_rps=_r(t.rate("generation")),
            preemptions_rps=_r(t.rate("preemptions")),
            replicas=replicas,
        )
        self._engine_views[pool] = (now_s, obs)
        return obs

    def _gpu_view(self, now_s: float, pool: str, results: list[TargetSamples],
                  listed: int) -> tuple[Reading, Reading]:
        """(GPU busy fraction, framebuffer used fraction of the fullest GPU) of the pool."""
        if listed == 0:
            self._gpu_views.pop(pool, None)
            return MISSING, MISSING
        if not results:
            held = self._gpu_views.get(pool)
            if held is None:
                return MISSING, MISSING
            return _aged(held[1], now_s - held[0]), _aged(held[2], now_s - held[0])
        reading = _r(_gpu_busy_frac(results))
        mem = _r(_fb_used_frac(results))
        self._gpu_views[pool] = (now_s, reading, mem)
        return reading, mem

    def _class_views(self, now_s: float, routers: list[_TargetHistory], listed: int) -> dict[str, ClassObservation]:
        if listed == 0:
            self._class_view = None
            return {c: ClassObservation(priority_class=c) for c in self.classes}
        if not routers:
            if self._class_view is None:
                return {c: ClassObservation(priority_class=c) for c in self.classes}
            at_s, last = self._class_view
            return {c: _age_all(o, now_s - at_s) for c, o in last.items()}
        t = _Totals()
        for h in routers:
            t.add(h)
        view: dict[str, ClassObservation] = {}
        for c in self.classes:
            arrivals = t.rate("arrivals", c)
            shed = t.rate("shed", c)
            errors_shed = t.rate("errors_shed", c)
            if shed is None and errors_shed is not None:
                shed = errors_shed
            if shed is None and arrivals is not None:
                shed = 0.0  # the router counts requests but has rejected none of this class
            admitted = t.rate("admitted", c)
            if admitted is None and arrivals is not None and shed is not None:
                admitted = arrivals - shed
            view[c] = ClassObservation(
                priority_class=c,
                arrival_rps=_r(arrivals),
                admitted_rps=_r(admitted),
                shed_rps=_r(shed),
                queue_depth=_r(t.gauge("queue", c)),
                ttft_p95_s=_r(t.quantile(0.95, "ttft", c)),
                tpot_p95_s=_r(t.quantile(0.95, "tpot", c)),
                retry_rps=_r(t.rate("retries", c)),
            )
        self._class_view = (now_s, view)
        return view


def _gpu_busy_frac(results: list[TargetSamples]) -> float | None:
    """Mean busy fraction over the GPUs of the answering DCGM exporters.

    Per GPU: DCGM_FI_PROF_GR_ENGINE_ACTIVE (0..1) when exported, else
    DCGM_FI_DEV_GPU_UTIL / 100. When any GPU carries a `pod` label (the
    exporter's Kubernetes mapping), only GPUs mapped to a pod count: a node's idle
    GPUs would dilute the pool's mean (e.g. 2 busy GPUs at 0.9 and 6 idle → 0.225).
    """
    per_gpu: dict[tuple, tuple[float, bool]] = {}
    for i, families in enumerate(results):
        samples = _flatten(families)
        for name, scale in ((_DCGM_UTIL, 0.01), (_DCGM_ACTIVE, 1.0)):  # ACTIVE second: it wins
            for s in samples.get(name, ()):
                host = s.labels.get("Hostname") or s.labels.get("hostname") or str(i)
                key = (host, s.labels.get("gpu", ""), s.labels.get("UUID") or s.labels.get("uuid", ""))
                per_gpu[key] = (float(s.value) * scale, bool(s.labels.get("pod")))
    if not per_gpu:
        return None
    values = [v for v, assigned in per_gpu.values() if assigned] or [v for v, _ in per_gpu.values()]
    return sum(values) / len(values)


def _fb_used_frac(results: list[TargetSamples]) -> float | None:
    """FB used / (used + free) of the pool's fullest GPU (GPUs mapped to a pod only, when any is)."""
    per_gpu: dict[tuple, dict[str, float]] = {}
    assigned: dict[tuple, bool] = {}
    for i, families in enumerate(results):
        samples = _flatten(families)
        for name in (_DCGM_FB_USED, _DCGM_FB_FREE):
            for s in samples.get(name, ()):
                host = s.labels.get("Hostname") or s.labels.get("hostname") or str(i)
                key = (host, s.labels.get("gpu", ""), s.labels.get("UUID") or s.labels.get("uuid", ""))
                per_gpu.setdefault(key, {})[name] = float(s.value)
                assigned[key] = bool(s.labels.get("pod"))
    fracs = {k: v[_DCGM_FB_USED] / (v[_DCGM_FB_USED] + v[_DCGM_FB_FREE]) for k, v in per_gpu.items()
             if len(v) == 2 and v[_DCGM_FB_USED] + v[_DCGM_FB_FREE] > 0}
    if not fracs:
        return None
    values = [f for k, f in fracs.items() if assigned.get(k)] or list(fracs.values())
    return max(values)


__all__ = ["FamiliesWindow", "read_sample_names"]
