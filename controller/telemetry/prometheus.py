"""Telemetry from a Prometheus server's HTTP API (`prometheus_api_client.PrometheusConnect`).

Each read runs the named queries of `promql.py` (with any per-query overrides
from the config) as instant queries, one after another, within one time budget
(`timeout_s` for the whole read, each query getting what is left, also passed to
Prometheus as its own `timeout`). Every outcome becomes a Reading:

- a query that fails (HTTP 400/422/503, bad JSON) → MISSING for its field, plus an error;
- a pool or class absent from a result → MISSING; a NaN value → NAN (e.g. a
  quantile over an idle window); ±Inf → NAN (not a usable number);
- a pool whose newest sample is older than `stale_after_s` → STALE. Sample age
  comes from the `*_sample_time` queries (`timestamp()` of a plain selector
  returns the sample's own time), measured against Prometheus' evaluation time
  so clock skew between Prometheus and the daemon does not matter;
- a transport failure (connection refused, timeout) → every reading MISSING and
  one entry in `FleetObservation.errors`; the remaining queries are skipped.

A pool with no engine series at all (e.g. scaled to zero) reads MISSING here,
not 0: from Prometheus' answers alone that cannot be told from a broken scrape.

With `recording_rules=True` (config `telemetry.prometheus.recording_rules`)
the default queries are not evaluated at read time: Prometheus evaluates them as
the recording rules of `rules.py` (deploy/prometheus/governor-rules.yml) and a
read selects every recorded series with ONE instant query, split back by record
name into the same per-query results, so the observation is the same. A query
overridden in the config still runs as its own raw query (an override always
wins). Recorded values are as old as the last rule evaluation (at most one
`evaluation_interval`) on top of the scrape age; the `*_sample_time` series carry
the sample times, so STALE is judged exactly as without rules. If the rules are
not loaded (no recorded series at all), the read says so in its errors and
health and falls back to the raw queries, so control goes on.

Never raises for anything the fleet or Prometheus does. Must not interpret
metrics beyond turning query results into Readings (the PromQL does the maths).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any, cast

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from controller.clock import Clock, WallClock
from controller.metrics import promql
from controller.telemetry import rules
from controller.telemetry.http_client import keep_server_name
from controller.telemetry.source import describe_error
from controller.types import (
    PRIORITY_CLASSES,
    ClassObservation,
    FleetObservation,
    PoolObservation,
    Reading,
    SignalStatus,
)


class TransportError(RuntimeError):
    """Prometheus could not be reached (or did not answer in time): nothing this read can be trusted."""


def _field(spec: promql.QuerySpec) -> str:
    return spec.fills.split(".", 1)[1]


def parse_vector(result: object, label: str) -> tuple[dict[str, tuple[float, float]], list[str]]:
    """An instant-vector result → {label value: (evaluation time, value)} and any problems found.

    Series without `label` are ignored; a second series for the same label value
    is a problem (the query should aggregate `by (label)`), and the first is kept.
    """
    out: dict[str, tuple[float, float]] = {}
    problems: list[str] = []
    if not isinstance(result, list):
        return out, [f"expected an instant vector, got {type(result).__name__}"]
    for item in result:
        try:
            key = item["metric"].get(label)
            ts, raw = item["value"]
            value = float(raw)  # "NaN", "+Inf" and "-Inf" parse too
            ts = float(ts)
        except (KeyError, TypeError, ValueError, AttributeError):
            problems.append(f"unreadable sample {item!r:.120}")
            continue
        if key is None:
            continue
        if key in out:
            problems.append(f"more than one series for {label}={key!r} (aggregate with 'by ({label})')")
            continue
        out[key] = (ts, value)
    return out, problems


def _reading(value: float | None, age_s: float, stale_after_s: float) -> Reading:
    if value is not None and math.isinf(value):
        return Reading(value, SignalStatus.NAN, age_s)
    return Reading.of(value, age_s, stale_after_s)


def observation_from_results(now_s: float, pools: Sequence[str], classes: Sequence[str],
                             results: Mapping[str, object], *, pool_label: str = promql.POOL,
                             stale_after_s: float = 60.0, source: str = "prometheus",
                             errors: Sequence[str] = ()) -> FleetObservation:
    """Assemble a FleetObservation from query results (name → vector result list, or the exception raised).

    Pure: the table tests feed it canned API answers. A query name missing from
    `results` or mapped to an exception leaves its field MISSING.
    """
    errs = list(errors)
    parsed: dict[str, dict[str, tuple[float, float]]] = {}
    for name, spec in promql.QUERIES.items():
        res = results.get(name)
        if res is None or isinstance(res, BaseException):
            continue
        label = promql.CLASS_LABEL if spec.group == promql.CLASS or name == "class_sample_time" else pool_label
        parsed[name], problems = parse_vector(res, label)
        errs.extend(f"query {name}: {p}" for p in problems)

    def age_of(freshness: str, key: str, eval_ts: float) -> float:
        newest = parsed.get(freshness, {}).get(key)
        if newest is None:  # unknown: the value's own evaluation is all we have
            return 0.0
        return max(0.0, eval_ts - newest[1])

    pool_fields: dict[str, dict[str, Reading]] = {p: {} for p in pools}
    class_fields: dict[str, dict[str, Reading]] = {c: {} for c in classes}
    for name, spec in promql.QUERIES.items():
        if spec.group == promql.FRESHNESS or name not in parsed:
            continue
        target = pool_fields if spec.group == promql.POOL else class_fields
        for key, fields in target.items():
            got = parsed[name].get(key)
            if got is None:
                continue  # stays MISSING
            eval_ts, value = got
            fields[_field(spec)] = _reading(value, age_of(spec.freshness, key, eval_ts), stale_after_s)
    return FleetObservation(
        at_s=now_s,
        # (the PromQL queries aggregate by pool: no per-replica readings, `replicas` stays empty)
        pools={p: PoolObservation(pool=p, **cast("dict[str, Any]", f)) for p, f in pool_fields.items()},
        classes={c: ClassObservation(priority_class=c, **f) for c, f in class_fields.items()},
        source=source,
        errors=tuple(errs),
    )


@dataclass(frozen=True, slots=True)
class _Health:
    ok: bool
    message: str


class PrometheusSource:
    """Reads the fleet through Prometheus (implements TelemetrySource).

    `client` may be a pre-built PrometheusConnect; by default one is built for `url` with no retries
    (the next tick is the retry), `timeout_s` as the request timeout, and `session` / `auth` (auth,
    headers, TLS: controller/telemetry/http_client.py) if given. A 401/403 answer is one transport
    error, "authentication refused", for the whole read. `recording_rules` reads the series
    recorded by Governor's rules (rules.py) with one query instead of evaluating
    every default query.
    """

    name = "prometheus"

    def __init__(self, pools: Sequence[str], *, url: str = "http://127.0.0.1:9090", timeout_s: float = 5.0,
                 pool_label: str = promql.POOL, window_s: float = 60.0, stale_after_s: float = 60.0,
                 queries: Mapping[str, str] | None = None, clock: Clock | None = None,
                 classes: Sequence[str] = PRIORITY_CLASSES, client: PrometheusConnect | None = None,
                 max_parallel: int = 4, recording_rules: bool = False, session: requests.Session | None = None,
                 auth: requests.auth.AuthBase | None = None) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: {timeout_s} must be > 0")
        self.pools = tuple(pools)
        self.classes = tuple(classes)
        self.url = url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.pool_label = pool_label
        self.stale_after_s = float(stale_after_s)
        self.queries = promql.render_all(pool_label, window_s, queries)
        self.recording_rules = bool(recording_rules)
        overridden = set(queries or {})
        # record name -> query name, for the default queries not overridden in the config
        self.records: dict[str, str] = rules.record_names(
            window_s, {n: None for n in promql.QUERY_NAMES if n not in overridden}) if self.recording_rules else {}
        self._raw_with_rules = {n: self.queries[n] for n in promql.QUERY_NAMES if n in overridden}
        self._rules_selector = rules.selector(list(self.records)) if self.records else ""
        self._windowed = {r for r in self.records if r.rsplit(":", 1)[1].startswith(("rate", "histogram_quantile"))}
        self.clock = clock or WallClock()
        # The read's budget bounds real I/O, so it runs on real monotonic time even when the daemon's clock is
        # virtual (a replay or a test): a virtual clock would never spend it and a hung Prometheus would cost
        # the timeout once per query instead of once per read.
        self._io_clock = WallClock()
        self.client = client or PrometheusConnect(
            url=self.url, timeout=self.timeout_s, session=session, auth=auth,
            retry=Retry(total=0, connect=0, read=0, status=0, redirect=0, raise_on_status=False),
        )
        if session is not None:
            keep_server_name(session, self.url)
        self._health = _Health(False, "not read yet")
        self._pool = futures.ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="prometheus-query")

    def _query(self, promql_text: str, remaining_s: float) -> object:
        try:
            return self.client.custom_query(promql_text, params={"timeout": f"{max(1, int(remaining_s * 1000))}ms"},
                                            timeout=remaining_s)
        except requests.RequestException as exc:  # refused, reset, timed out, TLS, not JSON: nothing can be trusted
            raise TransportError(describe_error(exc)) from None
        except PrometheusApiClientException as exc:
            # 401/403: every query will be refused the same way; one clear error instead of one per query
            code = str(exc).removeprefix("HTTP Status Code ").split(" ", 1)[0]
            if code in ("401", "403"):
                raise TransportError(f"authentication refused (HTTP {code}): check telemetry.prometheus "
                                     "basic_auth / bearer_token_file / headers") from None
            raise

    def _run(self, queries: Mapping[str, str], deadline: float,
             results: dict[str, object], errors: list[str]) -> tuple[int, str | None]:
        """Run `queries` (a few at a time) until `deadline`; fill `results`/`errors`; (answered, transport error)."""
        answered = 0
        transport_error: str | None = None
        budget = max(0.001, deadline - self._io_clock.monotonic_s())
        pending = {name: self._pool.submit(self._query, text, budget) for name, text in queries.items()}
        for name, fut in pending.items():
            remaining = deadline - self._io_clock.monotonic_s()
            try:
                results[name] = fut.result(timeout=max(0.0, remaining))
                answered += 1
            except futures.TimeoutError:
                errors.append(f"prometheus {self.url}: read budget of {self.timeout_s:g} s spent; "
                              f"query {name} unanswered")
            except TransportError as exc:
                transport_error = transport_error or f"prometheus {self.url}: {exc}"
            except (PrometheusApiClientException, KeyError, TypeError, ValueError) as exc:
                results[name] = exc
                errors.append(f"query {name}: {describe_error(exc)}")
        return answered, transport_error

    def _split_recorded(self, result: object, results: dict[str, object], errors: list[str]) -> bool:
        """Distribute the recorded series into per-query results; False when no recorded series came back."""
        if not isinstance(result, list):
            errors.append(f"query recording_rules: expected an instant vector, got {type(result).__name__}")
            return False
        by_query: dict[str, list] = {name: [] for name in self.records.values()}
        seen: set[str] = set()
        for item in result:
            try:
                record = item["metric"]["__name__"]
            except (KeyError, TypeError):
                continue
            name = self.records.get(record)
            if name is not None:
                by_query[name].append(item)
                seen.add(record)
        if not seen:
            return False
        if self._windowed and not (seen & self._windowed):
            tag = next(iter(self._windowed)).rsplit("rate", 1)[1]
            errors.append(f"recording rules: gauges are recorded but no rate over {tag}: were the rules generated "
                          f"for another telemetry.window_s? (python -m controller.telemetry.rules --window-s ...)")
        results.update(by_query)
        return True

    def read(self, now_s: float) -> FleetObservation:
        """Run every query (a few at a time: Prometheus evaluates them in parallel) within the budget."""
        results: dict[str, object] = {}
        errors: list[str] = []
        deadline = self._io_clock.monotonic_s() + self.timeout_s
        fell_back = False
        if self.recording_rules:
            answered, total, transport_error, fell_back = self._read_recorded(deadline, results, errors)
        else:
            answered, transport_error = self._run(self.queries, deadline, results, errors)
            total = len(self.queries)
        if transport_error is not None:
            errors = [transport_error]
            results = {}  # a broken connection taints the whole read: every reading MISSING
            answered = 0
        obs = observation_from_results(now_s, self.pools, self.classes, results, pool_label=self.pool_label,
                                       stale_after_s=self.stale_after_s, source=self.name, errors=errors)
        if answered == 0:
            self._health = _Health(False, errors[0] if errors else "no query answered")
        else:
            self._health = _Health(answered == total and not fell_back, f"{answered}/{total} queries answered"
                                   + (f"; first error: {errors[0]}" if errors else ""))
        return obs

    def _read_recorded(self, deadline: float, results: dict[str, object],
                       errors: list[str]) -> tuple[int, int, str | None, bool]:
        """The recorded series in one query (plus the queries no rule records), into `results`; the raw
        queries instead when Prometheus holds no governor:* series. (answered, asked, transport
        error, fell back)."""
        raw: dict[str, object] = {}
        asked = {"recording_rules": self._rules_selector, **self._raw_with_rules} if self.records \
            else dict(self._raw_with_rules)
        answered, transport_error = self._run(asked, deadline, raw, errors)
        total = len(asked)
        recorded = raw.pop("recording_rules", None)
        results.update(raw)
        if transport_error is not None or not self.records or isinstance(recorded, BaseException | None):
            return answered, total, transport_error, False
        if self._split_recorded(recorded, results, errors):
            return answered, total, None, False
        # The rules are not loaded (or not evaluated yet): say so, and read the raw queries instead.
        errors.append(f"recording rules: no governor:* series in {self.url} (are "
                      f"deploy/prometheus/governor-rules.yml loaded and evaluated? or is there nothing "
                      f"to record?); read the raw queries instead")
        rest = {n: self.queries[n] for n in self.records.values()}
        more, transport_error = self._run(rest, deadline, results, errors)
        return answered + more, total + len(rest), transport_error, True

    def health(self) -> tuple[bool, str]:
        h = self._health
        return h.ok, h.message

    def set_pools(self, pools: Sequence[str]) -> None:
        """The configured pools changed (a config reload): the next read reports these pools."""
        self.pools = tuple(pools)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


__all__ = ["PrometheusSource", "TransportError", "observation_from_results", "parse_vector"]
