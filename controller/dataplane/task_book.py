"""Tasks, steps and tenants at the picker: who a request is for, which task and step it is, and the bounded book
the picker keeps of the tasks under way.

The request convention (docs/TELEMETRY.md §"Tasks and tenants at the picker"), all headers optional:

- `x-gateway-inference-fairness-id`: the tenant (the fairness key of the Gateway API Inference Extension and
  llm-d's flow control; requests with the same id share a fair share). Absent: the tenant "default".
- `x-gateway-inference-objective`: the InferenceObjective's name; an objective named after a priority class
  (critical, standard, sheddable) sets the class when `x-governor-class` is absent.
- `x-governor-task-id`: the task (an agent's run, a workflow) the request is a step of; ids are scoped by tenant.
- `x-governor-task-step`: the step's 0-based index; `x-governor-task-steps`: how many steps the task expects.
  A task id without a step index: the picker counts the task's steps itself (the first one it sees is step 0).

A request without them works as before: a task of one step of the tenant "default", and admission is
step-blind for it (no task under way to protect). A value that breaks the convention (too long, characters
outside the set below, a step that is not a small non-negative integer, a step at or past the expected count)
is refused with 400 naming the header: an id the picker cannot read is an id it cannot account.

State is bounded whatever clients send: the task book is an LRU with expiry (cachetools.TTLCache: at most
`max_tasks` tasks; a task idle for `task_ttl_s` expires), and at most `max_tenants` distinct tenants are named
in state and metrics: later ones share the tenant `_other` (and its limits). A million distinct task ids cost
at most `max_tasks` entries.

A task's outcome, counted once per (class, tenant):
- started: its first admitted step;
- failed: a step rejected by admission (once it had started), or a step that failed (an error status, or a
  stream cut after its first byte: never replayed, docs/OPERATING.md);
- completed: its last expected step succeeded, or (expected count unknown) it went idle for `task_ttl_s` after
  a successful step; a task with a known count that goes idle before its last step is `abandoned`;
- evicted: pushed out of a full book (its outcome is then unknown, and counted as such).

The step profile the planner weighs shedding with (controller/core/workflow.py), per class: every admitted step of a
labelled task by its index with its estimated tokens (`step_requests`, `step_tokens`), and every labelled task
settled by the steps it ran (`task_steps`: the count the client declared, else the steps the book saw: a failed task
of undeclared length counts the steps it reached); indices and counts from PROFILE_STEPS on share the last bucket.
Each tenant's offered tokens (`tenant_tokens`: every request that reached admission, refused or not: what it asks
for, which the planner's fair share divides).

Pure: time comes in as arguments; no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import cachetools

from controller.names import ID_CHARS, ID_RE, MAX_ID_BYTES

TENANT_HEADER = "x-gateway-inference-fairness-id"
OBJECTIVE_HEADER = "x-gateway-inference-objective"
TASK_HEADER = "x-governor-task-id"
STEP_HEADER = "x-governor-task-step"
STEPS_HEADER = "x-governor-task-steps"
DEFAULT_TENANT = "default"
OTHER_TENANT = "_other"
MAX_STEPS = 100_000  # an agent's loop past this is not a task any accounting should keep open
# the step profile's buckets: step indices (and steps per task) from this many on share the last one (the
# planner's, controller/core/workflow.py MAX_PROFILE_STEPS; the picker does not import the core)
PROFILE_STEPS = 32
OUTCOMES = ("started", "completed", "failed", "abandoned", "evicted")


class IdentityError(ValueError):
    """A task or tenant header breaks the convention; the message names the header and the rule."""


@dataclass(frozen=True)
class Identity:
    """Who a request is for and which step of which task it is."""

    tenant: str = DEFAULT_TENANT
    task_id: str | None = None
    step: int | None = None  # 0-based; None: not said
    steps: int | None = None  # expected steps of the task; None: not said
    objective: str | None = None


def _id(name: str, value: str) -> str:
    if len(value.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise IdentityError(f"{name}: {len(value.encode('utf-8', 'surrogatepass'))} bytes, at most {MAX_ID_BYTES}")
    if not ID_RE.fullmatch(value):
        raise IdentityError(f"{name}: {value[:40]!r} has characters outside {ID_CHARS}")
    return value


def _count(name: str, value: str, lo: int) -> int:
    v = value.strip()
    if not (v.isascii() and v.isdigit() and len(v) <= 6) or not (lo <= int(v) <= MAX_STEPS):
        raise IdentityError(f"{name}: {value[:40]!r} is not an integer in [{lo}, {MAX_STEPS}]")
    return int(v)


def parse_identity(get: Callable[[str], str | None]) -> Identity:
    """The request's identity from its headers (`get(name)` → value or None); IdentityError if one is unreadable."""
    tenant = get(TENANT_HEADER)
    task = get(TASK_HEADER)
    step = get(STEP_HEADER)
    steps = get(STEPS_HEADER)
    objective = get(OBJECTIVE_HEADER)
    ident = Identity(
        tenant=_id(TENANT_HEADER, tenant.strip()) if tenant is not None and tenant.strip() else DEFAULT_TENANT,
        task_id=_id(TASK_HEADER, task.strip()) if task is not None and task.strip() else None,
        step=_count(STEP_HEADER, step, 0) if step is not None and step.strip() else None,
        steps=_count(STEPS_HEADER, steps, 1) if steps is not None and steps.strip() else None,
        objective=_id(OBJECTIVE_HEADER, objective.strip()) if objective is not None and objective.strip() else None)
    if ident.task_id is None and (ident.step is not None or ident.steps is not None):
        raise IdentityError(f"{STEP_HEADER}/{STEPS_HEADER} without {TASK_HEADER}: a step of which task?")
    if ident.step is not None and ident.steps is not None and ident.step >= ident.steps:
        raise IdentityError(f"{STEP_HEADER}: step {ident.step} of a task of {ident.steps} steps (0-based)")
    return ident


