"""The coupling is really learned: model against simulator, on runs the model did not train on.

Setup: Llama-3-8B on A100 with a deliberately small KV cache (gpu_memory_utilization 0.5) serving
the Azure 2023 chat trace (minutes 10-25, ×1.5) with 1,000 synthetic shared prefixes of 4,096
tokens (Zipf 1.05), so the cache is under pressure and routing matters.

- training run: seed 4, trace minutes 0-20, settings drawn every 4 minutes (replicas 2-8, prefix
  weight 0-8);
- test runs: seed 3 (another resampling of the trace and other prefix groups), trace minutes
  10-25, fixed settings: replicas 3 and 6 × prefix weight 0 and 3.
"""

from __future__ import annotations

import numpy as np
import pytest

from controller.bench.recordings import Excitation, RunSpec, SimRecorder, record_run
from controller.learning.fit import fit_coupling
from controller.learning.physics import physics_for_scenario_pool
from controller.learning.training_data import build_training_data
from controller.paths import shared_data_dir

SCENARIO = """
name: cache-coupling
seed: {seed}
trace:
  path: {trace}
  start_s: {start}
  duration_s: {duration}
  rate_scale: 1.5
  hash_block_tokens: 256
  prefixes: {{groups: 1000, zipf_a: 1.05, prefix_tokens: 4096}}
pools:
  - {{name: p, model: llama-3-8b, sku: a100-80gb, replicas: {replicas}, min_replicas: 1, max_replicas: 16,
      engine: {{gpu_memory_utilization: 0.5}}}}
"""


def scenario(seed: int, replicas: int, start: float, duration: float):
    from controller.sim.scenario import parse_scenario

    text = SCENARIO.format(seed=seed, trace=shared_data_dir() / "traces" / "azure2023_conv.csv", start=start,
                           duration=duration, replicas=replicas)
    return parse_scenario(text, source="cache-coupling")


def fixed_run(replicas: int, prefix_weight: float):
    from dataclasses import replace

    from controller.sim.fleet import Fleet

    sc = scenario(3, replicas, 600.0, 900.0)
    fleet = Fleet(sc, seed=3, record_requests=False)
    rec = SimRecorder(fleet)
    rec.apply("p", replace(rec.settings["p"], prefix_weight=prefix_weight))
    records, t = [], 0.0
    while t < 900.0:
        t += 15.0
        fleet.run_until(t)
        records.append(rec.read(t))
    return build_training_data(records, {"p": physics_for_scenario_pool(sc.pools[0])})


@pytest.fixture(scope="module")
def runs():
    spec = RunSpec("<inline>", "coupling-train", seed=4,
                   excitation=Excitation(240.0, replicas=(2, 3, 4, 6, 8), prefix_weights=(0.0, 1.0, 3.0, 8.0)))
    train = record_run(spec, scenario=scenario(4, 4, 0.0, 1200.0))
    data, phys = build_training_data(train.records, train.physics)
    models = fit_coupling(data, phys, np.random.default_rng(0))
    tests = {(r, pw): fixed_run(r, pw) for r in (3, 6) for pw in (0.0, 3.0)}
    return models, tests


def observed_and_predicted(models, data_phys):
    from controller.core.coupling import with_physics

    data, phys = data_phys
    m = with_physics(models, phys)
    ok = data.steady & np.isfinite(data.targets["hit_rate"]) & np.isfinite(data.targets["ttft_p95_s"])
    hit, _ = m.predict_hit_rate(data.cache)
    lat, _, _ = m.predict_latency(data.latency)  # at the observed hit rate
    return {"hit_obs": float(np.mean(data.targets["hit_rate"][ok])), "hit_pred": float(np.mean(hit[ok])),
            "ttft_obs": float(np.median(data.targets["ttft_p95_s"][ok])),
            "ttft_pred": float(np.median(lat["ttft_p95_s"][ok])), "rows": int(ok.sum())}


def test_hit_rate_drops_when_replicas_double_at_fixed_affinity(runs):
    models, tests = runs
    small = observed_and_predicted(models, tests[(3, 0.0)])
    large = observed_and_predicted(models, tests[(6, 0.0)])
    assert small["rows"] > 20 and large["rows"] > 20
    sim_drop = small["hit_obs"] - large["hit_obs"]
    model_drop = small["hit_pred"] - large["hit_pred"]
    assert sim_drop > 0.005, f"the simulator shows no drop: {small} {large}"
    assert model_drop > 0.0, f"the model misses the drop: {small} {large}"
    assert abs(model_drop - sim_drop) < 0.02
    for r in (small, large):  # a sanity bound here; the accuracy figure is `governor bench models`'s
        assert abs(r["hit_pred"] - r["hit_obs"]) < 0.08


def test_with_affinity_doubling_replicas_raises_the_hit_rate_instead(runs):
    """The contrast that shows the model learnt the coupling, not a constant: with cache affinity
    the extra replicas add cache without scattering the prefixes."""
    models, tests = runs
    small = observed_and_predicted(models, tests[(3, 3.0)])
    large = observed_and_predicted(models, tests[(6, 3.0)])
    assert large["hit_obs"] > small["hit_obs"] and large["hit_pred"] > small["hit_pred"]


def test_p95_ttft_rises_when_the_hit_rate_falls_at_fixed_load(runs):
    models, tests = runs
    high = observed_and_predicted(models, tests[(6, 3.0)])  # affinity on: more hits
    low = observed_and_predicted(models, tests[(6, 0.0)])  # same fleet and load, affinity off
    assert high["hit_obs"] - low["hit_obs"] > 0.05
    sim_rise = low["ttft_obs"] / high["ttft_obs"]
    model_rise = low["ttft_pred"] / high["ttft_pred"]
    assert sim_rise > 1.05, f"the simulator shows no rise: {high} {low}"
    assert model_rise > 1.05, f"the model misses the rise: {high} {low}"
    assert 0.5 < model_rise / sim_rise < 2.0


def test_recording_is_deterministic_for_a_seed():
    from controller.learning.records import record_to_dict

    spec = RunSpec("<inline>", "det", seed=9, excitation=Excitation(60.0, replicas=(2, 3), prefix_weights=(0.0, 3.0)))
    a = record_run(spec, scenario=scenario(9, 2, 0.0, 240.0), max_sim_s=240.0)
    b = record_run(spec, scenario=scenario(9, 2, 0.0, 240.0), max_sim_s=240.0)

    assert [record_to_dict(r) for r in a.records] == [record_to_dict(r) for r in b.records]
