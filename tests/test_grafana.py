"""Grafana dashboards: the committed JSON is what grafana/dashboards.py builds, and every PromQL in it
parses and names metrics (and matcher labels) that really exist.

`governor_*` names are checked against the daemon's own registry
(controller.obs.daemon_metrics.DaemonMetrics) with the suffixes Prometheus exposes
(`_total` for counters; `_bucket`/`_sum`/`_count` for histograms). Fleet names are
checked against what the simulator's exposition collectors render over a tiny set of
stats objects, so renaming a metric on either side breaks this test. Without the
Grafana Foundation SDK these tests fail (they do not skip).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from controller.obs.daemon_metrics import DaemonMetrics
from controller.sim.exposition import NodeCollector, ReplicaCollector, RouterCollector, collect_families
from controller.sim.stats import NodeStats, ReplicaStats, RouterStats

ROOT = Path(__file__).resolve().parents[1]
GRAFANA = ROOT / "grafana"
SDK_PIN = "grafana-foundation-sdk==1769699379!11.6.0"
FILES = ("governor-control-loop.json", "fleet.json")

# Labels the scrape adds to every target (Prometheus) and, for engines and DCGM, the pool label
# that deploy/ relabels in. The router serves every pool, so its target carries no pool label.
SCRAPE_LABELS = frozenset({"job", "instance", "namespace", "pod"})
POOL_TARGET_LABEL = "pool"


# --------------------------------------------------------------------------- loading


def _load_dashboards_module():
    if importlib.util.find_spec("grafana_foundation_sdk") is None:
        pytest.fail(f"the Grafana Foundation SDK is not installed: pip install '{SDK_PIN}' "
                    "(it belongs in pyproject's dev extras)", pytrace=False)
    spec = importlib.util.spec_from_file_location("governor_grafana_dashboards", GRAFANA / "dashboards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dashboards():
    return _load_dashboards_module()


@pytest.fixture(scope="module")
def committed() -> dict[str, dict]:
    return {name: json.loads((GRAFANA / name).read_text()) for name in FILES}


def _targets(dashboard: dict):
    """(panel title, refId, expr) for every query of every panel."""
    for panel in dashboard["panels"]:
        for t in panel.get("targets", []):
            yield panel["title"], t.get("refId", "?"), t["expr"]


def _all_exprs(committed: dict[str, dict]) -> list[tuple[str, str, str, str]]:
    return [(name, title, ref, expr) for name, d in committed.items() for title, ref, expr in _targets(d)]


# --------------------------------------------------------------------------- a small PromQL scanner

AGGREGATORS = frozenset({"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk", "bottomk",
                         "quantile", "count_values", "limitk", "limit_ratio"})
FUNCTIONS = AGGREGATORS | frozenset({
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min",
    "count_over_time", "delta", "deriv", "exp", "floor", "histogram_quantile", "idelta", "increase", "irate",
    "label_join", "label_replace", "last_over_time", "ln", "log2", "log10", "max_over_time", "min_over_time",
    "predict_linear", "quantile_over_time", "rate", "resets", "round", "scalar", "sort", "sort_desc", "sqrt",
    "stddev_over_time", "sum_over_time", "time", "timestamp", "vector"})
LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
WORDS = frozenset({"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"})

_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?(?:ms|[smhdwy])*")
_MATCHER = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*")
_PAIRS = {"(": ")", "[": "]", "{": "}"}


def _skip_string(expr: str, i: int) -> int:
    """Index just past the string literal starting at expr[i]; raises on an unterminated one."""
    quote, i = expr[i], i + 1
    while i < len(expr):
        if expr[i] == "\\" and quote != "`":
            i += 2
            continue
        if expr[i] == quote:
            return i + 1
        i += 1
    raise ValueError(f"unterminated string in {expr!r}")


def bracket_problem(expr: str) -> str | None:
    """Why the brackets of `expr` do not balance (strings ignored), or None."""
    stack: list[str] = []
    i = 0
    while i < len(expr):
        c = expr[i]
        if c in "\"'`":
            try:
                i = _skip_string(expr, i)
            except ValueError as exc:
                return str(exc)
            continue
        if c in _PAIRS:
            stack.append(_PAIRS[c])
        elif c in ")]}" and (not stack or stack.pop() != c):
            return f"unexpected {c!r} at {i}"
        i += 1
    return f"unclosed {stack[-1]!r}" if stack else None


def _skip_group(expr: str, i: int, close: str) -> int:
    """Index just past the bracket group that opens at expr[i] (strings inside are skipped)."""
    depth, opener = 0, expr[i]
    while i < len(expr):
        c = expr[i]
        if c in "\"'`":
            i = _skip_string(expr, i)
            continue
        if c == opener:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError(f"unclosed {opener!r} in {expr!r}")


def selectors(expr: str) -> list[tuple[str, frozenset[str]]]:
    """Every vector selector in `expr` as (metric name, label names it matches on).

    Raises ValueError for a call of an unknown function or a selector without a metric name
    (this checker wants every series named). E.g. 'sum by (pool) (rate(x_total{pool=~"a"}[1m]))'
    → [("x_total", {"pool"})].
    """
    out: list[tuple[str, frozenset[str]]] = []
    i = 0
    while i < len(expr):
        c = expr[i]
        if c.isspace():
            i += 1
        elif c in "\"'`":
            i = _skip_string(expr, i)
        elif c == "[":
            i = _skip_group(expr, i, "]")
        elif c == "{":
            raise ValueError(f"selector without a metric name at {i} in {expr!r}")
        elif m := _NUMBER.match(expr, i):
            i = m.end()
        elif m := _IDENT.match(expr, i):
            word, i = m.group(), m.end()
            j = i
            while j < len(expr) and expr[j].isspace():
                j += 1
            nxt = expr[j] if j < len(expr) else ""
            if word in LABEL_LIST_KEYWORDS:
                if nxt == "(":
                    i = _skip_group(expr, j, ")")
            elif nxt == "(" and word not in WORDS:
                if word not in FUNCTIONS:
                    raise ValueError(f"unknown function {word!r} in {expr!r}")
            elif word in AGGREGATORS or word in WORDS:
                pass
            else:
                labels: set[str] = set()
                if nxt == "{":
                    end = _skip_group(expr, j, "}")
                    body, k = expr[j + 1:end - 1], 0
                    while k < len(body):
                        mm = _MATCHER.match(body, k)
                        if not mm:
                            if body[k] in ", ":
                                k += 1
                                continue
                            raise ValueError(f"bad label matcher {body[k:]!r} in {expr!r}")
                        labels.add(mm.group(1))
                        k = _skip_string(body, mm.end())
                    i = end
                out.append((word, frozenset(labels)))
        else:
            i += 1
    return out


@pytest.mark.parametrize("expr, expected", [
    ('sum by (pool) (rate(x_total{pool=~"$pool"}[$__rate_interval]))', [("x_total", {"pool"})]),
    ("histogram_quantile(0.95, sum by (le, phase) (rate(h_bucket[5m])))", [("h_bucket", set())]),
    ('a{b="}",c!~"x\\"y"} / on (d) group_left (e) f offset 5m', [("a", {"b", "c"}), ("f", set())]),
    ("60 * sum(rate(vllm:num_preemptions_total[1m])) > bool 1e-9", [("vllm:num_preemptions_total", set())]),
    ("max(g) == 1 or vector(0)", [("g", set())]),
])
def test_selector_scanner(expr, expected):
    assert [(n, set(ls)) for n, ls in selectors(expr)] == expected


@pytest.mark.parametrize("expr", ['{pool="a"}', "rte(x[1m])", 'x{pool}', 'x{pool="a'])
def test_selector_scanner_rejects(expr):
    with pytest.raises(ValueError):
        selectors(expr)


@pytest.mark.parametrize("expr, ok", [
    ("sum(rate(x[1m]))", True), ('x{a="(("}', True), ("sum(rate(x[1m])", False), ("x[1m)", False),
    ("x}", False), ('x{a="b}', False),
])
def test_bracket_check(expr, ok):
    assert (bracket_problem(expr) is None) is ok


# --------------------------------------------------------------------------- what exists


def governor_series() -> dict[str, frozenset[str]]:
    """Exposed series name → label names, for every metric on the daemon's registry."""
    metrics = DaemonMetrics()
    labelnames: dict[str, tuple[str, ...]] = {}
    for value in vars(metrics).values():
        # prometheus_client keeps a metric's base name and label names on the wrapper
        name, names = getattr(value, "_name", None), getattr(value, "_labelnames", None)
        if isinstance(name, str) and names is not None:
            labelnames[name] = tuple(names)
    out: dict[str, frozenset[str]] = {}
    for family in metrics.registry.collect():
        labels = frozenset(labelnames.get(family.name, ())) | {"job", "instance"}
        if family.type == "counter":
            out[family.name + "_total"] = labels
        elif family.type == "histogram":
            out[family.name + "_bucket"] = labels | {"le"}
            out[family.name + "_sum"] = labels
            out[family.name + "_count"] = labels
        else:
            out[family.name] = labels
    return out


