"""The simulated router (an llm-d endpoint picker in front of the engines): admission and scoring.

Admission, per priority class, in this order (first rejection wins):
  1. shed_frac: a seeded coin rejects that fraction of arrivals at once (HTTP 429);
  2. rate limit: a token bucket refilled at `rate_limit_rps` holding at most one
     second of tokens (at least 1): a request that finds it empty is rejected (429),
     like Envoy's local rate limit. E.g. 2 rps: a burst of 3 at t=0 admits 2 and
     rejects 1; 0.5 s later one more token is back;
  3. queue budget: a request that finds no replica with room is *held* at the router
     (per pool, critical first, FCFS within a class) while fewer than `queue_budget`
     requests of its class are held; beyond that it is rejected (503). Held requests
     are dispatched as soon as a replica has room; after `hold_timeout_s` they get 503.

Step-aware admission (`router.step_aware` in the scenario, or a decision's `step_aware`; off by default), as
`governor picker` does it (controller/dataplane/picker.py): a request that is a later step of a task under way
(step > 0: its earlier steps succeeded, the engine sends step k only after step k − 1 finished) is protected
from what a new task's first step meets under pressure, so what the task has already spent is not thrown away:
  - shed_frac is taken from first steps only: every arrival adds its share to the class's running sum, a first
    step that finds it at one or more is shed and pays one, a later step passes (the sum held to SHED_DEBT), so the
    class sheds its fraction of all arrivals while it has first steps to shed (the picker's accumulator);
  - the rate limit: a later step may take the bucket down to minus one second of tokens, first steps wait for
    the debt;
  - the queue budget: a first step is refused once the class holds its budget of anything, a later step once
    it holds its budget of later steps;
  - held requests of a class: later steps go before first steps (FCFS within each).
Step-blind (the default), every arrival of a class is alike, as above.

Tenant quota (scenarios with `tenants:`), checked before the class admission: a token bucket
per tenant refilled at `quota_rps`, holding `quota_burst_s` seconds of tokens (at least 1). A request that
finds it empty is, per its class's `over_quota`, shed at once (429) or queued: it takes the next
token ahead (the bucket goes negative) and is sent on when that token is due, unless that is
more than `max_wait_s` away (its class's TTFT SLO: later, it has missed the SLO before it
starts), then it is shed. E.g. 2 rps, empty bucket: the next two queued requests wait 0.5 s
and 1 s.

Pool choice: within a route group a pool is drawn with probability proportional
to its traffic_weight (seeded) among the pools the request is eligible for (the pools'
`eligible` tier rule; all pools without one); all weights zero means equal weights. Pools
with no ready replica are left out of the draw while another has one (as `governor picker`
skips pools without a healthy endpoint), so a pool whose replicas all crashed loses its share
to the others at once.

Replica choice among the pool's ready replicas below the in-flight cap:

    score = prefix_weight × prefix_frac − queue_weight × queue_norm − kv_weight × kv_usage

- prefix_frac: prompt tokens found in the replica's prefix cache / prompt tokens (0..1);
- queue_norm: the replica's in-flight requests (engine waiting + running), min-max
  normalised over the candidates like llm-d's queue scorer: (q − q_min) / (q_max − q_min),
  0 when all are equal. E.g. in-flight 2, 5, 8 → 0, 0.5, 1;
- kv_usage: vllm:kv_cache_usage_perc (0..1).

With the defaults (3, 2, 2) a full prefix hit on the busiest replica (3 − 2 = 1)
beats an empty, idle one (0), while a 50 % hit (1.5 − 2 < 0) does not.
Ties go to the first candidate in a rotating order (round robin among equals).

Must not: simulate engines, decide retries, or read the wall clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from controller.sim.engine import Replica
from controller.sim.engine_records import HELD, Req
from controller.sim.scenario import Scenario
from controller.sim.workload import Workload
from controller.types import PRIORITY_CLASSES

N_CLASSES = len(PRIORITY_CLASSES)
# Critical requests pass the in-flight cap: the cap holds standard and sheddable traffic at the
# router (the Gateway API Inference Extension treats Critical the same way: only lower
# criticalities wait or are dropped when the pool is saturated). Protecting running streams by
# holding critical behind them made critical the class a crash hurt most.
CAP_EXEMPT_PRIO = PRIORITY_CLASSES.index("critical")


# Step-aware shedding: a later step pushes the class's shed sum past one; held at two, the first steps that follow pay
# at most one request of debt beyond their own share (as the picker's SHED_DEBT, controller/dataplane/picker.py).
SHED_DEBT = 2.0


@dataclass
class ClassAdmissionState:
    """Admission settings and token bucket of one priority class."""

    rate_limit_rps: float = 0.0  # 0 = unlimited
    queue_budget: int = -1  # -1 = unlimited
    shed_frac: float = 0.0
    tokens: float = 1.0
    t_last_s: float = 0.0
    held: int = 0  # requests of this class held at the router now
    held_later: int = 0  # of which later steps of a task under way (counted when step-aware)
    shed_acc: float = 0.0  # step-aware: the shed share owed, paid by first steps (see the module's docstring)

    def take_token(self, now_s: float, borrow: bool = False) -> bool:
        """Take a token; with `borrow` (a later step, step-aware) the bucket may go down to minus one second."""
        rate = self.rate_limit_rps
        if rate <= 0.0:
            return True
        cap = rate if rate > 1.0 else 1.0  # one second of burst, at least one request
        tokens = self.tokens + (now_s - self.t_last_s) * rate
        self.tokens = tokens if tokens < cap else cap
        self.t_last_s = now_s
        if self.tokens >= (1.0 - cap if borrow else 1.0):
            self.tokens -= 1.0
            return True
        return False

    def reset_bucket(self, now_s: float) -> None:
        cap = self.rate_limit_rps if self.rate_limit_rps > 1.0 else 1.0
        self.tokens = cap
        self.t_last_s = now_s


@dataclass
class TenantQuotaState:
    """Quota token bucket of one tenant, and what happens to its over-quota requests per class."""

    rate_rps: float  # 0 = no quota
    burst_s: float  # bucket depth, seconds of quota
    queue: tuple[bool, ...]  # per class: queue (True) or shed (False) over quota
    max_wait_s: tuple[float, ...]  # per class: longest a queued request may wait for its token
    tokens: float = 1.0
    t_last_s: float = 0.0
    shed: int = 0  # over-quota requests shed
    delayed: int = 0  # over-quota requests queued

    def __post_init__(self) -> None:
        self.tokens = self.cap

    @property
    def cap(self) -> float:
        c = self.rate_rps * self.burst_s
        return c if c > 1.0 else 1.0  # at least one request

    def settle(self, now_s: float) -> None:
        """Refill the bucket up to now_s."""
        rate = self.rate_rps
        cap = self.cap
        tokens = self.tokens + (now_s - self.t_last_s) * rate
        self.tokens = tokens if tokens < cap else cap
        self.t_last_s = now_s

    def admit(self, prio: int, now_s: float) -> float:
        """0: within quota; > 0: queued, send after this many seconds; < 0: shed (429)."""
        rate = self.rate_rps
        if rate <= 0.0:
            return 0.0
        self.settle(now_s)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        wait = (1.0 - self.tokens) / rate
        if not self.queue[prio] or wait > self.max_wait_s[prio]:
            self.shed += 1
            return -1.0
        self.tokens -= 1.0
        self.delayed += 1
        return wait


class PoolRoute:
    """Routing settings of one pool, its candidate replicas and the requests held for it.

    Its routing levers are attributes named as in the lever table (controller/levers.py: the pool
    levers that act at once): traffic_weight, inflight_cap, prefix_weight, queue_weight, kv_weight.
    No __slots__, so a lever added to the table is carried here with no change."""

    # the levers this router's physics reads (`pick`, `choose`); set from the table by the fleet
    traffic_weight: float
    inflight_cap: int
    prefix_weight: float
    queue_weight: float
    kv_weight: float

    def __init__(self, name: str, levers: Mapping[str, float]) -> None:
        self.name = name
        for k, v in levers.items():
            setattr(self, k, v)
        self.candidates: list[Replica] = []  # ready, not draining
        # replicas the controller ejected (slow): no new requests while another candidate is left
        self.ejected: frozenset[str] = frozenset()
        # held requests, two queues per class in the order they are served: the class's later steps (only when
        # step-aware), then the rest; entries are (request, attempt); stale ones are skipped on pop
        self.held: tuple[deque[tuple[Req, int]], ...] = tuple(deque() for _ in range(2 * N_CLASSES))
        self.held_by_prio = [0] * N_CLASSES  # live held requests per class (stale deque entries not counted)
        self._rr = 0

    @property
    def n_held(self) -> int:
        """Requests held for this pool now, every class."""
        return sum(self.held_by_prio)

    def pick(self, r: Req) -> Replica | None:
        """Best-scoring candidate with room under the in-flight cap (critical: any), or None."""
        cands = self.candidates
        if self.ejected:  # as Envoy's panic threshold: with every candidate ejected, route among them all
            cands = [c for c in cands if c.rid not in self.ejected] or cands
        n = len(cands)
        if n == 0:
            return None
        cap = 0 if r.prio == CAP_EXEMPT_PRIO else self.inflight_cap
        if n == 1:
            rep = cands[0]
            return rep if cap <= 0 or rep.n_waiting + len(rep.running) < cap else None
        self._rr = start = (self._rr + 1) % n
        order = cands[start:] + cands[:start]
        qs = [rep.n_waiting + len(rep.running) for rep in order]
        if cap > 0:
            open_ = [(rep, q) for rep, q in zip(order, qs, strict=True) if q < cap]
            if not open_:
                return None
            if len(open_) == 1:
                return open_[0][0]
            order = [x[0] for x in open_]
            qs = [x[1] for x in open_]
        qw = self.queue_weight
        kw = self.kv_weight
        pw = self.prefix_weight
        units = r.units if pw > 0.0 else ()
        qmin = min(qs)
        span = max(qs) - qmin
        qscale = qw / span if span > 0 else 0.0
        prompt = r.prompt
        best = None
        best_score = -1e300
        for rep, q in zip(order, qs, strict=True):
            score = (qmin - q) * qscale
            if kw:
                c = rep.cache
                score -= kw * (1.0 - (c.free_blocks + c.cached_blocks - c.pinned_blocks) / c.total_blocks)
            if units and rep.caching:
                m = rep.cache.match(units, len(units))
                if m:
                    hit = m * rep.unit_tokens
                    score += pw * (hit / prompt if hit < prompt else 1.0)
            if score > best_score:
                best_score = score
                best = rep
        return best

    def hold(self, r: Req, later: bool = False) -> None:
        """Hold `r` for this pool; `later`: a later step of a task under way, served before the class's others."""
        r.state = HELD
        r.held_pool = self
        self.held[2 * r.prio + (0 if later else 1)].append((r, r.attempt))
        self.held_by_prio[r.prio] += 1

    def pop_held(self) -> Req | None:
        """Next held request (critical first; within a class later steps first, each FCFS), skipping stale
        entries."""
        for q in self.held:
            while q:
                r, attempt = q.popleft()
                if r.state == HELD and r.held_pool is self and r.attempt == attempt:
                    self.held_by_prio[r.prio] -= 1
                    r.held_pool = None
                    return r
        return None

    def peek_held(self) -> Req | None:
        for q in self.held:
            while q:
                r, attempt = q[0]
                if r.state == HELD and r.held_pool is self and r.attempt == attempt:
                    return r
                q.popleft()
        return None

    def unhold(self, r: Req) -> None:
        """Forget a held request (expired or timed out); its deque entry is skipped later."""
        if r.held_pool is self:
            r.held_pool = None
            self.held_by_prio[r.prio] -= 1


