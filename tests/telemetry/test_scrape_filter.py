"""filter_exposition: parsing only the families the window reads gives the same observation as parsing
whole pages, on the canned exporter texts and on the simulator's rendered vLLM page."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controller.sim.exposition import ReplicaCollector, RouterCollector
from controller.sim.stats import ReplicaStats, RouterStats
from controller.telemetry.scrape import family_names, filter_exposition, parse_samples
from controller.telemetry.source import ScrapeTarget
from controller.telemetry.window import FamiliesWindow, read_sample_names
from tests.telemetry.canned import ClassState, Gpu, VllmState, dcgm_text, router_text, vllm_text


def _keep(kind: str) -> frozenset[str]:
    return family_names(read_sample_names(kind))


def _read_samples(text: str, kind: str) -> list[tuple]:
    wanted = read_sample_names(kind)
    return sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                  for f in text_string_to_metric_families(text) for s in f.samples if s.name in wanted)


def _vllm(names: str, n: float) -> str:
    s = VllmState(running=3, waiting=1, kv_usage=0.4, prefix_queries=100 * n, prefix_hits=30 * n,
                  prompt_tokens=100 * n, generation_tokens=20 * n, preemptions=n, names=names)
    s.ttft.add(0.25, 2 * n)
    s.ttft.add(0.5, 3 * n)
    s.itl.add(0.05, 10 * n)
    return vllm_text(s)


def _router(n: float) -> str:
    c = ClassState(arrivals=5 * n, shed=n, retries=0.5 * n, errors_429=n)
    c.ttft.add(1.0, 4 * n)
    return router_text({"critical": c, "standard": ClassState(arrivals=2 * n)})


def _sim_page(kind: str) -> str:
    reg = CollectorRegistry(auto_describe=False)
    if kind == "router":
        router_stats = RouterStats(model_name="m")
        router_stats.cell("critical", 0).arrivals = 7.0
        router_stats.cell("critical", 1).errors["429"] = 2.0
        reg.register(RouterCollector(router_stats, created_unix_s=1.7e9))
    else:
        rs = ReplicaStats(replica_id="r0", pool="a", model_name="m", node_id="n", gpu_indices=(0,),
                          num_gpu_blocks=100, block_size=16, gpu_memory_utilization=0.9, num_requests_running=4)
        rs.ttft_s.observe(0.3, 5.0)
        reg.register(ReplicaCollector(rs, created_unix_s=1.7e9))
    return generate_latest(reg).decode()


PAGES = [
    ("vllm current names", "vllm", _vllm("current", 1)),
    ("vllm pre-0.9 names", "vllm", _vllm("old", 1)),
    ("vllm exporting both", "vllm", _vllm("both", 1)),
    ("router", "router", _router(1)),
    ("dcgm", "dcgm", dcgm_text("node-a", [Gpu(90, 0.8, "a1"), Gpu(0)])),
    ("simulator's vLLM page", "vllm", _sim_page("vllm")),
    ("simulator's router page", "router", _sim_page("router")),
    ("untyped samples before any comment", "vllm",
     'vllm:num_requests_running{engine="0"} 2\nother_thing 5\n' + _vllm("current", 1)),
]


@pytest.mark.parametrize("label,kind,text", PAGES, ids=[p[0] for p in PAGES])
def test_filtered_page_keeps_every_read_sample_and_drops_the_rest(label: str, kind: str, text: str) -> None:
    kept = filter_exposition(text, _keep(kind))
    assert _read_samples(kept, kind) == _read_samples(text, kind)
    assert _read_samples(kept, kind), "nothing read: the case proves nothing"
    if label.startswith("simulator's vLLM"):
        # the sidecar's gain: a quarter of the lines, and histograms keep _bucket, _sum and _count
        assert kept.count("\n") < 0.35 * text.count("\n")
        assert "vllm:time_to_first_token_seconds_sum" in kept and "vllm:e2e_request_latency" not in kept


def test_filtered_and_whole_pages_give_the_same_observation() -> None:
    targets = [ScrapeTarget("http://a1/metrics", "a", "vllm"), ScrapeTarget("http://a2/metrics", "a", "vllm"),
               ScrapeTarget("http://gpu/metrics", "a", "dcgm"), ScrapeTarget("http://r/metrics", "", "router")]
    whole = FamiliesWindow(["a"], 60, 60)
    filtered = FamiliesWindow(["a"], 60, 60)
    for k in range(1, 4):
        pages = [_vllm("current", k), _vllm("old", 2 * k), dcgm_text("n", [Gpu(50 + k, 0.5)]), _router(k)]
        a = whole.update(15.0 * k, [(t, list(text_string_to_metric_families(p)))
                                    for t, p in zip(targets, pages, strict=True)])
        b = filtered.update(15.0 * k, [(t, list(text_string_to_metric_families(filter_exposition(p, _keep(t.kind)))))
                                       for t, p in zip(targets, pages, strict=True)])
    assert a == b
    assert a.pools["a"].ttft_p95_s.ok and a.classes["critical"].shed_rps.ok and a.pools["a"].gpu_util_frac.ok


def test_a_page_that_is_not_metrics_is_refused() -> None:
    with pytest.raises(ValueError, match="line 1"):
        filter_exposition("<html><body>login required</body></html>\n", _keep("vllm"))
    assert filter_exposition("", _keep("vllm")) == ""


# --------------------------------------------------------------------------- the fast sample parser

EDGE = [
    ("escaped label values", '# TYPE g gauge\ng{a="x\\"y",b="c\\\\d",c="e\\nf",d="}{,="} 1.5\n'),
    ("special values and a timestamp", "# TYPE g gauge\ng NaN\nh +Inf 1700000000000\ni -Inf\nj 1e-3\n"),
    ("a counter typed without _total", "# TYPE reqs counter\nreqs{x=\"1\"} 4\n"),
    ("spaces and a trailing comma", 'g { a = "1" , b="2", } 3\n'),
    ("untyped, no comments", "a 1\nb{c=\"d\"} 2\n"),
    ("an unknown escape is kept", '# TYPE g gauge\ng{a="x\\ty"} 1\n'),
]


def _everything(samples: dict) -> list[tuple]:
    return sorted((n, tuple(sorted(s.labels.items())), repr(float(s.value))) for n, ss in samples.items() for s in ss)


def _reference(text: str) -> list[tuple]:
    return sorted((s.name, tuple(sorted(s.labels.items())), repr(float(s.value)))  # it gives ints for "1"
                  for f in text_string_to_metric_families(text) for s in f.samples)


@pytest.mark.parametrize("label,text", [(p[0], p[2]) for p in PAGES] + EDGE,
                         ids=[p[0] for p in PAGES] + [e[0] for e in EDGE])
def test_fast_parser_gives_what_prometheus_client_gives(label: str, text: str) -> None:
    got = _everything(parse_samples(text))
    assert got == _reference(text)
    assert got


def test_fast_parser_hands_what_it_does_not_know_to_prometheus_client() -> None:
    # a UTF-8 quoted name (newer exposition): the fallback parses it; junk still raises
    text = '# TYPE "my.metric" gauge\n{"my.metric",a="1"} 2\n'
    assert _everything(parse_samples(text)) == _reference(text)
    with pytest.raises(ValueError):
        parse_samples("g{a=1} 2\n")
