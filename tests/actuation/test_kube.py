"""The Kubernetes adapter driven through the real `kubernetes` client against tests/fakes/kube_api.py.

Covers: /scale of Deployments, StatefulSets and LeaderWorkerSets; drain before removal (the annotation
lands on the pods that then go, and before the scale write); warm standby as a second Deployment; the
engine args patch; 409 conflicts retried with a fresh resourceVersion; 404 and 422 as clear refusals;
HPA and KEDA ScaledObject on the same target refused; generations, replays and the validity deadline.
"""

from __future__ import annotations

import pytest

from controller.actuation.kube import (
    DELETION_COST,
    DELETION_COST_ANNOTATION,
    KubeError,
    KubernetesAutoscaler,
    KubeTarget,
    api_client,
    get_flag,
    set_flag,
)
from controller.actuation.kube_actuator import FleetActuator
from controller.clock import VirtualClock
from controller.types import Decision, PoolDecision
from tests.fakes.kube_api import FakeKubeApi

T0 = 1_700_000_000.0
NS = "inference"


@pytest.fixture
def api():
    fake = FakeKubeApi()
    yield fake
    fake.close()


def ready_all(api: FakeKubeApi) -> None:
    for i, p in enumerate(api.pods()):
        if "deletionTimestamp" not in p["metadata"] and "podIP" not in p.get("status", {}):
            api.set_ready(p["metadata"]["name"], f"10.1.0.{i + 1}")


def adapter(api: FakeKubeApi, **targets: KubeTarget) -> KubernetesAutoscaler:
    return KubernetesAutoscaler(targets, api_client(host=api.url), conflict_retries=2, timeout_s=5.0)


def target(pool: str, kind: str = "Deployment", name: str | None = None, **kw) -> KubeTarget:
    return KubeTarget(pool=pool, kind=kind, name=name or f"vllm-{pool}", namespace=NS, container="vllm", port=8000,
                      **kw)


def decision(gen: int, clock: VirtualClock, valid_for_s: float = 60.0, did: str | None = None,
             **pools: PoolDecision) -> Decision:
    return Decision(decision_id=did or f"d-{gen}", generation=gen, at_s=clock.now_s(),
                    valid_until_s=clock.now_s() + valid_for_s, pools=pools)


def writes(api: FakeKubeApi) -> list[tuple[str, str]]:
    return [(m, p) for m, p, _ in api.requests if m != "GET"]


def test_flags_are_rewritten_in_both_spellings_or_appended():
    assert set_flag(["--model", "m", "--max-num-seqs", "256"], "--max-num-seqs", 64) == \
        ["--model", "m", "--max-num-seqs", "64"]
    assert set_flag(["--max-num-seqs=256"], "--max-num-seqs", 64) == ["--max-num-seqs=64"]
    assert set_flag(["--model", "m"], "--max-num-seqs", 64) == ["--model", "m", "--max-num-seqs=64"]
    assert get_flag(["--max-num-seqs", "64"], "--max-num-seqs") == 64
    assert get_flag(["--max-num-seqs=x"], "--max-num-seqs") == 0
    assert get_flag(["--max-num-seqsx=9"], "--max-num-seqs") == 0


def test_deployment_scale_down_annotates_the_leaving_pods_before_the_scale_write(api):
    api.add_workload("Deployment", "vllm-a", replicas=3)
    ready_all(api)
    kube = adapter(api, a=target("a"))
    plan = kube.plan_pool("a", 1, 0, 0, 0)
    # the two youngest ready pods are chosen, deterministically
    pods = [p["metadata"]["name"] for p in api.pods()]
    assert [e.id for e in plan.leaving] == sorted(pods, reverse=True)[:2]
    assert all(e.phase == "draining" and e.url.startswith("http://10.1.0.") for e in plan.leaving)
    notes = kube.execute(plan)
    assert notes == ["a: Deployment/vllm-a 3 → 1"]
    w = writes(api)
    leaving = {e.id for e in plan.leaving}
    patched = [p.rsplit("/", 1)[1] for m, p in w if m == "PATCH"]
    assert set(patched) == leaving
    assert w[-1] == ("PUT", f"/apis/apps/v1/namespaces/{NS}/deployments/vllm-a/scale")  # the scale write comes last
    # the fake ReplicaSet removed exactly the annotated pods (lowest deletion cost first)
    terminating = {p["metadata"]["name"] for p in api.pods() if "deletionTimestamp" in p["metadata"]}
    assert terminating == leaving
    assert all(p["metadata"]["annotations"][DELETION_COST_ANNOTATION] == DELETION_COST for p in api.pods()
               if p["metadata"]["name"] in leaving)
    view, _ = kube.pool_state("a")
    assert (view.target_replicas, view.ready, view.draining) == (1, 1, 2)


