"""Recording rules: the shipped files match the generator, promtool accepts them, and reading the recorded
series gives the same observation as the raw queries on a real Prometheus."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from controller.metrics import promql
from controller.telemetry import rules
from controller.telemetry.prometheus import PrometheusSource
from controller.types import FleetObservation, Reading, SignalStatus
from tests.fixtures.prometheus import wait_until

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES_FILE = DEPLOY / "prometheus" / "governor-rules.yml"


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool is not installed (Debian's prometheus package provides it; `make test` installs it)")
    return tool


# --------------------------------------------------------------------------- the files


def test_shipped_rules_file_is_the_generators_output() -> None:
    assert RULES_FILE.read_text() == rules.render_rules_yaml(), \
        "deploy/prometheus/governor-rules.yml drifted: python -m controller.telemetry.rules > it"


def test_prometheusrule_manifest_has_the_same_groups() -> None:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "prometheusrule.yaml").read_text()) if d]
    assert [d["kind"] for d in docs] == ["PrometheusRule"]
    assert docs[0]["spec"] == rules.recording_rules()


@pytest.mark.parametrize("pool_label,window_s", [("pool", 60.0), ("inference_pool", 30.0), ("pool", 2.5)])
def test_promtool_accepts_the_rules(tmp_path, pool_label: str, window_s: float) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(rules.render_rules_yaml(pool_label, window_s))
    res = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(promql.QUERIES)} rules found" in res.stdout


def test_prometheus_config_loads_the_rules_file(tmp_path) -> None:
    """prometheus.yml's rule_files glob finds governor-rules.yml next to it (checked on copies, without the
    Kubernetes jobs Debian's promtool cannot parse)."""
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    cfg["scrape_configs"] = [j for j in cfg["scrape_configs"] if "kubernetes_sd_configs" not in j]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    shutil.copy(RULES_FILE, tmp_path / RULES_FILE.name)
    res = subprocess.run([_promtool(), "check", "config", str(tmp_path / "prometheus.yml")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 rule files found" in res.stdout and f"{len(promql.QUERIES)} rules found" in res.stdout


def test_record_names_follow_the_convention_and_carry_the_window() -> None:
    names = rules.record_names(60.0)
    assert sorted(names.values()) == sorted(promql.QUERY_NAMES)  # one per query, no collision
    for record, query in names.items():
        assert re.fullmatch(r"governor:(pool|class|gpu)_[a-z0-9_]+:[a-z0-9_]+", record), record
        windowed = "rate(" in promql.QUERIES[query].template
        assert record.endswith("1m") is windowed, record
    assert rules.record_name("ttft_p95_s") == "governor:pool_ttft_p95_s:histogram_quantile_rate1m"
    assert rules.record_name("class_arrival_rps", 30) == "governor:class_arrival_rps:rate30s"
    assert rules.record_name("running", 30) == "governor:pool_running:sum"
    assert [rules.duration_tag(w) for w in (60, 300, 7200, 90, 2.5)] == ["1m", "5m", "2h", "90s", "2500ms"]


def test_rules_cli_rejects_bad_arguments(capsys) -> None:
    assert rules.main(["--pool-label", "bad-label"]) == 2
    assert "--pool-label" in capsys.readouterr().err
    assert rules.main(["--window-s", "0"]) == 2
    assert "--window-s" in capsys.readouterr().err


# --------------------------------------------------------------------------- a real Prometheus


def _fields(obs: FleetObservation) -> dict[tuple[str, str], Reading]:
    out = {}
    for p, po in obs.pools.items():
        out.update({(p, f): getattr(po, f) for f in po.__dataclass_fields__ if isinstance(getattr(po, f), Reading)})
    for c, co in obs.classes.items():
        out.update({(c, f): getattr(co, f) for f in co.__dataclass_fields__ if isinstance(getattr(co, f), Reading)})
    return out


def _recorded_everything(prom, source: PrometheusSource, expected: int) -> bool:
    got = prom.query(f"count({rules.selector(list(source.records))})")
    return bool(got) and float(got[0]["value"][1]) >= expected


@pytest.mark.e2e
def test_recorded_series_give_the_same_observation_as_raw_queries(tmp_path, prometheus_factory, linear_fleet):
    window_s = 5.0
    rules_path = tmp_path / "governor-rules.yml"
    rules_path.write_text(rules.render_rules_yaml("pool", window_s))
    prom = prometheus_factory(static_targets=linear_fleet.static_targets(), rule_files=[rules_path])
    prom.wait_for("count(up == 1) >= 6", deadline_s=30)
    prom.wait_for("min(count_over_time(llm_d_epp_request_total[10s])) >= 8", deadline_s=30)
    prom.wait_for("min(count_over_time(vllm:prompt_tokens_total[10s])) >= 8", deadline_s=30)

    raw = PrometheusSource(["a", "b"], url=prom.url, timeout_s=10, window_s=window_s, stale_after_s=60)
    rec = PrometheusSource(["a", "b"], url=prom.url, timeout_s=10, window_s=window_s, stale_after_s=60,
                           recording_rules=True)
    # Rules evaluate every second: wait (bounded) until every series the raw queries return is recorded too,
    # and the rates were evaluated over a full window of samples (the rule may lag the scrapes by one interval).
    raw_series = sum(len(prom.query(q)) for q in raw.queries.values())
    wait_until(lambda: _recorded_everything(prom, rec, raw_series), deadline_s=30, interval_s=0.25,
               what="every raw series to be recorded")
    prom.wait_for("min_over_time(governor:pool_prompt_tokens_rps:rate5s[3s]) > 95", deadline_s=30)

    a, b = raw.read(100.0), rec.read(100.0)
    assert a.errors == () and b.errors == (), (a.errors, b.errors)
    assert rec.health() == (True, "1/1 queries answered")
    fa, fb = _fields(a), _fields(b)
    assert fa.keys() == fb.keys()
    compared = 0
    for key, ra in fa.items():
        rb = fb[key]
        assert ra.status is rb.status, (key, ra, rb)
        if ra.value is None or math.isnan(ra.value):
            assert rb.value is None or math.isnan(rb.value), (key, ra, rb)
            continue
        # Rates are extrapolated from samples taken at slightly different instants (query vs rule time).
        assert rb.value == pytest.approx(ra.value, rel=0.05, abs=1e-9), (key, ra, rb)
        # Recorded values are at most one evaluation interval (1 s) + the query's own latency older.
        assert rb.age_s == pytest.approx(ra.age_s, abs=3.0), (key, ra, rb)
        compared += 1
    assert compared >= 20  # the comparison covered pools a and b and the classes, not just MISSINGs
    assert fb[("a", "ttft_p95_s")].value == pytest.approx(0.5 + 0.25 * 2.5 / 3, rel=1e-6)
    assert fb[("b", "running")].status is SignalStatus.STALE

    # An override still runs as its own raw query next to the recorded series.
    over = PrometheusSource(["a"], url=prom.url, timeout_s=10, window_s=window_s, recording_rules=True,
                            queries={"waiting": "sum by ($pool) (vllm:num_requests_waiting) * 10"})
    obs = over.read(1.0)
    assert obs.pools["a"].waiting.value == 10 and obs.pools["a"].running.value == 6, obs.errors
    assert over.health() == (True, "2/2 queries answered")

    # Rules generated for another window: gauges are found, rates are not, and the read says why.
    other = PrometheusSource(["a"], url=prom.url, timeout_s=10, window_s=7, recording_rules=True)
    obs = other.read(1.0)
    assert obs.pools["a"].running.value == 6 and obs.pools["a"].prompt_tokens_rps.status is SignalStatus.MISSING
    assert any("telemetry.window_s" in e for e in obs.errors), obs.errors
    for src in (raw, rec, over, other):
        src.close()


@pytest.mark.e2e
def test_without_the_rules_loaded_the_read_says_so_and_falls_back(prometheus_factory, linear_fleet):
    prom = prometheus_factory(static_targets=linear_fleet.static_targets())
    prom.wait_for("count(up == 1) >= 6", deadline_s=30)
    src = PrometheusSource(["a", "b"], url=prom.url, timeout_s=10, window_s=5, recording_rules=True)
    obs = src.read(1.0)
    assert obs.pools["a"].running.value == 6  # from the raw queries
    assert any("governor-rules.yml" in e for e in obs.errors), obs.errors
    ok, message = src.health()
    assert not ok and "governor-rules.yml" in message
    src.close()
