"""The endpoint picker's decision for one request: admit or reject, which pool, which replica, or hold.

Per request, in this order (the simulated router's order, controller/sim/router.py):

0. Its tenant's limits (tasks.py, `Settings.tenants`): requests in flight or held → 429 `tenant_concurrency`,
   a token bucket like the class's below → 429 `tenant_rate_limit`. Step-aware (`Settings.step_aware`, the
   default), a later step of a task under way is favoured at every stage of pressure below: the class's shed
   share is taken from first steps only, a later step may borrow one second of a bucket's rate, the queue budget
   refuses first steps before later ones, and a tenant's held later steps go before its held first steps; among
   tenants, held requests go by the token-weighted fair share (`HeldQueue`) and a full queue budget is shared by
   weight (`_displace`).
1. Admission of its priority class: `shed_frac` (`shed_fraction` on the wire) rejects that fraction of arrivals at once
   (429; deterministic: a running sum sheds the request that carries it past the next whole
   one, so 0.25 sheds exactly every 4th); then the rate limit, a token bucket refilled at
   `rate_limit_rps` holding one second of tokens (at least 1): empty → 429 with `retry-after`
   the seconds until the next token.
2. Pool: the route group's pools split its traffic by `traffic_weight` with smooth weighted
   round robin (deterministic; after n requests each pool's count is within one of n × its
   share). All weights zero: equal shares. Pools without a ready endpoint are skipped.
3. Replica among the pool's healthy endpoints not ejected as slow (`PoolRouting.ejected_replicas`,
   by address; when every healthy endpoint is ejected, all of them, as Envoy's panic threshold) below
   the per-replica in-flight cap (critical requests pass the cap, as the Gateway API Inference
   Extension treats Critical):

       score = prefix_weight × affinity − queue_weight × queue_norm − kv_weight × kv_usage

   - affinity: 1 on the prompt's home replica, else 0. The home is chosen by consistent
     (rendezvous) hashing of the prompt's first `affinity_blocks` blocks of `block_chars`
     characters over the pool's healthy endpoints: prompts sharing that prefix share a home
     (and its prefix cache), and a membership change moves only the prompts whose home left
     or joined. A prompt shorter than one block has no home.
   - queue_norm: load = max(requests this picker has in flight there, the engine's
     `vllm:num_requests_running + vllm:num_requests_waiting` from its /metrics), min-max
     normalised over the candidates (0 when all are equal); kv_usage: `vllm:kv_cache_usage_perc`.
   Ties go to the first candidate in a rotating order (round robin among equals).
   The request also names a fallback: the best-scoring other candidate of the same pool (same model, same rules;
   none when the pool has one candidate). The edge hands both to Envoy, which retries once on the fallback only
   when the request never reached the primary (deploy/envoy/loopback.yaml); the slot stays counted on the primary
   until the edge learns the fallback served it (`moved`).
   A route group none of whose pools has a ready replica (scaled to zero, or starting from zero):
   the request is held for the group in a bounded queue (`ColdStart`: at most `queue_size` at once;
   each class waits up to its own `wait_s`, 0 = not held: 503 at once), released critical first, FCFS
   within a class, as soon as a replica is ready; a full queue answers 429, a wait past the class's
   bound 503, both with `retry-after`. Held here they count as held for the class (Governor's
   scale-from-zero signal reads the picker's held requests).
4. No candidate (every replica at its cap): the request is held for the pool (critical first,
   FCFS within a class) while fewer than its class's `queue_budget` are held (-1 = unlimited);
   beyond that → 503 with `retry-after`. Held requests get a replica as soon as one has room
   (`finish`, `dispatch_held`); the edge gives up on one after its hold timeout (503).

The in-flight load the cap compares is the same max(own, engine) load: several pickers side by
side see each other's requests through the engines' metrics, one scrape late.

Pure: time comes in as arguments; no I/O, no clock, no randomness.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controller.dataplane.policy_store import ClassSettings, PoolSettings, Settings
from controller.dataplane.task_book import Identity, StepTicket, TaskBook
from controller.rpc.command_rules import show
from controller.types import PRIORITY_CLASSES

CRITICAL = "critical"


def _h64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def prefix_key(prompt: str, block_chars: int, blocks: int) -> int | None:
    """Hash of the prompt's first `blocks` full blocks of `block_chars` characters (None: shorter than a block)."""
    n = min(len(prompt) // block_chars, blocks)
    if n <= 0:
        return None
    return _h64(prompt[: n * block_chars].encode("utf-8", "surrogatepass"))


def rendezvous_home(key: int, addresses: Sequence[str]) -> str | None:
    """The address with the highest hash of (key, address): consistent hashing without a ring."""
    best, best_h = None, -1
    kb = key.to_bytes(8, "big")
    for a in addresses:
        h = _h64(kb + a.encode())
        if h > best_h:
            best, best_h = a, h
    return best


@dataclass
class Endpoint:
    """One replica as the picker sees it."""

    address: str
    pool: str
    inflight: int = 0  # requests this picker sent there that have not finished
    engine_queue: float = 0.0  # running + waiting, from its /metrics
    kv_usage: float = 0.0
    healthy: bool = True
    picks: int = 0

    @property
    def load(self) -> float:
        return max(float(self.inflight), self.engine_queue)


@dataclass
class HeldRequest:
    """A request waiting for room in `pool` (the edge keeps its own handle in `token`); held for a route group with
    no ready replica, `pool` is "" until one is ready, and `wait_s` is its class's bound (the edge's hold timeout
    otherwise)."""

    cls: str
    prio: int
    seq: int
    pool: str
    key: int | None
    token: object = None
    endpoint: Endpoint | None = None  # set when dispatched
    fallback: Endpoint | None = None  # set when dispatched: where a request that never reached `endpoint` retries
    done: bool = False
    group: str = ""
    wait_s: float | None = None
    later: bool = False  # a later step of a task under way (held ahead of first steps of its class)
    tenant: str = ""
    ticket: StepTicket | None = None
    rejected: str = ""  # set when it gave its place up to another tenant's request (`Picker.take_evicted`)


@dataclass(frozen=True)
class ColdStart:
    """Holding requests for a route group with no ready replica (scale from zero): how many at once, and how long
    each class waits (seconds; 0 = that class is not held). The defaults hold critical and standard up to a
    typical cold start (an engine loading its weights: minutes) and turn sheddable away at once."""

    queue_size: int = 1024
    wait_s: Mapping[str, float] = field(default_factory=lambda: {"critical": 300.0, "standard": 180.0,
                                                                 "sheddable": 0.0})

    def __post_init__(self) -> None:
        if self.queue_size < 0:
            raise ValueError(f"cold start queue_size: {self.queue_size} must be >= 0")
        for cls, w in self.wait_s.items():
            if cls not in PRIORITY_CLASSES or not (math.isfinite(w) and w >= 0):
                raise ValueError(f"cold start wait_s: {cls}={w!r} (classes {list(PRIORITY_CLASSES)}, seconds >= 0)")

    def wait_of(self, cls: str) -> float:
        return float(self.wait_s.get(cls, 0.0))


@dataclass(frozen=True)
class Route:
    """The outcome of `Picker.route`: exactly one of endpoint, held, or status (a rejection)."""

    endpoint: Endpoint | None = None
    held: HeldRequest | None = None
    status: int = 0
    retry_after_s: int = 0
    reason: str = ""
    ticket: StepTicket | None = None  # the admitted step's accounting: hand it back to `finish` with its outcome
    fallback: Endpoint | None = None  # another replica of the endpoint's pool, for a retry before the first byte


@dataclass
class _ClassState:
    tokens: float = 1.0
    t_last: float = -math.inf
    shed_acc: float = 0.0
    held: int = 0
    held_later: int = 0  # of which later steps of tasks under way


class HeldQueue:
    """One class's held requests in one pool: the tenant furthest below its token-weighted fair share goes first
    (least virtual time: tokens dispatched / weight), and within a tenant later steps of its tasks under way before
    its first steps (step-aware), FCFS within each. Step-awareness orders a tenant's own requests: a tenant with many
    tasks under way does not get ahead of another tenant's share by it. At most two queues a tenant, and the tenants
    are bounded (tasks.TaskBook.max_tenants)."""

    def __init__(self) -> None:
        self._q: dict[tuple[bool, str], deque[HeldRequest]] = {}

    def append(self, h: HeldRequest) -> None:
        self._q.setdefault((not h.later, h.tenant), deque()).append(h)

    def __len__(self) -> int:
        return sum(len(q) for q in self._q.values())

    def newest(self, tenant: str, later: bool) -> HeldRequest | None:
        """The tenant's most recently held request of that kind still waiting, or None."""
        q = self._q.get((not later, tenant))
        for h in reversed(q or ()):
            if not h.done:
                return h
        return None

    def head(self, book: TaskBook) -> deque[HeldRequest] | None:
        """The queue whose first request goes next (requests already done are dropped on the way), or None."""
        best: deque[HeldRequest] | None = None
        best_key: tuple[float, bool, int] | None = None
        for k, q in list(self._q.items()):
            while q and q[0].done:
                q.popleft()
            if not q:
                del self._q[k]
                continue
            st = book.tenants.get(k[1])
            key = (st.vtime if st is not None else 0.0, k[0], q[0].seq)
            if best_key is None or key < best_key:
                best, best_key = q, key
        return best


@dataclass
class Counters:
    """Totals the edge exports as Prometheus metrics."""

    arrivals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PRIORITY_CLASSES, 0))
    held: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PRIORITY_CLASSES, 0))
    rejected: dict[tuple[str, str], int] = field(default_factory=dict)  # (class, reason)
    fallbacks: dict[str, int] = field(default_factory=dict)  # pool → requests retried on its fallback replica
    per_second: dict[str, deque[tuple[int, int]]] = field(
        default_factory=lambda: {c: deque(maxlen=4) for c in PRIORITY_CLASSES})

    def arrive(self, cls: str, now_s: float) -> None:
        self.arrivals[cls] += 1
        sec = math.floor(now_s)
        q = self.per_second[cls]
        if q and q[-1][0] == sec:
            q[-1] = (sec, q[-1][1] + 1)
        else:
            q.append((sec, 1))

    def last_second_rate(self, cls: str, now_s: float) -> int:
        """Arrivals of the class in the last whole second before `now_s` (finer than a 15 s scrape)."""
        prev = math.floor(now_s) - 1
        for sec, n in self.per_second[cls]:
            if sec == prev:
                return n
        return 0


