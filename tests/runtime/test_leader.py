"""Leader election on a Lease: at no time do two daemons actuate the same shard.

Instances are real Daemons (real controller, state store, generation numbering) with their own
LeaderElector, on one VirtualClock, against a fake Lease store with the API server's
resourceVersion semantics (tests/fakes/leases.py). The shard's actuation target is shared and
checks generations as the real targets do (protos/governor/v1/control.proto): it records who
got a command accepted. A harness steps virtual time and runs every instance's election rounds
and ticks in a seeded order; partitions, lost replies and a leader paused in the middle of a send
are injected. One test runs the electors through the official `kubernetes` client against a
loopback HTTP fake of the Lease API.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

import pytest

from controller.actuation.outcome import APPLIED, STALE, ActuationOutcome, TargetResult
from controller.actuation.shadow import ShadowActuator
from controller.api.store import StateStore
from controller.clock import VirtualClock
from controller.config import Settings
from controller.obs.daemon_metrics import DaemonMetrics
from controller.runtime.daemon import Daemon
from controller.runtime.leader import (
    EPOCH_SHIFT,
    ElectionTiming,
    KubernetesLeaseStore,
    LeaderElector,
    LeaseConflictError,
    LeaseRecord,
)
from controller.runtime.main import build_controller
from controller.types import Mode
from tests.fakes.leases import FakeLeaseClient, FakeLeaseServer, LeaseApiServer
from tests.fakes.observations import fleet_obs, pool_obs

TIMING = ElectionTiming(lease_duration_s=15, renew_deadline_s=10.0, retry_period_s=2.0, clock_skew_margin_s=2.0)
POOLS = [{"name": "chat", "model": "llama-3-8b", "sku": "h100-80gb", "usd_per_gpu_hour": 2.0, "min_replicas": 1,
          "max_replicas": 8}]
LOG = logging.getLogger("test.leader")


class ShardTarget:
    """The shard's actuation target: refuses a generation lower than (or equal to, with another decision
    id) the one it applied, like the router and autoscaler; records the accepted commands' senders."""

    def __init__(self) -> None:
        self.applied_generation = 0
        self.applied_id = ""
        self.accepted: list[tuple[str, int]] = []
        self.rejected: list[tuple[str, int]] = []

    def command(self, sender: str, decision_id: str, generation: int) -> str:
        if generation < self.applied_generation or (generation == self.applied_generation
                                                    and decision_id != self.applied_id):
            self.rejected.append((sender, generation))
            return STALE
        self.applied_generation, self.applied_id = generation, decision_id
        self.accepted.append((sender, generation))
        return APPLIED


class InstanceActuator:
    """One instance's actuator for the shared target; `pause` runs the rest of the world between the
    daemon's leadership check and the command's arrival (a process stopped mid-send)."""

    def __init__(self, name: str, target: ShardTarget) -> None:
        self.name = name
        self.target = target
        self.pause = None  # callable run once before the next command is delivered

    def apply(self, decision) -> ActuationOutcome:
        if self.pause is not None:
            pause, self.pause = self.pause, None
            pause()
        status = self.target.command(self.name, decision.decision_id, decision.generation)
        return ActuationOutcome(decision.decision_id, decision.generation, status,
                                targets={"autoscaler": TargetResult("autoscaler", status, 1,
                                                                    self.target.applied_generation)})

    def fleet_state(self):
        return None

    def health(self):
        return True, "ok"

    def close(self) -> None:
        pass


class FixedSource:
    name = "fixed"

    def read(self, now_s: float):
        return fleet_obs(now_s, pool_obs("chat", ready=2, arrival=5.0, ttft=0.5))

    def health(self):
        return True, "ok"


@dataclass
class Instance:
    name: str
    elector: LeaderElector
    daemon: Daemon
    lease_client: FakeLeaseClient
    actuator: InstanceActuator
    paused_until: float = 0.0
    next_attempt: float = 0.0
    next_tick: float = 0.0
    ticks: int = 0
    led_ticks: list[int] = field(default_factory=list)


