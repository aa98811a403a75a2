"""Capacity that never comes (issue 34, part 5): replicas pending past their start-up are reported as not coming
(the Kubernetes adapter against the in-process API server, the simulator), the estimate does not count them as
starting, and the planner holds the pool at what it has, scales the other SKU pool of the same model instead
(`capacity_unavailable`) and asks the pool again after a backoff that doubles while the GPUs stay gone."""

from __future__ import annotations

from controller.actuation.kube import KubernetesAutoscaler, KubeTarget, api_client
from controller.bench.observe import SimObserver
from controller.core.capacity import CapacityState, advance_capacity, capped_fleet
from controller.core.guards import GuardConfig
from controller.core.step import Controller, TickInput
from controller.paths import PROJECT_ROOT
from controller.policies.registry import build_policy
from controller.sim.control import apply_decision
from controller.sim.fleet import Fleet
from controller.sim.fleet_accounting import PoolState
from controller.sim.fleetspec import fleet_spec_from_scenario
from controller.sim.scenario import load_scenario
from controller.types import FleetSpec, PoolSpec, Reason, SloSpec
from tests.fakes.kube_api import FakeKubeApi

DEMO = PROJECT_ROOT / "controller" / "sim" / "demo" / "demo.yaml"
H100, A100 = "llama8b-h100", "llama8b-a100"


def test_the_adapter_reports_pods_pending_past_start_up_and_missing_ones_as_not_coming():
    fake = FakeKubeApi()
    now = [1000.0]
    try:
        fake.add_workload("Deployment", "vllm-h100", replicas=3)
        pods = fake.pods()
        fake.set_ready(pods[0]["metadata"]["name"], "10.0.0.1")  # one serves; two stay Pending (no GPU)
        kube = KubernetesAutoscaler({"h100": KubeTarget("h100", "Deployment", "vllm-h100", "inference", "vllm", 8000,
                                                        startup_s=180.0)}, api_client(host=fake.url),
                                    clock=lambda: now[0])
        view, _ = kube.pool_state("h100")
        assert (view.ready, view.starting, view.unavailable) == (1, 2, 0)  # within start-up: on their way
        now[0] += 179.0
        assert kube.pool_state("h100")[0].unavailable == 0
        now[0] += 1.0
        view, _ = kube.pool_state("h100")
        assert (view.ready, view.starting, view.unavailable) == (1, 0, 2)  # past it: not coming, not starting
        fake.set_ready(pods[1]["metadata"]["name"], "10.0.0.2")  # a GPU freed up: that one came after all
        view, _ = kube.pool_state("h100")
        assert (view.ready, view.starting, view.unavailable) == (2, 0, 1)
        # a quota: the ReplicaSet cannot create the third pod at all
        fake.finish_delete(pods[2]["metadata"]["name"])
        assert kube.pool_state("h100")[0].unavailable == 0
        now[0] += 180.0
        view, _ = kube.pool_state("h100")
        assert (view.ready, view.starting, view.unavailable) == (2, 0, 1)
    finally:
        fake.close()


def _fleet() -> FleetSpec:
    pools = tuple(PoolSpec(name=n, model="llama-3-8b", sku=s, min_replicas=1, max_replicas=8, startup_cold_s=60.0)
                  for n, s in ((H100, "h100-80gb"), (A100, "a100-80gb")))
    return FleetSpec(pools, {"standard": SloSpec(5.0, 0.15)})


def test_a_hold_caps_the_pool_and_backs_off_doubling_until_the_pool_gets_what_it_asks():
    fleet = _fleet()
    st, reasons = advance_capacity(CapacityState(), fleet, {H100: PoolState(H100, 5, 2, 1, 0, 0, 256, 8192, 2)}, 0.0)
    (r,) = reasons
    assert r.code == "capacity_unavailable" and r.pool == H100 and r.data["elsewhere"] == [A100]
    assert r.data["held_at"] == 3 and r.data["retry_at_s"] == 60.0
    capped = capped_fleet(fleet, st)
    assert capped.pool(H100).max_replicas == 3 and capped.pool(A100).max_replicas == 8
    stuck = {H100: PoolState(H100, 5, 2, 0, 0, 0, 256, 8192, 3)}
    st, _ = advance_capacity(st, fleet, stuck, 59.0)
    assert st.holds[H100].until_s == 60.0  # still held
    st, reasons = advance_capacity(st, fleet, stuck, 60.0)  # retried, still not coming: twice as long
    assert st.holds[H100].backoff_s == 120.0 and st.holds[H100].until_s == 180.0
    st, reasons = advance_capacity(st, fleet, {H100: PoolState(H100, 2, 2, 0, 0, 0, 256, 8192, 0)}, 180.0)
    assert reasons == () and H100 not in st.holds and st.next_backoff_s[H100] == 240.0  # asked no more: no news
    st, reasons = advance_capacity(st, fleet, {H100: PoolState(H100, 3, 3, 0, 0, 0, 256, 8192, 0)}, 200.0)
    assert reasons == () and H100 not in st.next_backoff_s  # more than it was held at: the GPUs came, reset


