"""PrometheusSource: canned API answers (table), a Prometheus that is down, and a real Prometheus (e2e)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from controller.clock import VirtualClock
from controller.metrics import promql
from controller.telemetry.prometheus import PrometheusSource, observation_from_results, parse_vector
from controller.types import SignalStatus
from tests.fixtures.prometheus import free_port

OK, MISSING, NAN, STALE = SignalStatus.OK, SignalStatus.MISSING, SignalStatus.NAN, SignalStatus.STALE


# --------------------------------------------------------------------------- canned API answers


def vec(label: str, **values: tuple[float, str]) -> list[dict]:
    """An instant-vector result: vec("pool", a=(eval_ts, "1.5")) → [{"metric": {"pool": "a"}, "value": [...]}]."""
    return [{"metric": {label: k}, "value": [ts, v]} for k, (ts, v) in values.items()]


@dataclass
class Case:
    label: str
    results: dict[str, object]
    expect: dict[tuple[str, str], tuple[float | None, SignalStatus]]
    errors: tuple[str, ...] = ()
    pool_label: str = "pool"
    stale_after_s: float = 60.0
    age: dict[tuple[str, str], float] = field(default_factory=dict)


T = 1_700_000_000.0
CASES = [
    Case("values land in their fields, per pool",
         {"running": vec("pool", a=(T, "7"), b=(T, "0")), "ttft_p95_s": vec("pool", a=(T, "0.42")),
          "pool_sample_time": vec("pool", a=(T, str(T - 5)), b=(T, str(T - 1)))},
         {("a", "running"): (7, OK), ("b", "running"): (0, OK), ("a", "ttft_p95_s"): (0.42, OK),
          ("b", "ttft_p95_s"): (None, MISSING), ("a", "waiting"): (None, MISSING)},
         age={("a", "running"): 5.0, ("b", "running"): 1.0}),
    Case("NaN (a quantile over an idle window) and +Inf are NAN",
         {"ttft_p95_s": vec("pool", a=(T, "NaN"), b=(T, "+Inf"))},
         {("a", "ttft_p95_s"): (None, NAN), ("b", "ttft_p95_s"): (None, NAN)}),
    Case("a pool whose newest sample is older than stale_after_s is STALE",
         {"running": vec("pool", a=(T, "3"), b=(T, "4")),
          "pool_sample_time": vec("pool", a=(T, str(T - 61)), b=(T, str(T - 59)))},
         {("a", "running"): (3, STALE), ("b", "running"): (4, OK)}, age={("a", "running"): 61.0}),
    Case("DCGM freshness is judged separately from the engines'",
         {"running": vec("pool", a=(T, "3")), "gpu_util_frac": vec("pool", a=(T, "0.5")),
          "pool_sample_time": vec("pool", a=(T, str(T))), "gpu_sample_time": vec("pool", a=(T, str(T - 300)))},
         {("a", "running"): (3, OK), ("a", "gpu_util_frac"): (0.5, STALE)}),
    Case("a failed query leaves its field MISSING",
         {"running": RuntimeError("HTTP Status Code 400"), "waiting": vec("pool", a=(T, "2"))},
         {("a", "running"): (None, MISSING), ("a", "waiting"): (2, OK)}),
    Case("series of unknown pools and without the label are ignored; a duplicate is reported",
         {"running": [{"metric": {"pool": "zzz"}, "value": [T, "9"]}, {"metric": {}, "value": [T, "9"]},
                      {"metric": {"pool": "a", "instance": "x"}, "value": [T, "1"]},
                      {"metric": {"pool": "a", "instance": "y"}, "value": [T, "2"]}]},
         {("a", "running"): (1, OK)}, errors=("query running: more than one series for pool='a'",)),
    Case("a custom pool label",
         {"running": vec("inference_pool", a=(T, "5"))}, {("a", "running"): (5, OK)}, pool_label="inference_pool"),
    Case("classes by priority, with their own freshness",
         {"class_arrival_rps": vec("priority", critical=(T, "2.5"), standard=(T, "4")),
          "class_sample_time": vec("priority", critical=(T, str(T - 100)), standard=(T, str(T)))},
         {("critical", "arrival_rps"): (2.5, STALE), ("standard", "arrival_rps"): (4, OK),
          ("sheddable", "arrival_rps"): (None, MISSING)}),
    Case("an unreadable sample is reported, not raised",
         {"running": [{"metric": {"pool": "a"}, "value": [T, "not a number"]}]},
         {("a", "running"): (None, MISSING)}, errors=("query running: unreadable sample",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
def test_observation_from_results(case: Case) -> None:
    obs = observation_from_results(42.0, ["a", "b"], ["critical", "standard", "sheddable"], case.results,
                                   pool_label=case.pool_label, stale_after_s=case.stale_after_s)
    assert obs.at_s == 42.0 and obs.source == "prometheus"
    for (key, fname), (value, status) in case.expect.items():
        holder = obs.pools.get(key) or obs.classes[key]
        r = getattr(holder, fname)
        assert r.status is status, f"{key}.{fname}: {r}"
        if value is not None:
            assert r.value == pytest.approx(value)
        if (key, fname) in case.age:
            assert r.age_s == pytest.approx(case.age[(key, fname)])
    for s in case.errors:
        assert any(s in e for e in obs.errors), obs.errors


def test_parse_vector_rejects_non_vectors() -> None:
    values, problems = parse_vector([T, "1"], "pool")  # a scalar result
    assert values == {} and problems


def test_every_pool_query_groups_by_the_pool_label() -> None:
    for name, text in promql.render_all("my_pool", 30).items():
        spec = promql.QUERIES[name]
        wanted = "priority" if spec.group == promql.CLASS or name == "class_sample_time" else "my_pool"
        assert f"by ({wanted})" in text or f"by (le, {wanted})" in text, name
        assert "$" not in text, name
        if "rate(" in text:
            assert "[30s]" in text, name


def test_a_prometheus_that_is_down_gives_missing_and_an_error() -> None:
    src = PrometheusSource(["a"], url=f"http://127.0.0.1:{free_port()}", timeout_s=2.0, clock=VirtualClock())
    obs = src.read(10.0)
    assert obs.pools["a"].running.status is MISSING and obs.pools["a"].ttft_p95_s.status is MISSING
    assert obs.classes["critical"].arrival_rps.status is MISSING
    assert obs.all_stale
    assert len(obs.errors) == 1 and "127.0.0.1" in obs.errors[0]
    assert src.health()[0] is False
    src.close()


# --------------------------------------------------------------------------- a real Prometheus


@pytest.mark.e2e
def test_real_prometheus_readings_match_the_served_values(prometheus_factory, linear_fleet):
    prom = prometheus_factory(static_targets=linear_fleet.static_targets())
    # Wait (bounded) until every target is up and the series are older than the 5 s rate window: rate()
    # of a series younger than its window extrapolates only half an interval before the first sample.
    prom.wait_for("count(up == 1) >= 6", deadline_s=30)
    prom.wait_for("min(count_over_time(llm_d_epp_request_total[10s])) >= 8", deadline_s=30)
    prom.wait_for("min(count_over_time(vllm:prompt_tokens_total[10s])) >= 8", deadline_s=30)

    src = PrometheusSource(["a", "b"], url=prom.url, timeout_s=10, window_s=5, stale_after_s=60)
    obs = src.read(1234.0)
    assert obs.errors == (), obs.errors
    assert src.health() == (True, f"{len(promql.QUERIES)}/{len(promql.QUERIES)} queries answered")
    a, b = obs.pools["a"], obs.pools["b"]
    # gauges: running 4 + 2, waiting 1, KV mean (0.7 + 0.3) / 2 (a2 only has the old name)
    assert (a.replicas_ready.value, a.running.value, a.waiting.value) == (2, 6, 1)
    assert a.kv_usage_frac.value == pytest.approx(0.5)
    # hits 30/s over queries 100 + 50/s (a2 via the old counter names); the two targets are scraped at
    # different instants, so the rates are extrapolated differently: approximately 0.2
    assert a.hit_rate.value == pytest.approx(0.2, rel=0.05)
    # Quantiles come from one target, so only ratios of its own rates matter: exact.
    # TTFT cumulative per second 1, 7, 10: p50 = 0.25 + 0.25 × 4/6, p95 = 0.5 + 0.25 × 2.5/3
    assert a.ttft_p50_s.value == pytest.approx(0.25 + 0.25 * 4 / 6, rel=1e-6)
    assert a.ttft_p95_s.value == pytest.approx(0.5 + 0.25 * 2.5 / 3, rel=1e-6)
    assert a.tpot_p50_s.value == pytest.approx(0.0375, rel=1e-6)
    # absolute rates depend on scrape timing jitter; Prometheus extrapolates to the window edges
    assert a.prompt_tokens_rps.value == pytest.approx(100, rel=0.05)
    assert a.arrival_rps.value == pytest.approx(10, rel=0.05)
    # DCGM: the two GPUs mapped to pods, engine-active ratio: (0.8 + 0.4) / 2
    assert a.gpu_util_frac.value == pytest.approx(0.6)
    assert all(r.ok for r in (a.running, a.hit_rate, a.ttft_p95_s, a.gpu_util_frac))
    # pool b's samples are 120 s old: STALE, with their age; its rates need two samples → MISSING
    assert b.running.status is STALE and b.running.value == 9 and b.running.age_s >= 120
    assert b.prompt_tokens_rps.status is MISSING
    c, s = obs.classes["critical"], obs.classes["standard"]
    assert c.arrival_rps.value == pytest.approx(2, rel=0.05) and c.shed_rps.value == 0 and c.shed_rps.ok
    assert s.arrival_rps.value == pytest.approx(5, rel=0.05) and s.shed_rps.value == pytest.approx(1, rel=0.05)
    assert s.admitted_rps.value == pytest.approx(4, rel=0.05)
    assert obs.classes["sheddable"].arrival_rps.status is MISSING

    # A broken override fails alone: HTTP 400 for that query, the rest still read.
    bad = PrometheusSource(["a"], url=prom.url, timeout_s=10, window_s=5,
                           queries={"waiting": "sum by ($pool) (vllm:num_requests_waiting"})
    obs = bad.read(1.0)
    assert obs.pools["a"].waiting.status is MISSING and obs.pools["a"].running.value == 6
    assert len(obs.errors) == 1 and obs.errors[0].startswith("query waiting:") and "400" in obs.errors[0]

    # Prometheus goes away: every reading MISSING, one error, no exception.
    prom.stop()
    obs = src.read(1249.0)
    assert all(getattr(obs.pools["a"], f).status is MISSING for f in ("replicas_ready", "running", "ttft_p95_s"))
    assert obs.all_stale and len(obs.errors) == 1 and prom.url in obs.errors[0]
    assert src.health()[0] is False
    src.close()
    bad.close()