# A later step pushes the shed sum past one; held at two, the first steps that follow pay at most one request of
# debt beyond their own share, so a run of later steps never turns into a run of new tasks shed back to back.
SHED_DEBT = 2.0


def _bucket(tokens: float, t_last: float, rate: float, now_s: float, borrow: bool) -> tuple[float, float, float]:
    """A token bucket refilled at `rate` holding one second of tokens (at least 1): (tokens, t_last, wait). A
    request takes a token (wait 0) or is refused (wait: seconds until the next one). With `borrow` it may take
    the bucket down to minus one second of tokens: those requests pass, and the others wait for the debt."""
    cap = rate if rate > 1.0 else 1.0
    tokens = cap if t_last == -math.inf else min(cap, tokens + (now_s - t_last) * rate)
    floor = 1.0 - cap if borrow else 1.0
    if tokens < floor:
        return tokens, now_s, (1.0 - tokens) / rate
    return tokens - 1.0, now_s, 0.0


class Picker:
    """Endpoints, route groups, admission state and held requests. `settings` come with every call."""

    def __init__(self, groups: Mapping[str, Sequence[str]], *, block_chars: int = 256, affinity_blocks: int = 4,
                 default_group: str | None = None, cold: ColdStart | None = None, book: TaskBook | None = None) -> None:
        if not groups or any(not pools for pools in groups.values()):
            raise ValueError("groups: at least one route group, each with at least one pool")
        pools = [p for ps in groups.values() for p in ps]
        if len(set(pools)) != len(pools):
            raise ValueError(f"groups: a pool belongs to one route group only ({pools})")
        if block_chars < 1 or affinity_blocks < 1:
            raise ValueError("block_chars and affinity_blocks must be >= 1")
        self.groups = {g: list(ps) for g, ps in groups.items()}
        self.default_group = default_group or next(iter(self.groups))
        if self.default_group not in self.groups:
            raise ValueError(f"default_group: {self.default_group!r} is not one of {sorted(self.groups)}")
        self.block_chars = block_chars
        self.affinity_blocks = affinity_blocks
        self.endpoints: dict[str, list[Endpoint]] = {p: [] for p in pools}
        self.counters = Counters()
        self._classes = {c: _ClassState() for c in PRIORITY_CLASSES}
        self._swrr: dict[str, dict[str, float]] = {g: dict.fromkeys(ps, 0.0) for g, ps in self.groups.items()}
        self._rr: dict[str, int] = dict.fromkeys(pools, 0)
        self._held: dict[str, list[HeldQueue]] = {p: [HeldQueue() for _ in PRIORITY_CLASSES] for p in pools}
        self._seq = 0
        self.cold = cold if cold is not None else ColdStart()
        self._cold: dict[str, list[deque[HeldRequest]]] = {g: [deque() for _ in PRIORITY_CLASSES] for g in self.groups}
        self._cold_count = 0
        self.book = book if book is not None else TaskBook()
        self._held_by_tenant: dict[tuple[str, str], int] = {}  # (class, tenant) → requests held
        self._evicted: list[HeldRequest] = []

    # ------------------------------------------------------------------ membership and readings

    def set_endpoints(self, pool: str, addresses: Sequence[str]) -> None:
        """The pool's current replicas; those already known keep their state (in-flight counts, readings)."""
        if pool not in self.endpoints:
            raise ValueError(f"unknown pool {pool!r}; this picker routes {sorted(self.endpoints)}")
        old = {e.address: e for e in self.endpoints[pool]}
        self.endpoints[pool] = [old.get(a) or Endpoint(a, pool) for a in dict.fromkeys(addresses)]

    def endpoint(self, address: str) -> Endpoint | None:
        for eps in self.endpoints.values():
            for e in eps:
                if e.address == address:
                    return e
        return None

    def update_reading(self, address: str, *, queue: float, kv_usage: float, healthy: bool = True) -> None:
        e = self.endpoint(address)
        if e is not None:
            e.engine_queue = queue
            e.kv_usage = kv_usage
            e.healthy = healthy

    def held_count(self, cls: str) -> int:
        return self._classes[cls].held

    # ------------------------------------------------------------------ the decision

    def group_of(self, group: str | None) -> str:
        if group is None or group == "":
            return self.default_group
        if group not in self.groups:
            raise ValueError(f"unknown route group {show(group)}; this picker routes {sorted(self.groups)}")
        return group

    def route(self, cls: str, prompt: str, settings: Settings, now_s: float, group: str | None = None,
              ident: Identity | None = None, tokens: float = 0.0) -> Route:
        """Admit, choose a pool and a replica, or hold. `now_s`: any monotonic seconds (rate limits, counters, the
        task book's expiry). `ident`: the request's tenant and task (tasks.py; None: tenant "default", no task);
        `tokens`: its estimated tokens (prompt and output), which the tenants' fair share weighs."""
        if cls not in self._classes:
            raise ValueError(f"unknown priority class {cls!r}; allowed: {list(PRIORITY_CLASSES)}")
        self.counters.arrive(cls, now_s)
        book = self.book
        book.advance(now_s)
        ident = ident if ident is not None else Identity()
        tenant = book.tenant_of(ident.tenant, settings.tenants)
        book.arrived(tenant, cls, ident.task_id, ident.step, tokens)  # the step profile and the tenant's demand
        under_way = book.is_later_step(tenant, ident.step, ident.task_id)
        later = settings.step_aware and under_way
        rejected = (self._admit_tenant(cls, tenant, settings, now_s, later)
                    or self._admit(cls, settings.admission_of(cls), now_s, later))
        if rejected is None:
            rejected = self._place(cls, prompt, settings, group, later, tenant)
        if rejected.endpoint is None and rejected.held is None:
            book.rejected(tenant, cls, ident.task_id, under_way)
            return rejected
        ticket = book.admit(tenant, cls, ident.task_id, ident.step, ident.steps, tokens)
        book.state(tenant).inflight += 1
        if rejected.held is not None:
            rejected.held.ticket = ticket
            return rejected
        assert rejected.endpoint is not None
        self._charge(tenant, tokens, settings)
        return Route(endpoint=rejected.endpoint, ticket=ticket, fallback=rejected.fallback)

    def _place(self, cls: str, prompt: str, settings: Settings, group: str | None, later: bool,
               tenant: str) -> Route:
        """A replica, a hold, or the rejection of the queue budget / the cold-start queue."""
        g = self.group_of(group)
        pool = self._choose_pool(g, settings)
        key = prefix_key(prompt, self.block_chars, self.affinity_blocks)
        if pool is None:
            return self._hold_cold(cls, g, key, later, tenant)
        ep, fallback = self._pick(pool, cls, key, settings.pools[pool])
        if ep is not None:
            self._start(ep)
            return Route(endpoint=ep, fallback=fallback)
        budget = settings.admission_of(cls).queue_budget
        st = self._classes[cls]
        # the budget bounds what a class holds; step-aware, first steps count everything held and later steps only
        # the later steps held, so new tasks cannot take the room of the tasks under way
        if budget >= 0 and (st.held_later if later else st.held) >= budget and not self._displace(
                cls, tenant, later, settings):
            return self._reject(cls, 503, 1, "queue_budget")
        self._seq += 1
        h = HeldRequest(cls, PRIORITY_CLASSES.index(cls), self._seq, pool, key, later=later, tenant=tenant)
        self._held[pool][h.prio].append(h)
        self._hold(h)
        return Route(held=h)

    def finish(self, ep: Endpoint, settings: Settings, ticket: StepTicket | None = None,
               ok: bool | None = True) -> list[HeldRequest]:
        """A request on `ep` finished: free its slot and its tenant's, settle its step (`ok`: it succeeded; False:
        an error or its stream cut; None: not known yet, `settle` later), and dispatch what the pool's held
        requests now can."""
        ep.inflight = max(0, ep.inflight - 1)
        self._release(ticket, ok)
        return self.dispatch_held(settings, ep.pool)

    def moved(self, primary: Endpoint, served: Endpoint) -> None:
        """The request never reached `primary` and Envoy retried it on `served`, its fallback: its slot moves there
        (the step is still one step: its ticket, its tenant's slot and its outcome, the retry's, are untouched)."""
        primary.inflight = max(0, primary.inflight - 1)
        served.inflight += 1
        self.counters.fallbacks[served.pool] = self.counters.fallbacks.get(served.pool, 0) + 1

    def settle(self, ticket: StepTicket, ok: bool) -> None:
        """The outcome of a step whose slot `finish` freed with ok=None."""
        self.book.finished(ticket, ok)

    def _release(self, ticket: StepTicket | None, ok: bool | None) -> None:
        if ticket is None:
            return
        st = self.book.tenants.get(ticket.tenant)
        if st is not None:
            st.inflight = max(0, st.inflight - 1)
        if ok is not None:
            self.book.finished(ticket, ok)

    def dispatch_held(self, settings: Settings, pool: str | None = None) -> list[HeldRequest]:
        """Give held requests a replica where one has room (after a finish, a reading, a policy change)."""
        out: list[HeldRequest] = self._dispatch_cold(settings) if pool is None else []
        for p in [pool] if pool is not None else list(self._held):
            ps = settings.pools[p]
            blocked = False
            for hq in self._held[p]:  # critical first; within a class HeldQueue's order
                while not blocked:
                    q = hq.head(self.book)
                    if q is None:
                        break
                    h = q[0]
                    ep, fallback = self._pick(p, h.cls, h.key, ps)
                    if ep is None:
                        blocked = True  # no room for this class: none for the classes behind it either
                        break
                    q.popleft()
                    self._dispatched(h, ep, fallback, settings)
                    out.append(h)
        return out

    def abandon(self, h: HeldRequest, reason: str = "hold_timeout") -> bool:
        """The edge gave up on a held request: True if it was still held. `reason` "hold_timeout" counts
        as a rejection (503; "cold_start_timeout" when it waited for a group with no ready replica);
        "client_gone" (the client left while it waited) does not."""
        if h.done:
            return False
        h.done = True
        self._unhold(h)
        self._release(h.ticket, ok=False)
        if not h.pool:  # still waiting for its group's first replica
            self._cold_count -= 1
            reason = "cold_start_timeout" if reason == "hold_timeout" else reason
        if reason in ("hold_timeout", "cold_start_timeout"):
            self.counters.rejected[(h.cls, reason)] = self.counters.rejected.get((h.cls, reason), 0) + 1
        return True

    # ------------------------------------------------------------------ a group with no ready replica

    def cold_count(self) -> int:
        """Requests held for route groups with no ready replica."""
        return self._cold_count

    def _hold_cold(self, cls: str, group: str, key: int | None, later: bool = False, tenant: str = "") -> Route:
        """Hold a request for a group that has no ready replica, within the class's wait and the queue's size."""
        wait = self.cold.wait_of(cls)
        if wait <= 0:
            return self._reject(cls, 503, 1, "no_endpoint")
        if self._cold_count >= self.cold.queue_size:
            return self._reject(cls, 429, max(1, math.ceil(min(wait, 60.0))), "cold_queue_full")
        self._seq += 1
        h = HeldRequest(cls, PRIORITY_CLASSES.index(cls), self._seq, "", key, group=group, wait_s=wait, later=later,
                        tenant=tenant)
        self._cold[group][h.prio].append(h)
        self._cold_count += 1
        self._hold(h)
        return Route(held=h)

    def _dispatch_cold(self, settings: Settings) -> list[HeldRequest]:
        """Groups that have a ready replica again: their held requests, critical first, go to a replica, or
        wait in the chosen pool's queue for room like any request held at the in-flight cap."""
        out: list[HeldRequest] = []
        for group, queues in self._cold.items():
            for q in queues:
                while q:
                    h = q[0]
                    if h.done:
                        q.popleft()
                        continue
                    pool = self._choose_pool(group, settings)
                    if pool is None:
                        break
                    q.popleft()
                    self._cold_count -= 1
                    h.pool = pool
                    ep, fallback = self._pick(pool, h.cls, h.key, settings.pools[pool])
                    if ep is None:
                        self._held[pool][h.prio].append(h)  # still held (counted), now for room in the pool
                        continue
                    self._dispatched(h, ep, fallback, settings)
                    out.append(h)
        return out

    # ------------------------------------------------------------------ parts

    def _hold(self, h: HeldRequest) -> None:
        st = self._classes[h.cls]
        st.held += 1
        st.held_later += h.later
        k = (h.cls, h.tenant)
        self._held_by_tenant[k] = self._held_by_tenant.get(k, 0) + 1
        self.counters.held[h.cls] += 1

    def _unhold(self, h: HeldRequest) -> None:
        st = self._classes[h.cls]
        st.held -= 1
        st.held_later -= h.later
        k = (h.cls, h.tenant)
        n = self._held_by_tenant.get(k, 0) - 1
        if n > 0:
            self._held_by_tenant[k] = n
        else:
            self._held_by_tenant.pop(k, None)

    def _displace(self, cls: str, tenant: str, later: bool, settings: Settings) -> bool:
        """A class's full queue budget is shared by the tenants' weights: when another tenant holds more of it
        per weight than the arriving one would with this request, that tenant's newest held request gives its
        place up (503 queue_budget, answered by the edge from `take_evicted`): for a later step, a later step
        (first steps do not count against its budget); for a first step, a first step if it holds one, else a
        later step — step-awareness orders a tenant's own requests, it does not let a tenant with many tasks under
        way take more than its share from the others. True if a place was freed."""
        def share(t: str, extra: int = 0) -> float:
            return (self._held_by_tenant.get((cls, t), 0) + extra) / settings.tenant_limits(t).weight

        mine = share(tenant, 1)
        for top in sorted((t for c, t in self._held_by_tenant if c == cls and t != tenant), key=share,
                          reverse=True):
            if share(top) <= mine:
                return False
            prio = PRIORITY_CLASSES.index(cls)
            victims: list[HeldRequest] = []
            for kind in ((True,) if later else (False, True)):
                victims = [h for hqs in self._held.values() if (h := hqs[prio].newest(top, kind)) is not None]
                if victims:
                    break
            if not victims:
                continue  # nothing it holds frees the kind of place this request needs: the next tenant down
            h = max(victims, key=lambda v: v.seq)
            h.done = True
            h.rejected = "queue_budget"
            self._unhold(h)
            self._release(h.ticket, ok=False)
            self.counters.rejected[(cls, "queue_budget")] = self.counters.rejected.get((cls, "queue_budget"), 0) + 1
            self._evicted.append(h)
            return True
        return False

    def take_evicted(self) -> list[HeldRequest]:
        """Held requests that gave their place up since the last call (the edge answers them 503)."""
        out, self._evicted = self._evicted, []
        return out

    def _dispatched(self, h: HeldRequest, ep: Endpoint, fallback: Endpoint | None, settings: Settings) -> None:
        self._start(ep)
        h.endpoint = ep
        h.fallback = fallback
        h.done = True
        self._unhold(h)
        if h.ticket is not None:
            self._charge(h.ticket.tenant, h.ticket.tokens, settings)

    def _charge(self, tenant: str, tokens: float, settings: Settings) -> None:
        """The fair share's virtual time: a tenant's dispatched tokens over its weight (at least one token a
        request, so unlabelled lengths still count requests)."""
        self.book.state(tenant).vtime += max(1.0, tokens) / settings.tenant_limits(tenant).weight

    def _reject(self, cls: str, status: int, retry_after_s: int, reason: str) -> Route:
        self.counters.rejected[(cls, reason)] = self.counters.rejected.get((cls, reason), 0) + 1
        return Route(status=status, retry_after_s=retry_after_s, reason=reason)

    def _admit(self, cls: str, a: ClassSettings, now_s: float, later: bool = False) -> Route | None:
        """The class's shed fraction and rate limit. Step-aware (`later`: a later step of a task under way), the
        shed share is taken from first steps only: a later step adds its share to the running sum and passes, and
        the next first steps pay it (the sum held to SHED_DEBT so at most two new tasks are shed back to back);
        a later step may also borrow one second of the bucket's rate, which first steps then wait to repay."""
        st = self._classes[cls]
        if a.shed_frac > 0.0:
            st.shed_acc += a.shed_frac
            if st.shed_acc >= 1.0 - 1e-9:
                if not later:
                    st.shed_acc -= 1.0
                    return self._reject(cls, 429, 1, "shed")
                st.shed_acc = min(st.shed_acc, SHED_DEBT)
        if a.rate_limit_rps > 0.0:
            st.tokens, st.t_last, wait = _bucket(st.tokens, st.t_last, a.rate_limit_rps, now_s, later)
            if wait > 0:
                return self._reject(cls, 429, max(1, math.ceil(wait)), "rate_limit")
        return None

    def _admit_tenant(self, cls: str, tenant: str, settings: Settings, now_s: float, later: bool) -> Route | None:
        """The tenant's rate limit (a bucket like the class's, later steps borrowing alike) and in-flight limit."""
        lim = settings.tenant_limits(tenant)
        if lim.rate_limit_rps <= 0.0 and lim.max_inflight <= 0:
            return None
        st = self.book.state(tenant)
        if lim.max_inflight > 0 and st.inflight >= lim.max_inflight:
            return self._reject(cls, 429, 1, "tenant_concurrency")
        if lim.rate_limit_rps > 0.0:
            st.tokens, st.t_last, wait = _bucket(st.tokens, st.t_last, lim.rate_limit_rps, now_s, later)
            if wait > 0:
                return self._reject(cls, 429, max(1, math.ceil(wait)), "tenant_rate_limit")
        return None

    def _choose_pool(self, group: str, settings: Settings) -> str | None:
        pools = [p for p in self.groups[group] if any(e.healthy for e in self.endpoints[p])]
        if not pools:
            return None
        if len(pools) == 1:
            return pools[0]
        weights = {p: settings.pools[p].traffic_weight for p in pools}
        total = sum(weights.values())
        if total <= 0.0:
            weights = dict.fromkeys(pools, 1.0)
            total = float(len(pools))
        cw = self._swrr[group]
        best = None
        for p in pools:
            cw[p] += weights[p]
            if weights[p] > 0.0 and (best is None or cw[p] > cw[best]):
                best = p
        assert best is not None  # total > 0, so some weight is positive
        cw[best] -= total
        return best

    def _pick(self, pool: str, cls: str, key: int | None, ps: PoolSettings
              ) -> tuple[Endpoint | None, Endpoint | None]:
        """(the best candidate, the best other candidate: the fallback), or (None, None) when none has room."""
        eps = [e for e in self.endpoints[pool] if e.healthy]
        if ps.ejected:  # slow endpoints Governor ejected; all of them ejected: all used (Envoy's panic threshold)
            eps = [e for e in eps if e.address not in ps.ejected] or eps
        if not eps:
            return None, None
        cap = 0 if cls == CRITICAL else ps.inflight_cap
        cands = [e for e in eps if cap <= 0 or e.load < cap]
        if not cands:
            return None, None
        n = len(cands)
        start = self._rr[pool] = (self._rr[pool] + 1) % n
        order = cands[start:] + cands[:start]
        if n == 1:
            return order[0], None
        home = rendezvous_home(key, [e.address for e in eps]) if (key is not None and ps.prefix_weight > 0) else None
        loads = [e.load for e in order]
        lo = min(loads)
        span = max(loads) - lo
        qscale = ps.queue_weight / span if span > 0 else 0.0
        best, best_score = order[0], -math.inf
        second, second_score = None, -math.inf
        for e, q in zip(order, loads, strict=True):
            score = (lo - q) * qscale - ps.kv_weight * e.kv_usage
            if e.address == home:
                score += ps.prefix_weight
            if score > best_score:
                second, second_score = best if best_score > -math.inf else None, best_score
                best, best_score = e, score
            elif score > second_score:
                second, second_score = e, score
        return best, second

    def _start(self, ep: Endpoint) -> None:
        ep.inflight += 1
        ep.picks += 1