def fleet_series() -> dict[str, frozenset[str]]:
    """Series name → label names, as the simulator's vLLM, DCGM and router collectors render them."""
    replica = ReplicaStats(replica_id="chat-h100-0", pool="chat-h100", model_name="llama-3-8b", node_id="node-0",
                           gpu_indices=(0,), num_gpu_blocks=1000, block_size=16, gpu_memory_utilization=0.9)
    replica.ttft_s.observe(0.2)
    node = NodeStats(node_id="node-0", sku="h100-80gb", model_name_label="NVIDIA H100 80GB HBM3", gpus=2,
                     fb_total_mib=81559.0, pool="chat-h100")
    router = RouterStats(model_name="llama-3-8b", queue_size={"chat-h100": 0}, ready_endpoints={"chat-h100": 1},
                         running={"chat-h100": 0})
    router.cell("critical", 0).errors["429"] = 1.0
    out: dict[str, set[str]] = {}
    for collector, target_labels in (
        (ReplicaCollector(replica), SCRAPE_LABELS | {POOL_TARGET_LABEL}),
        (NodeCollector(node, [replica], now_s=lambda: 0.0), SCRAPE_LABELS | {POOL_TARGET_LABEL}),
        (RouterCollector(router), SCRAPE_LABELS),
    ):
        for family in collect_families(collector):
            for sample in family.samples:
                out.setdefault(sample.name, set(target_labels)).update(sample.labels)
    return {k: frozenset(v) for k, v in out.items()}


