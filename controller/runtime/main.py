"""Composition root of the daemon: build every object once from the config and run the loop.

`governor run --config FILE` governs a real fleet; `governor run --demo` first
starts the simulator's live mode on loopback (scenarios/demo.yaml) and points a
daemon at it by direct scrape, with the live terminal view. Nothing here
decides anything: it wires the edges to the pure core and starts the servers.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.actuation.keda import KedaScalerServer
from controller.actuation.shadow import ShadowActuator
from controller.api.kube_store import GovernorStateApi, KubeStateStore
from controller.api.server import PolicyServer
from controller.api.store import StateStore, StoreError
from controller.clock import Clock, WallClock, budget_timer
from controller.config import ConfigError, Settings
from controller.config.carriers import actuator_carriers, held_levers
from controller.core.guards import GuardConfig
from controller.core.step import Controller
from controller.learning.physics import physics_for_pool_spec
from controller.obs.daemon_metrics import DaemonMetrics
from controller.obs.logs import setup_logging
from controller.obs.otel import build_tick_telemetry
from controller.obs.task_cost import CostTracker, PickerTasksReader
from controller.policies.registry import (
    POLICY_NAMES,
    breaker_for,
    build_policy,
    estimator_for,
    figures_in,
    outliers_for,
)
from controller.rpc.transport import Authenticator, TlsConfig, TokenEntry, load_tokens_file
from controller.runtime.actuators import build_actuator
from controller.runtime.daemon import Daemon, TickReport
from controller.runtime.leader import (
    ANNOTATION_ADDRESS,
    ANNOTATION_MODE,
    ANNOTATION_TARGETS,
    EPOCH_SHIFT,
    ElectionTiming,
    KubernetesLeaseStore,
    LeaderElector,
    LeaseStore,
)
from controller.runtime.learning import Learning
from controller.runtime.loop import TickLoop
from controller.runtime.preflight import preflight
from controller.runtime.systemd import SystemdNotifier
from controller.telemetry import build_source
from controller.types import Mode

# The demo ships inside the package (scenarios/demo.yaml links to it): `--demo` needs no checkout.
DEMO_SCENARIO = Path(__file__).resolve().parents[1] / "sim" / "demo" / "demo.yaml"


@dataclass
class Services:
    """Everything the daemon started, so it can all be stopped."""

    settings: Settings
    daemon: Daemon
    store: StateStore
    api: PolicyServer
    api_port: int
    metrics: DaemonMetrics
    metrics_url: str | None
    keda: KedaScalerServer | None = None
    keda_port: int | None = None
    closers: list[Any] = field(default_factory=list)

    def close(self) -> None:
        for c in reversed(self.closers):
            try:
                c()
            except Exception:  # logged: shutting down, keep closing the rest
                logging.getLogger("governor").exception("error while shutting down")


def _host_port(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


def build_controller(settings: Settings, learning: Learning | None = None) -> Controller:
    fleet = settings.fleet_spec()
    g = settings.guards
    params = dict(settings.policy_params)
    if settings.policy == "mpc":
        # In the daemon the planner's search is bounded by time (the bench uses an evaluation count): wall
        # time by default, or the thread's CPU time (`budget_clock: cpu`, for a machine shared with others)
        params.setdefault("timer", budget_timer(str(params.pop("budget_clock", "wall"))))
        # every pool's step-time figures as its engine resolved (calibrated table or roofline), so a model
        # or SKU declared in the config plans like a built-in one; figures set in policy_params win
        params["engine_figures"] = {**{n: e.figures for n, e in settings.engines().items()},
                                    **dict(params.get("engine_figures") or {})}
        if params.get("planning_model") == "learned" and learning is not None:
            # the planner reads the model slot every tick: a refit that passed the gate is used next tick
            slot = learning.slot
            params.setdefault("coupling_source", lambda: slot.get().coupling)
        if learning is not None:
            # the forecaster too: planned on where it beats the prior online (policies/mpc/forecasting.py)
            fslot = learning.slot
            params.setdefault("forecast_source", lambda: fslot.get().forecaster)
        # the MPC plans only the levers a configured actuator carries: the others are held at what is in
        # force, added to what the operator holds (policy_params.planner.fixed_levers)
        held = held_levers(settings)
        if held:
            planner = dict(params.get("planner") or {})
            mine = tuple(planner.get("fixed_levers") or ())
            planner["fixed_levers"] = mine + tuple(g for g in held if g not in mine)
            params["planner"] = planner
            carriers = "; ".join(f"{a}: {', '.join(sorted(c))}" for a, c in actuator_carriers(settings).items())
            logging.getLogger("governor").info(
                "mpc: holding %s at what is in force: no configured actuator carries them (%s)",
                ", ".join(held), carriers)
    policy = build_policy(settings.policy, fleet, params)
    return Controller(
        fleet, policy, breaker=breaker_for(settings.policy, params),
        estimator=estimator_for(settings.policy, params), outliers=outliers_for(settings.policy, params),
        engine_figures={**{n: e.figures for n, e in settings.engines().items()}, **figures_in(settings.policy, params)},
        guards=GuardConfig(max_step_up=g.max_step_up, max_step_down=g.max_step_down,
                           scale_down_stabilization_s=g.scale_down_stabilization_s,
                           budget_usd_per_hour=g.budget_usd_per_hour, min_confidence=g.min_confidence,
                           max_concurrent_drains=g.max_concurrent_drains),
        decision_validity_s=settings.actuators.decision_validity_s, seed=settings.seed,
        tick_s=settings.tick_interval_s)


def reload_settings(path: str, policy: str | None) -> Settings:
    """A reloaded config, checked as `governor run` checks it at start-up (preflight: fields, engines,
    policy_params, the tick budget); --policy still wins over the file."""
    return shard_settings(_with_policy(preflight(path), policy))


def reloaded_parts(settings: Settings, learning: Learning | None) -> tuple[dict, Controller]:
    """(each pool's physics, the controller) of a reloaded config: built before anything is swapped, so a
    config that fails here changes nothing."""
    engines = settings.engines()
    fleet = settings.fleet_spec()
    physics = {p.name: physics_for_pool_spec(p, engines[p.name]) for p in fleet.pools}
    return physics, build_controller(settings, learning)


def shard_settings(settings: Settings) -> Settings:
    """Under leader election with shards, the config restricted to this daemon's shard's pools."""
    le = settings.leader_election
    if not le.enabled:
        return settings
    _, pools = le.lease_and_pools(settings.pool_names())
    return settings.model_copy(update={"pools": [p for p in settings.pools if p.name in pools]})


def _build_elector(settings: Settings, clock: Clock, logger: logging.Logger, metrics: DaemonMetrics,
                   store: LeaseStore | None = None) -> LeaderElector:
    le = settings.leader_election
    lease, _ = le.lease_and_pools(settings.pool_names())
    if store is None:
        store = KubernetesLeaseStore.from_environment(le.namespace, le.kubeconfig, le.timeout_s)
    metrics.leader.labels(lease).set(0)

    def changed(leading: bool) -> None:
        metrics.leader.labels(lease).set(1 if leading else 0)
        metrics.leader_transitions.labels(lease).inc()

    timing = ElectionTiming(lease_duration_s=le.lease_duration_s, renew_deadline_s=le.renew_deadline_s,
                            retry_period_s=le.retry_period_s, clock_skew_margin_s=le.clock_skew_margin_s)
    return LeaderElector(store, lease, le.resolved_identity(), clock=clock, timing=timing, logger=logger,
                         on_change=changed)


def leader_annotations(settings: Settings, daemon: Daemon) -> dict[str, str]:
    """What the holder publishes in its Lease on each renewal (read without the daemon's tick lock)."""
    out = {ANNOTATION_TARGETS: json.dumps(daemon.published_targets(), sort_keys=True),
           ANNOTATION_MODE: daemon.mode.value}
    if settings.leader_election.address:
        out[ANNOTATION_ADDRESS] = settings.leader_election.address
    return out


def _state_store(settings: Settings, state_dir: Path) -> StateStore:
    """SQLite in the state directory; under leader election (shared_state) with the overrides, mode, audit trail
    and refit verdict replicated in the shard's GovernorState object, read once before anything starts."""
    path = state_dir / "governor.db"
    le = settings.leader_election
    if not (le.enabled and le.shared_state):
        return StateStore(path, max_overrides=settings.api.max_overrides)
    lease, _ = le.lease_and_pools(settings.pool_names())
    api = GovernorStateApi.from_environment(le.namespace, lease, le.kubeconfig, le.timeout_s)
    store = KubeStateStore(str(path), api, identity=le.resolved_identity(), max_overrides=settings.api.max_overrides)
    try:
        store.sync()
    except StoreError as exc:  # the API server is down: start as a follower on the local copy; ticks retry
        logging.getLogger("governor").warning(f"shared state not read at start: {exc}",
                                              extra={"event": "store_error"})
    return store


def build_costs(settings: Settings, controller: Controller) -> CostTracker:
    """Spend from the pools' prices; task outcomes from the pickers among the scrape source's router targets (with
    Prometheus as the source the daemon exports the spend and the dashboard divides it by the pickers' series)."""
    urls = [t.url for t in settings.telemetry.scrape.targets if t.kind == "router"] \
        if settings.telemetry.source == "scrape" else []
    from controller.telemetry.scrape import fetch_text

    reader = (PickerTasksReader(urls, fetch_text, timeout_s=min(1.0, settings.telemetry.scrape.timeout_s))
              if urls else None)
    return CostTracker({p.name: p.usd_per_replica_hour for p in controller.fleet.pools}, reader)


def build_services(settings: Settings, *, clock: Clock, logger: logging.Logger, on_tick=None,
                   lease_store: LeaseStore | None = None) -> Services:
    """Build and start the servers (API, KEDA, metrics); the tick loop is started by the caller.
    `lease_store` replaces the Kubernetes Lease API under leader election (tests)."""
    settings = shard_settings(settings)
    state_dir = Path(settings.state_dir)
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # the audit trail and overrides: the daemon's own
    if state_dir.stat().st_mode & 0o077:  # an existing open directory is made private, as the database is
        state_dir.chmod(0o700)
    store = _state_store(settings, state_dir)
    closers: list[Any] = [store.close]
    try:
        fleet = settings.fleet_spec()
        engines = settings.engines()
        learning = Learning(fleet, state_dir, clock=clock, logger=logger, seed=settings.seed,
                            physics={p.name: physics_for_pool_spec(p, engines[p.name]) for p in fleet.pools})
        closers.append(learning.stop)
        controller = build_controller(settings, learning)
        source = build_source(settings, clock)
        acts = settings.actuators
        actuator, actuator_closers = build_actuator(settings, clock)  # gRPC, or Kubernetes + routers
        closers.extend(actuator_closers)
        metrics = DaemonMetrics()
        learning.start()
        elector = (_build_elector(settings, clock, logger, metrics, lease_store)
                   if settings.leader_election.enabled else None)
        otel = build_tick_telemetry(settings.otel, metrics.registry)
        if otel is not None:
            closers.append(otel.shutdown)  # flushes the last spans and metrics
        daemon = Daemon(controller=controller, source=source, actuator=actuator, shadow=ShadowActuator(clock=clock),
                        store=store, metrics=metrics, clock=clock, logger=logger, mode=settings.mode,
                        profile=settings.profile, on_tick=on_tick, learning=learning, leadership=elector, otel=otel,
                        costs=build_costs(settings, controller))
        if elector is not None:
            if isinstance(store, KubeStateStore):
                store.bind(lambda: elector.generation_floor() >> EPOCH_SHIFT)
            elector.set_annotations(lambda: leader_annotations(settings, daemon))
            elector.start()
            closers.append(elector.stop)  # stopped (and the lease released) after the API and KEDA
        api_tls = settings.api.tls
        server_tls = TlsConfig(api_tls.cert, api_tls.key, api_tls.client_ca) if api_tls.cert and api_tls.key else None
        tokens = tuple(load_tokens_file(settings.api.tokens_file)) if settings.api.tokens_file else ()
        api = PolicyServer(daemon, store, settings.api.listen, token=settings.api.resolved_token(), tls=server_tls,
                           clock=clock, tokens=tokens, cert_roles=api_tls.client_roles,
                           cert_role=api_tls.default_client_role)
        api_port = api.start()
        closers.append(api.stop)
        metrics_url = None
        if settings.metrics.listen:
            host, port = _host_port(settings.metrics.listen)
            port = metrics.serve(host, port)
            metrics_url = f"http://{host}:{port}/metrics"
            closers.append(metrics.close)
        keda = keda_port = None
        if acts.keda.enabled:
            keda = _keda_server(settings, daemon, logger)
            keda_port = keda.start()
            daemon.after_tick.append(keda.notify)
            closers.append(keda.stop)
    except BaseException:
        for c in reversed(closers):
            c()
        raise
    return Services(settings, daemon, store, api, api_port, metrics, metrics_url, keda, keda_port, closers)


def _keda_server(settings: Settings, daemon: Daemon, logger: logging.Logger) -> KedaScalerServer:
    k = settings.actuators.keda
    tls = TlsConfig(k.tls.cert, k.tls.key, k.tls.client_ca) if k.tls.cert and k.tls.key else None
    tokens: tuple[TokenEntry, ...] = tuple(load_tokens_file(k.token_file, "actuators.keda.token_file")) \
        if k.token_file else ()
    auth = Authenticator(tokens, mtls=tls is not None and tls.mutual)
    if not auth.required:
        logger.warning(f"KEDA scaler on {k.listen} without authentication: any local process can read the replica "
                       "targets (set actuators.keda.tls.client_ca for KEDA's mTLS)",
                       extra={"event": "keda_scaler", "listen": k.listen, "tls": tls is not None, "auth": "none"})
    else:
        logger.info(f"KEDA scaler on {k.listen}", extra={"event": "keda_scaler", "listen": k.listen, "tls": tls is not
                    None, "auth": "+".join(x for x, on in (("mtls", tls is not None and tls.mutual),
                                                           ("token", bool(tokens))) if on)})
    return KedaScalerServer(daemon.keda_targets, k.listen, tls=tls, authenticator=auth)


# ------------------------------------------------------------------------------------------ demo


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def demo_settings(scenario, listening: dict[str, Any], state_dir: str) -> Settings:
    """A daemon config for the demo fleet: direct scrape via the simulator's discovery, gRPC to its control."""
    from controller.sim.fleetspec import fleet_spec_from_scenario

    spec = fleet_spec_from_scenario(scenario)
    pools = [{"name": p.name, "model": p.model, "sku": p.sku, "engine": p.engine,
              "gpus_per_replica": p.gpus_per_replica,
              "usd_per_gpu_hour": p.usd_per_replica_hour / p.gpus_per_replica, "min_replicas": max(1, p.min_replicas),
              "max_replicas": p.max_replicas, "startup_warm_s": p.startup_warm_s, "startup_cold_s": p.startup_cold_s,
              "role": p.role, "group": p.group, "max_num_seqs": p.max_num_seqs,
              "max_num_batched_tokens": p.max_num_batched_tokens} for p in spec.pools]
    return Settings(
        # The demo runs the MPC: its surge rises faster than a replica starts, and the planner's stream
        # guard keeps critical's streams on pace while the replicas it orders start (docs/decisions/
        # 0014-stream-guard.md; docs/BENCHMARKS.md, "The demo, live"); `--policy` picks another.
        mode="active", policy="mpc", tick_interval_s=3.0, state_dir=state_dir,
        # Timeouts sized to the 3 s tick (controller/config/tick_budget.py): a 1.5 s read round (0.5 s × 2 + 0.5 s)
        # plus 1.1 s of actuation (2 attempts of 0.5 s and a 0.1 s backoff) fit 90 % of it on loopback.
        telemetry={"source": "scrape", "scrape": {"discovery_url": listening["discovery"], "timeout_s": 0.5},
                   "window_s": 20.0, "stale_after_s": 20.0},
        pools=pools,
        slo={c: {"ttft_s": s.ttft_s, "tpot_s": s.tpot_s} for c, s in spec.slos.items()},
        actuators={"router": {"address": listening["router_control"], "retries": 1, "timeout_s": 0.5,
                              "backoff_s": 0.1},
                   "autoscaler": {"address": listening["autoscaler_control"], "retries": 1, "timeout_s": 0.5,
                                  "backoff_s": 0.1},
                   "decision_validity_s": 30.0,
                   "keda": {"enabled": True, "listen": f"127.0.0.1:{_free_port()}"}},
        api={"listen": f"127.0.0.1:{_free_port()}"},
        metrics={"listen": f"127.0.0.1:{_free_port()}"},
        log={"level": "info", "format": "json"},
        guards={"max_step_up": 4, "max_step_down": 1, "scale_down_stabilization_s": 60.0},
    )


# ------------------------------------------------------------------------------------------ command


def _with_policy(settings: Settings, name: str | None) -> Settings:
    """`--policy NAME` over the configured policy (its policy_params stay: they are the config's)."""
    if name is None:
        return settings
    return settings.model_copy(update={"policy": name})


def tick_status(report: object) -> str:
    """The STATUS= line systemd shows (`systemctl status governor`): the last decision, in one line."""
    if not isinstance(report, TickReport):
        return "ticking"
    d = report.result.decision
    if d is None:
        return f"mode {report.result.mode.value}: no decision (paused)"
    outcome = report.outcome.status if report.outcome is not None else "none"
    replicas = " ".join(f"{p}={pd.replicas}" for p, pd in sorted(d.pools.items()))
    frozen = ", telemetry frozen" if report.result.frozen else ""
    return f"mode {report.result.mode.value}: {d.decision_id} gen {d.generation} {outcome}{frozen}; {replicas}"


def cmd_run(args) -> int:
    headless = bool(getattr(args, "headless", False)) or not sys.stdout.isatty()
    clock = WallClock()
    live = None
    tmp = None
    policy = getattr(args, "policy", None)
    if policy is not None and policy not in POLICY_NAMES:
        print(f"governor: --policy {policy!r} is not a policy; choose one of {', '.join(POLICY_NAMES)}",
              file=sys.stderr)
        return 2
    dataplane = None
    if getattr(args, "dataplane", None) and not args.demo:
        print("governor: --dataplane envoy runs with --demo (a real fleet's data plane is deployed, see "
              "docs/OPERATING.md)", file=sys.stderr)
        return 2
    if args.demo and args.config:
        print("governor: --demo runs its own simulated fleet with its own config, so --config is not used with it "
              "(choose the policy with --policy, e.g. --demo --policy slo-feedback)", file=sys.stderr)
        return 2
    if args.demo:
        from controller.sim.live import LiveFleet
        from controller.sim.scenario import ScenarioError, load_scenario

        try:
            scenario = load_scenario(DEMO_SCENARIO)
        except ScenarioError as exc:
            print(f"governor: {exc}", file=sys.stderr)
            return 2
        if getattr(args, "dataplane", None) == "envoy":
            from controller.runtime.dataplane_demo import DataplaneDemo

            try:
                dataplane = DataplaneDemo(duration_s=args.for_s or 3600.0)
                listening = dataplane.start()
            except (OSError, RuntimeError, ScenarioError) as exc:
                print(f"governor: cannot start the data plane: {exc}", file=sys.stderr)
                return 2
            live = dataplane.live
            tmp = tempfile.TemporaryDirectory(prefix="governor-demo-")
            settings = dataplane.settings(demo_settings(dataplane.scenario, listening, tmp.name))
        else:
            live = LiveFleet(scenario, speed=1.0)
            listening = live.start()
            tmp = tempfile.TemporaryDirectory(prefix="governor-demo-")
            settings = demo_settings(scenario, listening, tmp.name)
    else:
        try:
            settings = preflight(args.config)  # what `governor config validate` checks
        except ConfigError as exc:
            print(f"governor: {exc}", file=sys.stderr)
            return 2
        if not settings.pools:
            print("governor: the config names no pools (see deploy/governor.example.yaml)", file=sys.stderr)
            return 2
    settings = _with_policy(settings, policy)
    # In the live view the log would tear the table: it goes to a file in the state directory instead.
    log_file = None
    if not headless:
        Path(settings.state_dir).mkdir(parents=True, exist_ok=True)
        log_file = open(Path(settings.state_dir) / "governor.log", "a")  # noqa: SIM115 - closed on every exit below
    logger = setup_logging(settings.log.level, settings.log.format, stream=log_file or sys.stderr)
    slo_ttft = min(s.ttft_s for s in settings.fleet_spec().slos.values())
    from controller.runtime.view import JsonLines, LiveView

    out = JsonLines()
    view = None if headless else LiveView("Governor demo — simulated fleet" if args.demo else "Governor")

    def on_tick(report: TickReport) -> None:
        (view or out).on_tick(report, slo_ttft)

    try:
        services = build_services(settings, clock=clock, logger=logger, on_tick=on_tick)
    except (ValueError, OSError, StoreError) as exc:
        if dataplane is not None:
            dataplane.stop()
        if live:
            live.stop()
        if log_file is not None:
            log_file.close()
        print(f"governor: cannot start: {exc}", file=sys.stderr)
        return 2
    if args.mode and getattr(services.store, "replicated", False):
        logger.warning(f"--mode {args.mode} ignored: the mode is the shard's shared state (GovernorState); set it "
                       "with `governor mode` on the leader", extra={"event": "mode"})
    elif args.mode:
        services.daemon.set_mode(Mode(args.mode), author="cli", reason="--mode")
        services.store.set_mode(args.mode, author="cli", now_s=clock.now_s(), reason="--mode on the command line")
    api_addr = f"{_host_port(settings.api.listen)[0]}:{services.api_port}"
    listening_event: dict[str, Any] = {"event": "listening", "policy_api": api_addr,
                       "keda_scaler": f"127.0.0.1:{services.keda_port}" if services.keda_port else None,
                       "metrics": services.metrics_url}
    if live is not None:
        listening_event["fleet"] = live.listening()
    if dataplane is not None:
        listening_event["dataplane"] = {k: dataplane.info[k] for k in ("envoy", "router_control", "picker_metrics",
                                                                        "envoy_admin")}
    logger.info("governor started", extra={**listening_event, "mode": services.daemon.mode.value,
                                           "policy": settings.policy, "pools": [p.name for p in settings.pools]})
    try:
        if args.once:
            services.daemon.tick()
            return 0
        if headless:
            out.emit(listening_event)
        notifier = SystemdNotifier()
        if notifier.watchdog_s is not None and notifier.watchdog_s < 2 * settings.tick_interval_s:
            logger.warning(f"WatchdogSec ({notifier.watchdog_s:g} s) is under 2 x tick_interval_s "
                           f"({settings.tick_interval_s:g} s): a slow but healthy tick may get the daemon restarted",
                           extra={"event": "sd_notify"})
        loop = TickLoop(services.daemon.tick, settings.tick_interval_s, logger,
                        on_skipped=lambda: services.metrics.ticks.labels("skipped").inc(),
                        on_error=lambda e: services.metrics.ticks.labels("error").inc(),
                        notifier=notifier, status_of=tick_status, freeze_heap=True)

        def reload() -> None:
            # Pools, SLOs, policy and guardrails reload; listen addresses and sources need a restart.
            if not args.config:
                logger.info("SIGHUP ignored: no config file to reload", extra={"event": "reload"})
                return
            try:
                new = reload_settings(args.config, policy)
                physics, controller = reloaded_parts(new, services.daemon.learning)
            except (ConfigError, ValueError, OSError) as exc:  # rejected whole: the running config stays
                services.daemon.note_reload(False, " ".join(str(exc).split())[:500], clock.now_s())
                raise
            services.daemon.reload(controller, physics)
            logger.info("config reloaded", extra={"event": "reload", "summary": new.summary()})

        if view is not None:
            view.set_header(f"policy API {api_addr} · metrics {services.metrics_url} · "
                            f"mode {services.daemon.mode.value} · log {log_file.name if log_file else 'stderr'} · "
                            "Ctrl-C stops everything")
            with view:
                loop.run(stop_after_s=args.for_s, reload=reload)
        else:
            loop.run(stop_after_s=args.for_s, reload=reload)
    finally:
        services.close()
        if live is not None:
            summary = live.summary() if hasattr(live, "summary") else None
            if dataplane is not None:
                dataplane.stop()
                if headless and dataplane.summary is not None:
                    out.emit({"event": "replay", **dataplane.summary})
            live.stop()
            if headless and summary is not None:
                out.emit({"event": "summary", **(summary if isinstance(summary, dict) else summary.to_dict())})
        if log_file is not None:
            log_file.close()
        if tmp is not None:
            tmp.cleanup()
    return 0
