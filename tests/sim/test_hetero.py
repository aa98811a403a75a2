"""Heterogeneous-fleet features of the simulator: tier rules, tenants with quotas and surges, a shifting
length mix, agentic tasks — their schema checks, the workload they build and what the fleet does with them.

Real calibration, engine and router; traces are the shared ones or spelled out per test.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from controller.paths import shared_data_dir
from controller.sim.fleet import Fleet
from controller.sim.router import TenantQuotaState, expected_pool_shares
from controller.sim.scenario import Scenario, ScenarioError, parse_scenario
from controller.sim.trace_types import TraceError
from controller.sim.workload import build_workload
from controller.types import PRIORITY_CLASSES

TRACES = shared_data_dir() / "traces"
CRIT, STD, SHED = (PRIORITY_CLASSES.index(c) for c in ("critical", "standard", "sheddable"))


def _csv_trace(path: Path, n: int = 600, rate: float = 4.0, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    lines = ["arrival_s,prompt_tokens,output_tokens"]
    lines += [f"{a:.4f},{int(p)},{int(o)}" for a, p, o in
              zip(t, rng.integers(100, 1500, n), rng.integers(5, 120, n), strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return path


TWO_TIERS = """
name: t
seed: 2
trace:
  path: {trace}
pools:
  - name: big
    model: llama-3-8b
    sku: h100-80gb
    replicas: 2
    traffic_weight: {w_big}
  - name: small
    model: llama-3-8b
    sku: a100-80gb
    replicas: 2
    traffic_weight: 1
    eligible: {{critical: 0.0, standard: 0.5}}
{extra}
"""


def _tiers(tmp_path: Path, w_big: float = 1.0, extra: str = "") -> Scenario:
    trace = _csv_trace(tmp_path / "t.csv")
    return parse_scenario(TWO_TIERS.format(trace=trace, w_big=w_big, extra=extra), source="t.yaml", base_dir=tmp_path)


# --------------------------------------------------------------------------- tier rules


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("standard: 0.5}", "standard: 1.5}", "eligible: shares must be in [0, 1]"),
        ("standard: 0.5}", "premium: 0.5}", "eligible: unknown priority class ['premium']"),
        ("    eligible:", "    eligible: {critical: 0.5}\n    x_eligible:", "Extra inputs are not permitted"),
    ],
)
def test_tier_rules_are_validated(tmp_path, old, new, expected):
    text = TWO_TIERS.format(trace=_csv_trace(tmp_path / "t.csv"), w_big=1, extra="")
    with pytest.raises(ScenarioError, match=r"t\.yaml:\d+: .*" + expected.replace("[", r"\[").replace("]", r"\]")):
        parse_scenario(text.replace(old, new, 1), source="t.yaml", base_dir=tmp_path)


def test_a_class_no_pool_takes_whole_is_refused(tmp_path):
    text = TWO_TIERS.format(trace=_csv_trace(tmp_path / "t.csv"), w_big=1, extra="")
    big_rule = "    traffic_weight: 1\n    eligible: {critical: 0.9}\n  - name: small"
    text = text.replace("    traffic_weight: 1\n  - name: small", big_rule, 1)
    with pytest.raises(ScenarioError, match=r"no first-hop pool takes every 'critical' task .*\['big', 'small'\]"):
        parse_scenario(text, source="t.yaml", base_dir=tmp_path)


def test_router_sends_only_eligible_tasks_to_the_small_tier(tmp_path):
    sc = _tiers(tmp_path, w_big=0.0)  # weight 0 on the big pool: eligible traffic all goes to the small one
    f = Fleet(sc)
    f.run()
    wl = f.workload
    assert wl.tier_u is not None
    routed = f.summary().per_pool
    prio = wl.priority
    eligible_small = (prio == SHED) | ((prio == STD) & (wl.tier_u < 0.5))
    # every eligible task went to the small pool (weight 0 on big), every other one to big
    assert routed["small"].routed_attempts == int(eligible_small.sum())
    assert routed["big"].routed_attempts == int((~eligible_small).sum())
    assert 0.2 < eligible_small.mean() < 0.7
    shares = expected_pool_shares(sc, wl)
    assert np.array_equal(shares["small"] > 0, eligible_small)
    assert np.allclose(shares["small"] + shares["big"], 1.0)


def test_traffic_weights_split_only_eligible_traffic(tmp_path):
    sc = _tiers(tmp_path, w_big=1.0)
    f = Fleet(sc)
    s = f.run()
    wl = f.workload
    assert wl.tier_u is not None  # the scenario has a tier rule: every task drew its u
    eligible_small = (wl.priority == SHED) | ((wl.priority == STD) & (wl.tier_u < 0.5))
    shares = expected_pool_shares(sc, wl)
    assert shares["small"][eligible_small] == pytest.approx(0.5)
    assert shares["small"][~eligible_small] == pytest.approx(0.0)
    # the seeded draws land near the expectation: 600 requests, binomial sd ~ 8
    expected_small = shares["small"].sum()
    assert abs(s.per_pool["small"].routed_attempts - expected_small) < 40
    # and the same seed gives the same run
    again = Fleet(sc).run()
    assert again.to_dict() == s.to_dict()


# --------------------------------------------------------------------------- tenants


TENANTS = """
tenants:
  alpha:
    share: 0.6
    classes: {critical: 1.0}
  beta:
    share: 0.4
    classes: {standard: 0.5, sheddable: 0.5}
    quota_rps: 0.5
    quota_burst_s: 4
    over_quota: {standard: queue, sheddable: shed}
    surge: {at_s: 40, factor: 4, ramp_s: 0, duration_s: 40}