class Cluster:
    def __init__(self, tmp_path, n: int = 2, seed: int = 0, tick_s: float = 1.0) -> None:
        self.clock = VirtualClock(1_000_000.0)
        self.server = FakeLeaseServer()
        self.target = ShardTarget()
        self.rng = random.Random(seed)
        self.tick_s = tick_s
        self.stores: list[StateStore] = []
        settings = Settings(mode="active", policy="slo-feedback", state_dir=str(tmp_path), pools=POOLS,
                            tick_interval_s=tick_s, telemetry={"stale_after_s": 30})
        self.instances: list[Instance] = []
        for i in range(n):
            name = f"governor-{i}"
            client = self.server.client()
            elector = LeaderElector(client, "governor", name, clock=self.clock, timing=TIMING, logger=LOG)
            store = StateStore(tmp_path / f"{name}.db")
            self.stores.append(store)
            act = InstanceActuator(name, self.target)
            daemon = Daemon(controller=build_controller(settings), source=FixedSource(), actuator=act,
                            shadow=ShadowActuator(clock=self.clock), store=store, metrics=DaemonMetrics(),
                            clock=self.clock, logger=LOG, mode=Mode.ACTIVE, leadership=elector)
            self.instances.append(Instance(name, elector, daemon, client, act))
        self.overlaps = 0

    def close(self) -> None:
        for s in self.stores:
            s.close()

    def leaders(self) -> list[str]:
        return [i.name for i in self.instances if i.elector.leading()]

    def step(self, dt: float = 0.5) -> None:
        """Advance virtual time by dt and run what is due on every running instance, in a seeded order."""
        self.clock.advance(dt)
        now = self.clock.monotonic_s()
        order = list(self.instances)
        self.rng.shuffle(order)
        for inst in order:
            if now < inst.paused_until:
                continue
            if now >= inst.next_attempt:
                inst.elector.attempt()
                inst.next_attempt = now + TIMING.retry_period_s
            if now >= inst.next_tick:
                rep = inst.daemon.tick()
                inst.ticks += 1
                if rep.result.decision is not None and rep.outcome is not None and rep.outcome.status != "shadow":
                    inst.led_ticks.append(inst.ticks)
                inst.next_tick = now + self.tick_s
            self.check()

    def check(self) -> None:
        leaders = self.leaders()
        assert len(leaders) <= 1, f"two instances may actuate at {self.clock.now_s()}: {leaders}"

    def run(self, seconds: float, dt: float = 0.5) -> None:
        for _ in range(int(seconds / dt)):
            self.step(dt)

    def by_name(self, name: str) -> Instance:
        return next(i for i in self.instances if i.name == name)


def assert_no_interleaving(target: ShardTarget) -> list[str]:
    """Accepted commands: generations strictly rising, every term (epoch = generation >> EPOCH_SHIFT) has
    one sender, and once a later term's command was accepted no earlier term's ever is (that follows from
    the rising generations; asserted on what the target accepted). Returns the terms' senders in order."""
    gens = [g for _, g in target.accepted]
    assert gens == sorted(gens) and len(set(gens)) == len(gens), gens
    sender_of: dict[int, str] = {}
    terms: list[str] = []
    for sender, g in target.accepted:
        epoch = g >> EPOCH_SHIFT
        if epoch not in sender_of:
            sender_of[epoch] = sender
            terms.append(sender)
        assert sender_of[epoch] == sender, f"term {epoch} had two senders: {target.accepted}"
    return terms


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


def test_timing_must_let_a_leader_stop_before_its_lease_can_expire_elsewhere():
    with pytest.raises(ValueError, match="must be < lease_duration_s"):
        ElectionTiming(lease_duration_s=10, renew_deadline_s=9, retry_period_s=2, clock_skew_margin_s=2)
    with pytest.raises(ValueError, match="retry_period_s"):
        ElectionTiming(lease_duration_s=15, renew_deadline_s=4, retry_period_s=5, clock_skew_margin_s=1)
    with pytest.raises(ValueError, match="identity"):
        LeaderElector(FakeLeaseServer(), "governor", "", clock=VirtualClock())


def test_one_leader_actuates_and_the_follower_stays_warm_in_shadow(cluster):
    cluster.run(20)
    leaders = cluster.leaders()
    assert len(leaders) == 1
    leader = cluster.by_name(leaders[0])
    follower = next(i for i in cluster.instances if i is not leader)
    assert leader.led_ticks and not follower.led_ticks
    assert follower.ticks >= 19  # the follower ticks too: telemetry, policy state and models stay warm
    assert assert_no_interleaving(cluster.target) == [leader.name]
    # the leader numbers from its term's floor (epoch 1: the first term)
    assert cluster.target.accepted[0][1] > 1 << EPOCH_SHIFT
    # a follower refuses writes and names the leader
    refusal = follower.daemon.write_refusal()
    assert refusal is not None and leader.name in refusal and leader.daemon.write_refusal() is None
    assert dict(follower.daemon.status().details)["leader.holder"] == leader.name


