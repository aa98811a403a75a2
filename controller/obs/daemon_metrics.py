"""The daemon's own metrics (`governor_*`), on a registry of its own, served at /metrics.

Built once in the composition root and passed down; nothing registers on
prometheus_client's global default registry. (OpenTelemetry's Prometheus reader
registers on that global registry, which is why plain prometheus_client is used.)
The runtime turns each TickResult's diagnostics into these series; the Grafana
dashboards read them.
"""

from __future__ import annotations

import contextlib
import math
import threading
from wsgiref.simple_server import WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

from controller.types import Mode, PoolGauges

TICK_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0)


def _remove(gauge: Gauge, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # not set yet
        gauge.remove(*labels)


class DaemonMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.ticks = Counter("governor_ticks", "Ticks run, by result (decided, paused, skipped, error)", ["result"],
                             registry=r)
        self.tick_duration = Histogram("governor_tick_duration_seconds", "Time per tick phase", ["phase"],
                                       buckets=TICK_BUCKETS_S, registry=r)
        self.decisions = Counter("governor_decisions", "Decisions by actuation outcome", ["outcome"], registry=r)
        self.actuation = Counter("governor_actuation_calls", "Actuation results per target", ["target", "status"],
                                 registry=r)
        self.generation = Gauge("governor_generation", "Generation of the last decision", registry=r)
        self.mode = Gauge("governor_mode", "1 for the current mode", ["mode"], registry=r)
        self.frozen = Gauge("governor_telemetry_frozen",
                            "1 when all telemetry is stale and the last safe decision is held", registry=r)
        self.telemetry = Gauge("governor_telemetry_status", "1 for the pool's current telemetry status",
                               ["pool", "status"], registry=r)
        self.source_errors = Counter("governor_telemetry_errors", "Telemetry read problems", registry=r)
        self.replicas_desired = Gauge("governor_replicas_desired", "Replica target decided", ["pool"], registry=r)
        self.replicas_ready = Gauge("governor_replicas_ready", "Replicas observed ready", ["pool"], registry=r)
        self.replicas_starting = Gauge("governor_replicas_starting", "Replicas observed starting", ["pool"], registry=r)
        self.arrival_rps = Gauge("governor_pool_arrival_rps", "Observed request rate per pool", ["pool"], registry=r)
        self.ttft_p95 = Gauge("governor_pool_ttft_p95_seconds", "Observed p95 time to first token", ["pool"],
                              registry=r)
        self.slo_ttft = Gauge("governor_slo_ttft_seconds", "TTFT SLO of the tightest class", registry=r)
        self.hit_rate = Gauge("governor_pool_hit_rate", "Observed prefix-cache hit rate", ["pool"], registry=r)
        self.kv_usage = Gauge("governor_pool_kv_usage", "Observed mean KV-cache usage", ["pool"], registry=r)
        self.gpu_mem_used = Gauge("governor_pool_gpu_memory_used_fraction", "Observed DCGM framebuffer used / "
                                  "(used + free) of the pool's fullest GPU", ["pool"], registry=r)
        self.gpu_mem_free = Gauge("governor_pool_gpu_memory_free_bytes", "Framebuffer free on the pool's fullest GPU, "
                                  "as the MPC planned with", ["pool"], registry=r)
        self.batch_tokens_ceiling = Gauge("governor_pool_max_batched_tokens_ceiling", "Largest "
                                          "max_num_batched_tokens the framebuffer headroom lets the MPC raise to",
                                          ["pool"], registry=r)
        self.shed = Gauge("governor_admission_shed_fraction", "Shed fraction decided per class", ["priority"],
                          registry=r)
        self.guard_adjustments = Counter("governor_guard_adjustments", "Guardrail adjustments by code", ["code"],
                                         registry=r)
        self.reasons = Counter("governor_decision_reasons", "Policy reasons by code", ["code"], registry=r)
        self.replicas_ejected = Gauge("governor_replicas_ejected", "Replicas ejected as slow now: the router sends "
                                      "them no new requests (controller/core/outliers.py)", ["pool"], registry=r)
        self.replacements = Counter("governor_replica_replacements", "Slow replicas Governor asked the autoscaler "
                                    "to replace", ["pool"], registry=r)
        self.model_error = Gauge("governor_model_error", "Recent prediction error of the learned models "
                                 "(APE for latency, absolute error for hit rate)", ["metric"], registry=r)
        self.breaker_stage = Gauge("governor_breaker_stage", "Cascading-failure breaker stage (0 = closed)", registry=r)
        self.breaker_trips = Gauge("governor_breaker_trips", "Times the cascading-failure breaker has tripped",
                                   registry=r)
        self.overrides_active = Gauge("governor_overrides_active", "Operator overrides in force", registry=r)
        self.planner_candidates = Gauge("governor_planner_candidates",
                                        "Candidate plans the MPC scored in the last tick", registry=r)
        self.planner_budget_cut = Counter("governor_planner_budget_cut", "Ticks whose MPC search its time budget cut "
                                          "short (raise mpc time_budget_s if this grows with most ticks)", registry=r)
        self.leader = Gauge("governor_leader", "1 while this daemon leads the shard's Lease (actuates), else 0",
                            ["lease"], registry=r)
        self.leader_transitions = Counter("governor_leader_transitions", "Times this daemon became or stopped "
                                          "being the leader of the shard's Lease", ["lease"], registry=r)
        self.last_tick = Gauge("governor_last_tick_timestamp_seconds", "Clock time the last completed tick started",
                               registry=r)
        self.class_ttft_p95 = Gauge("governor_class_ttft_p95_seconds", "Observed p95 time to first token per class "
                                    "(router telemetry)", ["priority"], registry=r)
        self.class_slo_ttft = Gauge("governor_class_slo_ttft_seconds", "TTFT SLO per class", ["priority"], registry=r)
        self.class_slo_violation = Gauge("governor_class_slo_violation", "1 when the class's observed p95 TTFT or "
                                         "TPOT exceeds its SLO this tick, 0 when within; absent when unobserved",
                                         ["priority"], registry=r)
        self.config_reloads = Counter("governor_config_reloads", "Config reloads (SIGHUP), by result (ok, failed); "
                                      "a failed reload keeps the running config", ["result"], registry=r)
        self.store_errors = Counter("governor_state_store_errors", "State-store writes that failed (disk full, "
                                    "read-only), by what was being written", ["write"], registry=r)
        self.spend_rate = Gauge("governor_spend_usd_per_hour", "What the pool's ready and starting replicas cost "
                                "(price per replica-hour × replicas)", ["pool"], registry=r)
        self.spend = Counter("governor_spend_usd", "Spend since the daemon started (the replicas' price integrated "
                             "over the ticks)", registry=r)
        self.tasks = Counter("governor_tasks", "Task outcomes the pickers counted since the daemon started "
                             "(governor_picker_tasks_total)", ["class", "tenant", "outcome"], registry=r)
        self.cost_per_success = Gauge("governor_cost_per_successful_task_usd", "Spend / tasks completed since the "
                                      "daemon started; basis=requests when no request carried a task id",
                                      ["basis"], registry=r)
        self._spent = 0.0
        self._tasks_seen: dict[tuple[str, str, str], float] = {}
        self._server: WSGIServer | None = None

    def observe_costs(self, c) -> None:
        """One tick's CostSnapshot (obs/task_cost.py) into the spend, task and cost series."""
        for pool, v in c.spend_usd_per_hour.items():
            self.spend_rate.labels(pool).set(v)
        if c.spend_usd > self._spent:
            self.spend.inc(c.spend_usd - self._spent)
            self._spent = c.spend_usd
        for key, v in c.tasks.items():
            seen = self._tasks_seen.get(key, 0.0)
            if v > seen:
                self.tasks.labels(*key).inc(v - seen)
                self._tasks_seen[key] = v
        for basis in ("tasks", "requests"):
            if basis == c.basis and c.cost_per_success_usd is not None:
                self.cost_per_success.labels(basis).set(c.cost_per_success_usd)
            else:
                _remove(self.cost_per_success, basis)

    def set_mode(self, mode: Mode) -> None:
        for m in Mode:
            self.mode.labels(m.value).set(1 if m is mode else 0)

    def observe_tick(self, result, observation) -> None:
        """Turn one TickResult (controller.core.step) and its observation into series."""
        self.set_mode(result.mode)
        self.frozen.set(1 if result.frozen else 0)
        self.overrides_active.set(len(result.overrides))
        for pool, status in result.telemetry.items():
            for s in ("ok", "partial", "missing", "stale"):
                self.telemetry.labels(pool, s).set(1 if s == status else 0)
        for pool, p in observation.pools.items():
            for gauge, reading in ((self.replicas_ready, p.replicas_ready),
                                   (self.replicas_starting, p.replicas_starting),
                                   (self.arrival_rps, p.arrival_rps), (self.ttft_p95, p.ttft_p95_s),
                                   (self.hit_rate, p.hit_rate), (self.kv_usage, p.kv_usage_frac),
                                   (self.gpu_mem_used, p.gpu_mem_used_frac)):
                gauge.labels(pool).set(reading.value if reading.ok else math.nan)
        gauges = result.status.pools  # the policy's typed per-pool figures (the MPC's headroom); NaN when none
        for pool in observation.pools:
            g = gauges.get(pool, PoolGauges())
            self.gpu_mem_free.labels(pool).set(g.gpu_mem_free_bytes if g.gpu_mem_free_bytes is not None else math.nan)
            self.batch_tokens_ceiling.labels(pool).set(g.batch_tokens_ceiling if g.batch_tokens_ceiling is not None
                                                       else math.nan)
        if observation.errors:
            self.source_errors.inc(len(observation.errors))
        d = result.decision
        if d is None:
            return
        self.generation.set(d.generation)
        for pool, pd in d.pools.items():
            self.replicas_desired.labels(pool).set(pd.replicas)
            self.replicas_ejected.labels(pool).set(len(pd.ejected))
            if pd.replace:
                self.replacements.labels(pool).inc(len(pd.replace))
        for cls in ("critical", "standard", "sheddable"):
            a = d.admission.get(cls)
            self.shed.labels(cls).set(a.shed_frac if a else 0.0)
        for r in result.guard_adjustments:
            self.guard_adjustments.labels(r.code).inc()
        for r in result.policy_reasons:
            self.reasons.labels(r.code).inc()

    def observe_slos(self, now_s: float, observation, slos) -> None:
        """Per-class SLO series (the alerting rules' burn rate reads the violation gauge)."""
        self.last_tick.set(now_s)
        for cls, slo in slos.items():
            self.class_slo_ttft.labels(cls).set(slo.ttft_s)
            c = observation.classes.get(cls)
            ttft = c.ttft_p95_s if c is not None else None
            tpot = c.tpot_p95_s if c is not None else None
            known = [(r.value, limit) for r, limit in ((ttft, slo.ttft_s), (tpot, slo.tpot_s))
                     if r is not None and r.ok]
            if ttft is not None and ttft.ok:
                self.class_ttft_p95.labels(cls).set(ttft.value)
            else:
                _remove(self.class_ttft_p95, cls)
            if known:
                self.class_slo_violation.labels(cls).set(1 if any(v > limit for v, limit in known) else 0)
            else:
                _remove(self.class_slo_violation, cls)  # unknown is not "within": no sample, no burn

    def serve(self, host: str, port: int) -> int:
        """Serve /metrics on host:port (port 0 = any free port); returns the bound port."""
        app = make_wsgi_app(self.registry)
        server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_SilentHandler)
        threading.Thread(target=server.serve_forever, name="governor-metrics", daemon=True).start()
        self._server = server
        return server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