"""


def test_tenants_are_validated(tmp_path):
    bad = TENANTS.replace("share: 0.4", "share: 0.3")
    with pytest.raises(ScenarioError, match="tenants: shares must sum to 1"):
        _tiers(tmp_path, extra=bad)
    bad = TENANTS.replace("{critical: 1.0}", "{critical: 0.5}")
    with pytest.raises(ScenarioError, match=r"tenants\.alpha: .*classes: shares must be >= 0 and sum to 1"):
        _tiers(tmp_path, extra=bad)
    bad = TENANTS.replace("sheddable: shed}", "sheddable: drop}")
    with pytest.raises(ScenarioError, match=r"tenants\.beta\.over_quota\.sheddable"):
        _tiers(tmp_path, extra=bad)
    with pytest.raises(ScenarioError, match="session is not supported with tenants"):
        _tiers(tmp_path, extra=TENANTS + "tasks: {kind: session}\n")


def test_tenant_mixes_and_a_tenant_surge_build_the_workload(tmp_path):
    base = _tiers(tmp_path, extra=TENANTS.replace("    surge: {at_s: 40, factor: 4, ramp_s: 0, duration_s: 40}\n", ""))
    sc = _tiers(tmp_path, extra=TENANTS)
    w0 = build_workload(base, np.random.default_rng(1))
    w = build_workload(sc, np.random.default_rng(1))
    assert w.tenant_names == ("alpha", "beta") and w.tenant is not None
    alpha, beta = w.tenant == 0, w.tenant == 1
    assert set(w.priority[alpha].tolist()) == {CRIT}
    assert set(w.priority[beta].tolist()) == {STD, SHED}
    assert w0.tenant is not None and 0.5 < (w0.tenant == 0).mean() < 0.7  # shares, before beta's surge
    # only beta's requests were copied, only in [40, 80) s, about 3 more per original
    t0, t = w0.trace.arrival_s, w.trace.arrival_s
    for k in (0, 1):
        before = ((t0 >= 40) & (t0 < 80) & (w0.tenant == k)).sum()
        after = ((t >= 40) & (t < 80) & (w.tenant == k)).sum()
        if k == 0:
            assert after == before
        else:
            assert 3.0 * before < after < 5.0 * before
    assert (w.tenant[t >= 80] == 0).sum() == (w0.tenant[t0 >= 80] == 0).sum()


def test_quota_sheds_or_queues_over_quota_requests_and_reports_per_tenant(tmp_path):
    sc = _tiers(tmp_path, extra=TENANTS + "clients: {retry_on_shed: false}\n")
    f = Fleet(sc)
    s = f.run()
    assert set(s.per_tenant) == {"alpha", "beta"}
    a, b = s.per_tenant["alpha"], s.per_tenant["beta"]
    assert a.quota_shed == 0 and a.quota_delayed == 0  # no quota
    assert b.quota_shed > 0 and b.quota_delayed > 0
    # beta sends ~1.6 req/s (4x in its surge) against 0.5 req/s: at most what the quota passes gets through
    rec = f.request_records()
    beta_sent = (f.workload.tenant == 1) & (rec["status"] == 1)
    span = float(f.workload.trace.arrival_s.max()) + 60.0
    assert beta_sent.sum() <= 0.5 * span + 0.5 * 4 + 1
    assert a.slo_attainment["critical"] > 0.95
    assert b.slo_attainment["sheddable"] < 0.6
    assert a.tasks + b.tasks == s.tasks
    assert a.successful_tasks + b.successful_tasks == s.successful_tasks
    assert a.cost_share + b.cost_share == pytest.approx(1.0)
    assert a.cost_usd + b.cost_usd == pytest.approx(s.cost_usd)
    assert s.to_dict()["per_tenant"]["beta"]["quota_shed"] == b.quota_shed
    assert Fleet(sc).run().to_dict() == s.to_dict()  # seeded: quotas, surges and queues replay exactly
    f2 = Fleet(sc)
    f2.set_tenant_quota("beta", rate_rps=0.0)
    s2 = f2.run()
    assert s2.per_tenant["beta"].quota_shed == 0 and s2.per_tenant["beta"].slo_attainment["sheddable"] > 0.9
    with pytest.raises(ValueError, match="unknown tenant 'gamma'"):
        f2.set_tenant_quota("gamma", rate_rps=1.0)


def test_quota_bucket_queues_until_the_token_is_due_or_sheds():
    q = TenantQuotaState(rate_rps=2.0, burst_s=1.0, queue=(True, True, False), max_wait_s=(0.75, 0.75, 0.75))
    assert [q.admit(CRIT, 0.0) for _ in range(2)] == [0.0, 0.0]  # one second of burst: 2 tokens
    assert q.admit(CRIT, 0.0) == pytest.approx(0.5)  # the next token is due in 0.5 s
    assert q.admit(STD, 0.0) < 0  # the one after in 1.0 s > 0.75 s: shed
    assert q.admit(SHED, 0.0) < 0  # sheddable is shed over quota
    assert q.admit(STD, 1.0) == 0.0  # by 1 s the bucket is back above one token
    assert (q.shed, q.delayed) == (2, 1)


# --------------------------------------------------------------------------- shifting length mix


def _mix_scenario(extra: str) -> Scenario:
    text = f"""