def test_a_partitioned_leader_stops_before_the_follower_takes_over_and_the_fence_holds(cluster):
    cluster.run(10)
    (first,) = cluster.leaders()
    a = cluster.by_name(first)
    b = next(i for i in cluster.instances if i is not a)
    a.lease_client.partitioned = True  # cut from the API server, still reaching the actuation target
    cut_at = cluster.clock.monotonic_s()
    stopped_at = took_over_at = None
    while took_over_at is None:
        cluster.step()
        now = cluster.clock.monotonic_s()
        if stopped_at is None and not a.elector.leading():
            stopped_at = now
        if b.elector.leading():
            took_over_at = now
        assert now - cut_at < 60, "no takeover within a minute"
    assert stopped_at is not None and stopped_at <= cut_at + TIMING.renew_deadline_s
    # takeover within the lease duration plus one retry period of the last renewal the follower saw
    assert took_over_at - cut_at <= TIMING.lease_duration_s + 2 * TIMING.retry_period_s
    assert took_over_at - stopped_at >= TIMING.lease_duration_s - TIMING.renew_deadline_s - TIMING.retry_period_s
    a.lease_client.partitioned = False
    cluster.run(20)
    assert cluster.leaders() == [b.name]  # the healed instance sees the new holder and follows
    assert assert_no_interleaving(cluster.target) == [a.name, b.name]
    assert a.elector.transitions_seen == 2 and b.elector.transitions_seen == 1


def test_a_leader_paused_mid_send_is_fenced_by_the_generation(cluster):
    cluster.run(10)
    (first,) = cluster.leaders()
    a = cluster.by_name(first)
    b = next(i for i in cluster.instances if i is not a)

    def world_moves_on() -> None:
        # A stopped (GC pause, SIGSTOP, a slow node) after its leadership check: 30 s pass without it.
        a.paused_until = cluster.clock.monotonic_s() + 30
        while cluster.clock.monotonic_s() < a.paused_until:
            cluster.step()
        assert cluster.leaders() == [b.name]

    a.actuator.pause = world_moves_on
    # A's next tick passes the leadership check, then pauses inside the send.
    a.next_tick = 0.0
    while a.actuator.pause is not None:
        cluster.step()
    # A's late command arrived after B's: refused as stale, never accepted
    assert cluster.target.rejected and cluster.target.rejected[-1][0] == a.name
    assert cluster.target.rejected[-1][1] < cluster.target.applied_generation
    cluster.run(10)
    assert cluster.leaders() == [b.name]
    assert assert_no_interleaving(cluster.target) == [a.name, b.name]
    # B's term numbers above A's: its epoch is higher
    b_gens = [g for s, g in cluster.target.accepted if s == b.name]
    a_gens = [g for s, g in cluster.target.accepted if s == a.name]
    assert min(b_gens) >> EPOCH_SHIFT > max(a_gens) >> EPOCH_SHIFT


def test_lost_replies_flapping_partitions_and_restarts_never_give_two_actuators(tmp_path):
    """A seeded storm: random partitions, lost write replies and pauses on three instances."""
    for seed in range(2):
        (tmp_path / f"s{seed}").mkdir()
        c = Cluster(tmp_path / f"s{seed}", n=3, seed=seed, tick_s=2.0)
        rng = random.Random(100 + seed)
        try:
            for _ in range(240):  # 120 s of virtual time
                for inst in c.instances:
                    r = rng.random()
                    if r < 0.03:
                        inst.lease_client.partitioned = not inst.lease_client.partitioned
                    elif r < 0.05:
                        inst.lease_client.lose_responses = not inst.lease_client.lose_responses
                    elif r < 0.06:
                        inst.paused_until = c.clock.monotonic_s() + rng.uniform(2, 25)
                c.step()
            for inst in c.instances:  # heal, and the shard gets a leader again
                inst.lease_client.partitioned = inst.lease_client.lose_responses = False
                inst.paused_until = 0.0
            c.run(TIMING.lease_duration_s + 3 * TIMING.retry_period_s)
            assert len(c.leaders()) == 1
            terms = assert_no_interleaving(c.target)
            assert len(terms) >= 2  # the storm did move the lease
        finally:
            c.close()