def test_ordered_kinds_remove_their_highest_ordinals_without_annotations(api):
    api.add_workload("StatefulSet", "vllm-s", replicas=3)
    api.add_workload("LeaderWorkerSet", "vllm-l", replicas=3)
    ready_all(api)
    kube = adapter(api, s=target("s", "StatefulSet"), l=target("l", "LeaderWorkerSet"))
    for pool, name in (("s", "vllm-s"), ("l", "vllm-l")):
        plan = kube.plan_pool(pool, 1, 0, 0, 0)
        assert [e.id for e in plan.leaving] == [f"{name}-2", f"{name}-1"]
        kube.execute(plan)
        gone = sorted(p["metadata"]["name"] for p in api.pods() if "deletionTimestamp" in p["metadata"]
                      and p["metadata"]["name"].startswith(name))
        assert gone == [f"{name}-1", f"{name}-2"]
    assert not [p for m, p in writes(api) if m == "PATCH"]
    assert ("PUT", f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NS}/leaderworkersets/vllm-l/scale") in writes(api)


def test_scale_up_counts_starting_pods_until_they_are_ready(api):
    api.add_workload("Deployment", "vllm-a", replicas=1)
    ready_all(api)
    kube = adapter(api, a=target("a"))
    kube.execute(kube.plan_pool("a", 3, 0, 0, 0))
    view, eps = kube.pool_state("a")
    assert (view.target_replicas, view.ready, view.starting) == (3, 1, 2)
    assert [e.url for e in eps if e.phase == "starting"] == ["", ""]  # no IP yet: no router gets them
    ready_all(api)
    assert kube.pool_state("a")[0].ready == 3


def test_warm_standby_scales_the_unserved_deployment(api):
    api.add_workload("Deployment", "vllm-a", replicas=2)
    api.add_workload("Deployment", "vllm-a-standby", replicas=0, labels={"app": "vllm-a-standby"})
    kube = adapter(api, a=target("a", standby="vllm-a-standby"), b=target("b", name="vllm-b"))
    api.add_workload("Deployment", "vllm-b", replicas=1)
    kube.execute(kube.plan_pool("a", 2, 1, 0, 0))
    assert api.workload("deployments", "vllm-a-standby")["spec"]["replicas"] == 1
    ready_all(api)
    view, eps = kube.pool_state("a")
    assert (view.ready, view.standby) == (2, 1)
    assert [e.id for e in eps if e.phase == "standby"][0].startswith("vllm-a-standby-")
    # a pool without a standby Deployment says it cannot carry the lever instead of pretending
    plan = kube.plan_pool("b", 1, 2, 0, 0)
    assert plan.notes == ["warm_standby 2 not carried: pool 'b' has no standby Deployment"]


