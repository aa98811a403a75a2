"""Governor's routing policy, applied by a real Envoy + `governor picker`, counted at the simulated replicas."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest

from controller.dataplane.replay import send_one
from controller.gen.governor.v1 import control_pb2 as pb
from tests.dataplane.conftest import A100, H100, DataPlane, wait_for

pytestmark = pytest.mark.e2e

PREFIX = "You are a careful assistant for the fleet's operators; answer briefly and cite the runbook. " * 2


def _idle(dp: DataPlane) -> None:
    """Wait until the picker's readings show every engine idle (the last test's load is gone)."""
    wait_for(lambda: dp.on_picker(lambda: all(e.engine_queue == 0 and e.inflight == 0
                                              for es in dp.running.svc.picker.endpoints.values() for e in es)),
             10, "idle engines in the picker's readings")


def _by_pool(dp: DataPlane, before, after) -> dict[str, int]:
    return {pool: sum(after[r] - before[r] for r in rids) for pool, rids in dp.pools.items()}


def test_traffic_split_between_pools_follows_the_weights(dataplane: DataPlane):
    dp = dataplane
    dp.apply({A100: {"weight": 0.7, "prefix": 0.0}, H100: {"weight": 0.3, "prefix": 0.0}})
    before = dp.served()
    results = dp.send([f"request {i} about nothing in particular" for i in range(300)], concurrency=24)
    assert [r.status for r in results] == [200] * 300 and not any(r.error for r in results)
    got = _by_pool(dp, before, dp.served())
    assert sum(got.values()) == 300
    assert abs(got[A100] / 300 - 0.7) <= 0.03
    assert abs(got[H100] / 300 - 0.3) <= 0.03


def test_an_ejected_replica_gets_no_new_requests_through_envoy_and_the_picker(dataplane: DataPlane):
    """RouterControl ejects one replica of a pool (a slow one, controller/core/outliers.py) by its address: the
    picker sends it nothing while its neighbour is left; the next command without it puts it back."""
    dp = dataplane
    slow, other = dp.pools[A100][0], dp.pools[A100][1]
    dp.apply({A100: {"weight": 1.0, "prefix": 0.0, "ejected": [dp.addresses[slow]]}, H100: {"weight": 0.0}})
    before = dp.served()
    results = dp.send([f"ejection probe {i}" for i in range(60)], concurrency=12)
    assert [r.status for r in results] == [200] * 60
    after = dp.served()
    assert after.get(slow, 0) == before.get(slow, 0)
    assert after[other] - before.get(other, 0) == 60
    dp.apply({A100: {"weight": 1.0, "prefix": 0.0}, H100: {"weight": 0.0}})
    before = dp.served()
    dp.send([f"back in {i}" for i in range(40)], concurrency=8)
    assert dp.served()[slow] > before.get(slow, 0)


def test_shared_prefix_sticks_to_one_replica_at_high_affinity_and_spreads_at_zero(dataplane: DataPlane):
    dp = dataplane
    prompts = [PREFIX + f"question {i}" for i in range(40)]
    dp.apply({A100: {"weight": 1.0, "prefix": 10.0}, H100: {"weight": 0.0}})
    _idle(dp)
    before = dp.served()
    assert all(r.status == 200 for r in dp.send(prompts, concurrency=8))
    after = dp.served()
    counts = sorted(after[r] - before[r] for r in dp.pools[A100])
    assert counts == [0, 40]  # one home replica for the shared prefix

    dp.apply({A100: {"weight": 1.0, "prefix": 0.0}, H100: {"weight": 0.0}})
    _idle(dp)
    before = dp.served()
    assert all(r.status == 200 for r in dp.send(prompts, concurrency=8))
    after = dp.served()
    counts = sorted(after[r] - before[r] for r in dp.pools[A100])
    assert sum(counts) == 40 and counts[0] >= 12  # by load and round robin: both replicas take a fair part


def test_beyond_the_inflight_cap_standard_and_sheddable_wait_while_critical_passes(dataplane: DataPlane):
    dp = dataplane
    dp.apply({A100: {"weight": 1.0, "cap": 1, "prefix": 0.0}, H100: {"weight": 0.0}})
    _idle(dp)
    held = lambda cls: dp.on_picker(lambda: dp.running.svc.picker.held_count(cls))  # noqa: E731

    async def scenario() -> dict:
        body = lambda n: json.dumps({"prompt": "long story", "max_tokens": n, "stream": True}).encode()  # noqa: E731
        path = "/v1/completions"
        # two long streams fill both A100 replicas up to the cap
        long = [asyncio.create_task(send_one(dp.url, path, body(2000), {"x-governor-class": "standard"}, 30))
                for _ in range(2)]
        await asyncio.to_thread(wait_for, lambda: sum(dp.served()[r] for r in dp.pools[A100]) >= base + 2,
                                10, "the long streams to reach the replicas")
        std = asyncio.create_task(send_one(dp.url, path, body(2), {"x-governor-class": "standard"}, 30))
        shed = asyncio.create_task(send_one(dp.url, path, body(2), {"x-governor-class": "sheddable"}, 30))
        await asyncio.to_thread(wait_for, lambda: held("standard") == 1 and held("sheddable") == 1, 10,
                                "standard and sheddable to be held")
        t0 = time.monotonic()
        crit = await send_one(dp.url, path, body(2), {"x-governor-class": "critical"}, 30)
        crit_s = time.monotonic() - t0
        still_held = (held("standard"), held("sheddable"), std.done(), shed.done())
        for t in long:  # the clients give up on the long streams: their slots free, the held ones go
            t.cancel()
        res_std, res_shed = await std, await shed
        return {"crit": crit, "crit_s": crit_s, "still_held": still_held, "std": res_std, "shed": res_shed}

    base = sum(dp.served()[r] for r in dp.pools[A100])
    out = asyncio.run(scenario())
    assert out["crit"].status == 200 and not out["crit"].error and out["crit_s"] < 5
    assert out["still_held"] == (1, 1, False, False)  # they waited while critical passed
    assert out["std"].status == 200 and out["shed"].status == 200  # held, not failed
    wait_for(lambda: held("standard") == 0 and held("sheddable") == 0, 5, "the holds to clear")


def test_a_shed_class_gets_429_and_the_others_none(dataplane: DataPlane):
    dp = dataplane
    dp.apply({A100: {"weight": 1.0}, H100: {"weight": 1.0}}, admission={"sheddable": {"shed": 1.0}})
    _idle(dp)
    classes = ["critical", "standard", "sheddable"] * 20
    results = dp.send([f"p {i}" for i in range(len(classes))], cls=classes, concurrency=12)
    by = {c: sorted({r.status for r, k in zip(results, classes, strict=True) if k == c}) for c in set(classes)}
    assert by == {"critical": [200], "standard": [200], "sheddable": [429]}

    async def one_shed():
        reader, writer = await asyncio.open_connection(*dp.url.removeprefix("http://").split(":"))
        body = b'{"prompt": "x", "max_tokens": 1}'
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nx-governor-class: sheddable\r\n"
                     b"Content-Type: application/json\r\nConnection: close\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        data = await reader.read()
        writer.close()
        return data.decode().lower()

    raw = asyncio.run(one_shed())
    assert raw.startswith("http/1.1 429") and "retry-after: 1" in raw and "shed" in raw


def test_after_the_validity_deadline_the_picker_falls_back_to_its_defaults(dataplane: DataPlane):
    dp = dataplane
    dp.apply({A100: {"weight": 1.0}, H100: {"weight": 0.0}}, admission={"standard": {"shed": 1.0}}, valid_for_s=1.5)
    assert {r.status for r in dp.send(["while valid"] * 5)} == {429}
    before = dp.served()
    wait_for(lambda: dp.control.GetRoutingPolicy(pb.GetRoutingPolicyRequest(), timeout=5).pools[1].traffic_weight
             == 1.0, 10, "the policy to expire")
    results = dp.send([f"after expiry {i}" for i in range(40)])
    assert [r.status for r in results] == [200] * 40  # no more shedding: the defaults admit everything
    got = _by_pool(dp, before, dp.served())
    assert got == {A100: 20, H100: 20}  # the defaults' equal weights, not the expired 1 : 0
    policy = dp.control.GetRoutingPolicy(pb.GetRoutingPolicyRequest(), timeout=5)
    assert policy.meta.valid_until_unix_s < time.time()
    assert all(a.shed_fraction == 0 for a in policy.admission)


def test_requests_without_a_body_are_picked_at_their_headers(dataplane: DataPlane):
    with urllib.request.urlopen(dataplane.url + "/v1/models", timeout=10) as r:
        models = json.loads(r.read())
    assert models["data"][0]["id"] == "meta-llama/Meta-Llama-3-8B-Instruct"
    with urllib.request.urlopen(dataplane.url + "/health", timeout=10) as r:
        assert r.status == 200
