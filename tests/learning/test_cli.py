"""`governor record` and `governor fit` end to end on a small scenario, through the real CLI parser."""

from __future__ import annotations

import json

import pytest

from controller.cli import main
from controller.learning.records import read_recording
from controller.learning.store import ModelStore
from controller.paths import shared_data_dir

SCENARIO = """
name: tiny
seed: 2
trace:
  path: {trace}
  start_s: 0
  duration_s: 700
  rate_scale: 2
  hash_block_tokens: 256
  prefixes: {{groups: 16, zipf_a: 1.2, prefix_tokens: 512}}
pools:
  - {{name: small, model: llama-3-8b, sku: a100-80gb, replicas: 2, min_replicas: 1, max_replicas: 8}}
"""


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    d = tmp_path_factory.mktemp("rec")
    sc = d / "tiny.yaml"
    sc.write_text(SCENARIO.format(trace=shared_data_dir() / "traces" / "azure2023_conv.csv"))
    out = d / "tiny.jsonl"
    assert main(["record", "--scenario", str(sc), "--for", "600", "--out", str(out)]) == 0
    return out


def test_record_writes_a_header_and_one_line_per_tick(recording, capsys):
    header, physics, records = read_recording(recording)
    assert header["kind"] == "header" and set(physics) == {"small"}
    assert len(records) == 40  # 600 s / 15 s
    r = records[-1]
    assert r.settings["small"].replicas == 2 and r.settings["small"].prefix_weight == 3.0
    assert 0 < r.reuse["small"].inf_hit <= 1
    assert r.observation.pools["small"].arrival_rps.ok


def test_fit_writes_models_that_load(recording, tmp_path, capsys):
    out = tmp_path / "models"
    assert main(["fit", str(recording), "--out", str(out), "--seed", "3"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["out"] == str(out) and "arrival_rps:standard" in summary["forecast_series"]
    store = ModelStore(out)
    models, man = store.load_coupling()
    fc, _ = store.load_forecaster()
    assert man.data["seed"] == 3 and man.data["training"]["sources"] == [str(recording)]
    assert [p.key for p in models.physics] == ["llama-3-8b/a100-80gb/tp1"]
    assert "arrival_rps" in fc.series


@pytest.mark.parametrize("argv, message", [
    (["record", "--out", "x.jsonl"], "exactly one of --scenario"),
    (["record", "--scenario", "nope.yaml", "--out", "x.jsonl"], "cannot read scenario"),
    (["fit", "--out", "m"], "give one or more recordings"),
    (["fit", "missing.jsonl", "--out", "m"], "missing.jsonl: cannot read"),
])
def test_bad_input_is_named(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_record_from_a_config_reads_the_fleet_it_points_at(tmp_path, capsys):
    """A live recording against a scrape target nobody serves: the telemetry is missing, which is
    recorded as missing (not an error), one line per tick on the wall clock."""
    from tests.fixtures.prometheus import free_port

    cfg = tmp_path / "governor.yaml"
    cfg.write_text(f"""
telemetry:
  source: scrape
  scrape:
    timeout_s: 0.2
    targets:
      - {{url: "http://127.0.0.1:{free_port()}/metrics", pool: small, kind: vllm}}
pools:
  - {{name: small, model: llama-3-8b, sku: a100-80gb, usd_per_gpu_hour: 5.12}}
""")
    out = tmp_path / "live.jsonl"
    assert main(["record", "--config", str(cfg), "--for", "1.0", "--tick", "0.25", "--out", str(out)]) == 0
    header, physics, records = read_recording(out)
    assert header["source"].startswith("live:") and set(physics) == {"small"}
    assert len(records) >= 1
    assert not records[0].observation.pools["small"].arrival_rps.ok