_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def name_problems(exprs, known: dict[str, frozenset[str]]) -> list[str]:
    """One line per selector whose metric or matcher label does not exist, and per `by (...)` label
    that none of the expression's series carries."""
    problems = []
    for where, expr in exprs:
        try:
            found = selectors(expr)
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if not found:
            problems.append(f"{where}: no metric in {expr!r}")
        for name, labels in found:
            if name not in known:
                problems.append(f"{where}: {name!r} is not exported")
            elif labels - known[name]:
                problems.append(f"{where}: {name!r} has no label {sorted(labels - known[name])}")
        carried = set().union(*(known.get(name, frozenset()) for name, _ in found))
        for group in _GROUPING.findall(expr):
            for label in filter(None, (x.strip() for x in group.split(","))):
                if label not in carried:
                    problems.append(f"{where}: groups by {label!r}, which none of its series carries")
    return problems


def picker_series() -> dict[str, frozenset[str]]:
    """Series name → label names of `governor picker`'s own governor_picker_* families, from a real picker that
    routed a labelled task step (its collector names labels only on the samples it has)."""
    from controller.dataplane.server import PickerConfig, PickerService
    from controller.dataplane.task_book import Identity

    svc = PickerService(PickerConfig(groups={"g": ["a"]}, endpoints={"a": ["10.0.0.1:8000"]}))
    s = svc.settings()
    r = svc.picker.route("standard", "", s, 0.0, ident=Identity("acme", "t", 0, 1), tokens=1.0)
    assert r.endpoint is not None
    svc.picker.finish(r.endpoint, s, r.ticket, ok=True)
    out: dict[str, set[str]] = {}
    for family in svc.registry.collect():
        for sample in family.samples:
            if sample.name.startswith("governor_picker_"):
                out.setdefault(sample.name, {"job", "instance"}).update(sample.labels)
    return {k: frozenset(v) for k, v in out.items()}


