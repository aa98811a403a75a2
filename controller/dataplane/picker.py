"""The endpoint picker's decision for one request: admit or reject, which pool, which replica, or hold.

Per request, in this order (the simulated router's order, controller/sim/router.py):

1. Admission of its priority class: `shed_fraction` rejects that fraction of arrivals at once
   (429; deterministic: a running sum sheds the request that carries it past the next whole
   one, so 0.25 sheds exactly every 4th); then the rate limit, a token bucket refilled at
   `rate_limit_rps` holding one second of tokens (at least 1): empty → 429 with `retry-after`
   the seconds until the next token.
2. Pool: the route group's pools split its traffic by `traffic_weight` with smooth weighted
   round robin (deterministic; after n requests each pool's count is within one of n × its
   share). All weights zero: equal shares. Pools without a ready endpoint are skipped.
3. Replica among the pool's healthy endpoints below the per-replica in-flight cap (critical
   requests pass the cap, as the Gateway API Inference Extension treats Critical):

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

from controller.dataplane.policy import ClassSettings, PoolSettings, Settings
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
    done: bool = False
    group: str = ""
    wait_s: float | None = None


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


@dataclass
class _ClassState:
    tokens: float = 1.0
    t_last: float = -math.inf
    shed_acc: float = 0.0
    held: int = 0


@dataclass
class Counters:
    """Totals the edge exports as Prometheus metrics."""

    arrivals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PRIORITY_CLASSES, 0))
    held: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PRIORITY_CLASSES, 0))
    rejected: dict[tuple[str, str], int] = field(default_factory=dict)  # (class, reason)
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


class Picker:
    """Endpoints, route groups, admission state and held requests. `settings` come with every call."""

    def __init__(self, groups: Mapping[str, Sequence[str]], *, block_chars: int = 256, affinity_blocks: int = 4,
                 default_group: str | None = None, cold: ColdStart | None = None) -> None:
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
        self._held: dict[str, list[deque[HeldRequest]]] = {p: [deque() for _ in PRIORITY_CLASSES] for p in pools}
        self._seq = 0
        self.cold = cold if cold is not None else ColdStart()
        self._cold: dict[str, list[deque[HeldRequest]]] = {g: [deque() for _ in PRIORITY_CLASSES] for g in self.groups}
        self._cold_count = 0

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

    def route(self, cls: str, prompt: str, settings: Settings, now_s: float, group: str | None = None) -> Route:
        """Admit, choose a pool and a replica, or hold. `now_s`: any monotonic seconds (rate limits, counters)."""
        if cls not in self._classes:
            raise ValueError(f"unknown priority class {cls!r}; allowed: {list(PRIORITY_CLASSES)}")
        self.counters.arrive(cls, now_s)
        rejected = self._admit(cls, settings.admission_of(cls), now_s)
        if rejected is not None:
            return rejected
        g = self.group_of(group)
        pool = self._choose_pool(g, settings)
        key = prefix_key(prompt, self.block_chars, self.affinity_blocks)
        if pool is None:
            return self._hold_cold(cls, g, key)
        ep = self._pick(pool, cls, key, settings.pools[pool])
        if ep is not None:
            self._start(ep)
            return Route(endpoint=ep)
        budget = settings.admission_of(cls).queue_budget
        st = self._classes[cls]
        if budget >= 0 and st.held >= budget:
            return self._reject(cls, 503, 1, "queue_budget")
        self._seq += 1
        h = HeldRequest(cls, PRIORITY_CLASSES.index(cls), self._seq, pool, key)
        self._held[pool][h.prio].append(h)
        st.held += 1
        self.counters.held[cls] += 1
        return Route(held=h)

    def finish(self, ep: Endpoint, settings: Settings) -> list[HeldRequest]:
        """A request on `ep` finished: free its slot and dispatch what the pool's held requests now can."""
        ep.inflight = max(0, ep.inflight - 1)
        return self.dispatch_held(settings, ep.pool)

    def dispatch_held(self, settings: Settings, pool: str | None = None) -> list[HeldRequest]:
        """Give held requests a replica where one has room (after a finish, a reading, a policy change)."""
        out: list[HeldRequest] = self._dispatch_cold(settings) if pool is None else []
        for p in [pool] if pool is not None else list(self._held):
            ps = settings.pools[p]
            blocked = False
            for q in self._held[p]:  # critical first, FCFS within a class
                while q and not blocked:
                    h = q[0]
                    if h.done:
                        q.popleft()
                        continue
                    ep = self._pick(p, h.cls, h.key, ps)
                    if ep is None:
                        blocked = True  # no room for this class: none for the classes behind it either
                        break
                    q.popleft()
                    self._start(ep)
                    h.endpoint = ep
                    h.done = True
                    self._classes[h.cls].held -= 1
                    out.append(h)
        return out

    def abandon(self, h: HeldRequest, reason: str = "hold_timeout") -> bool:
        """The edge gave up on a held request: True if it was still held. `reason` "hold_timeout" counts
        as a rejection (503; "cold_start_timeout" when it waited for a group with no ready replica);
        "client_gone" (the client left while it waited) does not."""
        if h.done:
            return False
        h.done = True
        self._classes[h.cls].held -= 1
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

    def _hold_cold(self, cls: str, group: str, key: int | None) -> Route:
        """Hold a request for a group that has no ready replica, within the class's wait and the queue's size."""
        wait = self.cold.wait_of(cls)
        if wait <= 0:
            return self._reject(cls, 503, 1, "no_endpoint")
        if self._cold_count >= self.cold.queue_size:
            return self._reject(cls, 429, max(1, math.ceil(min(wait, 60.0))), "cold_queue_full")
        self._seq += 1
        h = HeldRequest(cls, PRIORITY_CLASSES.index(cls), self._seq, "", key, group=group, wait_s=wait)
        self._cold[group][h.prio].append(h)
        self._cold_count += 1
        self._classes[cls].held += 1
        self.counters.held[cls] += 1
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
                    ep = self._pick(pool, h.cls, h.key, settings.pools[pool])
                    if ep is None:
                        self._held[pool][h.prio].append(h)  # still held (counted), now for room in the pool
                        continue
                    self._start(ep)
                    h.endpoint = ep
                    h.done = True
                    self._classes[h.cls].held -= 1
                    out.append(h)
        return out

    # ------------------------------------------------------------------ parts

    def _reject(self, cls: str, status: int, retry_after_s: int, reason: str) -> Route:
        self.counters.rejected[(cls, reason)] = self.counters.rejected.get((cls, reason), 0) + 1
        return Route(status=status, retry_after_s=retry_after_s, reason=reason)

    def _admit(self, cls: str, a: ClassSettings, now_s: float) -> Route | None:
        st = self._classes[cls]
        if a.shed_frac > 0.0:
            st.shed_acc += a.shed_frac
            if st.shed_acc >= 1.0 - 1e-9:
                st.shed_acc -= 1.0
                return self._reject(cls, 429, 1, "shed")
        rate = a.rate_limit_rps
        if rate > 0.0:
            cap = rate if rate > 1.0 else 1.0
            if st.t_last == -math.inf:
                st.tokens = cap
            else:
                st.tokens = min(cap, st.tokens + (now_s - st.t_last) * rate)
            st.t_last = now_s
            if st.tokens < 1.0:
                wait = (1.0 - st.tokens) / rate
                return self._reject(cls, 429, max(1, math.ceil(wait)), "rate_limit")
            st.tokens -= 1.0
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

    def _pick(self, pool: str, cls: str, key: int | None, ps: PoolSettings) -> Endpoint | None:
        eps = [e for e in self.endpoints[pool] if e.healthy]
        if not eps:
            return None
        cap = 0 if cls == CRITICAL else ps.inflight_cap
        cands = [e for e in eps if cap <= 0 or e.load < cap]
        if not cands:
            return None
        n = len(cands)
        start = self._rr[pool] = (self._rr[pool] + 1) % n
        order = cands[start:] + cands[:start]
        if n == 1:
            return order[0]
        home = rendezvous_home(key, [e.address for e in eps]) if (key is not None and ps.prefix_weight > 0) else None
        loads = [e.load for e in order]
        lo = min(loads)
        span = max(loads) - lo
        qscale = ps.queue_weight / span if span > 0 else 0.0
        best, best_score = order[0], -math.inf
        for e, q in zip(order, loads, strict=True):
            score = (lo - q) * qscale - ps.kv_weight * e.kv_usage
            if e.address == home:
                score += ps.prefix_weight
            if score > best_score:
                best, best_score = e, score
        return best

    def _start(self, ep: Endpoint) -> None:
        ep.inflight += 1
        ep.picks += 1