name: t
seed: 3
trace:
  path: azure2023_conv.csv
  duration_s: 1200
{extra}
pools:
  - name: p
    model: llama-3-8b
    sku: a100-80gb
"""
    return parse_scenario(text, source="t.yaml", base_dir=TRACES)


def test_mix_shift_resamples_the_traces_own_pairs_on_schedule():
    plain = build_workload(_mix_scenario(""), np.random.default_rng(0)).trace
    shifted = build_workload(_mix_scenario("  mix_shift: {at_s: [0, 1200], prefill_heavy_frac: [0.1, 0.9]}"),
                             np.random.default_rng(0)).trace
    assert np.array_equal(plain.arrival_s, shifted.arrival_s)
    pairs = set(zip(plain.prompt_tokens.tolist(), plain.output_tokens.tolist(), strict=True))
    assert set(zip(shifted.prompt_tokens.tolist(), shifted.output_tokens.tolist(), strict=True)) <= pairs
    ratio = plain.prompt_tokens / np.maximum(plain.output_tokens, 1)
    cut = np.median(ratio)
    r = shifted.prompt_tokens / np.maximum(shifted.output_tokens, 1)
    early, late = shifted.arrival_s < 300, shifted.arrival_s >= 900
    assert (r[early] > cut).mean() < 0.3 < 0.7 < (r[late] > cut).mean()
    assert shifted.prompt_tokens[late].mean() > 1.2 * shifted.prompt_tokens[early].mean()
    assert shifted.output_tokens[late].mean() < 0.8 * shifted.output_tokens[early].mean()


def test_mix_shift_is_validated_and_refuses_traces_with_hash_ids():
    with pytest.raises(ScenarioError, match="strictly increasing"):
        _mix_scenario("  mix_shift: {at_s: [10, 5], prefill_heavy_frac: [0.1, 0.9]}")
    with pytest.raises(ScenarioError, match="must have the same length"):
        _mix_scenario("  mix_shift: {at_s: [0], prefill_heavy_frac: [0.1, 0.9]}")
    sc = parse_scenario("""