def test_release_on_shutdown_hands_over_at_the_next_retry(cluster):
    cluster.run(10)
    (first,) = cluster.leaders()
    a = cluster.by_name(first)
    b = next(i for i in cluster.instances if i is not a)
    a.elector.release()
    a.paused_until = float("inf")  # stopped
    start = cluster.clock.monotonic_s()
    while not b.elector.leading():
        cluster.step()
    assert cluster.clock.monotonic_s() - start <= TIMING.retry_period_s + 0.5  # not a whole lease duration


def test_follower_serves_keda_the_leaders_published_targets(cluster):
    for inst in cluster.instances:
        inst.elector.set_annotations(lambda d=inst.daemon: {"governor.llm-d.ai/replica-targets":
                                                            __import__("json").dumps(d.published_targets())})
    cluster.run(20)
    (first,) = cluster.leaders()
    leader = cluster.by_name(first)
    follower = next(i for i in cluster.instances if i is not leader)
    assert leader.daemon.keda_targets() == leader.daemon.applied_replicas != {}
    assert follower.daemon.keda_targets() == leader.daemon.applied_replicas


# --------------------------------------------------------------------------- the real client


def test_kubernetes_store_through_the_real_client_against_a_loopback_lease_api():
    from kubernetes import client

    with LeaseApiServer() as api:
        cfg = client.Configuration()
        cfg.host = api.url
        store = KubernetesLeaseStore("inference", client.CoordinationV1Api(client.ApiClient(cfg)))
        assert store.get("governor") is None
        rec = store.create("governor", LeaseRecord("a", 15, 1_000.5, 1_000.5, 0, {"k": "v"}))
        assert rec.resource_version == "1" and rec.holder == "a" and rec.annotations == {"k": "v"}
        assert store.get("governor") == rec and abs(rec.renew_time_s - 1_000.5) < 1e-6
        with pytest.raises(LeaseConflictError):
            store.create("governor", rec)
        newer = store.update("governor", LeaseRecord("a", 15, 1_000.5, 1_002.0, 0, {}, rec.resource_version))
        with pytest.raises(LeaseConflictError):  # a write carrying the stale resourceVersion
            store.update("governor", LeaseRecord("b", 15, 1_003.0, 1_003.0, 1, {}, rec.resource_version))
        now = store.get("governor")
        assert now is not None and now.holder == "a" and newer.resource_version == "2"

        # two electors over the real client: one leads; after it stops, the other takes over
        clock = VirtualClock(2_000.0)
        ea = LeaderElector(store, "shard-b", "a", clock=clock, timing=TIMING, logger=LOG)
        eb = LeaderElector(store, "shard-b", "b", clock=clock, timing=TIMING, logger=LOG)
        assert ea.attempt() and not eb.attempt()
        for _ in range(20):  # a stops renewing
            clock.advance(1.0)
            assert not eb.attempt() or clock.now_s() >= 2_000.0 + TIMING.lease_duration_s
            if eb.leading():
                break
        assert eb.leading() and not ea.leading()
        assert eb.generation_floor() >> EPOCH_SHIFT == 2  # second term
        methods = {m for m, _, _ in api.requests}
        assert methods == {"GET", "POST", "PUT"}
        assert any(code == 409 for _, _, code in api.requests)


# --------------------------------------------------------------------------- config and composition


def test_config_shards_pools_across_leases_and_names_bad_entries():
    import yaml

    from controller.config import ConfigError, parse_settings

    two = POOLS + [{**POOLS[0], "name": "code"}]
    bad = {"pools": two, "leader_election": {"enabled": True, "shards": [
        {"lease": "gov-a", "pools": ["chat", "nope"]}, {"lease": "gov-b", "pools": ["chat"]}]}}
    with pytest.raises(ConfigError) as err:
        parse_settings(yaml.safe_dump(bad))
    text = str(err.value)
    assert "leader_election.shards[0].pools[1]: 'nope' is not a configured pool" in text
    assert "leader_election.shards[1].pools[0]: 'chat' is already in shard 'gov-a'" in text
    assert "leader_election.shard: required with shards" in text
    with pytest.raises(ConfigError, match="must be < lease_duration_s"):
        parse_settings("pools: [{name: a, model: m, sku: h100-80gb, usd_per_gpu_hour: 1}]\n"
                       "leader_election: {enabled: true, lease_duration_s: 10, renew_deadline_s: 9}\n")
    s = Settings(pools=two, leader_election={"enabled": True, "shard": "gov-b", "shards": [
        {"lease": "gov-a", "pools": ["chat"]}, {"lease": "gov-b", "pools": ["code"]}]})
    assert s.leader_election.lease_and_pools(s.pool_names()) == ("gov-b", ("code",))


