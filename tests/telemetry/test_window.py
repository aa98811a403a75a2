"""FamiliesWindow: rates, quantiles, gauges, resets, missing/NaN/stale data, classes, DCGM.

Table-driven: each case is a sequence of updates (time → what each target
served, or the error its scrape raised) and the readings expected after the
last one, hand-computed in the case's comment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client.registry import Collector

from controller.telemetry.source import ScrapeTarget
from controller.telemetry.window import FamiliesWindow
from controller.types import SignalStatus
from tests.telemetry.canned import ClassState, Gpu, VllmState, dcgm_text, families, router_text, vllm_text

OK, MISSING, NAN, STALE = SignalStatus.OK, SignalStatus.MISSING, SignalStatus.NAN, SignalStatus.STALE

TARGETS = {
    "a1": ScrapeTarget("http://10.0.0.1:8000/metrics", "a", "vllm"),
    "a2": ScrapeTarget("http://10.0.0.2:8000/metrics", "a", "vllm"),
    "b1": ScrapeTarget("http://10.0.1.1:8000/metrics", "b", "vllm"),
    "gpu-a": ScrapeTarget("http://10.0.0.1:9400/metrics", "a", "dcgm"),
    "router": ScrapeTarget("http://10.0.9.1:9090/metrics", "", "router"),
    "stray": ScrapeTarget("http://10.0.7.1:8000/metrics", "zzz", "vllm"),
}
REFUSED = ConnectionRefusedError(111, "Connection refused")


def vllm(**kw) -> str:
    """A vLLM page; ttft/itl/req_tpot given as {upper bound: count} (non-cumulative)."""
    ttft = kw.pop("ttft", {})
    itl = kw.pop("itl", {})
    req_tpot = kw.pop("req_tpot", {})
    s = VllmState(**kw)
    for b, n in ttft.items():
        s.ttft.add(b, n)
    for b, n in itl.items():
        s.itl.add(b, n)
    for b, n in req_tpot.items():
        s.req_tpot.add(b, n)
    return vllm_text(s)


def router(**per_class: Any) -> str:
    ext = per_class.pop("extensions", True)
    classes = {}
    for c, kw in per_class.items():
        kw = dict(kw)
        ttft = kw.pop("ttft", {})
        cs = ClassState(**kw)
        for b, n in ttft.items():
            cs.ttft.add(b, n)
        classes[c] = cs
    return router_text(classes, governor_extensions=ext)


@dataclass
class Case:
    label: str
    steps: list[tuple[float, dict[str, str | BaseException]]]
    pools: dict[tuple[str, str], tuple[float | None, SignalStatus]] = field(default_factory=dict)
    classes: dict[tuple[str, str], tuple[float | None, SignalStatus]] = field(default_factory=dict)
    all_stale: bool | None = None
    errors: tuple[str, ...] = ()  # substrings that must appear in FleetObservation.errors
    no_errors: bool = False
    window_s: float = 60.0
    stale_after_s: float = 60.0


# Pool a over one 30 s window (a1 + a2):
#   prefix queries +3000 (a1) +1500 (a2), hits +900 (a1) → hit rate 900 / 4500 = 0.2
#   prompt +3000 → 100/s; generation +1500 → 50/s; preemptions +3 → 0.1/s
#   TTFT in the window (a1): 10 in (0.1, 0.25], 60 in (0.25, 0.5], 30 in (0.5, 0.75] → cumulative 10, 70, 100
#     p50: rank 50 in (0.25, 0.5] → 0.25 + 0.25 × (50 − 10) / 60 = 0.416667
#     p95: rank 95 in (0.5, 0.75] → 0.5 + 0.25 × (95 − 70) / 30 = 0.708333
#     (500 old observations at ≤ 0.01 s before the window must not count)
#   arrivals = TTFT count increase 100 / 30 s = 3.3333/s
#   ITL (a2): 100 in (0.025, 0.05] → p50 = 0.025 + 0.025 × 50/100 = 0.0375, p95 = 0.025 + 0.025 × 95/100 = 0.04875
#   per-request TPOT (a2, the 10 requests that finished): 8 in (0.01, 0.025], 2 in (0.025, 0.05] → cumulative 8, 10
#     p95: rank 9.5 in (0.025, 0.05] → 0.025 + 0.025 × 1.5/2 = 0.04375 (under the per-token p95, as chunked
#     prefill makes it)
#   gauges at t=30: running 6 + 2 = 8, waiting 2 + 0, KV mean (0.7 + 0.3) / 2 = 0.5
A1_T0 = dict(running=4, waiting=1, kv_usage=0.5, prefix_queries=1000, prefix_hits=200, prompt_tokens=5000,
             generation_tokens=1000, preemptions=2, ttft={0.01: 500})
A1_T30 = dict(running=6, waiting=2, kv_usage=0.7, prefix_queries=4000, prefix_hits=1100, prompt_tokens=8000,
              generation_tokens=2500, preemptions=5, ttft={0.01: 500, 0.25: 10, 0.5: 60, 0.75: 30})
A2_T0 = dict(running=2, kv_usage=0.3, prefix_queries=500, itl={0.01: 7})
A2_T30 = dict(running=2, kv_usage=0.3, prefix_queries=2000, itl={0.01: 7, 0.05: 100}, req_tpot={0.025: 8, 0.05: 2})

POOL_A_EXPECTED = {
    ("a", "replicas_ready"): (2, OK), ("a", "running"): (8, OK), ("a", "waiting"): (2, OK),
    ("a", "kv_usage_frac"): (0.5, OK), ("a", "hit_rate"): (0.2, OK),
    ("a", "prompt_tokens_rps"): (100, OK), ("a", "generation_tokens_rps"): (50, OK),
    ("a", "preemptions_rps"): (0.1, OK), ("a", "arrival_rps"): (100 / 30, OK),
    ("a", "ttft_p50_s"): (0.25 + 0.25 * 40 / 60, OK), ("a", "ttft_p95_s"): (0.5 + 0.25 * 25 / 30, OK),
    ("a", "tpot_p50_s"): (0.0375, OK), ("a", "tpot_p95_s"): (0.04875, OK), ("a", "request_tpot_p95_s"): (0.04375, OK),
    ("a", "replicas_starting"): (None, MISSING), ("a", "gpu_util_frac"): (None, MISSING),
}

CASES = [
    Case("rates, quantiles and gauges over one window",
         [(0, {"a1": vllm(**A1_T0), "a2": vllm(**A2_T0)}), (30, {"a1": vllm(**A1_T30), "a2": vllm(**A2_T30)})],
         pools=POOL_A_EXPECTED, no_errors=True),
    Case("an intermediate sample does not change a steady rate",
         [(0, {"a1": vllm(prompt_tokens=0)}), (15, {"a1": vllm(prompt_tokens=1500)}),
          (30, {"a1": vllm(prompt_tokens=3000)})],
         pools={("a", "prompt_tokens_rps"): (100, OK)}),
    Case("samples older than the window are dropped",
         # window 20 s: at t=40 only t=20 and t=40 count: (5000 − 3000) / 20 = 100/s (the full history says 125/s)
         [(0, {"a1": vllm(prompt_tokens=0)}), (20, {"a1": vllm(prompt_tokens=3000)}),
          (40, {"a1": vllm(prompt_tokens=5000)})],
         pools={("a", "prompt_tokens_rps"): (100, OK)}, window_s=20),
    Case("counter reset is a restart from zero",
         # 100 → 160 → 20: increase 60 + 20 = 80 over 30 s
         [(0, {"a1": vllm(prompt_tokens=100)}), (15, {"a1": vllm(prompt_tokens=160)}),
          (30, {"a1": vllm(prompt_tokens=20)})],
         pools={("a", "prompt_tokens_rps"): (80 / 30, OK)}),
    Case("histogram buckets reset too",
         # 50 obs ≤ 0.25 s, then the engine restarts and has 10 obs in (0.5, 0.75]: the window holds 50 + 10 (the reset
         # counts the new value whole). cumulative 0.25: 50, 0.5: 50, 0.75: 60 → p95 rank 57 in (0.5, 0.75]:
         # 0.5 + 0.25 × (57 − 50) / 10 = 0.675
         [(0, {"a1": vllm()}), (15, {"a1": vllm(ttft={0.25: 50})}), (30, {"a1": vllm(ttft={0.75: 10})})],
         pools={("a", "ttft_p95_s"): (0.675, OK)}),
    Case("the first update has gauges but no rates",
         [(0, {"a1": vllm(**A1_T0)})],
         pools={("a", "running"): (4, OK), ("a", "replicas_ready"): (1, OK),
                ("a", "prompt_tokens_rps"): (None, MISSING), ("a", "hit_rate"): (None, MISSING),
                ("a", "ttft_p95_s"): (None, MISSING)},
         all_stale=False),
    Case("an idle window gives NaN quantiles and hit rate, zero rates",
         [(0, {"a1": vllm(**A1_T0)}), (30, {"a1": vllm(**A1_T0)})],
         pools={("a", "ttft_p95_s"): (None, NAN), ("a", "hit_rate"): (None, NAN), ("a", "prompt_tokens_rps"): (0, OK)}),
    Case("a target that refuses: the pool is read from those that answered",
         [(0, {"a1": vllm(**A1_T0), "a2": vllm(**A2_T0)}), (30, {"a1": vllm(**A1_T30), "a2": REFUSED})],
         pools={("a", "replicas_ready"): (1, OK), ("a", "running"): (6, OK), ("a", "kv_usage_frac"): (0.7, OK),
                ("a", "hit_rate"): (900 / 3000, OK)},
         errors=("10.0.0.2:8000", "Connection refused")),
    Case("a pool whose only target never answered is MISSING",
         [(0, {"a1": vllm(**A1_T0), "b1": REFUSED}), (30, {"a1": vllm(**A1_T30), "b1": REFUSED})],
         pools={("b", "replicas_ready"): (None, MISSING), ("b", "running"): (None, MISSING),
                ("b", "ttft_p95_s"): (None, MISSING), ("a", "running"): (6, OK)},
         errors=("10.0.1.1",), all_stale=False),
    Case("NaN gauges are NAN readings",
         [(0, {"a1": vllm(running=math.nan, kv_usage=math.nan)})],
         pools={("a", "running"): (None, NAN), ("a", "kv_usage_frac"): (None, NAN), ("a", "waiting"): (0, OK)}),
    Case("a failed pool holds its last view, STALE from the first failed read (freshness is when it was read)",
         [(0, {"a1": vllm(**A1_T0)}), (30, {"a1": vllm(**A1_T30)}), (60, {"a1": REFUSED})],
         pools={("a", "running"): (6, STALE), ("a", "prompt_tokens_rps"): (100, STALE),
                ("a", "replicas_ready"): (1, STALE)},
         errors=("Connection refused",), all_stale=True),
    Case("… and is STALE once older than stale_after_s; all pools stale → all_stale",
         [(0, {"a1": vllm(**A1_T0)}), (30, {"a1": vllm(**A1_T30)}), (60, {"a1": REFUSED}), (91, {"a1": REFUSED})],
         pools={("a", "running"): (6, STALE), ("a", "replicas_ready"): (1, STALE),
                ("a", "prompt_tokens_rps"): (100, STALE), ("a", "ttft_p95_s"): (0.5 + 0.25 * 25 / 30, STALE)},
         all_stale=True),
    Case("every target failing from the start → all MISSING, all_stale",
         [(0, {"a1": REFUSED, "b1": TimeoutError("timed out")})],
         pools={("a", "running"): (None, MISSING), ("b", "running"): (None, MISSING)},
         all_stale=True, errors=("timed out", "Connection refused")),
    Case("a pool with no engine target is at zero, not missing",
         [(0, {"a1": vllm(**A1_T0)})],
         pools={("b", "replicas_ready"): (0, OK), ("b", "running"): (0, OK), ("b", "waiting"): (0, OK),
                ("b", "ttft_p95_s"): (None, MISSING)}, no_errors=True),
    Case("pre-0.9 vLLM names give the same readings",
         [(0, {"a1": vllm(**A1_T0, names="old"), "a2": vllm(**A2_T0, names="old")}),
          (30, {"a1": vllm(**A1_T30, names="old"), "a2": vllm(**A2_T30, names="old")})],
         # (no per-request TPOT histogram on those builds: that reading is missing, the rest the same)
         pools={**POOL_A_EXPECTED, ("a", "request_tpot_p95_s"): (None, MISSING)}),
    Case("a build exporting old and new names is not counted twice",
         [(0, {"a1": vllm(**A1_T0, names="both"), "a2": vllm(**A2_T0, names="both")}),
          (30, {"a1": vllm(**A1_T30, names="both"), "a2": vllm(**A2_T30, names="both")})],
         pools=POOL_A_EXPECTED),
    Case("DCGM: GPUs mapped to pods only, engine-active preferred over GPU_UTIL",
         # pod GPUs: 0.5 (engine active, GPU_UTIL says 80 %) and 0.4 (40 %, no profiling) → 0.45; 6 idle GPUs ignored
         [(0, {"a1": vllm(), "gpu-a": dcgm_text("node-a", [Gpu(80, 0.5, "a1"), Gpu(40, None, "a2")] + [Gpu(0)] * 6)})],
         pools={("a", "gpu_util_frac"): (0.45, OK)}),
    Case("DCGM without the Kubernetes mapping (and the new lowercase hostname): every GPU",
         [(0, {"a1": vllm(), "gpu-a": dcgm_text("node-a", [Gpu(90), Gpu(30), Gpu(0), Gpu(0)], host_label="hostname")})],
         pools={("a", "gpu_util_frac"): (0.3, OK)}),
    Case("DCGM exporter down: its held reading goes STALE, engine readings unaffected",
         [(0, {"a1": vllm(), "gpu-a": dcgm_text("node-a", [Gpu(50)])}), (61, {"a1": vllm(), "gpu-a": REFUSED})],
         pools={("a", "gpu_util_frac"): (0.5, STALE), ("a", "running"): (0, OK)}),
    Case("router: per-class rates, shed, admitted, retries and TTFT",
         # 20 s: critical +40 arrivals → 2/s, nothing shed; standard +100 → 5/s, shed +20 → 1/s, admitted 4/s,
         # retries +10 → 0.5/s. critical TTFT in window: 19 in (0.5, 0.75], 1 in (2.5, 5.0] → p95 rank 19 in
         # (0.5, 0.75] → 0.5 + 0.25 × 19/19 = 0.75. sheddable never seen → MISSING.
         [(0, {"router": router(critical=dict(arrivals=10), standard=dict(arrivals=50, shed=5, retries=1))}),
          (20, {"router": router(critical=dict(arrivals=50, ttft={0.75: 19, 5.0: 1}),
                                 standard=dict(arrivals=150, shed=25, retries=11))})],
         classes={("critical", "arrival_rps"): (2, OK), ("critical", "shed_rps"): (0, OK),
                  ("critical", "admitted_rps"): (2, OK), ("critical", "ttft_p95_s"): (0.75, OK),
                  ("standard", "arrival_rps"): (5, OK), ("standard", "shed_rps"): (1, OK),
                  ("standard", "admitted_rps"): (4, OK), ("standard", "retry_rps"): (0.5, OK),
                  ("sheddable", "arrival_rps"): (None, MISSING), ("critical", "queue_depth"): (None, MISSING)}),
    Case("router without Governor's extensions: shed from 429 errors",
         [(0, {"router": router(standard=dict(arrivals=0, errors_429=0), extensions=False)}),
          (10, {"router": router(standard=dict(arrivals=30, errors_429=10), extensions=False)})],
         classes={("standard", "arrival_rps"): (3, OK), ("standard", "shed_rps"): (1, OK),
                  ("standard", "admitted_rps"): (2, OK), ("standard", "retry_rps"): (None, MISSING)}),
    Case("no router target: classes MISSING",
         [(0, {"a1": vllm()})],
         classes={("critical", "arrival_rps"): (None, MISSING)}),
    Case("a target of an unconfigured pool is reported and ignored",
         [(0, {"a1": vllm(running=1), "stray": vllm(running=50)})],
         pools={("a", "running"): (1, OK)}, errors=("'zzz' is not configured",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
def test_window(case: Case) -> None:
    w = FamiliesWindow(["a", "b"], window_s=case.window_s, stale_after_s=case.stale_after_s)
    obs = None
    for now_s, served in case.steps:
        scraped = [(TARGETS[name], body if isinstance(body, BaseException) else families(body))
                   for name, body in served.items()]
        obs = w.update(now_s, scraped)
    assert obs is not None and obs.at_s == case.steps[-1][0]
    for (pool, fname), (value, status) in case.pools.items():
        _check(getattr(obs.pools[pool], fname), value, status, f"{pool}.{fname}")
    for (cls, fname), (value, status) in case.classes.items():
        _check(getattr(obs.classes[cls], fname), value, status, f"{cls}.{fname}")
    if case.all_stale is not None:
        assert obs.all_stale is case.all_stale
    joined = "\n".join(obs.errors)
    for s in case.errors:
        assert s in joined, f"{s!r} not in errors: {obs.errors}"
    if case.no_errors:
        assert obs.errors == ()


def _check(reading, value, status, what: str) -> None:
    assert reading.status is status, f"{what}: {reading}"
    if value is not None:
        assert reading.value == pytest.approx(value, rel=1e-9, abs=1e-12), f"{what}: {reading}"


def test_stale_reading_reports_its_age() -> None:
    w = FamiliesWindow(["a"], window_s=60, stale_after_s=30)
    w.update(100.0, [(TARGETS["a1"], families(vllm(running=3)))])
    obs = w.update(145.0, [(TARGETS["a1"], REFUSED)])
    assert obs.pools["a"].running.status is STALE
    assert obs.pools["a"].running.age_s == pytest.approx(45.0)


def test_history_of_departed_targets_is_forgotten() -> None:
    """Replicas come and go (new URL each time); their history must not pile up."""
    w = FamiliesWindow(["a"], window_s=30, stale_after_s=30)
    for i in range(50):
        t = ScrapeTarget(f"http://10.0.0.{i}:8000/metrics", "a", "vllm")
        w.update(float(i * 15), [(t, families(vllm(prompt_tokens=i)))])
    assert len(w._histories) <= 3


def test_constructor_rejects_bad_window() -> None:
    with pytest.raises(ValueError, match="window_s"):
        FamiliesWindow(["a"], window_s=0, stale_after_s=10)


# --------------------------------------------------------------------------- in-process, no HTTP


def test_simulator_collectors_feed_the_window_in_process() -> None:
    """The bench path: the simulator's collectors → families → FamiliesWindow, with no HTTP at all."""
    from controller.sim.exposition import NodeCollector, ReplicaCollector, RouterCollector, collect_families
    from controller.sim.stats import NodeStats, ReplicaStats, RouterStats

    r = ReplicaStats(replica_id="a-0", pool="a", model_name="llama-3-8b", node_id="a-node-0", gpu_indices=(0,),
                     num_gpu_blocks=27000, block_size=16, gpu_memory_utilization=0.9)
    node = NodeStats(node_id="a-node-0", sku="h100-80gb", model_name_label="NVIDIA H100 80GB HBM3", gpus=2,
                     fb_total_mib=81559)
    rs = RouterStats(model_name="llama-3-8b")
    cell = rs.cell("critical", 0)  # a series needs two samples for a rate, as in Prometheus
    sim_now = [0.0]
    collectors: list[tuple[ScrapeTarget, Collector]] = [
        (ScrapeTarget("sim://a-0", "a", "vllm"), ReplicaCollector(r)),
        (ScrapeTarget("sim://a-node-0", "a", "dcgm"), NodeCollector(node, [r], now_s=lambda: sim_now[0])),
        (ScrapeTarget("sim://router", "", "router"), RouterCollector(rs)),
    ]
    w = FamiliesWindow(["a"], window_s=60, stale_after_s=60, source_name="sim")
    w.update(0.0, [(t, collect_families(c)) for t, c in collectors])

    # 15 simulated seconds: 30 requests at 0.3 s TTFT, 3000 prompt tokens of which 1200 hit the cache,
    # GPU 0 busy 12 s of 15 (80 %), 45 critical requests at the router of which 15 shed.
    sim_now[0] = 15.0
    r.num_requests_running, r.num_requests_waiting, r.kv_cache_usage_perc = 7, 3, 0.25
    r.prompt_tokens, r.prefix_cache_queries, r.prefix_cache_hits = 3000.0, 3000.0, 1200.0
    r.ttft_s.observe(0.3, 30)
    node.gpu_busy_s[0] = 12.0
    cell.arrivals, cell.admitted, cell.shed = 45.0, 30.0, 15.0
    obs = w.update(15.0, [(t, collect_families(c)) for t, c in collectors])

    a = obs.pools["a"]
    assert (a.replicas_ready.value, a.running.value, a.waiting.value) == (1, 7, 3)
    assert a.kv_usage_frac.value == pytest.approx(0.25)
    assert a.prompt_tokens_rps.value == pytest.approx(200.0)
    assert a.hit_rate.value == pytest.approx(0.4)
    assert a.arrival_rps.value == pytest.approx(2.0)
    # 30 observations in (0.25, 0.5]: p95 = 0.25 + 0.25 × 28.5/30 = 0.4875
    assert a.ttft_p95_s.value == pytest.approx(0.4875)
    assert a.gpu_util_frac.value == pytest.approx(0.8)  # only GPU 0 is mapped to the replica
    c = obs.classes["critical"]
    assert (c.arrival_rps.value, c.admitted_rps.value, c.shed_rps.value) == pytest.approx((3.0, 2.0, 1.0))
    assert obs.errors == ()