name: t
trace:
  path: mooncake_conversation.jsonl
  duration_s: 60
  mix_shift: {at_s: [0], prefill_heavy_frac: [0.5]}
pools: [{name: p, model: llama-3-8b, sku: a100-80gb}]
""", source="t.yaml", base_dir=TRACES)
    with pytest.raises(TraceError, match="mix_shift: the trace has its own hash_ids"):
        build_workload(sc, np.random.default_rng(0))


# --------------------------------------------------------------------------- agentic tasks


def _agentic(tmp_path: Path, n: int = 40, classes: str = "") -> Scenario:
    rng = np.random.default_rng(5)
    lines = []
    for i in range(n):
        blocks = int(rng.integers(4, 12))
        hashes = [0, 1] + [100 * (i + 1) + k for k in range(blocks - 2)]  # two shared system-prompt blocks
        lines.append(json.dumps({"arrival_s": 2.0 * i, "prompt_tokens": 512 * blocks - 100,
                                 "output_tokens": int(rng.integers(10, 60)), "hash_ids": hashes}))
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    text = f"""
name: t
seed: 4
trace: {{path: a.jsonl}}
pools: [{{name: p, model: llama-3-8b, sku: a100-80gb, replicas: 1}}]
tasks: {{kind: agentic, steps_min: 3, steps_max: 8, think_time_s: 2}}
{classes}
"""
    return parse_scenario(text, source="t.yaml", base_dir=tmp_path)


def test_agentic_tasks_send_growing_prefixes_of_one_prompt(tmp_path):
    sc = _agentic(tmp_path)
    w = build_workload(sc, np.random.default_rng(0))
    tr = w.trace
    assert w.n_tasks == 40
    steps = np.bincount(w.task_id)
    assert steps.min() >= 3 and steps.max() <= 8 and len(set(steps.tolist())) > 2
    src = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    for t in range(w.n_tasks):
        idx = np.flatnonzero(w.task_id == t)
        assert w.step[idx].tolist() == list(range(len(idx)))
        p = tr.prompt_tokens[idx]
        assert np.all(np.diff(p) > 0)
        assert p[-1] == src[t]["prompt_tokens"] and tr.output_tokens[idx[-1]] == src[t]["output_tokens"]
        full = tuple(src[t]["hash_ids"])
        assert tr.block_hashes is not None  # the Mooncake trace carries its own hash ids
        for i in idx:
            h = tr.block_hashes[i]
            assert h == full[: len(h)] and len(h) == -(-int(tr.prompt_tokens[i]) // 512)
        assert np.all(tr.arrival_s[idx] == src[t]["arrival_s"])


def test_agentic_needs_hash_ids(tmp_path):
    sc = parse_scenario(f"""
name: t
trace: {{path: {_csv_trace(tmp_path / "t.csv")}}}
pools: [{{name: p, model: llama-3-8b, sku: a100-80gb}}]
tasks: {{kind: agentic, steps_min: 3, steps_max: 8}}
""", source="t.yaml", base_dir=tmp_path)
    with pytest.raises(ValueError, match="agentic needs a trace with its own hash_ids"):
        build_workload(sc, np.random.default_rng(0))


def test_a_late_failed_call_wastes_the_task_and_cost_counts_tasks(tmp_path):
    sc = _agentic(tmp_path)
    f = Fleet(sc)
    s = f.run()
    assert s.successful_tasks == s.tasks == 40
    assert s.hit_rate > 0.5  # each call re-sends the previous call's context
    # Critical TTFT SLO that only a first call can meet: every longer call misses, every task fails.
    tight = _agentic(tmp_path, classes="classes:\n  critical: {share: 1.0, ttft_slo_s: 0.05, tpot_slo_s: 1.0}")
    ft = Fleet(tight)
    st = ft.run()
    rec = ft.request_records()
    assert st.successful_tasks < st.tasks
    assert (rec["status"] == 1).sum() == len(ft.workload)  # every call ran (and was billed) anyway
    if st.successful_tasks:
        assert st.cost_per_successful_task_usd == pytest.approx(st.cost_usd / st.successful_tasks)
    else:
        assert np.isnan(st.cost_per_successful_task_usd)