@dataclass(frozen=True)
class TenantSettings:
    """One tenant's limits: requests per second (token bucket of one second, at least 1; 0 = none), requests in
    flight at the replicas (0 = none), and its weight in the token-weighted fair share of held requests."""

    rate_limit_rps: float = 0.0
    max_inflight: int = 0
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate_limit_rps) and self.rate_limit_rps >= 0):
            raise ValueError(f"tenant rate_limit_rps: {self.rate_limit_rps!r} must be >= 0")
        if self.max_inflight < 0:
            raise ValueError(f"tenant max_inflight: {self.max_inflight!r} must be >= 0")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"tenant weight: {self.weight!r} must be > 0")


@dataclass
class TenantState:
    """A tenant's bucket, requests in flight, and virtual time of the fair share (tokens served / weight)."""

    tokens: float = 1.0
    t_last: float = -math.inf
    inflight: int = 0
    vtime: float = 0.0


@dataclass(slots=True)
class Task:
    """One task under way, as the book keeps it (slots: a hundred thousand of them are ~15 MB, not ~30)."""

    tenant: str
    cls: str
    steps: int | None
    next_step: int = 0  # the step index the picker expects next (its own count when the client says none)
    inflight: int = 0
    ok_steps: int = 0
    tokens: float = 0.0  # estimated tokens of its admitted steps (prompt + max_tokens)
    failed: bool = False
    done: bool = False


@dataclass(slots=True)
class StepTicket:
    """What the picker remembers of one admitted step until its outcome: the task it belongs to (or None)."""

    key: tuple[str, str] | None
    tenant: str
    cls: str
    tokens: float
    step: int
    last: bool


class _Book(cachetools.TTLCache):
    """TTLCache that hands its LRU evictions to a callback (expiries are collected by `TaskBook.expire`)."""

    def __init__(self, maxsize: int, ttl: float, timer: Callable[[], float],
                 on_evict: Callable[[tuple[str, str], Task], None]) -> None:
        super().__init__(maxsize, ttl, timer=timer)
        self._on_evict = on_evict

    def popitem(self):
        key, value = super().popitem()
        self._on_evict(key, value)
        return key, value