def test_engine_caps_patch_the_args_and_restart_only_when_they_change(api):
    api.add_workload("Deployment", "vllm-a", replicas=2, args=["--model", "m", "--max-num-seqs", "256"])
    kube = adapter(api, a=target("a"))
    notes = kube.execute(kube.plan_pool("a", 2, 0, 128, 4096))
    assert notes == ["a: engine args of Deployment/vllm-a set to {'--max-num-seqs': 128, "
                     "'--max-num-batched-tokens': 4096} (rolling restart)"]
    d = api.workload("deployments", "vllm-a")
    assert d["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "--model", "m", "--max-num-seqs", "128", "--max-num-batched-tokens=4096"]
    assert d["metadata"]["generation"] == 2  # the template changed: a rollout
    assert kube.execute(kube.plan_pool("a", 2, 0, 128, 4096)) == []  # same caps: no write, no restart
    assert api.workload("deployments", "vllm-a")["metadata"]["generation"] == 2
    view, _ = kube.pool_state("a")
    assert (view.max_num_seqs, view.max_num_batched_tokens) == (128, 4096)


def test_sglang_engines_use_their_own_flags(api):
    api.add_workload("LeaderWorkerSet", "sgl", replicas=1, container="sglang", args=["--model-path", "m"])
    kube = adapter(api, s=KubeTarget("s", "LeaderWorkerSet", "sgl", NS, "sglang", 30000, engine="sglang"))
    kube.execute(kube.plan_pool("s", 1, 0, 64, 2048))
    args = api.workload("leaderworkersets", "sgl")["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"][
        "containers"][0]["args"]
    assert args == ["--model-path", "m", "--max-running-requests=64", "--chunked-prefill-size=2048"]


def test_a_conflict_rereads_and_retries_with_the_new_resource_version(api):
    api.add_workload("Deployment", "vllm-a", replicas=1)
    kube = adapter(api, a=target("a"))
    scale = f"/apis/apps/v1/namespaces/{NS}/deployments/vllm-a/scale"
    plan = kube.plan_pool("a", 2, 0, 0, 0)
    api.interfere(scale, times=2)  # a concurrent writer right after each of the next two reads
    kube.execute(plan)
    assert api.workload("deployments", "vllm-a")["spec"]["replicas"] == 2
    puts = [p for m, p in writes(api) if m == "PUT"]
    assert puts == [scale] * 3  # two 409s, then the write with a fresh resourceVersion
    api.interfere(scale, times=5)  # more conflicts than retries: a clear error, not a loop
    with pytest.raises(KubeError, match=r"scale Deployment/vllm-a .* HTTP 409: .*has been modified"):
        kube.execute(kube.plan_pool("a", 3, 0, 0, 0))


def test_missing_workload_and_invalid_values_are_refused_by_name(api):
    kube = adapter(api, a=target("a"))
    with pytest.raises(KubeError, match=r"read Deployment/vllm-a scale in namespace inference: not found \(404\)"):
        kube.plan_pool("a", 1, 0, 0, 0)
    with pytest.raises(KubeError, match="has no Kubernetes target"):
        kube.plan_pool("zz", 1, 0, 0, 0)
    api.add_workload("Deployment", "vllm-a", replicas=1)
    plan = kube.plan_pool("a", 1, 0, 0, 0)
    plan.replicas = -1  # what a bad plan would send: the API server's 422 comes back named
    with pytest.raises(KubeError, match=r"rejected as invalid \(422\): .*spec.replicas: Invalid value: -1") as err:
        kube.execute(plan)
    assert err.value.invalid


@pytest.mark.parametrize("other", ["hpa", "keda"])
def test_it_refuses_to_fight_another_autoscaler_on_the_same_target(api, other):
    api.add_workload("Deployment", "vllm-a", replicas=1)
    api.add_workload("Deployment", "vllm-b", replicas=1)
    if other == "hpa":
        api.add_hpa("vllm-a", "Deployment", "vllm-a")
    else:
        api.add_scaledobject("vllm-a-so", "vllm-a")
    clock = VirtualClock(T0)
    act = FleetActuator(adapter(api, a=target("a"), b=target("b")), clock=clock)
    out = act.apply(decision(1, clock, a=PoolDecision(replicas=3), b=PoolDecision(replicas=2)))
    assert out.status == "invalid"
    want = "HorizontalPodAutoscaler inference/vllm-a" if other == "hpa" else "KEDA ScaledObject inference/vllm-a-so"
    assert want in out.detail and "will not fight it" in out.detail
    # nothing applied, not even to the other pool
    assert writes(api) == []
    assert act.health()[0] is False and "will not fight it" in act.health()[1]


def test_generations_replays_and_the_validity_deadline(api):
    api.add_workload("Deployment", "vllm-a", replicas=1)
    clock = VirtualClock(T0)
    act = FleetActuator(adapter(api, a=target("a")), clock=clock)
    assert act.apply(decision(2, clock, a=PoolDecision(replicas=2))).status == "applied"
    assert act.apply(decision(2, clock, a=PoolDecision(replicas=2))).status == "replay"
    assert act.apply(decision(2, clock, did="other", a=PoolDecision(replicas=5))).status == "stale"
    assert act.apply(decision(1, clock, a=PoolDecision(replicas=5))).status == "stale"
    assert api.workload("deployments", "vllm-a")["spec"]["replicas"] == 2
    late = decision(3, clock, valid_for_s=1.0, a=PoolDecision(replicas=4))
    clock.advance(2.0)
    out = act.apply(late)
    assert out.status == "failed" and "validity deadline" in out.detail
    state = act.fleet_state()
    assert state is not None and state.applied_generation == 2
    assert state.fallback_active is False
    clock.advance(60.0)  # the applied plan expires: replicas stay, the expiry is reported
    state = act.fleet_state()
    assert state is not None and state.fallback_active is True and state.pools["a"].target_replicas == 2


def test_a_missing_permission_is_named_and_refuses_the_plan(api):
    api.add_workload("Deployment", "vllm-a", replicas=1)
    api.keda_installed = True
    api.forbidden.add("/scaledobjects")  # the Role's KEDA rule left out: Governor cannot tell, so it refuses
    kube = adapter(api, a=target("a"))
    with pytest.raises(KubeError, match=r"list KEDA ScaledObjects in namespace inference: forbidden \(403\): the "
                                        r"service account lacks this permission; see the Role in "
                                        r"deploy/kubernetes/kubernetes-adapter.yaml"):
        kube.plan_pool("a", 2, 0, 0, 0)
    assert writes(api) == []


def test_a_slow_replica_is_replaced_by_deleting_its_pod_and_its_deployment_makes_another(api):
    """PoolDecision.replace names a slow replica (controller/core/outliers.py) by its host:port, as the
    telemetry does, or by pod name: the adapter deletes that pod (graceful), the Deployment's controller
    starts another, the target is unchanged; a replay replaces nothing more; an unknown name is noted."""
    api.add_workload("Deployment", "vllm-a", replicas=3)
    ready_all(api)
    clock = VirtualClock(T0)
    act = FleetActuator(adapter(api, a=target("a")), clock=clock)
    pods = {p["metadata"]["name"]: p["status"]["podIP"] for p in api.pods()}
    slow = sorted(pods)[1]
    d = decision(1, clock, a=PoolDecision(replicas=3, replace=(f"{pods[slow]}:8000", "10.9.9.9:8000")))
    out = act.apply(d)
    assert out.status == "applied", out.detail
    deletes = [p for m, p in writes(api) if m == "DELETE"]
    assert deletes == [f"/api/v1/namespaces/{NS}/pods/{slow}"]
    assert "'10.9.9.9:8000' to replace is not a live pod" in out.detail and f"pod {slow} replaced" in out.detail
    live = [p for p in api.pods() if "deletionTimestamp" not in p["metadata"]]
    assert len(live) == 3 and slow not in {p["metadata"]["name"] for p in live}  # a new pod in its place
    assert api.workload("deployments", "vllm-a")["spec"]["replicas"] == 3
    assert act.apply(d).status == "replay" and [p for m, p in writes(api) if m == "DELETE"] == deletes
    view, _ = act.kube.pool_state("a")
    assert (view.target_replicas, view.ready, view.starting, view.draining) == (3, 2, 1, 1)
    by_name = decision(2, clock, a=PoolDecision(replicas=3, replace=(sorted(pods)[0],)))
    assert act.apply(by_name).status == "applied"
    assert [p for m, p in writes(api) if m == "DELETE"][-1].endswith(f"/pods/{sorted(pods)[0]}")
