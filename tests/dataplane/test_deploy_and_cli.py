"""The picker's flags, readings and shipped Envoy/Kubernetes files; bench and demo end to end (bounded)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import grpc
import pytest
import yaml

from controller.cli import build_parser
from controller.dataplane.cli import config_from_args
from controller.dataplane.envoy import envoy_binary, render_bootstrap
from controller.dataplane.scrape import ScrapeError, parse_engine_metrics, parse_http_sd
from controller.dataplane.server import PickerConfig, PickerThread, prompt_text, resolve
from controller.gen.governor.v1 import control_pb2 as pb
from controller.gen.governor.v1 import control_pb2_grpc as pb_grpc
from controller.paths import PROJECT_ROOT
from tests.dataplane.conftest import wait_for

ENVOY_DIR = PROJECT_ROOT / "deploy" / "envoy"


def _cfg(*argv: str):
    return config_from_args(build_parser().parse_args(["picker", *argv]))


def test_flags_become_a_config_and_bad_ones_are_named():
    cfg = _cfg("--pool", "a=127.0.0.1:1,127.0.0.1:2", "--pool", "b=dns:localhost:8000", "--group", "g=a,b",
               "--default-weight", "a=3", "--default-inflight-cap", "4", "--default-scorer", "1,0,0")
    assert cfg.groups == {"g": ["a", "b"]} and cfg.endpoints == {"a": ["127.0.0.1:1", "127.0.0.1:2"]}
    assert cfg.dns == {"b": ("localhost", 8000)}
    assert cfg.defaults is not None
    assert cfg.defaults.pools["a"].traffic_weight == 3.0 and cfg.defaults.pools["b"].inflight_cap == 4
    assert cfg.defaults.pools["b"].prefix_weight == 1.0 and cfg.defaults.pools["b"].queue_weight == 0.0
    for argv, msg in [((), "--pool: name at least one pool"),
                      (("--pool", "a=nohost"), "'nohost' is not HOST:PORT"),
                      (("--pool", "a=1.2.3.4:5", "--group", "g=b"), "must be exactly the --pool pools"),
                      (("--pool", "a=1.2.3.4:5", "--default-scorer", "x"), "--default-scorer 'x'"),
                      (("--pool", "a=1.2.3.4:5", "--pool", "a=1.2.3.4:6"), "'a' given twice")]:
        with pytest.raises(ValueError, match=msg):
            _cfg(*argv)


def test_dns_membership_lists_every_address_of_a_name():
    assert resolve("localhost", 8000) in (["127.0.0.1:8000"], ["127.0.0.1:8000", "[::1]:8000"], ["[::1]:8000"])


def test_engine_readings_and_discovery_are_parsed():
    text = ('# HELP x\nvllm:num_requests_running{model_name="m",engine="0"} 3.0\n'
            'vllm:num_requests_waiting{model_name="m",engine="0"} 2\nvllm:kv_cache_usage_perc{engine="0"} 0.25\n'
            'vllm:num_requests_running_other 99\n')
    assert parse_engine_metrics(text) == (5.0, 0.25)
    assert parse_engine_metrics("sglang:num_running_reqs 1\nsglang:num_queue_reqs 1\nsglang:token_usage 0.5\n") \
        == (2.0, 0.5)
    with pytest.raises(ScrapeError, match="no vllm:num_requests_running"):
        parse_engine_metrics("up 1\n")
    sd = json.dumps([{"targets": ["10.0.0.1:8000"], "labels": {"kind": "vllm", "pool": "a"}},
                     {"targets": ["10.0.0.9:9400"], "labels": {"kind": "dcgm", "pool": "a"}},
                     {"targets": ["10.0.0.2:8000"], "labels": {"pool": "zz"}},
                     {"targets": ["10.0.0.3:8000"], "labels": {"pool": "a", "draining": "true"}}]).encode()
    assert parse_http_sd(sd, ["a", "b"]) == {"a": ["10.0.0.1:8000"], "b": []}
    with pytest.raises(ScrapeError, match="not JSON"):
        parse_http_sd(b"<html>", ["a"])


def test_prompt_text_reads_completions_and_chat():
    assert prompt_text(b'{"prompt": "hello"}') == "hello"
    assert prompt_text(b'{"messages": [{"role": "user", "content": "hi"}]}') == "user: hi"
    assert prompt_text(b"not json") == "" and prompt_text(b"") == ""


def test_the_kubernetes_example_is_consistent_with_the_picker_and_envoy():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all((ENVOY_DIR / "inferencepool.yaml")
                                                                             .read_text()) if d}
    container = docs[("Deployment", "governor-picker")]["spec"]["template"]["spec"]["containers"][0]
    cfg = config_from_args(build_parser().parse_args(container["args"]))
    assert cfg.dns == {"chat-h100": ("vllm-chat-h100-pods.inference.svc.cluster.local", 8000),
                       "chat-a100": ("vllm-chat-a100-pods.inference.svc.cluster.local", 8000)}
    # beyond loopback, RouterControl is served with mTLS from the mounted Secret (the picker refuses it otherwise)
    assert cfg.host == "0.0.0.0" and cfg.control_tls is not None and cfg.control_tls.mutual
    mount = container["volumeMounts"][0]["mountPath"]
    assert all(str(f).startswith(mount + "/") for f in (cfg.control_tls.cert_file, cfg.control_tls.key_file,
                                                        cfg.control_tls.client_ca_file))
    svc_ports = {p["name"]: p["port"] for p in docs[("Service", "governor-picker")]["spec"]["ports"]}
    assert svc_ports == {"extproc": cfg.extproc_port, "control": cfg.control_port, "metrics": cfg.metrics_port}
    pool = docs[("InferencePool", "chat")]["spec"]
    assert pool["endpointPickerRef"] == {"name": "governor-picker", "port": {"number": cfg.extproc_port},
                                         "failureMode": "FailClose"}
    for p in ("chat-h100", "chat-a100"):
        headless = docs[("Service", f"vllm-{p}-pods")]["spec"]
        assert headless["clusterIP"] == "None" and headless["ports"][0]["port"] == pool["targetPorts"][0]["number"]
    boot = yaml.safe_load((ENVOY_DIR / "kubernetes.yaml").read_text())
    picker = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "picker")
    sock = picker["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    assert sock == {"address": "governor-picker.inference.svc.cluster.local", "port_value": cfg.extproc_port}
    assert boot["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["loopback", "kubernetes"])
def test_envoy_accepts_the_shipped_bootstraps(tmp_path, name):
    path = ENVOY_DIR / f"{name}.yaml"
    if name == "loopback":
        path = tmp_path / "loopback.yaml"
        path.write_text(render_bootstrap(picker_address="127.0.0.1", picker_port=9002))
    out = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert f"configuration '{path}' OK" in out.stdout + out.stderr


@pytest.mark.e2e
def test_bench_dataplane_prints_one_json_object_within_targets():
    out = subprocess.run([sys.executable, "-m", "controller", "bench", "dataplane", "--json", "--requests", "300",
                          "--rate", "200", "--timeout", "60"], capture_output=True, text=True, timeout=120,
                         cwd=PROJECT_ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    res = json.loads(lines[0])
    for key in ("requests", "errors", "share_error_max", "pick_latency_p50_ms", "pick_latency_p99_ms",
                "added_latency_p99_ms", "rps"):
        assert key in res
    assert res["requests"] == 300 and res["errors"] == 0 and res["share_error_max"] <= 0.03
    assert 0 < res["pick_latency_p50_ms"] <= res["pick_latency_p99_ms"]


@pytest.mark.e2e
def test_demo_with_envoy_governs_the_picker_and_the_replayed_traffic_succeeds():
    out = subprocess.run([sys.executable, "-m", "controller", "run", "--demo", "--dataplane", "envoy", "--for", "8",
                          "--headless"], capture_output=True, text=True, timeout=120, cwd=PROJECT_ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    listening = events[0]
    assert listening["event"] == "listening" and listening["dataplane"]["envoy"].startswith("http://127.0.0.1:")
    ticks = [e for e in events if e["event"] == "tick"]
    assert ticks and all(t["outcome"] == "applied" for t in ticks)
    # the arrival rate comes from the picker's counters (the only router target that sees traffic)
    assert max(t["arrival_rps"] or 0 for t in ticks) > 5
    replay = next(e for e in events if e["event"] == "replay")
    assert replay["requests"] > 50 and replay["errors"] == 0
    # spend and cost per successful request from the picker's counters (the replay sends no task ids)
    costs = ticks[-1]["costs"]
    assert costs["basis"] == "requests" and costs["spend_usd"] > 0 and costs["tasks"]["completed"] > 0
    assert costs["cost_per_success_usd"] == pytest.approx(costs["spend_usd"] / costs["tasks"]["completed"])


@pytest.mark.e2e
def test_a_follower_picker_obeys_the_policy_governor_sends_to_its_leader():
    groups = {"g": ["a", "b"]}
    leader = PickerThread(PickerConfig(groups=groups, endpoints={"a": ["127.0.0.1:9"], "b": ["127.0.0.1:9"]},
                                       scrape_interval_s=0.1))
    lead = leader.start()
    follower = PickerThread(PickerConfig(groups=groups, endpoints={"a": ["127.0.0.1:9"], "b": ["127.0.0.1:9"]},
                                         scrape_interval_s=0.1, follow=lead.control_address))
    fol = follower.start()
    try:
        msg = pb.RoutingPolicy(meta=pb.CommandMeta(decision_id="d-7", generation=7,
                                                   valid_until_unix_s=time.time() + 1.0))
        msg.pools.add(pool="a", traffic_weight=0.25, inflight_cap=3)
        msg.admission.add(priority_class="sheddable", shed_fraction=0.5)
        with grpc.insecure_channel(lead.control_address) as ch:
            assert pb_grpc.RouterControlStub(ch).ApplyRoutingPolicy(msg, timeout=5).status == pb.ACK_STATUS_APPLIED

        def followed():
            a = fol.svc.store.settings(time.time())
            return (a.generation, a.decision_id, a.fallback, a.settings.pools["a"].inflight_cap,
                    a.settings.admission_of("sheddable").shed_frac)

        wait_for(lambda: follower.call(followed) == (7, "d-7", False, 3, 0.5), 5, "the follower to copy the policy")
        # the leader's deadline holds for the follower too: both fall back to their defaults
        wait_for(lambda: follower.call(followed)[2], 5, "the follower to fall back")
        assert follower.call(followed)[3:] == (0, 0.0)
    finally:
        follower.stop()
        leader.stop()
