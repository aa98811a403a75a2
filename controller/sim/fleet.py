"""The simulated fleet: pools of engines, the router, the autoscaler, failures, clients and tasks.

One discrete-event loop (a heapq of (time, seq, kind, a, b) plus a cursor over the
trace's first steps) drives everything; engines advance in segments (see
engine.py), so an hour of trace is ~10^5 events, not ~10^7 engine steps.

`Fleet` is the façade: it owns the state, builds it, runs the loop and takes the
controls; each concern is a mixin in its own module:

- fleet_events: the event queue, the event kinds and the loop (`_advance`);
- fleet_lifecycle: pools, node slots, placement, start/ready/drain/retire, reconcile;
- fleet_clients: requests, admission, dispatch, retries, timeouts, holds, completion;
- fleet_faults: scheduled, Poisson and injected crashes, preemptions and slowdowns;
- fleet_accounting: cost, outcomes, summaries, timelines, pool states, gauges;
- fleet_records: the run-time records (slots, nodes, replicas, pools, route groups).

Semantics of the fleet, over all those modules (docs/SIMULATOR.md carries the same list):

- Lifecycle of a replica: standby → starting → ready → draining → gone. A new
  serving replica promotes a warm-standby replica if one exists (ready
  `startup_warm_s` after it finished loading), else goes on a node slot that
  still has the model's weights (a replica left it within `WARM_NODE_TTL_S`:
  warm start), else starts cold (`startup_cold_s`). Scaling down removes
  starting replicas first (the latest started first), then drains ready ones
  (old engine settings first, then the fewest in flight): a draining replica
  takes no new requests, finishes its running and waiting ones, then is gone and
  its cache with it. Serving, starting, draining and standby replicas all cost
  `tp × $/GPU-hour`; an empty node slot costs nothing.
- Engine caps (`max_num_seqs`, `max_num_batched_tokens`) are a rolling restart
  (maxSurge 1, maxUnavailable 0): one new replica with the new caps is started
  (warm: the weights are on the pool's nodes); when it is ready one old replica is
  drained; repeat. New caches start empty.
- Failures: `crash` kills the engine (in-flight requests fail with 500, its cache
  is lost). The pool's target is unchanged, so, like a ReplicaSet, the fleet
  immediately starts a replacement: warm if a standby exists, else cold (the crash
  takes the pod's local copy of the weights with it). `preempt` (spot) is the same
  but the replica's GPU slot is gone for good: the replacement goes to another slot
  or a new node. `slow` multiplies the replica's step time by `factor` for
  `duration_s`. Faults hit ready replicas, chosen with the seeded generator;
  Poisson faults (`rate_per_hour` per replica) draw their next time with the pool's
  current ready count.
- Clients: a request that has streamed a token and then fails (crash, timeout)
  cannot be retried: it fails and so does its task. A request that failed before
  its first token (500), was shed (429/503, if `retry_on_shed`) or timed out
  before its first token is re-sent after `retry_backoff_s`, at most `max_retries`
  times. `timeout_s` bounds the whole request (send → last token).
- Tasks: step 0 is sent at its trace arrival, step k+1 `think_time_s` after step k
  finished. A task succeeds if every step finished meeting its class's TTFT and TPOT
  SLOs, TTFT measured by the client from the step's first send (retries included),
  TPOT = (last token − first token) / (output tokens − 1). A failed step ends its task.
- Route groups: with one group (the usual case) all traffic goes to it; with
  several, task t goes to group t mod n (groups sorted by name). In a group with
  prefill and decode pools, the first hop is drawn among the prefill (and mixed)
  pools; after prefill the KV moves in prompt_tokens × kv_bytes_per_token × 8 /
  (kv_transfer_gbps × 10^9) seconds (Gbit/s; e.g. Llama-3-8B, 2,000 tokens:
  262 MB over 100 Gbit/s = 21 ms) and a decode pool produces every output token,
  the first one included.
- Tier rules: a pool's `eligible` shares admit a task iff its per-task draw is below its class's
  share; the group's traffic weights split only the eligible traffic (router.py).
- Tenants: a per-tenant quota bucket is checked before the class admission; over quota a request
  is shed or, per class, queued for its token (at most its class's TTFT SLO); the summary reports
  per tenant (fleet_accounting.py).
- Prompts longer than max_model_len are served (scenarios that need it assume the
  long-context variant); a request that cannot fit in a replica's whole KV cache
  is rejected (error, not retried).

Must not: read the wall clock, use unseeded randomness, or keep module-level state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from controller.levers import admission_levers, check_levers, lever, routing_levers
from controller.sim.fleet_accounting import AccountingMixin, SimSummary
from controller.sim.fleet_clients import ClientsMixin
from controller.sim.fleet_events import EventsMixin
from controller.sim.fleet_faults import FaultsMixin
from controller.sim.fleet_lifecycle import LifecycleMixin, route_defaults
from controller.sim.fleet_records import INF, READY, PoolRT
from controller.sim.router import Router
from controller.sim.scenario import MAX_NUM_BATCHED_TOKENS_RANGE, MAX_NUM_SEQS_RANGE, AdmissionSpec, Scenario
from controller.sim.stats import RouterStats
from controller.sim.workload import Workload, build_workload
from controller.types import PRIORITY_CLASSES


class Fleet(EventsMixin, LifecycleMixin, ClientsMixin, FaultsMixin, AccountingMixin):
    """A simulated fleet driven by a scenario. Not thread-safe: callers serialise access.

    Public API: running (`run_until`, `run`, `done`, `now_s`), controls (`set_pool_routing`,
    `set_admission`, `set_pool_target`, `reset_controls`, `inject_fault`), defined here; reading
    (`summary`, `timeline`, `pool_states`, `replica_phases`, `replica_stats`, `node_stats`,
    `request_records`, `cost_usd`, `router_stats`), from fleet_accounting. The concerns are
    mixins of this one class rather than helper objects because the event loop calls their
    handlers ~10^5 times per simulated hour: a method on `self` costs one cached lookup, a
    helper object would add an attribute load per call and per piece of shared state.
    """

    def __init__(self, scenario: Scenario, *, seed: int | None = None, workload: Workload | None = None,
                 record_requests: bool = True) -> None:
        self.scenario = scenario
        self.seed = int(scenario.seed if seed is None else seed)
        ss = np.random.SeedSequence(self.seed)
        w_ss, r_ss, f_ss = ss.spawn(3)
        self.workload = workload if workload is not None else build_workload(scenario, np.random.default_rng(w_ss))
        self._fault_rng = np.random.default_rng(f_ss)
        self.router = Router(np.random.default_rng(r_ss))
        self.record_requests = record_requests
        self._init_events()
        first = scenario.engine_catalogue().model(scenario.pools[0].model)
        self.router_stats = RouterStats(model_name=first.served_name)
        # the order below is the order of side effects (validation errors, events pushed, random draws)
        self._init_pools(scenario)
        self._reset_admission()
        self._init_clients(scenario)
        self._init_accounting()
        self._scaling_actions = 0
        self._stop_s = scenario.duration_s if scenario.duration_s is not None else INF
        self._start_initial_replicas()
        self._schedule_faults()
        self._start_sampling()
        self._refresh()

    # ------------------------------------------------------------------ running

    @property
    def done(self) -> bool:
        return self._n_resolved >= self._n_tasks or self.now_s >= self._stop_s

    def run_until(self, t_s: float) -> None:
        """Process every event with time <= t_s; afterwards now_s = t_s and the stats are current."""
        if t_s < self.now_s:
            raise ValueError(f"run_until: t_s ({t_s}) is before now_s ({self.now_s})")
        self._advance(t_s, stop_when_done=False)
        self.now_s = t_s
        self._refresh()

    def run(self) -> SimSummary:
        """Run until every task is resolved, or until scenario.duration_s."""
        self._advance(self._stop_s, stop_when_done=True)
        if self._n_resolved < self._n_tasks and self._stop_s < INF:
            self.now_s = self._stop_s
        self._refresh()
        return self.summary()

    # ------------------------------------------------------------------ controls

    def set_pool_routing(self, pool: str, **levers: float) -> None:
        """Set routing levers of `pool` by name (the table's levers that act at once, controller/levers.py:
        traffic_weight, inflight_cap, prefix_weight, queue_weight, kv_weight); the others keep their value."""
        p = self._pool(pool)
        check_levers(f"set_pool_routing({pool!r})", routing_levers(), levers)
        r = p.route
        for name, v in levers.items():
            setattr(r, name, lever(name).kind(v))
        self._dispatch_held(p)

    def set_admission(self, priority_class: str, **levers: float) -> None:
        """Set admission levers of one class by name (rate_limit_rps, queue_budget, shed_frac; the others
        keep their value)."""
        k = self._class_index(priority_class)
        self._check_admission(priority_class, levers)
        a = self.router.classes[k]
        a.take_token(self.now_s)  # settle the bucket at the old rate first
        for name, v in levers.items():
            setattr(a, name, lever(name).kind(v))
        cap = a.rate_limit_rps if a.rate_limit_rps > 1.0 else 1.0
        a.tokens = min(a.tokens, cap)

    def set_tenant_quota(self, tenant: str, *, rate_rps: float) -> None:
        """Change a tenant's quota (0 = none); the bucket keeps its tokens, capped at the new burst."""
        names = self.workload.tenant_names
        if tenant not in names:
            raise ValueError(f"unknown tenant {tenant!r}; tenants are {list(names)}")
        if not (isinstance(rate_rps, (int, float)) and math.isfinite(rate_rps) and rate_rps >= 0):
            raise ValueError(f"set_tenant_quota({tenant!r}): rate_rps = {rate_rps!r} must be a finite number >= 0")
        q = self.router.tenants[names.index(tenant)]
        q.settle(self.now_s)  # at the old rate first
        q.rate_rps = float(rate_rps)
        q.tokens = min(q.tokens, q.cap)

    def set_pool_target(self, pool: str, *, replicas: int, warm_standby: int | None = None,
                        max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None) -> None:
        p = self._pool(pool)
        self._check_target(p, replicas, warm_standby, max_num_seqs, max_num_batched_tokens)
        changed = replicas != p.target or (warm_standby is not None and warm_standby != p.standby_target)
        if changed:
            self._scaling_actions += 1
        p.target = int(replicas)
        if warm_standby is not None:
            p.standby_target = int(warm_standby)
        caps = (max_num_seqs if max_num_seqs is not None else p.max_num_seqs,
                max_num_batched_tokens if max_num_batched_tokens is not None else p.max_batched_tokens)
        if caps != (p.max_num_seqs, p.max_batched_tokens):
            p.max_num_seqs, p.max_batched_tokens = caps
            p.gen += 1
        self._reconcile(p)

    def set_ejected(self, pool: str, replicas: tuple[str, ...] | list[str]) -> None:
        """The router sends no new request to these replicas of `pool` (the controller ejected them as
        slow) while another candidate is left; ids of replicas the pool no longer has are ignored."""
        p = self._pool(pool)
        ejected = frozenset(str(r) for r in replicas)
        if ejected == p.route.ejected:
            return
        back = bool(p.route.ejected - ejected)
        p.route.ejected = ejected
        if back:  # a replica is a candidate again: what waits may go to it
            self._dispatch_held(p)

    def replace_replicas(self, pool: str, replicas: tuple[str, ...] | list[str]) -> list[str]:
        """Replace these ready replicas of `pool`, as a Kubernetes controller does for a deleted pod: each
        drains (no new requests, its in-flight ones finish) and a new one starts at once, the target
        unchanged. Returns the ids replaced (ids the pool has no ready replica of are ignored)."""
        p = self._pool(pool)
        want = {str(r) for r in replicas}
        hit = [i for i in p.insts if i.rid in want and i.phase == READY]
        for inst in hit:
            self._drain(inst)
        if hit:
            self._reconcile(p)
        return [i.rid for i in hit]

    def set_capacity(self, pool: str, replicas: int | None) -> None:
        """The GPUs of a pool's SKU run out (or come back, None): at most `replicas` of its replicas can be placed;
        the rest of its target stays pending (reported as unavailable once past its cold start-up time)."""
        p = self._pool(pool)
        if replicas is not None and replicas < 0:
            raise ValueError(f"set_capacity {pool}: replicas must be >= 0 or None (got {replicas})")
        p.capacity = replicas
        self._reconcile(p)

    def reset_controls(self) -> None:
        """Routing, admission and pool targets back to the scenario's values (no replica ejected)."""
        for p in self.pools.values():
            p.route.ejected = frozenset()
            self.set_pool_routing(p.name, **route_defaults(self.scenario, p.spec))
        self._reset_admission()
        for p in self.pools.values():
            e = p.spec.engine
            self.set_pool_target(p.name, replicas=p.spec.replicas, warm_standby=p.spec.warm_standby,
                                 max_num_seqs=e.max_num_seqs, max_num_batched_tokens=e.max_num_batched_tokens)

    def inject_fault(self, kind: str, pool: str, count: int = 1, duration_s: float = 300.0,
                     factor: float = 3.0) -> list[str]:
        """Hit `count` ready replicas of `pool` now. Returns the replica ids hit."""
        p = self._pool(pool)
        if kind not in ("crash", "preempt", "slow"):
            raise ValueError(f"inject_fault: kind = {kind!r}; allowed: 'crash', 'preempt', 'slow'")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"inject_fault: count = {count!r} must be an int >= 1")
        if not (math.isfinite(duration_s) and duration_s > 0):
            raise ValueError(f"inject_fault: duration_s = {duration_s!r} must be > 0")
        if not (math.isfinite(factor) and factor > 1):
            raise ValueError(f"inject_fault: factor = {factor!r} must be > 1")
        return self._fault(kind, p, count, duration_s, factor)

    # ------------------------------------------------------------------ validation

    def _pool(self, name: str) -> PoolRT:
        p = self.pools.get(name)
        if p is None:
            raise ValueError(f"unknown pool {name!r}; pools are {sorted(self.pools)}")
        return p

    @staticmethod
    def _class_index(c: str) -> int:
        if c not in PRIORITY_CLASSES:
            raise ValueError(f"unknown priority class {c!r}; allowed: {list(PRIORITY_CLASSES)}")
        return PRIORITY_CLASSES.index(c)

    @staticmethod
    def _check_admission(c: str, levers: Mapping[str, float]) -> None:
        check_levers(f"set_admission({c!r})", admission_levers(), levers)

    @staticmethod
    def _check_target(p: PoolRT, replicas: int, warm_standby: int | None, max_num_seqs: int | None,
                      max_num_batched_tokens: int | None) -> None:
        s = p.spec
        where = f"set_pool_target({p.name!r})"

        def is_int(v: object) -> bool:
            return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

        if not is_int(replicas) or not (s.min_replicas <= replicas <= s.max_replicas):
            raise ValueError(f"{where}: replicas = {replicas!r} is outside [min_replicas, max_replicas] = "
                             f"[{s.min_replicas}, {s.max_replicas}]")
        if warm_standby is not None and (not is_int(warm_standby) or not 0 <= warm_standby <= s.max_replicas):
            raise ValueError(f"{where}: warm_standby = {warm_standby!r} is outside [0, {s.max_replicas}]")
        lo, hi = MAX_NUM_SEQS_RANGE
        if max_num_seqs is not None and (not is_int(max_num_seqs) or not lo <= max_num_seqs <= hi):
            raise ValueError(f"{where}: max_num_seqs = {max_num_seqs!r} is outside [{lo}, {hi}]")
        lo, hi = MAX_NUM_BATCHED_TOKENS_RANGE
        if max_num_batched_tokens is not None and (not is_int(max_num_batched_tokens)
                                                   or not lo <= max_num_batched_tokens <= hi):
            raise ValueError(f"{where}: max_num_batched_tokens = {max_num_batched_tokens!r} is outside [{lo}, {hi}]")
        seqs = max_num_seqs if max_num_seqs is not None else p.max_num_seqs
        tokens = max_num_batched_tokens if max_num_batched_tokens is not None else p.max_batched_tokens
        if tokens < seqs:
            raise ValueError(f"{where}: max_num_batched_tokens ({tokens}) must be >= max_num_seqs ({seqs}), "
                             "as vLLM requires")

    def set_step_aware(self, step_aware: bool | None) -> None:
        """Step-aware admission at the router on or off (controller/sim/router.py); None: the scenario's own
        (`router.step_aware`). Requests already held stay in the queue they were held in."""
        self.router.step_aware = self.scenario.router.step_aware if step_aware is None else bool(step_aware)

    def _reset_admission(self) -> None:
        self.router.step_aware = self.scenario.router.step_aware
        spec = self.scenario.router.admission
        for k, c in enumerate(PRIORITY_CLASSES):
            a = spec.get(c, AdmissionSpec())
            st = self.router.classes[k]
            for lv in admission_levers():
                setattr(st, lv.name, getattr(a, lv.name))
            st.reset_bucket(self.now_s)
