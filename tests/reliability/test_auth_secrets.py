"""Secrets never in logs, status or metrics (issue 21): a real daemon (build_services: API, KEDA scaler,
/metrics) started with a token file, a tokens file and a KEDA token file, ticked, asked for its status and
scraped; the log, the status and the metrics page are searched for every token."""

from __future__ import annotations

import io
import json
import logging
import urllib.request

import grpc

from controller.clock import WallClock
from controller.config import Settings
from controller.gen.governor.v1 import policy_pb2, policy_pb2_grpc
from controller.obs.logs import setup_logging
from controller.runtime.main import build_services

LEGACY = "legacy-secret-token-11111111"
WRITER = "writer-secret-token-22222222"
READER = "reader-secret-token-33333333"
KEDA = "keda-secret-token-4444444444"


def test_no_token_in_the_log_the_status_or_the_metrics(tmp_path):
    (tmp_path / "tokens.yaml").write_text(f"tokens:\n  - {{name: alice, token: {WRITER}, role: write}}\n"
                                          f"  - {{name: grafana, token: {READER}, role: read}}\n")
    (tmp_path / "keda.yaml").write_text(f"tokens:\n  - {{name: keda, token: {KEDA}, role: read}}\n")
    settings = Settings(
        state_dir=str(tmp_path / "state"), tick_interval_s=1.0, mode="shadow",
        pools=[{"name": "a", "model": "llama-3.1-8b", "sku": "a100-80gb", "usd_per_gpu_hour": 2.0}],
        # nothing listens on port 9: the tick reads nothing, fails cleanly, and is logged
        telemetry={"source": "scrape", "scrape": {"targets": [{"url": "http://127.0.0.1:9/metrics", "pool": "a"}],
                                                  "timeout_s": 0.2}, "window_s": 2.0, "stale_after_s": 2.0},
        api={"listen": "127.0.0.1:0", "tokens_file": str(tmp_path / "tokens.yaml")},
        metrics={"listen": "127.0.0.1:0"}, log={"level": "debug"},
        actuators={"keda": {"enabled": True, "listen": "127.0.0.1:0", "token_file": str(tmp_path / "keda.yaml")}},
    )
    stream = io.StringIO()
    logger = setup_logging("debug", "json", stream=stream)
    services = build_services(settings, clock=WallClock(), logger=logger)
    try:
        services.daemon.tick()
        with grpc.insecure_channel(f"127.0.0.1:{services.api_port}") as ch:
            stub = policy_pb2_grpc.PolicyServiceStub(ch)
            md = (("authorization", f"Bearer {WRITER}"),)
            status = stub.GetStatus(policy_pb2.GetStatusRequest(), metadata=md, timeout=5)
            stub.SetMode(policy_pb2.SetModeRequest(mode=policy_pb2.MODE_PAUSED, author="ops", reason="drill"),
                         metadata=md, timeout=5)
            try:
                stub.GetStatus(policy_pb2.GetStatusRequest(), metadata=(("authorization", f"Bearer {LEGACY}"),),
                               timeout=5)
            except grpc.RpcError as exc:
                refused = exc.details() or ""
            audit = stub.ListAudit(policy_pb2.ListAuditRequest(), metadata=md, timeout=5)
        assert services.metrics_url is not None
        with urllib.request.urlopen(services.metrics_url, timeout=5) as resp:
            metrics = resp.read().decode()
    finally:
        services.close()
        for name in ("governor", "controller", "apscheduler"):
            lg = logging.getLogger(name)
            lg.handlers.clear()
            lg.propagate = True
            lg.setLevel(logging.NOTSET)
    log = stream.getvalue()
    assert [json.loads(line) for line in log.splitlines()]  # it logged, in JSON
    assert "governor_" in metrics and status.generation >= 0
    assert audit.entries[0].caller == "token:alice"
    outputs = {"log": log, "status": str(status), "metrics": metrics, "audit": str(audit), "refusal": refused,
               "settings": repr(settings) + settings.summary()}
    for token in (LEGACY, WRITER, READER, KEDA):
        for where, text in outputs.items():
            assert token not in text, f"a token appears in the {where}"
