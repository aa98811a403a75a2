"""The shipped scenarios load, build workloads and say what their comments claim; bad files give clear errors."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from controller.paths import PROJECT_ROOT
from controller.sim.scenario import Scenario, ScenarioError, load_scenario
from controller.sim.trace_types import TraceError
from controller.sim.workload import Workload, build_workload

SCENARIOS = PROJECT_ROOT / "scenarios"
FILES = sorted(SCENARIOS.glob("*.yaml"))
BASES = ("azure-conv", "azure-code", "mooncake-conv", "servegen-diurnal")
# Heterogeneous fleets (issue 16): several pools, tiers, SKUs, P/D, agents, tenants.
HETERO_BASES = ("tiers", "mixed-sku", "pd-split", "agentic", "multi-tenant")

# Capacities the scenario comments size fleets with: (prefill tok/s, output tok/s) of one replica,
# read off the calibrated iteration model at each trace's typical context and the scenario's
# prefill chunk (max_num_batched_tokens); decode at batch 128, or at the batch the KV cache allows
# for Mooncake's 12k contexts.
CAPACITY = {
    "azure-conv": (13_000.0, 1_800.0),  # Llama-3-70B TP4 H100, ~1.4k context, 8,192-token chunks
    "azure-code": (12_600.0, 1_800.0),  # Llama-3-8B A100, ~2k context, 1,024-token chunks
    "mooncake-conv": (45_500.0, 1_430.0),  # Llama-3-8B TP2 H100, ~12k context, 2,048-token chunks, ~85 in KV
    "servegen-diurnal": (13_000.0, 1_800.0),  # Llama-3-70B TP4 H100, ~1.2k context
}
UTILISATION = 0.7
PEAK_WINDOW_S = 300.0  # crashes land at the start of the busiest 5 minutes
NEED_WINDOW_S = 60.0  # "replicas needed at peak": the busiest minute at 70% utilisation
WARMUP_S = 300.0  # the first 5 minutes start with a cold cache; peaks are looked for after them


def _build(path: Path) -> tuple[Scenario, Workload]:
    sc = load_scenario(path)
    return sc, build_workload(sc, np.random.default_rng(sc.seed))


def _busy_replicas(sc: Scenario, w: Workload, window_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Busy replicas per window (start times every 10 s), prefix hits of an infinite cache free."""
    prefill, decode = CAPACITY[sc.name.removesuffix("-crash").removesuffix("-surge")]
    tr = w.trace
    hit = np.zeros(len(tr))
    if tr.block_hashes is not None:
        seen: set[int] = set()
        for i, h in enumerate(tr.block_hashes):
            k = 0
            for b in h:
                if b not in seen:
                    break
                k += 1
            hit[i] = min(k, tr.prompt_tokens[i] // tr.hash_block_tokens) * tr.hash_block_tokens
            seen.update(h)
    work = (tr.prompt_tokens - hit) / prefill + tr.output_tokens / decode
    cum = np.concatenate([[0.0], np.cumsum(work)])
    starts = np.arange(0.0, tr.duration_s - window_s + 1, 10.0)
    lo = np.searchsorted(tr.arrival_s, starts)
    hi = np.searchsorted(tr.arrival_s, starts + window_s)
    return starts, (cum[hi] - cum[lo]) / window_s


def _need_at_peak(sc: Scenario, w: Workload) -> float:
    starts, busy = _busy_replicas(sc, w, NEED_WINDOW_S)
    return float(busy[starts >= WARMUP_S].max()) / UTILISATION


def test_the_expected_scenarios_are_shipped():
    names = {p.stem for p in FILES}
    expected = {"demo"} | {b + v for b in BASES + HETERO_BASES for v in ("", "-crash", "-surge")}
    assert expected <= names
    readme = (SCENARIOS / "README.md").read_text()
    for name in names:
        assert f"`{name}.yaml`" in readme


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_scenario_loads_and_builds_a_workload(path):
    text = path.read_text()
    assert text.startswith("# "), "each scenario begins with comments saying what it is"
    sc, w = _build(path)
    assert sc.name == path.stem
    assert sc.trace_path().is_file()
    assert len(w) > 1000 and w.n_tasks > 0
    for pool in sc.pools:
        assert pool.min_replicas < pool.replicas < pool.max_replicas  # room to scale both ways


# Replicas the busiest minute needs: a few to a dozen (Mooncake's TP2 H100 replicas are large: 2-4).
NEED_RANGE = {"azure-conv": (4, 12), "azure-code": (4, 12), "mooncake-conv": (2, 4), "servegen-diurnal": (4, 12)}


@pytest.mark.parametrize("base", BASES)
def test_base_fleets_start_at_steady_state_below_their_peak_need(base):
    sc, w = _build(SCENARIOS / f"{base}.yaml")
    need = _need_at_peak(sc, w)
    lo, hi = NEED_RANGE[base]
    assert lo <= need <= hi
    # The fleet starts sized for its first minutes (the controller takes over a running fleet),
    # which is no more than the peak needs, so policies still have to scale up.
    assert sc.pools[0].replicas <= math.ceil(need) <= sc.pools[0].max_replicas


@pytest.mark.parametrize("base", BASES)
def test_crash_variant_hits_a_third_of_the_pool_at_peak_load(base):
    sc, w = _build(SCENARIOS / f"{base}-crash.yaml")
    base_sc = load_scenario(SCENARIOS / f"{base}.yaml")
    assert sc.model_dump(exclude={"name", "description", "faults"}) == base_sc.model_dump(
        exclude={"name", "description", "faults"}
    )
    (fault,) = sc.faults
    assert fault.kind == "crash" and fault.pool == sc.pools[0].name and fault.at_s is not None
    starts, busy = _busy_replicas(sc, w, PEAK_WINDOW_S)
    after = starts >= WARMUP_S
    k = int(np.argmin(np.abs(starts - fault.at_s)))
    assert busy[k] >= 0.97 * busy[after].max()  # the crash lands at the start of the busiest 5 minutes
    assert fault.count == max(1, round(_need_at_peak(sc, w) / 3))
    assert re.search(rf"\b{int(fault.at_s)} s\b", sc.model_dump_json() + (SCENARIOS / f"{base}-crash.yaml").read_text())


@pytest.mark.parametrize("base", BASES)
def test_surge_variant_is_3x_within_a_minute_for_a_few_minutes(base):
    sc = load_scenario(SCENARIOS / f"{base}-surge.yaml")
    base_sc = load_scenario(SCENARIOS / f"{base}.yaml")
    surge = sc.trace.surge
    assert surge is not None and surge.factor == 3 and surge.ramp_s <= 60 and 120 <= surge.duration_s <= 600
    dump = sc.model_dump(exclude={"name", "description"})
    dump["trace"]["surge"] = None
    base_dump = base_sc.model_dump(exclude={"name", "description"})
    # The operator's cap may be raised for the surge (room for it); nothing else differs.
    for pool, base_pool in zip(dump["pools"], base_dump["pools"], strict=True):
        assert pool.pop("max_replicas") >= base_pool.pop("max_replicas")
    assert dump == base_dump
    assert f"at {int(surge.at_s)} s" in (SCENARIOS / f"{base}-surge.yaml").read_text()


@pytest.mark.parametrize("base", HETERO_BASES)
def test_heterogeneous_variants_differ_from_their_base_only_by_the_event(base):
    base_sc = load_scenario(SCENARIOS / f"{base}.yaml")
    crash = load_scenario(SCENARIOS / f"{base}-crash.yaml")
    surge = load_scenario(SCENARIOS / f"{base}-surge.yaml")
    assert not base_sc.faults and base_sc.trace.surge is None
    keep = {"name", "description", "faults"}
    assert crash.model_dump(exclude=keep) == base_sc.model_dump(exclude=keep)
    (fault,) = crash.faults
    assert fault.kind == "crash" and fault.at_s is not None and fault.count >= 1
    assert fault.count <= crash.pool(fault.pool).max_replicas
    assert f"at {int(fault.at_s)} s" in (SCENARIOS / f"{base}-crash.yaml").read_text()
    s = surge.trace.surge
    assert s is not None and s.factor == 3 and s.ramp_s <= 60 and s.duration_s == 240
    dump = surge.model_dump(exclude={"name", "description"})
    dump["trace"]["surge"] = None
    base_dump = base_sc.model_dump(exclude={"name", "description"})
    for pool, base_pool in zip(dump["pools"], base_dump["pools"], strict=True):
        assert pool.pop("max_replicas") >= base_pool.pop("max_replicas")
    assert dump == base_dump
    assert f"at {int(s.at_s)} s" in (SCENARIOS / f"{base}-surge.yaml").read_text()


def test_heterogeneous_bases_use_the_features_they_are_named_for():
    tiers = load_scenario(SCENARIOS / "tiers.yaml")
    assert {p.model for p in tiers.pools} == {"llama-3-70b", "llama-3-8b"} and len({p.group for p in tiers.pools}) == 1
    small = next(p for p in tiers.pools if p.model == "llama-3-8b")
    assert small.eligible_share("critical") == 0.0 and 0 < small.eligible_share("standard") < 1
    assert all(p.usd_per_gpu_hour for p in tiers.pools)
    mixed = load_scenario(SCENARIOS / "mixed-sku.yaml")
    assert {p.sku for p in mixed.pools} == {"a100-80gb", "h100-80gb", "l40s-48gb"}
    assert len({p.model for p in mixed.pools}) == 1 and len({p.usd_per_gpu_hour for p in mixed.pools}) == 3
    assert len({p.startup_cold_s for p in mixed.pools}) > 1
    pd = load_scenario(SCENARIOS / "pd-split.yaml")
    assert sorted(p.role for p in pd.pools) == ["decode", "prefill"] and pd.trace.mix_shift is not None
    agentic = load_scenario(SCENARIOS / "agentic.yaml")
    assert agentic.tasks.kind == "agentic" and (agentic.tasks.steps_min, agentic.tasks.steps_max) == (3, 8)
    assert agentic.tasks.think_time_s > 0
    tenants = load_scenario(SCENARIOS / "multi-tenant.yaml").tenants
    assert len(tenants) == 3 and all(t.quota_rps > 0 for t in tenants.values())
    assert sum(t.surge is not None for t in tenants.values()) == 1
    assert len({tuple(sorted((t.classes or {}).items())) for t in tenants.values()}) == 3


def test_task_structures_cover_workflow_and_session():
    kinds = {load_scenario(SCENARIOS / f"{b}.yaml").tasks.kind for b in BASES}
    assert {"workflow", "session"} <= kinds
    moon = load_scenario(SCENARIOS / "mooncake-conv.yaml")
    assert moon.tasks.kind == "session" and moon.pools[0].model == "llama-3-8b"
    assert moon.pools[0].engine.enable_prefix_caching
    code = load_scenario(SCENARIOS / "azure-code.yaml")
    assert (code.tasks.steps_min, code.tasks.steps_max) == (1, 4)


def test_demo_reacts_within_90_seconds():
    sc, w = _build(SCENARIOS / "demo.yaml")
    assert len(sc.pools) == 2 and {p.sku for p in sc.pools} == {"a100-80gb", "h100-80gb"}
    assert all(p.model == "llama-3-8b" and 2 <= p.replicas <= 3 for p in sc.pools)
    assert all(p.startup_warm_s <= 15 and p.startup_cold_s <= 60 for p in sc.pools)
    assert sc.trace.surge is not None and sc.trace.surge.factor >= 2 and 10 <= sc.trace.surge.at_s <= 30
    (crash,) = sc.faults
    assert crash.kind == "crash" and crash.at_s is not None and 40 <= crash.at_s <= 90
    assert w.trace.duration_s <= 330


# --------------------------------------------------------------------------- malformed scenarios

GOOD = """\
name: bad
trace:
  path: ../../shared/data/traces/azure2023_code.csv
  rate_scale: 2
pools:
  - name: p
    model: llama-3-8b
    sku: a100-80gb
"""


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("rate_scale: 2", "rate_scale: -1", "bad.yaml:4: trace.rate_scale: Input should be greater than 0"),
        ("sku: a100-80gb", "sku: v100", "pools[0].sku: unknown sku 'v100'"),
        ("rate_scale: 2", "rate_scale: 2\n  surge: {at_s: 10, factor: 0.5}", "bad.yaml:5: trace.surge.factor:"),
        ("rate_scale: 2", "rate_scale: 2\n  servegen: {start_day: 13, days: 2}",
         "bad.yaml:5: trace.servegen: Value error, start_day + days (13 + 2) must be <= 14"),
        ("rate_scale: 2", "rate_scale: 2\n  prefixes: {groups: 0}", "bad.yaml:5: trace.prefixes.groups:"),
        ("  rate_scale: 2\n", "  rate_scale: 2\n  window: 5\n",
         "bad.yaml:5: trace.window: Extra inputs are not permitted"),
    ],
)
def test_malformed_scenarios_name_file_line_and_field(tmp_path, old, new, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(ScenarioError) as exc:
        load_scenario(path)
    assert expected in str(exc.value)


def test_a_scenario_whose_trace_is_missing_fails_at_build(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace("azure2023_code.csv", "missing.csv"))
    sc = load_scenario(path)
    with pytest.raises(TraceError, match=r"missing\.csv: trace file not found"):
        build_workload(sc, np.random.default_rng(0))


def test_trace_paths_resolve_against_the_scenario_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,2\n1,20,3\n")
    path = tmp_path / "s.yaml"
    path.write_text(GOOD.replace("../../shared/data/traces/azure2023_code.csv", "sub/t.csv")
                    .replace("rate_scale: 2", "rate_scale: 1"))
    w = build_workload(load_scenario(path), np.random.default_rng(0))
    assert w.trace.prompt_tokens.tolist() == [10, 20]
