"""The shared state in a GovernorState object (controller/api/kube_store.py), through the official client against the
in-process API server (tests/fakes/kube_api.py): what one replica writes the other reads, a write lands in the object
and the local copy together or in neither, a 409 is retried without duplicating anything, and a replica that does not
lead (or whose term a later one has written over) cannot write."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml
from kubernetes import client

from controller.actuation.kube import api_client
from controller.api.kube_store import GROUP, PLURAL, FencedError, GovernorStateApi, KubeStateStore
from tests.fakes.kube_api import FakeKubeApi

T0 = 1_800_000_000.0
CRD = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "governorstate-crd.yaml"


@pytest.fixture
def fake():
    api = FakeKubeApi()
    yield api
    api.close()


def _store(fake: FakeKubeApi, tmp_path: Path, who: str, epoch: list[int]) -> KubeStateStore:
    api = GovernorStateApi("inference", "governor", client.CustomObjectsApi(api_client(host=fake.url)))
    store = KubeStateStore(str(tmp_path / who / "governor.db"), api, identity=who)
    store.bind(lambda: epoch[0])
    return store


def test_what_the_leader_writes_the_follower_serves_whole(fake, tmp_path):
    a_term, b_term = [1], [0]
    a, b = _store(fake, tmp_path, "pod-a", a_term), _store(fake, tmp_path, "pod-b", b_term)
    assert a.claim(T0)
    pin = a.add_override("pin_replicas", pool="chat", value=3, ttl_s=3600, author="alice", now_s=T0 + 1,
                         reason="launch", caller="token:alice")
    a.set_mode("active", author="alice", now_s=T0 + 2, reason="shadow week looked right")
    a.add_override("admission", priority_class="sheddable", value=0.5, ttl_s=60, author="bob", now_s=T0 + 3)
    assert a.delete_override(pin.override_id, author="alice", now_s=T0 + 4)
    obj = fake.get_object(GROUP, PLURAL, "governor")
    assert obj is not None and obj["spec"]["writer"] == {"identity": "pod-a", "epoch": 1}
    assert b.sync() and not b.sync()  # changed once, then nothing new
    assert b.get_mode() == "active"
    assert b.list_overrides(T0 + 5, include_expired=True) == a.list_overrides(T0 + 5, include_expired=True)
    assert b.list_audit(100) == a.list_audit(100)
    assert [e.action for e in b.list_audit(100)][::-1] == ["leader.claim", "override.set", "mode.set", "override.set",
                                                           "override.delete"]
    # the object is what the CRD accepts
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.validate(obj, schema)
    # expiry is audited once, by the leader; a follower only reads
    assert b.expire_overrides(T0 + 100) == [] and b.list_audit(1)[0].action == "override.delete"
    (expired,) = a.expire_overrides(T0 + 100)
    assert expired.kind == "admission"
    assert a.expire_overrides(T0 + 101) == []  # nothing new: no write
    b.sync()
    assert b.list_audit(1)[0].action == "override.expired"
    assert [e.seq for e in b.list_audit(100)] == [e.seq for e in a.list_audit(100)]


def test_a_follower_and_a_deposed_leader_cannot_write_and_nothing_is_half_applied(fake, tmp_path):
    a_term, b_term = [1], [0]
    a, b = _store(fake, tmp_path, "pod-a", a_term), _store(fake, tmp_path, "pod-b", b_term)
    a.claim(T0)
    a.add_override("max_replicas", pool="chat", value=8, ttl_s=600, author="alice", now_s=T0)
    with pytest.raises(FencedError, match="does not lead"):
        b.add_override("pin_replicas", pool="chat", value=1, ttl_s=600, author="mallory", now_s=T0 + 1)
    assert [o.kind for o in b.list_overrides(T0 + 2)] == ["max_replicas"]  # b's local attempt rolled back
    # b takes the Lease (term 2) while a still believes it leads (term 1)
    b_term[0] = 2
    assert b.claim(T0 + 3)
    before = fake.get_object(GROUP, PLURAL, "governor")
    with pytest.raises(FencedError, match="term 2 \\(pod-b\\) has written"):
        a.set_mode("paused", author="alice", now_s=T0 + 4)
    assert fake.get_object(GROUP, PLURAL, "governor") == before
    assert a.get_mode() != "paused" and a.list_audit(1)[0].action == "leader.claim"  # a now holds b's copy
    b.set_mode("shadow", author="carol", now_s=T0 + 5)
    obj = fake.get_object(GROUP, PLURAL, "governor")
    assert obj is not None and obj["spec"]["mode"] == "shadow"


def test_a_concurrent_write_is_retried_on_the_new_object_without_duplicates(fake, tmp_path):
    term = [1]
    a = _store(fake, tmp_path, "pod-a", term)
    a.claim(T0)
    path = "/apis/governor.llm-d.ai/v1alpha1/namespaces/inference/governorstates/governor"
    fake.interfere(path, times=2)  # the next two reads are followed by someone else's write: two 409s
    o = a.add_override("freeze", pool="chat", ttl_s=60, author="alice", now_s=T0 + 1)
    spec = fake.get_object(GROUP, PLURAL, "governor")["spec"]
    assert [x["id"] for x in spec["overrides"]] == [o.override_id] == ["ov-000001"]
    assert [e["action"] for e in spec["audit"]] == ["leader.claim", "override.set"]
    writes = [r[0] for r in fake.requests if r[0] in ("POST", "PUT")]
    assert writes == ["POST", "PUT", "PUT", "PUT"]  # the claim created it; then 2 refused (409) and 1 accepted


def test_the_refit_verdict_is_shared(fake, tmp_path):
    a, b = _store(fake, tmp_path, "pod-a", [1]), _store(fake, tmp_path, "pod-b", [0])
    a.set_refit({"at_s": T0, "coupling_swapped": False, "reason": "kept: candidate 0.31 >= current 0.29",
                 "by": "pod-a"})
    b.sync()
    shared = b.get_refit()
    assert shared is not None and shared == a.get_refit() and shared["reason"].startswith("kept")


def test_a_read_that_crosses_a_write_does_not_put_the_older_state_back(fake, tmp_path):
    """The tick's sync reads the object while an API call writes it: the read must not answer with the object from
    before the write and then be imported over it (found by the 20-cycle failover run: a leader's audit trail
    lost its last mode.set until the next sync)."""
    import threading

    a = _store(fake, tmp_path, "pod-a", [1])
    a.claim(T0)
    real_get = a.api.get
    writer: list[threading.Thread] = []

    def get_crossing_a_write():
        obj = real_get()  # the object as it is before the write
        if not writer:
            writer.append(threading.Thread(target=lambda: a.set_mode("paused", author="alice", now_s=T0 + 1)))
            writer[0].start()
            writer[0].join(0.5)  # the write may land now (it must wait for the read's lock)
        return obj

    a.api.get = get_crossing_a_write  # type: ignore[method-assign]
    a.sync()
    writer[0].join(10)
    assert a.get_mode() == "paused" and a.list_audit(1)[0].action == "mode.set"
    obj = fake.get_object(GROUP, PLURAL, "governor")
    assert obj is not None and obj["spec"]["mode"] == "paused"


def test_the_crd_accepts_exactly_the_modes_profiles_and_override_kinds_governor_has():
    from controller.api.store import OVERRIDE_KINDS
    from controller.names import PROFILES
    from controller.types import Mode

    spec = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props = spec["properties"]
    assert props["mode"]["enum"] == [m.value for m in Mode]
    assert props["profile"]["enum"] == list(PROFILES)
    assert props["overrides"]["items"]["properties"]["kind"]["enum"] == list(OVERRIDE_KINDS)