def test_build_services_under_leader_election_governs_its_shard_and_releases_on_close(tmp_path):
    from controller.clock import WallClock
    from controller.runtime.main import build_services
    from tests.fixtures.prometheus import wait_until

    two = POOLS + [{**POOLS[0], "name": "code"}]
    settings = Settings(pools=two, state_dir=str(tmp_path), api={"listen": "127.0.0.1:0"}, metrics={"listen": None},
                        telemetry={"source": "scrape", "scrape": {"targets": [
                            {"url": "http://127.0.0.1:9/metrics", "kind": "vllm", "pool": "code"}]}},
                        leader_election={"enabled": True, "identity": "pod-a", "shard": "gov-b", "shared_state": False,
                                         "address": "10.0.0.7:50051",
                                         "shards": [{"lease": "gov-a", "pools": ["chat"]},
                                                    {"lease": "gov-b", "pools": ["code"]}]})
    server = FakeLeaseServer()
    services = build_services(settings, clock=WallClock(), logger=LOG, lease_store=server.client())
    try:
        assert services.daemon.pool_names() == ["code"]
        leadership = services.daemon.leadership
        assert leadership is not None
        wait_until(leadership.leading, deadline_s=10, what="the lease acquired")
        lease = server.get("gov-b")
        assert lease is not None and lease.holder == "pod-a"
        assert lease.annotations["governor.llm-d.ai/leader-address"] == "10.0.0.7:50051"
        assert services.metrics.registry.get_sample_value("governor_leader", {"lease": "gov-b"}) == 1
    finally:
        services.close()
    released = server.get("gov-b")
    assert released is not None and released.holder == ""  # released: a follower takes over at its next retry


def test_outside_a_cluster_without_a_kubeconfig_the_error_says_what_to_set(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ValueError, match="set leader_election.kubeconfig"):
        KubernetesLeaseStore.from_environment("inference", None, 5.0)


def test_a_slow_read_does_not_shorten_the_lease():
    """A follower's GET is in flight for 7 s while the leader renews; the follower must count the lease
    duration from when the answer arrived, or it would take over while the leader still actuates."""
    clock = VirtualClock(0.0)
    server = FakeLeaseServer()
    a = LeaderElector(server.client(), "governor", "a", clock=clock, timing=TIMING, logger=LOG)
    slow = server.client()
    b = LeaderElector(slow, "governor", "b", clock=clock, timing=TIMING, logger=LOG)
    assert a.attempt()
    clock.advance(1.0)
    real_get = slow.get

    def get_in_flight(name):
        clock.advance(6.0)
        a.attempt()  # the leader renews while B's request is on its way
        clock.advance(1.0)
        return real_get(name)

    slow.get = get_in_flight  # type: ignore[method-assign]
    assert not b.attempt()
    slow.get = real_get  # type: ignore[method-assign]
    a_client = a.store
    assert isinstance(a_client, FakeLeaseClient)
    a_client.partitioned = True  # the leader renews no more
    took_over = None
    for _ in range(80):
        clock.advance(0.5)
        a.attempt()
        b.attempt()
        assert not (a.leading() and b.leading()), f"two leaders at {clock.now_s()}"
        if took_over is None and b.leading():
            took_over = clock.now_s()
    assert took_over is not None and took_over >= 8.0 + TIMING.lease_duration_s


def test_followers_take_the_leaders_mode_and_keep_it_after_a_takeover(cluster, tmp_path):
    from controller.runtime.main import leader_annotations

    settings = Settings(pools=POOLS, state_dir=str(tmp_path))
    for inst in cluster.instances:
        inst.elector.set_annotations(lambda d=inst.daemon: leader_annotations(settings, d))
    cluster.run(10)
    (first,) = cluster.leaders()
    a = cluster.by_name(first)
    b = next(i for i in cluster.instances if i is not a)
    a.daemon.set_mode(Mode.SHADOW, author="ana", reason="investigating")  # on the leader, through its API
    cluster.run(2 * TIMING.retry_period_s + 2)
    assert b.daemon.mode is Mode.SHADOW
    assert b.daemon.store.get_mode() == "shadow"  # persisted, with an audit entry naming the leader
    assert any(e.author == f"leader {a.name}" for e in b.daemon.store.list_audit())
    accepted = len(cluster.target.accepted)
    a.lease_client.partitioned = True
    cluster.run(TIMING.lease_duration_s + 3 * TIMING.retry_period_s)
    assert cluster.leaders() == [b.name]
    assert len(cluster.target.accepted) == accepted  # the new leader stays in shadow: nothing sent