def test_an_sglang_replica_and_the_dcgm_framebuffer_feed_the_window_in_process() -> None:
    """Direct scrape of an SGLang-named replica reads as the vLLM one (hit rate from cached / prompt
    tokens), and DCGM FB used/free give the pool's memory use (its fullest GPU mapped to a pod)."""
    from controller.sim.exposition import NodeCollector, collect_families
    from controller.sim.exposition_sglang import SglangReplicaCollector
    from controller.sim.stats import NodeStats, ReplicaStats

    r = ReplicaStats(replica_id="a-0", pool="a", model_name="qwen-2.5-7b", node_id="n0", gpu_indices=(0,),
                     num_gpu_blocks=27000, block_size=16, gpu_memory_utilization=0.9)
    node = NodeStats(node_id="n0", sku="l40s-48gb", model_name_label="NVIDIA L40S", gpus=2, fb_total_mib=46068)
    node.fb_used_mib[0] = 0.9 * 46068
    node.fb_used_mib[1] = 0.99 * 46068  # the idle GPU (no pod) does not count
    targets = [(ScrapeTarget("sim://a-0", "a", "sglang"), SglangReplicaCollector(r)),
               (ScrapeTarget("sim://n0", "a", "dcgm"), NodeCollector(node, [r], now_s=lambda: 0.0))]
    w = FamiliesWindow(["a"], window_s=60, stale_after_s=60, source_name="sim")
    w.update(0.0, [(t, collect_families(c)) for t, c in targets])
    r.num_requests_running, r.kv_cache_usage_perc = 5, 0.5
    r.prefix_cache_queries, r.prefix_cache_hits = 3000.0, 1200.0
    obs = w.update(15.0, [(t, collect_families(c)) for t, c in targets])
    a = obs.pools["a"]
    assert (a.replicas_ready.value, a.running.value, a.kv_usage_frac.value) == (1, 5, 0.5)
    assert a.hit_rate.value == pytest.approx(0.4)
    assert a.gpu_mem_used_frac.value == pytest.approx(0.9, abs=1e-4)
    assert not a.request_tpot_p95_s.ok  # SGLang exports no per-request TPOT histogram


