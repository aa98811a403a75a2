"""Any model on any GPU: a fleet of Qwen2.5-7B on L40S plus a model and a SKU only the config declares
validates and runs (`governor run --config F --once`) against a live simulated fleet of the same pools
(the simulator times both on the roofline), and a pool naming an unknown model is refused by
`governor config validate` with the name in the message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.config import load_settings
from controller.sim.live import LiveFleet
from controller.sim.scenario import load_scenario
from tests.fakes.live_scenario import HASH_BLOCK_TOKENS, write_trace

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]

CATALOGUE = """\
catalogue:
  models:
    - {name: acme-13b, params: 13.0e9, layers: 40, hidden: 5120, kv_heads: 8, head_dim: 128, dtype: bf16,
       context: 16384}
  skus:
    - {name: acme-gpu, hbm_tb_per_s: 2.0, dense_bf16_tflops: 400, memory_gib: 64, interconnect_gb_per_s: 300}
"""


def _scenario(tmp: Path) -> Path:
    write_trace(tmp / "trace.jsonl", n=600, rps=6.0)
    path = tmp / "scenario.yaml"
    path.write_text(f"""\
name: any-engine
seed: 3
trace: {{path: trace.jsonl, format: jsonl, hash_block_tokens: {HASH_BLOCK_TOKENS}}}
pools:
  - {{name: qwen-l40s, model: qwen-2.5-7b, sku: l40s, replicas: 1, max_replicas: 4, usd_per_gpu_hour: 1.86}}
  - {{name: acme, model: acme-13b, sku: acme-gpu, tp: 2, replicas: 1, max_replicas: 4, usd_per_gpu_hour: 3.0}}
{CATALOGUE}""")
    return path


def _config(tmp: Path, info: dict, model: str = "qwen-2.5-7b") -> Path:
    path = tmp / "governor.yaml"
    path.write_text(f"""\
mode: active
tick_interval_s: 15
state_dir: {tmp / 'state'}
telemetry:
  source: scrape
  scrape: {{discovery_url: "{info['discovery']}"}}
  window_s: 30
  stale_after_s: 30
pools:
  - {{name: qwen-l40s, model: {model}, sku: l40s, usd_per_gpu_hour: 1.86, min_replicas: 1, max_replicas: 4,
     group: qwen}}
  - {{name: acme, model: acme-13b, sku: acme-gpu, gpus_per_replica: 2, usd_per_gpu_hour: 3.0, min_replicas: 1,
     max_replicas: 4, group: acme}}
{CATALOGUE}
actuators:
  router: {{address: "{info['router_control']}"}}
  autoscaler: {{address: "{info['autoscaler_control']}"}}
api: {{listen: "127.0.0.1:0"}}
metrics: {{listen: null}}
log: {{format: json}}
""")
    return path


def _governor(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "controller", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)


def test_a_declared_model_and_sku_and_a_qwen_l40s_pool_validate_and_run(tmp_path):
    scenario = load_scenario(_scenario(tmp_path))
    fleet = LiveFleet(scenario, speed=1.0)
    info = fleet.start()
    try:
        config = _config(tmp_path, info)
        engines = load_settings(config).engines()
        assert {n: (e.key, e.source) for n, e in engines.items()} == {
            "qwen-l40s": ("qwen-2.5-7b/l40s-48gb/tp1", "roofline"), "acme": ("acme-13b/acme-gpu/tp2", "roofline")}
        ok = _governor("config", "validate", str(config), cwd=tmp_path)
        assert ok.returncode == 0, ok.stderr
        assert "qwen-l40s=qwen-2.5-7b/l40s-48gb/tp1 (roofline)" in ok.stdout
        run = _governor("run", "--config", str(config), "--once", cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-2000:]
        ticks = [json.loads(line) for line in run.stderr.splitlines()
                 if line.startswith("{") and '"event":"tick"' in line.replace(" ", "")]
        assert ticks and set(ticks[-1]["replicas"]) == {"qwen-l40s", "acme"}, run.stderr[-2000:]
        assert ticks[-1]["outcome"] == "applied"
    finally:
        fleet.stop()


def test_an_unknown_model_is_refused_by_validate_with_its_name(tmp_path):
    info = {"discovery": "http://127.0.0.1:1/sd", "router_control": "127.0.0.1:1", "autoscaler_control": "127.0.0.1:2"}
    bad = _governor("config", "validate", str(_config(tmp_path, info, model="qwen-9b")), cwd=tmp_path)
    assert bad.returncode == 2
    assert "pools[0].model: unknown model 'qwen-9b'" in bad.stderr
    run = _governor("run", "--config", str(tmp_path / "governor.yaml"), "--once", cwd=tmp_path)
    assert run.returncode == 2 and "unknown model 'qwen-9b'" in run.stderr