# --------------------------------------------------------------------------- end to end


@pytest.mark.e2e
def test_two_daemons_on_a_real_client_and_a_live_fleet_hand_over_without_overlap(tmp_path):
    """Two composed daemons (build_services) elect through the official client against the loopback
    Lease API, and command a live simulated fleet over gRPC, whose control plane checks generations.
    The leader's shutdown releases the Lease; the follower takes over and numbers above it."""
    import yaml

    from controller.clock import WallClock
    from controller.runtime.main import Services, build_services
    from controller.sim.fleetspec import fleet_spec_from_scenario
    from controller.sim.live import LiveFleet
    from controller.sim.scenario import load_scenario
    from tests.fakes.live_scenario import write_scenario
    from tests.fixtures.prometheus import wait_until

    scenario = load_scenario(write_scenario(tmp_path, n=3000, rps=10.0, replicas=1, max_replicas=3, startup_s=2.0))
    spec = fleet_spec_from_scenario(scenario)
    fleet = LiveFleet(scenario, speed=2.0)
    info = fleet.start()
    services: dict[str, Services] = {}
    with LeaseApiServer() as api:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "loopback", "cluster": {"server": api.url}}],
            "users": [{"name": "nobody", "user": {}}],
            "contexts": [{"name": "test", "context": {"cluster": "loopback", "user": "nobody"}}]}))
        pools = [{"name": p.name, "model": p.model, "sku": p.sku, "usd_per_gpu_hour": 2.0,
                  "min_replicas": p.min_replicas, "max_replicas": p.max_replicas} for p in spec.pools]
        try:
            for name in ("a", "b"):
                settings = Settings(
                    mode="active", tick_interval_s=1.0, state_dir=str(tmp_path / name), pools=pools,
                    telemetry={"source": "scrape", "scrape": {"discovery_url": info["discovery"]}, "window_s": 10,
                               "stale_after_s": 30},
                    actuators={"router": {"address": info["router_control"]},
                               "autoscaler": {"address": info["autoscaler_control"]}},
                    api={"listen": "127.0.0.1:0"}, metrics={"listen": None}, log={"format": "text"},
                    leader_election={"enabled": True, "identity": name, "kubeconfig": str(kubeconfig),
                                     # room for a loaded machine: a late renewal must not move the lease
                                     "lease_duration_s": 8, "renew_deadline_s": 6.0, "retry_period_s": 0.5,
                                     "clock_skew_margin_s": 1.0})
                services[name] = build_services(settings, clock=WallClock(), logger=logging.getLogger(f"e2e-{name}"))
            daemons = {n: s.daemon for n, s in services.items()}
            applied: list[tuple[str, int]] = []

            def tick_all(names) -> list[tuple[str, int]]:
                for n in names:
                    rep = daemons[n].tick()
                    if rep.outcome is not None and rep.outcome.status == "applied":
                        assert rep.result.decision is not None
                        applied.append((n, rep.result.decision.generation))
                return applied

            wait_until(lambda: len(tick_all("ab")) >= 2, deadline_s=30, interval_s=0.3,
                       what="the leader's decisions applied")
            first = applied[0][0]
            other = "b" if first == "a" else "a"
            assert {n for n, _ in applied} == {first}  # the follower sent nothing
            services.pop(first).close()  # stops the daemon and releases the Lease
            wait_until(lambda: tick_all(other)[-1][0] == other, deadline_s=30, interval_s=0.3,
                       what="the follower taking over")
            old = max(g for n, g in applied if n == first)
            new = min(g for n, g in applied if n == other)
            assert new >> EPOCH_SHIFT > old >> EPOCH_SHIFT  # a later term numbers above the earlier one
            actuator = daemons[other].actuator
            assert actuator is not None
            state = actuator.fleet_state()
            assert state is not None and state.applied_generation >= new
            assert {"GET", "PUT"} <= {m for m, _, _ in api.requests}
        finally:
            for s in services.values():
                s.close()
            fleet.stop()