def test_each_replica_reports_its_own_mean_itl_and_batch() -> None:
    """Per replica (outlier detection, controller/core/outliers.py): the increase of its ITL histogram's _sum
    over that of its _count since the previous scrape, and its running batch; keyed by discovery's `replica`
    label, else the engine's address. a1: 100 gaps of 20 ms then 100 more of 20 ms → 20 ms; a2: 100 of 20 ms,
    then 100 of 60 ms → 6 / 100 = 60 ms (the last interval's, not the window's 40 ms)."""
    a1 = ScrapeTarget("http://10.0.0.1:8000/metrics", "a", "vllm", {"replica": "pod-a1"})
    a2 = TARGETS["a2"]
    w = FamiliesWindow(["a"], window_s=60, stale_after_s=30)
    first = {"a1": VllmState(running=10), "a2": VllmState(running=12)}
    for s in first.values():
        s.itl.add(0.025, 100, mean_value=0.02)
    w.update(100.0, [(a1, families(vllm_text(first["a1"]))), (a2, families(vllm_text(first["a2"])))])
    first["a1"].itl.add(0.025, 100, mean_value=0.02)
    first["a2"].itl.add(0.075, 100, mean_value=0.06)
    obs = w.update(115.0, [(a1, families(vllm_text(first["a1"]))), (a2, families(vllm_text(first["a2"])))])
    reps = obs.pools["a"].replicas
    assert set(reps) == {"pod-a1", "10.0.0.2:8000"}
    assert reps["pod-a1"].itl_mean_s.value == pytest.approx(0.02)
    assert reps["10.0.0.2:8000"].itl_mean_s.value == pytest.approx(0.06)
    assert reps["10.0.0.2:8000"].running.value == 12.0
    # no token since the last scrape: not a number, so not judged; a target down this time: not reported;
    # every target down: no per-replica view at all
    obs = w.update(130.0, [(a1, families(vllm_text(first["a1"]))), (a2, REFUSED)])
    assert obs.pools["a"].replicas["pod-a1"].itl_mean_s.status is NAN
    assert "10.0.0.2:8000" not in obs.pools["a"].replicas
    obs = w.update(145.0, [(a1, REFUSED), (a2, REFUSED)])
    assert obs.pools["a"].replicas == {}
