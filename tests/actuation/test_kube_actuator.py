"""FleetActuator's ordering and membership rules with an in-memory router (the real routers are in
test_router_membership.py): ready-only adds, removal before the scale-down, a held scale-down when a
router cannot drop a pod, router trouble reported and never raised."""

from __future__ import annotations

import pytest

from controller.actuation.kube import KubernetesAutoscaler, KubeTarget, api_client
from controller.actuation.kube_actuator import FleetActuator
from controller.actuation.routers.membership import RouterError, RouterReading
from controller.clock import VirtualClock
from controller.types import Decision, PoolDecision
from tests.fakes.kube_api import FakeKubeApi

T0 = 1_700_000_000.0


class MemoryRouter:
    kind = "memory-router"

    def __init__(self, pools: tuple[str, ...] = ()) -> None:
        self.url = "http://router.test"
        self.pools = pools
        self.members: set[str] = set()
        self.log: list[tuple[str, str]] = []
        self.fail_remove = False
        self.down = False
        self.unhealthy: set[str] = set()

    def workers(self) -> set[str]:
        if self.down:
            raise RouterError("memory-router list: unreachable")
        return set(self.members)

    def add(self, url: str) -> None:
        self.log.append(("add", url))
        self.members.add(url)

    def remove(self, url: str) -> None:
        if self.fail_remove:
            raise RouterError(f"memory-router remove {url}: HTTP 500")
        self.log.append(("remove", url))
        self.members.discard(url)

    def reading(self) -> RouterReading:
        return RouterReading(healthy={u: u not in self.unhealthy for u in self.members})


@pytest.fixture
def api():
    fake = FakeKubeApi()
    fake.add_workload("Deployment", "vllm-a", replicas=2)
    fake.add_workload("Deployment", "vllm-b", replicas=1)
    for i, p in enumerate(fake.pods()):
        fake.set_ready(p["metadata"]["name"], f"10.2.0.{i + 1}")
    yield fake
    fake.close()


def make(api: FakeKubeApi, *routers: MemoryRouter, clock: VirtualClock | None = None) -> FleetActuator:
    kube = KubernetesAutoscaler({p: KubeTarget(p, "Deployment", f"vllm-{p}", "inference", "vllm", 8000)
                                 for p in ("a", "b")}, api_client(host=api.url))
    return FleetActuator(kube, list(routers), clock=clock or VirtualClock(T0))


def decision(gen: int, a: int, b: int = 1) -> Decision:
    return Decision(f"d-{gen}", gen, T0, T0 + 60, {"a": PoolDecision(replicas=a), "b": PoolDecision(replicas=b)})


def urls(api: FakeKubeApi, name: str, *, terminating: bool = False) -> set[str]:
    return {f"http://{p['status']['podIP']}:8000" for p in api.pods() if p["metadata"]["name"].startswith(name)
            and ("deletionTimestamp" in p["metadata"]) == terminating and "podIP" in p.get("status", {})}


def test_membership_is_the_ready_replicas_of_the_pools_a_router_fronts(api):
    only_a, every = MemoryRouter(("a",)), MemoryRouter()
    act = make(api, only_a, every)
    assert act.apply(decision(1, 2)).status == "applied"
    assert only_a.members == urls(api, "vllm-a") and len(only_a.members) == 2
    assert every.members == urls(api, "vllm-a") | urls(api, "vllm-b")
    out = act.apply(decision(2, 3))
    assert out.targets["routers"].status == "applied"
    assert len(only_a.members) == 2  # the new pod is starting: not added yet
    [new] = [p["metadata"]["name"] for p in api.pods() if "podIP" not in p.get("status", {})]
    api.set_ready(new, "10.2.0.9")
    assert act.fleet_state() is not None  # every tick's fleet_state re-syncs
    assert "http://10.2.0.9:8000" in only_a.members and len(only_a.members) == 3


def test_leaving_pods_are_removed_before_the_scale_down_and_a_failed_removal_holds_it(api):
    router = MemoryRouter()
    act = make(api, router)
    act.apply(decision(1, 2))
    router.fail_remove = True
    out = act.apply(decision(2, 1))
    assert out.status == "failed"  # the membership part failed, and says so
    assert "scale-down to 1 held at 2" in out.targets["autoscaler"].detail
    assert api.workload("deployments", "vllm-a")["spec"]["replicas"] == 2  # no pod is stopped under traffic
    router.fail_remove = False
    out = act.apply(decision(3, 1))
    assert out.status == "applied", out.detail
    gone = urls(api, "vllm-a", terminating=True)
    assert len(gone) == 1 and not gone & router.members
    # the pod that went was taken out of the router (the order against the scale write: test_router_membership.py)
    assert ("remove", next(iter(gone))) in router.log


def test_router_trouble_is_reported_in_health_not_raised(api):
    router = MemoryRouter()
    act = make(api, router)
    act.apply(decision(1, 2))
    router.unhealthy = set(list(router.members)[:1])
    act.sync_membership()
    ok, detail = act.health()
    assert not ok and "the router reports unhealthy workers: http://10.2.0." in detail
    router.down = True
    assert act.sync_membership() == ["memory-router list: unreachable"]
    assert act.health()[0] is False


def test_no_router_is_touched_without_a_valid_applied_plan(api):
    """Shadow or paused mode applies no plan: membership stays the router's own; so after a plan expires."""
    router = MemoryRouter()
    router.members = {"http://keep.me:8000"}
    clock = VirtualClock(T0)
    act = make(api, router, clock=clock)
    assert act.sync_membership() == [] and act.fleet_state() is not None
    assert router.members == {"http://keep.me:8000"} and router.log == []
    act.apply(decision(1, 2))
    assert router.members == urls(api, "vllm-a") | urls(api, "vllm-b")
    clock.advance(61.0)  # the plan's validity (60 s) is over: hands off again
    router.members.add("http://added.by.hand:8000")
    act.sync_membership()
    act.fleet_state()
    assert "http://added.by.hand:8000" in router.members