def known_series() -> dict[str, frozenset[str]]:
    fleet, gov, picker = fleet_series(), governor_series(), picker_series()
    assert not set(fleet) & set(gov) and not set(gov) & set(picker)
    return {**fleet, **gov, **picker}


# --------------------------------------------------------------------------- the dashboards


def test_sdk_is_installed():
    """Fails (does not skip) without the SDK, naming the pin to install."""
    module = _load_dashboards_module()
    assert [name for name, _ in module.DASHBOARDS] == list(FILES)


def test_committed_json_is_what_the_code_builds(dashboards):
    for name, text in dashboards.rendered().items():
        path = GRAFANA / name
        assert path.exists(), f"{path} is missing: run `make dashboards`"
        assert path.read_text() == text, f"{path} differs from grafana/dashboards.py: run `make dashboards`"
    assert set(dashboards.rendered()) == set(FILES)


def test_build_is_deterministic(dashboards):
    first = dashboards.rendered()
    assert dashboards.rendered() == first
    for text in first.values():
        assert list(json.loads(text)) == sorted(json.loads(text))  # keys sorted at the top level


def test_check_mode_reports_a_stale_file(dashboards, tmp_path, capsys):
    assert dashboards.main(["--out", str(tmp_path)]) == 0
    assert dashboards.main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "fleet.json").write_text("{}\n")
    assert dashboards.main(["--out", str(tmp_path), "--check"]) == 1
    assert "fleet.json" in capsys.readouterr().err


@pytest.mark.parametrize("name, pool_metric", [("governor-control-loop.json", "governor_replicas_desired"),
                                              ("fleet.json", "vllm:num_requests_running")])
def test_structure(committed, name, pool_metric):
    d = committed[name]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    pool = variables["pool"]
    assert pool["type"] == "query" and pool["multi"] and pool["includeAll"]
    assert pool["query"] == f"label_values({pool_metric}, pool)"
    assert pool["datasource"]["uid"] == "${datasource}"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids)
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p.get("targets"), f"{p['title']}: no query"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)) and all(refs), p["title"]
        assert p.get("description"), f"{p['title']}: no description"


def test_control_loop_covers_the_brief(committed):
    """Each thing the operator asked to see is on the control-loop dashboard."""
    exprs = " ".join(e for _, _, e in _targets(committed["governor-control-loop.json"]))
    for needle in ("governor_replicas_desired", "governor_replicas_ready", "governor_replicas_starting",
                   "governor_pool_ttft_p95_seconds", "governor_slo_ttft_seconds", "governor_pool_arrival_rps",
                   "governor_pool_hit_rate", "governor_pool_kv_usage", "governor_telemetry_status",
                   "governor_telemetry_frozen", "governor_decisions_total", "governor_guard_adjustments_total",
                   "governor_decision_reasons_total", "governor_tick_duration_seconds_bucket",
                   'result="skipped"', "governor_mode", "governor_generation", "governor_overrides_active",
                   "governor_admission_shed_fraction"):
        assert needle in exprs, needle


def test_fleet_covers_the_brief(committed):
    exprs = " ".join(e for _, _, e in _targets(committed["fleet.json"]))
    for needle in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                   "vllm:prefix_cache_hits_total", "histogram_quantile(0.95, sum by (le, pool) "
                   "(rate(vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                   "vllm:request_time_per_output_token_seconds_bucket", "vllm:generation_tokens_total",
                   "vllm:num_preemptions_total", "DCGM_FI_DEV_GPU_UTIL",
                   "DCGM_FI_DEV_FB_USED", "sum by (priority) (rate(llm_d_epp_request_total",
                   "sum by (priority) (rate(llm_d_epp_governor_shed_total",
                   "sum by (priority) (rate(llm_d_epp_governor_retries_total",
                   "sum by (workflow_step) (rate(llm_d_epp_request_total"):
        assert needle in exprs, needle