@dataclass
class TaskCounters:
    """Task outcomes per (class, tenant, outcome), and the tokens of tasks by final outcome."""

    tasks: dict[tuple[str, str, str], int] = field(default_factory=dict)
    tokens: dict[str, float] = field(default_factory=dict)  # outcome → estimated tokens of those tasks
    steps: dict[tuple[str, str], int] = field(default_factory=dict)  # (step kind first/later, outcome)
    unlabelled: int = 0  # admitted requests without a task id (each a task of one step)
    # the step profile (module docstring): per (class, step index), admitted steps and their tokens; per (class,
    # steps ran), labelled tasks settled; per tenant, the tokens it offered
    step_requests: dict[tuple[str, int], int] = field(default_factory=dict)
    step_tokens: dict[tuple[str, int], float] = field(default_factory=dict)
    task_steps: dict[tuple[str, int], int] = field(default_factory=dict)
    tenant_tokens: dict[str, float] = field(default_factory=dict)

    def add(self, cls: str, tenant: str, outcome: str, n: int = 1) -> None:
        k = (cls, tenant, outcome)
        self.tasks[k] = self.tasks.get(k, 0) + n

    def step(self, cls: str, idx: int, tokens: float) -> None:
        k = (cls, min(idx, PROFILE_STEPS - 1))
        self.step_requests[k] = self.step_requests.get(k, 0) + 1
        self.step_tokens[k] = self.step_tokens.get(k, 0.0) + tokens

    def settled(self, cls: str, steps: int) -> None:
        k = (cls, min(max(steps, 1), PROFILE_STEPS))
        self.task_steps[k] = self.task_steps.get(k, 0) + 1

    def offered(self, tenant: str, tokens: float) -> None:
        self.tenant_tokens[tenant] = self.tenant_tokens.get(tenant, 0.0) + tokens

    def count(self, outcome: str, cls: str | None = None, tenant: str | None = None) -> int:
        return sum(n for (c, t, o), n in self.tasks.items()
                   if o == outcome and (cls is None or c == cls) and (tenant is None or t == tenant))


