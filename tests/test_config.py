"""Config: the shipped example parses and documents every key; env overrides; each kind of error."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from controller.config import (
    ConfigError,
    Settings,
    cmd_schema,
    is_loopback,
    load_settings,
    parse_settings,
)
from controller.runtime.preflight import cmd_validate
from controller.types import FleetSpec, Mode, PoolSpec

EXAMPLE = Path(__file__).resolve().parents[1] / "deploy" / "governor.example.yaml"

BASE = """\
mode: shadow
tick_interval_s: 15
pools:
  - name: chat-h100
    model: llama-3-8b
    sku: h100-80gb
    gpus_per_replica: 2
    usd_per_gpu_hour: 3.0
    min_replicas: 1
    max_replicas: 8
  - name: chat-a100
    model: llama-3-8b
    sku: a100-80gb
    usd_per_gpu_hour: 1.5
telemetry:
  window_s: 90
api:
  listen: 127.0.0.1:50051
"""

KUBE = """\
actuators:
  kubernetes:
    enabled: true
    pools:
      - {pool: chat-h100, name: vllm-h100}
      - {pool: chat-a100, name: vllm-a100}
"""


def test_the_kubernetes_section_parses_with_its_defaults():
    s = parse_settings(BASE + KUBE + "    routers:\n      - {kind: sglang-router, url: 'http://127.0.0.1:30000'}\n")
    kube = s.actuators.kubernetes
    assert kube.enabled and kube.namespace == "inference" and kube.kubeconfig is None
    assert [(w.pool, w.kind, w.container, w.port, w.standby) for w in kube.pools] == [
        ("chat-h100", "Deployment", "vllm", 8000, None), ("chat-a100", "Deployment", "vllm", 8000, None)]
    assert [(r.kind, r.pools, r.metrics_url) for r in kube.routers] == [("sglang-router", [], None)]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """Tests must not see GOVERNOR_* variables from the environment they run in."""
    for name in list(os.environ):
        if name.upper().startswith("GOVERNOR_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "governor.yaml"
    p.write_text(text)
    return p


# --------------------------------------------------------------------------- the shipped example


def test_example_config_parses():
    s = load_settings(EXAMPLE)
    assert s.mode is Mode.SHADOW and s.policy == "slo-feedback"
    assert [p.name for p in s.pools] == ["chat-h100", "chat-a100"]
    assert s.telemetry.prometheus.pool_label == "pool"


def _model_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    from controller.config.loading import _strip

    out: set[tuple[str, ...]] = set()
    for name, f in model.model_fields.items():
        path = (*prefix, name)
        out.add(path)
        inner = _strip(f.annotation)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            out |= _model_paths(inner, path)
    return out


def _yaml_paths(node, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], int]:
    """Key path → line of its first occurrence (list items merged)."""
    out: dict[tuple[str, ...], int] = {}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            path = (*prefix, k.value)
            out.setdefault(path, k.start_mark.line)
            for p, line in _yaml_paths(v, path).items():
                out.setdefault(p, line)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            for p, line in _yaml_paths(item, prefix).items():
                out.setdefault(p, line)
    return out


def test_example_documents_every_key_with_a_comment():
    text = EXAMPLE.read_text()
    in_file = _yaml_paths(yaml.compose(text))
    missing = sorted(".".join(p) for p in _model_paths(Settings) - set(in_file))
    assert not missing, f"keys not shown in {EXAMPLE.name}: {missing}"
    lines = text.splitlines()
    # Every key of the model has a comment on its line or in the few lines above (its block's comment).
    undocumented = [".".join(p) for p, line in in_file.items() if p in _model_paths(Settings)
                    and not any("#" in lines[i] for i in range(max(0, line - 5), line + 1))]
    assert not undocumented, f"keys without a comment: {undocumented}"


# --------------------------------------------------------------------------- environment overrides


def test_env_overrides_the_file_and_merges_nested_keys(tmp_path, monkeypatch):
    path = write(tmp_path, BASE.replace("127.0.0.1:50051", "0.0.0.0:50051"))
    monkeypatch.setenv("GOVERNOR_MODE", "active")
    monkeypatch.setenv("GOVERNOR_API__TOKEN", "s3cret-token")  # makes the non-loopback listen valid
    monkeypatch.setenv("GOVERNOR_TELEMETRY__PROMETHEUS__URL", "http://prom.monitoring:9090")
    monkeypatch.setenv("GOVERNOR_GUARDS__MAX_STEP_UP", "7")
    s = load_settings(path)
    assert s.mode is Mode.ACTIVE
    assert s.api.resolved_token() == "s3cret-token" and s.api.listen == "0.0.0.0:50051"
    assert s.telemetry.prometheus.url == "http://prom.monitoring:9090"
    assert s.telemetry.window_s == 90  # the file's sibling key survives the nested override
    assert s.guards.max_step_up == 7


def test_env_can_replace_a_list_as_json(tmp_path, monkeypatch):
    monkeypatch.setenv("GOVERNOR_POOLS", json.dumps([{"name": "only", "model": "llama-3-8b", "sku": "h100-80gb",
                                                      "usd_per_gpu_hour": 2.0}]))
    assert [p.name for p in load_settings(write(tmp_path, BASE)).pools] == ["only"]


def test_env_alone_without_a_file(monkeypatch):
    monkeypatch.setenv("GOVERNOR_POOLS", '[{"name": "a", "model": "mistral-7b", "sku": "l4", "usd_per_gpu_hour": 1}]')
    monkeypatch.setenv("GOVERNOR_SEED", "42")
    s = load_settings(None)
    assert s.seed == 42 and s.pool_names() == ("a",)


def test_a_bad_env_value_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("GOVERNOR_TICK_INTERVAL_S", "0")
    with pytest.raises(ConfigError) as e:
        load_settings(write(tmp_path, BASE))
    assert "tick_interval_s: '0' is invalid: Input should be greater than or equal to 0.1" in str(e.value)
    assert "(from environment variable GOVERNOR_TICK_INTERVAL_S)" in str(e.value)


def test_unrelated_governor_variables_are_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("GOVERNOR_API_TOKEN", "for-the-cli-client")  # single underscore: not a config key
    assert load_settings(write(tmp_path, BASE)).api.token is None


# --------------------------------------------------------------------------- validation errors


def sub(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, 1)


ERROR_CASES = [
    # (label, yaml text, expected fragments — each names the file line, the field, the value, the range)
    ("unknown top-level key", BASE + "tick_intervall_s: 5\n",
     ["governor.yaml:19: tick_intervall_s: unknown key (allowed: mode, profile, policy,"]),
    ("unknown nested key", sub("    max_replicas: 8\n", "    max_replicas: 8\n    replicas: 3\n"),
     ["governor.yaml:11: pools[0].replicas: unknown key (allowed: name, model, sku,"]),
    ("min above max (cross-field)", sub("    min_replicas: 1\n", "    min_replicas: 9\n"),
     ["governor.yaml:9: pools[0].min_replicas: 9 must be <= max_replicas (8)"]),
    ("bad choice", sub("mode: shadow", "mode: aggressive"),
     ["governor.yaml:1: mode: 'aggressive' is invalid: Input should be 'active', 'shadow' or 'paused'"]),
    ("out of range", sub("tick_interval_s: 15", "tick_interval_s: 0"),
     ["governor.yaml:2: tick_interval_s: 0 is invalid: Input should be greater than or equal to 0.1"]),
    ("wrong type", sub("    max_replicas: 8", "    max_replicas: lots"),
     ["governor.yaml:10: pools[0].max_replicas: 'lots' is invalid: Input should be a valid integer"]),
    ("required key missing", sub("    usd_per_gpu_hour: 1.5\n", ""),
     ["governor.yaml:11: pools[1].usd_per_gpu_hour: required, but not set"]),
    ("bad pool name", sub("name: chat-a100", "name: Chat_A100"),
     ["pools[1].name: 'Chat_A100' is invalid: String should match pattern"]),
    ("duplicate pool name", sub("name: chat-a100", "name: chat-h100"),
     ["governor.yaml:11: pools[1].name: 'chat-h100' duplicates pools[0]"]),
    ("prefill without decode", sub("    usd_per_gpu_hour: 1.5\n", "    usd_per_gpu_hour: 1.5\n    role: prefill\n"),
     ["pools[1].role: group 'default' has a prefill pool but no decode pool"]),
    ("bad host:port", sub("listen: 127.0.0.1:50051", "listen: 127.0.0.1:99999"),
     ["governor.yaml:18: api.listen: '127.0.0.1:99999': port must be an integer in [0, 65535]"]),
    ("bad url", sub("  window_s: 90\n", "  window_s: 90\n  prometheus:\n    url: prometheus:9090\n"),
     ["governor.yaml:18: telemetry.prometheus.url: 'prometheus:9090' is not an http:// or https:// URL"]),
    ("unknown query name", sub("  window_s: 90\n", "  window_s: 90\n  prometheus:\n    queries: {ttft_p99: x}\n"),
     ["telemetry.prometheus.queries: unknown query name 'ttft_p99' (known: pool_sample_time,"]),
    ("bad query placeholder",
     sub("  window_s: 90\n", "  window_s: 90\n  prometheus:\n    queries: {running: 'sum by ($label) (x)'}\n"),
     ["query 'running' uses unknown placeholder $label (allowed: $pool, $window)"]),
    ("scrape source without targets", sub("  window_s: 90\n", "  window_s: 90\n  source: scrape\n"),
     ["telemetry.scrape: source 'scrape' needs discovery_url or at least one target"]),
    ("scrape window shorter than two ticks", sub("  window_s: 90\n", "  window_s: 20\n  source: scrape\n  scrape:\n"
                                                 "    discovery_url: http://127.0.0.1:1/sd\n"),
     ["governor.yaml:16: telemetry.window_s: 20 must be >= 2 × tick_interval_s (30) with source 'scrape'"]),
    ("scrape target of an unknown pool and a router with a pool",
     sub("  window_s: 90\n", "  window_s: 90\n  scrape:\n    targets:\n"
         "      - {url: 'http://10.0.0.1:8000/metrics', pool: chat-l40s}\n"
         "      - {url: 'http://10.0.0.9:9090/metrics', pool: chat-h100, kind: router}\n"),
     ["telemetry.scrape.targets[0].pool: 'chat-l40s' is not a configured pool (pools: ['chat-h100', 'chat-a100'])",
      "telemetry.scrape.targets[1].pool: 'chat-h100': a router target serves every pool; leave pool out"]),
    ("scrape target kind differs from the pool's engine",
     sub("  window_s: 90\n", "  window_s: 90\n  scrape:\n    targets:\n"
         "      - {url: 'http://10.0.0.1:8000/metrics', pool: chat-h100, kind: sglang}\n"),
     ["telemetry.scrape.targets[0].kind: 'sglang' but pool 'chat-h100' runs 'vllm'"]),
    ("stale_after_s below a tick", sub("  window_s: 90\n", "  window_s: 90\n  stale_after_s: 5\n"),
     ["telemetry.stale_after_s: 5 must be >= tick_interval_s (15)"]),
    ("token and token_file", sub("api:\n", "api:\n  token: abc\n  token_file: /run/secrets/t\n"),
     ["api.token_file: set token or token_file, not both"]),
    ("tls cert without key", sub("api:\n", "api:\n  tls: {cert: /etc/governor/tls.crt}\n"),
     ["api.tls: cert and key must be set together"]),
    ("two servers on one port", BASE + "metrics:\n  listen: 127.0.0.1:50051\n",
     ["governor.yaml:20: metrics.listen: 127.0.0.1:50051 is also api.listen"]),
    ("budget below the floor", BASE + "guards:\n  budget_usd_per_hour: 5\n",
     ["guards.budget_usd_per_hour: 5 is below the cost of every pool at min_replicas (6 USD/h)"]),
    ("duplicate YAML key", BASE + "mode: active\n", ["governor.yaml:19: mode: duplicate key (first at line 1)"]),
    ("not YAML", BASE + "pools: [\n", ["governor.yaml:20: not valid YAML"]),
    ("not a mapping", "- 1\n- 2\n", ["the config must be a YAML mapping, got list"]),
    ("no pools", "mode: shadow\n", ["pools: at least one pool is required"]),
    ("kubernetes adapter and a gRPC autoscaler",
     BASE + KUBE + "  autoscaler: {address: '127.0.0.1:7000'}\n",
     ["actuators.kubernetes.enabled: the Kubernetes adapter is the autoscaler: set actuators.autoscaler.address "
      "or actuators.kubernetes.enabled, not both"]),
    ("kubernetes adapter and KEDA", BASE + KUBE + "  keda: {enabled: true}\n",
     ["actuators.kubernetes.enabled: KEDA's HPA and the Kubernetes adapter would both scale the pools"]),
    ("kubernetes adapter without a workload for every pool",
     BASE + KUBE.replace("      - {pool: chat-a100, name: vllm-a100}\n", ""),
     ["actuators.kubernetes.pools: no workload for pool(s) ['chat-a100']"]),
    ("kubernetes workload of an unknown kind",
     BASE + KUBE.replace("{pool: chat-a100, name: vllm-a100}", "{pool: chat-a100, name: x, kind: ReplicaSet}"),
     ["actuators.kubernetes.pools[1].kind: 'ReplicaSet' is invalid: Input should be 'Deployment', 'StatefulSet' "
      "or 'LeaderWorkerSet'"]),
    ("kubernetes workload of an unknown pool, and one twice",
     BASE + KUBE + "      - {pool: chat-l40s, name: x}\n      - {pool: chat-h100, name: again}\n",
     ["actuators.kubernetes.pools[2].pool: 'chat-l40s' is not a configured pool",
      "actuators.kubernetes.pools[3].pool: 'chat-h100' duplicates pools[0]"]),
    ("router of an unknown pool, duplicated, of an unknown kind",
     BASE + KUBE + "    routers:\n      - {kind: vllm-router, url: 'http://10.0.0.1:30000', pools: [chat-l40s]}\n"
     "      - {kind: vllm-router, url: 'http://10.0.0.1:30000'}\n",
     ["actuators.kubernetes.routers[0].pools[0]: 'chat-l40s' is not a configured pool",
      "actuators.kubernetes.routers[1].url: 'http://10.0.0.1:30000' duplicates routers[0]"]),
    ("router kind", BASE + KUBE + "    routers:\n      - {kind: envoy, url: 'http://10.0.0.1:30000'}\n",
     ["actuators.kubernetes.routers[0].kind: 'envoy' is invalid: Input should be 'vllm-router' or 'sglang-router'"]),
    ("bad workload name and flag",
     BASE + KUBE.replace("name: vllm-a100}", "name: VLLM_A100, max_num_seqs_flag: max-num-seqs}"),
     ["actuators.kubernetes.pools[1].name: 'VLLM_A100' is invalid: String should match pattern",
      "actuators.kubernetes.pools[1].max_num_seqs_flag: 'max-num-seqs' is invalid: String should match pattern"]),
]


@pytest.mark.parametrize("label, text, fragments", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_validation_errors_name_line_field_value_and_range(tmp_path, label, text, fragments):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_settings(path)
    message = str(e.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    assert message.startswith(str(path))


def test_all_problems_are_listed_at_once(tmp_path):
    text = sub("mode: shadow", "mode: fast").replace("sku: a100-80gb", "sku: a100-80gb\n    color: red")
    text = text.replace("tick_interval_s: 15", "tick_interval_s: -1")
    with pytest.raises(ConfigError) as e:
        load_settings(write(tmp_path, text))
    assert len(e.value.problems) == 3, e.value.problems
    assert "3 problems" in str(e.value)


def test_an_unreadable_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_settings(tmp_path / "nope.yaml")


# --------------------------------------------------------------------------- token beyond loopback


@pytest.mark.parametrize("listen, token, valid", [
    ("127.0.0.1:50051", None, True),
    ("127.0.0.2:50051", None, True),
    ("localhost:50051", None, True),
    ("[::1]:50051", None, True),
    ("0.0.0.0:50051", None, False),
    ("[::]:50051", None, False),
    ("10.1.2.3:50051", None, False),
    ("governor.inference.svc:50051", None, False),
    ("0.0.0.0:50051", "token: abc123", True),
    ("0.0.0.0:50051", "token_file: /run/secrets/governor-token", True),
])
def test_a_token_is_required_beyond_loopback(listen, token, valid):
    text = sub("  listen: 127.0.0.1:50051\n", f"  listen: '{listen}'\n" + (f"  {token}\n" if token else ""))
    if valid:
        assert parse_settings(text).api.listen == listen
    else:
        with pytest.raises(ConfigError, match=r"api\.token: required when api\.listen .* is not a loopback address"):
            parse_settings(text)


def test_is_loopback():
    assert is_loopback("127.0.0.1:1") and is_loopback("[::1]:1") and is_loopback("localhost:1")
    assert not is_loopback("0.0.0.0:1") and not is_loopback("example.com:1")


def test_token_file_is_read_when_resolved(tmp_path):
    secret = tmp_path / "token"
    secret.write_text("from-a-file\n")
    s = parse_settings(sub("  listen: 127.0.0.1:50051\n", f"  listen: 0.0.0.0:50051\n  token_file: {secret}\n"))
    assert s.api.resolved_token() == "from-a-file"
    gone = parse_settings(sub("  listen: 127.0.0.1:50051\n", f"  token_file: {tmp_path / 'gone'}\n"))
    with pytest.raises(ConfigError, match="api.token_file: cannot read"):
        gone.api.resolved_token()


def test_the_token_is_not_printed():
    s = parse_settings(sub("  listen: 127.0.0.1:50051\n", "  token: hunter2-hunter2\n"))
    assert "hunter2" not in repr(s) and "hunter2" not in s.model_dump_json()


# --------------------------------------------------------------------------- views and CLI


def test_fleet_spec_prices_replicas_per_gpu():
    spec = parse_settings(BASE).fleet_spec()
    assert isinstance(spec, FleetSpec)
    h100 = spec.pool("chat-h100")
    assert isinstance(h100, PoolSpec)
    assert h100.usd_per_replica_hour == pytest.approx(6.0)  # 3.0 $/GPU-h × 2 GPUs
    assert (h100.min_replicas, h100.max_replicas, h100.gpus_per_replica) == (1, 8, 2)
    assert spec.pool("chat-a100").usd_per_replica_hour == pytest.approx(1.5)
    assert spec.slos["critical"].ttft_s == 2.5 and set(spec.slos) == {"critical", "standard", "sheddable"}


def test_settings_are_frozen():
    s = parse_settings(BASE)
    with pytest.raises(ValidationError):
        s.mode = Mode.ACTIVE  # type: ignore[misc]  # assigning a frozen field is what is tested
    assert s.model_copy(update={"mode": Mode.ACTIVE}).mode is Mode.ACTIVE


def test_cmd_validate(tmp_path, capsys):
    good = write(tmp_path, BASE)
    assert cmd_validate(argparse.Namespace(file=str(good))) == 0
    out = capsys.readouterr().out
    assert ": ok: " in out.splitlines()[0] and "2 pool(s)" in out.splitlines()[0]
    assert out.splitlines()[1].split() == ["lever", "planned", "carried", "by"]  # the carriage table follows
    bad = write(tmp_path, sub("    min_replicas: 1\n", "    min_replicas: 9\n"))
    assert cmd_validate(argparse.Namespace(file=str(bad))) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "pools[0].min_replicas: 9 must be <= max_replicas (8)" in captured.err


def test_cmd_schema(capsys):
    assert cmd_schema(argparse.Namespace()) == 0
    schema = json.loads(capsys.readouterr().out)
    assert {"mode", "pools", "telemetry", "api", "guards"} <= set(schema["properties"])
    assert schema["additionalProperties"] is False