def test_every_expression_has_balanced_brackets(committed):
    bad = [f"{n} / {t} / {r}: {why}" for n, t, r, e in _all_exprs(committed) if (why := bracket_problem(e))]
    assert not bad, "\n".join(bad)


def test_every_expression_parses_with_promtool(committed, tmp_path):
    """Prometheus' own parser (promtool ships with Debian's prometheus package, which `make test` installs)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed (Debian's prometheus package provides it; `make test` installs it)")
    grafana_vars = {"$__rate_interval": "1m", "$__range": "3h", "$__interval": "30s", "$pool": ".*"}
    rules = []
    for i, (_, _, _, expr) in enumerate(_all_exprs(committed)):
        for var, value in grafana_vars.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
        rules.append({"record": f"dashboard_expr_{i}", "expr": expr})
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    res = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(rules)} rules found" in res.stdout


def test_every_metric_exists(committed):
    exprs = [(f"{n} / {t} / {r}", e) for n, t, r, e in _all_exprs(committed)]
    problems = name_problems(exprs, known_series())
    assert not problems, "\n".join(problems)


def test_each_dashboard_reads_its_own_side(committed):
    """The control loop reads only governor_*; the fleet dashboard only engine, GPU and router series."""
    for name, _, _, expr in _all_exprs(committed):
        names = {n for n, _ in selectors(expr)}
        if name == "governor-control-loop.json":
            assert all(n.startswith("governor_") for n in names), expr
        else:
            assert not any(n.startswith("governor_") for n in names), expr


@pytest.mark.parametrize("expr, complaint", [
    ("governor_replica_desired", "'governor_replica_desired' is not exported"),
    ("rate(governor_ticks[1m])", "'governor_ticks' is not exported"),  # a counter needs _total
    ("governor_tick_duration_seconds", "is not exported"),  # a histogram is only _bucket/_sum/_count
    ('governor_replicas_desired{priority="x"}', "has no label ['priority']"),
    ("vllm:num_requests_runing", "is not exported"),
    ("vllm:gpu_cache_usage_perc", "is not exported"),  # the pre-0.10 name is not what the fleet serves
    ('llm_d_epp_ready_endpoints{pool=~"a"}', "has no label ['pool']"),  # the router names the pool `name`
    ("sum(rate(vllm:prefix_cache_hits[1m]))", "is not exported"),
    ("sum by (workflow_step) (vllm:num_requests_running)", "groups by 'workflow_step'"),
    ("histogram_quantile(0.9, sum by (le, priority) (rate(governor_tick_duration_seconds_bucket[1m])))",
     "groups by 'priority'"),
])
def test_a_wrong_name_is_caught(expr, complaint):
    problems = name_problems([("probe", expr)], known_series())
    assert problems and complaint in problems[0], problems


def test_known_series_include_both_sides():
    known = known_series()
    for name in ("governor_ticks_total", "governor_tick_duration_seconds_bucket", "governor_mode",
                 "vllm:time_to_first_token_seconds_bucket", "DCGM_FI_DEV_FB_FREE", "llm_d_epp_governor_shed_total"):
        assert name in known, name
    assert "pool" in known["governor_replicas_desired"] and "pool" in known["vllm:num_requests_running"]
    assert "workflow_step" in known["llm_d_epp_request_total"]


# --------------------------------------------------------------------------- end to end

# Series that exist only once something happened (a skipped or failed tick, a guardrail firing, a
# router error); an empty answer from these panels is correct on a calm fleet.
MAY_BE_EMPTY = ('result="skipped"', 'result="error"', "governor_guard_adjustments_total",
                "governor_replica_replacements_total",  # once a slow replica was replaced
                "llm_d_epp_request_error_total", "governor_leader",  # governor_leader*: with leader election only
                # the live fleet's router is the simulator's, not `governor picker`: no task counters, so no cost
                # per successful task either (tests/runtime/test_task_cost.py and the demo with Envoy cover them)
                "governor_picker_", "governor_cost_per_successful_task_usd")
GRAFANA_VARS_E2E = {"$__rate_interval": "10s", "$__range": "1h"}  # $pool: the fleet's pool, set below


class _CombinedDiscovery:
    """An HTTP service-discovery endpoint: the simulator's targets plus the daemon's /metrics."""

    def __init__(self, sim_sd_url: str, governor_target: str) -> None:
        import threading
        import urllib.request
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        def groups() -> bytes:
            with urllib.request.urlopen(sim_sd_url, timeout=2) as r:
                sim = json.load(r)
            return json.dumps(sim + [{"targets": [governor_target], "labels": {"kind": "governor"}}]).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = groups()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # keep test output quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/sd"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.e2e
def test_dashboards_show_data_from_a_live_fleet(committed, prometheus_factory, tmp_path):
    """A live simulated fleet and a daemon governing it, both scraped by a real Prometheus: every
    dashboard query (Grafana variables filled in) returns a finite value, except the event-only ones."""
    import logging
    import math

    from controller.clock import WallClock
    from controller.config import Settings
    from controller.runtime.main import build_services
    from controller.sim.fleetspec import fleet_spec_from_scenario
    from controller.sim.live import LiveFleet
    from controller.sim.scenario import load_scenario
    from tests.fakes.live_scenario import write_scenario
    from tests.fixtures.prometheus import wait_until

    scenario = load_scenario(write_scenario(tmp_path, n=4000, rps=20.0, replicas=2, max_replicas=4, startup_s=4.0))
    spec = fleet_spec_from_scenario(scenario)
    fleet = LiveFleet(scenario, speed=2.0)
    info = fleet.start()
    services = discovery = None
    try:
        pools = [{"name": p.name, "model": p.model, "sku": p.sku, "gpus_per_replica": p.gpus_per_replica,
                  "usd_per_gpu_hour": p.usd_per_replica_hour / p.gpus_per_replica, "min_replicas": p.min_replicas,
                  "max_replicas": p.max_replicas} for p in spec.pools]
        settings = Settings(
            mode="active", tick_interval_s=1.0, state_dir=str(tmp_path / "state"), pools=pools,
            telemetry={"source": "scrape", "scrape": {"discovery_url": info["discovery"]}, "window_s": 10,
                       "stale_after_s": 30},
            actuators={"router": {"address": info["router_control"]},
                       "autoscaler": {"address": info["autoscaler_control"]}},
            api={"listen": "127.0.0.1:0"}, metrics={"listen": "127.0.0.1:0"}, log={"format": "text"})
        services = build_services(settings, clock=WallClock(), logger=logging.getLogger("test-grafana"))
        assert services.metrics_url is not None
        discovery = _CombinedDiscovery(info["discovery"], services.metrics_url.split("/")[2])
        prom = prometheus_factory(http_sd_url=discovery.url)

        pending = {}
        for name, title, ref, expr in _all_exprs(committed):
            # a real pool name (not "All" = .*, which also matches series without the label)
            for var, value in {**GRAFANA_VARS_E2E, "$pool": spec.pools[0].name}.items():
                expr = expr.replace(var, value)
            if not any(s in expr for s in MAY_BE_EMPTY):
                pending[f"{name} / {title} / {ref}"] = expr
        answered: dict[str, float] = {}

        def all_answered() -> bool:
            services.daemon.tick()
            for where, expr in list(pending.items()):
                finite = [v for r in prom.query(expr) if math.isfinite(v := float(r["value"][1]))]
                if finite:
                    answered[where] = finite[0]
                    del pending[where]
            return not pending

        try:
            wait_until(all_answered, deadline_s=60, interval_s=0.5, what="every dashboard query to return data")
        except TimeoutError:
            pytest.fail("no data after 60 s for:\n" + "\n".join(f"{w}: {e}" for w, e in pending.items()))
        assert len(answered) > 40
    finally:
        if discovery is not None:
            discovery.close()
        if services is not None:
            services.close()
        fleet.stop()