def _run(capacity: int | None, until_s: float = 300.0) -> tuple[dict[str, list[int]], list[tuple[float, Reason]],
                                                                  Fleet]:
    scenario = load_scenario(DEMO)
    fleet = Fleet(scenario, seed=3)
    observer = SimObserver(fleet, window_s=60.0)
    spec = fleet_spec_from_scenario(scenario)
    controller = Controller(spec, build_policy("mpc", spec, {}), guards=GuardConfig(),
                            decision_validity_s=60.0, seed=3, tick_s=15.0)
    state = controller.initial_state()
    if capacity is not None:
        fleet.set_capacity(H100, capacity)  # the H100s run out: no H100 replica beyond what runs now
    replicas: dict[str, list[int]] = {H100: [], A100: []}
    reasons: list[tuple[float, Reason]] = []
    t = 0.0
    for k in range(1, int(until_s // 15) + 1):
        t = k * 15.0
        fleet.run_until(t)
        state, result = controller.step(state, TickInput(now_s=t, observation=observer.read(t),
                                                         fleet_state=observer.fleet_state()))
        assert result.decision is not None
        apply_decision(fleet, result.decision)
        for pool in replicas:
            replicas[pool].append(result.decision.pools[pool].replicas)
        reasons.extend((t, r) for r in result.decision.reasons if r.code == "capacity_unavailable")
    return replicas, reasons, fleet


def test_one_sku_runs_out_and_the_planner_scales_the_other_and_retries_with_backoff():
    free, _, _ = _run(None)
    held, reasons, fleet = _run(capacity=2)
    assert max(free[H100]) > 2  # unconstrained, the planner grows the H100 pool in the demo's surge
    assert reasons, "the H100 shortage is never reported"
    first_t, first = reasons[0]
    assert first.pool == H100 and first.data["elsewhere"] == [A100] and first.data["held_at"] == 2
    # from the first hold on, H100 is asked for no more than it has, and A100 carries what H100 would have
    k = int(first_t // 15) - 1
    assert all(n <= 2 for n in held[H100][k:k + 2])
    assert max(held[A100][k:]) > max(free[A100][k:]), (held[A100], free[A100])
    # the pool is asked again when a hold ends; still no GPU: the next hold is twice as long
    backoffs = sorted({r.data["backoff_s"] for _, r in reasons})
    assert len(backoffs) >= 2 and backoffs[1] == 2 * backoffs[0], backoffs
    assert [t for t, r in reasons if r.data["backoff_s"] == backoffs[1]][0] > first_t + backoffs[0]
    # the simulator's pending H100 replicas: starting within their start-up, then unavailable (not starting)
    fleet.set_pool_target(H100, replicas=4)
    st = fleet.pool_states()[H100]
    assert (st.ready, st.starting, st.unavailable) == (2, 2, 0)
    fleet.run_until(fleet.now_s + 21.0)  # the demo's cold start-up is 20 s
    st = fleet.pool_states()[H100]
    assert (st.ready, st.starting, st.unavailable) == (2, 0, 2)


def test_the_simulators_control_plane_carries_unavailable_replicas_to_the_grpc_actuator():
    """AutoscalerControl.GetFleetState (protos/governor/v1/control.proto PoolState.unavailable) from the simulator's
    control plane, read back the way Governor's gRPC actuator reads it."""
    import threading

    from controller.actuation.grpc_actuator import fleet_state_view
    from controller.clock import VirtualClock
    from controller.gen.governor.v1 import control_pb2 as pb
    from controller.sim.control_plane import ControlPlane

    fleet = Fleet(load_scenario(DEMO), seed=3)
    fleet.set_capacity(H100, 2)
    fleet.set_pool_target(H100, replicas=5)
    fleet.run_until(21.0)  # past the demo's 20 s cold start-up
    plane = ControlPlane(fleet, threading.RLock(), VirtualClock(), sim_to_unix=lambda t: t)
    msg = plane.fleet_state()
    view = fleet_state_view(pb.FleetState.FromString(msg.SerializeToString())).pools[H100]
    assert (view.target_replicas, view.ready + view.starting, view.unavailable) == (5, 2, 3)