class TaskBook:
    """Tenants (bounded) and tasks under way (an LRU with expiry); outcomes counted once per task."""

    def __init__(self, *, max_tasks: int = 100_000, task_ttl_s: float = 600.0, max_tenants: int = 64) -> None:
        if max_tasks < 1 or max_tenants < 1:
            raise ValueError("max_tasks and max_tenants must be >= 1")
        if not (math.isfinite(task_ttl_s) and task_ttl_s > 0):
            raise ValueError(f"task_ttl_s: {task_ttl_s!r} must be > 0")
        self.max_tenants = max_tenants
        self.task_ttl_s = task_ttl_s
        self.tenants: dict[str, TenantState] = {}
        self.counters = TaskCounters()
        self._now = 0.0
        self._book = _Book(max_tasks, task_ttl_s, lambda: self._now, self._evicted)

    def __len__(self) -> int:
        return len(self._book)

    # ------------------------------------------------------------------ tenants

    def tenant_of(self, name: str, named: Mapping[str, TenantSettings]) -> str:
        """The name state and metrics use: the tenant's own while fewer than max_tenants are known, else _other
        (tenants named in the settings always keep their own)."""
        if name in self.tenants or name in named:
            return name
        if len(self.tenants) >= self.max_tenants:
            return OTHER_TENANT
        return name

    def state(self, tenant: str) -> TenantState:
        st = self.tenants.get(tenant)
        if st is None:
            st = self.tenants[tenant] = TenantState()
            active = [s.vtime for s in self.tenants.values() if s.inflight > 0]
            st.vtime = min(active) if active else 0.0  # a tenant (re)joining starts level with the busiest
        return st

    # ------------------------------------------------------------------ tasks

    def advance(self, now_s: float) -> None:
        """Set the book's clock and settle the tasks that went idle past their expiry."""
        self._now = now_s
        for key, task in self._book.expire(now_s):
            self._settle_idle(key, task)

    def lookup(self, tenant: str, task_id: str | None) -> Task | None:
        if task_id is None:
            return None
        return self._book.get((tenant, task_id))

    def is_later_step(self, tenant: str, ident_step: int | None, task_id: str | None) -> bool:
        """A step of a task already under way (the client says step > 0, or the book has seen the task)."""
        if task_id is None:
            return False
        if ident_step is not None:
            return ident_step > 0
        t = self.lookup(tenant, task_id)
        return t is not None and not t.done

    def admit(self, tenant: str, cls: str, task_id: str | None, step: int | None, steps: int | None,
              tokens: float) -> StepTicket:
        """An admitted step (sent to a replica or held): opens or refreshes its task; its ticket closes it."""
        if task_id is None:
            self.counters.add(cls, tenant, "started")
            self.counters.unlabelled += 1
            return StepTicket(None, tenant, cls, tokens, 0, True)
        key = (tenant, task_id)
        t = self._book.get(key)
        if t is None or (t.done and not step):  # a new task, or a finished one's id run again from step 0
            t = Task(tenant, cls, steps)
            self.counters.add(cls, tenant, "started")
        if steps is not None:
            t.steps = steps
        idx = step if step is not None else t.next_step
        t.next_step = max(t.next_step, idx + 1)
        t.inflight += 1
        t.tokens += tokens
        self._book[key] = t  # refreshes its expiry and its place in the LRU
        return StepTicket(key, tenant, cls, tokens, idx, t.steps is not None and idx + 1 >= t.steps)

    def arrived(self, tenant: str, cls: str, task_id: str | None, step: int | None, tokens: float) -> None:
        """A step that reached admission, admitted or not: the tenant's offered tokens, and for a labelled task
        its index (the client's, else the book's count) into the step profile."""
        self.counters.offered(tenant, tokens)
        if task_id is None:
            return
        if step is None:
            t = self._book.get((tenant, task_id))
            step = t.next_step if t is not None and not t.done else 0
        self.counters.step(cls, step, tokens)

    def rejected(self, tenant: str, cls: str, task_id: str | None, later: bool) -> None:
        """A step refused by admission: a task under way fails (what it spent is lost); a first step that never
        started is not a task yet."""
        self.counters.steps[("later" if later else "first", "rejected")] = \
            self.counters.steps.get(("later" if later else "first", "rejected"), 0) + 1
        if task_id is None or not later:
            return
        t = self._book.get((tenant, task_id))
        if t is not None and not t.done and not t.failed:
            self._fail(t)

    def finished(self, ticket: StepTicket, ok: bool) -> None:
        """The step's outcome (its response, or its stream cut)."""
        kind = "later" if ticket.step > 0 else "first"
        self.counters.steps[(kind, "ok" if ok else "failed")] = \
            self.counters.steps.get((kind, "ok" if ok else "failed"), 0) + 1
        if ticket.key is None:  # an unlabelled request is a task of one step
            self._final(ticket.cls, ticket.tenant, "completed" if ok else "failed", ticket.tokens)
            return
        t = self._book.get(ticket.key)
        if t is None:  # expired or evicted meanwhile: already settled
            return
        t.inflight = max(0, t.inflight - 1)
        if not ok:
            if not t.failed and not t.done:
                self._fail(t)
            return
        t.ok_steps += 1
        if ticket.last and not t.failed and not t.done:
            t.done = True
            self._final(t.cls, t.tenant, "completed", t.tokens)
            self._settled(t)

    def _fail(self, t: Task) -> None:
        t.failed = True
        t.done = True
        self._final(t.cls, t.tenant, "failed", t.tokens)
        self._settled(t)

    def _settled(self, t: Task) -> None:
        """A labelled task's length into the step profile: the count its client declared, else the steps seen."""
        self.counters.settled(t.cls, t.steps if t.steps is not None else t.next_step)

    def _final(self, cls: str, tenant: str, outcome: str, tokens: float) -> None:
        self.counters.add(cls, tenant, outcome)
        self.counters.tokens[outcome] = self.counters.tokens.get(outcome, 0.0) + tokens

    def _settle_idle(self, key: tuple[str, str], t: Task) -> None:
        if t.done:
            return
        if t.steps is None and t.ok_steps > 0 and t.inflight == 0:
            self._final(t.cls, t.tenant, "completed", t.tokens)
        else:
            self._final(t.cls, t.tenant, "abandoned", t.tokens)
        self._settled(t)

    def _evicted(self, key: tuple[str, str], t: Task) -> None:
        if not t.done:
            self._final(t.cls, t.tenant, "evicted", t.tokens)