class Router:
    """Admission state per class, routing state per pool, and the seeded draws."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.classes = [ClassAdmissionState() for _ in PRIORITY_CLASSES]
        self.pools: dict[str, PoolRoute] = {}
        self.tenants: list[TenantQuotaState] = []  # index = the workload's tenant index
        self.step_aware = False  # see the module's docstring

    def later(self, r: Req) -> bool:
        """Whether `r` is admitted as a later step of a task under way (step-aware only)."""
        return self.step_aware and r.step > 0

    def admit(self, prio: int, now_s: float, later: bool = False) -> int:
        """0 if admitted, else the HTTP status of the rejection (429). `later`: see `later()`."""
        a = self.classes[prio]
        if a.shed_frac > 0.0:
            if self.step_aware:  # first steps pay the class's share of every arrival (the module's docstring)
                a.shed_acc += a.shed_frac
                if a.shed_acc >= 1.0 - 1e-9:
                    if not later:
                        a.shed_acc -= 1.0
                        return 429
                    a.shed_acc = min(a.shed_acc, SHED_DEBT)
            elif a.shed_frac >= 1.0 or self.rng.random() < a.shed_frac:
                return 429
        if a.rate_limit_rps > 0.0 and not a.take_token(now_s, later):
            return 429
        return 0

    def can_hold(self, prio: int, later: bool = False) -> bool:
        a = self.classes[prio]
        return a.queue_budget < 0 or (a.held_later if later else a.held) < a.queue_budget

    def held_in(self, r: Req, later: bool) -> None:
        """Count `r` held for its class (`later`: as a later step)."""
        a = self.classes[r.prio]
        a.held += 1
        r.held_later = later
        if later:
            a.held_later += 1

    def held_out(self, r: Req) -> None:
        """`r` is no longer held (dispatched, expired or timed out)."""
        a = self.classes[r.prio]
        a.held -= 1
        if r.held_later:
            a.held_later -= 1
            r.held_later = False

    def choose(self, pools: list[PoolRoute]) -> PoolRoute:
        """A pool of a route group, drawn by traffic_weight among the pools with a ready replica.

        A pool with no ready replica (scaled to zero, every replica crashed or still starting) is
        skipped, as `governor picker` skips a pool without a healthy endpoint
        (controller/dataplane/picker.py), so its share goes to the others at once, not a tick later
        when the controller moves the weights. If no pool has one, the draw is over all of them and
        the request is held for the pool drawn until a replica is ready there."""
        if len(pools) == 1:
            return pools[0]
        ready = [p for p in pools if p.candidates]
        if ready:
            pools = ready
        weights = [p.traffic_weight for p in pools]
        total = sum(weights)
        if total <= 0.0:
            weights = [1.0] * len(pools)
            total = float(len(pools))
        positive = [p for p, w in zip(pools, weights, strict=True) if w > 0.0]
        if len(positive) == 1:
            return positive[0]
        x = self.rng.random() * total
        acc = 0.0
        for p, w in zip(pools, weights, strict=True):
            acc += w
            if x < acc and w > 0.0:
                return p
        return positive[-1]


def expected_pool_shares(scenario: Scenario, workload: Workload, *, full_share: bool = False) -> dict[str, np.ndarray]:
    """Per pool, the expected share (0..1) of each workload request it serves, as `Router.choose` splits
    traffic: task t goes to route group t mod n (groups sorted by name); within a group and hop (first
    hop: prefill and mixed pools; decode pools) the request's eligible pools (tier rules) share it by
    traffic_weight (all zero: equally). For planners and the bench, which size pools from demand.
    `full_share`: each pool's share as if it took every request of its group and hop it is eligible
    for (1 or 0 per request; the joint oracle's unit)."""
    names = sorted({p.group for p in scenario.pools})
    group_of_task = np.asarray(workload.task_id) % len(names)
    prio = np.asarray(workload.priority)
    u = workload.tier_u if workload.tier_u is not None else np.zeros(len(workload))
    out: dict[str, np.ndarray] = {}
    for gi, g in enumerate(names):
        members = [p for p in scenario.pools if p.group == g]
        in_group = (group_of_task == gi).astype(np.float64)
        for hop_decode in (False, True):
            pools = [p for p in members if (p.role == "decode") == hop_decode]
            if not pools:
                continue
            weights = np.array([p.traffic_weight for p in pools], dtype=np.float64)
            if weights.sum() <= 0:
                weights = np.ones(len(pools))
            elig = np.zeros((len(pools), len(workload)), dtype=bool)
            for j, p in enumerate(pools):
                share = np.array([p.eligible_share(c) for c in PRIORITY_CLASSES])
                elig[j] = u < share[prio]
            none = ~elig.any(axis=0)
            elig[:, none] = True  # a request no pool may take (only where validation was bypassed) goes anywhere
            if full_share:
                for j, p in enumerate(pools):
                    out[p.name] = in_group * elig[j]
                continue
            w = elig * weights[:, None]
            total = w.sum(axis=0)
            zero = total <= 0
            w[:, zero] = elig[:, zero]  # eligible pools all at weight 0: equal shares, as choose() does
            total = w.sum(axis=0)
            for j, p in enumerate(pools):
                out[p.name] = in_group * (w[j] / total)
    return out
