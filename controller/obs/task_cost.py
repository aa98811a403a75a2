"""Cost per successful task, live: the fleet's spend and the picker's task outcomes, accumulated tick by tick.

Spend: each pool's replicas that cost money (ready and starting) × its price per replica-hour (the config's
`usd_per_gpu_hour` × `gpus_per_replica`, the catalogue's price where the pool takes it), integrated over the time
between ticks (a gap longer than `max_gap_s`, a daemon that was stopped or stalled, is charged `max_gap_s`: what
it did not watch it does not bill).

Tasks: the picker's cumulative `governor_picker_tasks_total{class,tenant,outcome}` (controller/dataplane/task_book.py),
read each tick; the counts since this daemon's first reading are kept (a counter that goes down, a picker that
restarted, counts from zero again, as Prometheus' rate() does). Several pickers: their counts add up.

Cost per successful task = spend since the first tick / tasks completed since then. When no request carried a
task id (`governor_picker_unlabelled_requests_total` covers every start) the picker's tasks are its requests, and
the basis says `requests`; without a picker's counts at all there is no figure (None) and the basis is `none`.

The task profile (`TaskProfileWindow`): the pickers' step counters (`governor_picker_step_requests_total`,
`_step_tokens_total`, `_task_steps_total`, `_tenant_tokens_total`; controller/dataplane/task_book.py) over the last
`window_s` (their increase between the newest reading and the newest one at least that old: a counter that went
down counts from zero), made into each class's step profile and each tenant's offered tokens per second
(controller/core/workflow.py `profile_from_counts`). The daemon hands it to the next tick (`TickInput.tasks`): the
planner weighs shedding with it and sets tenants' fair shares from it. None before two readings, or where no
labelled task settled and no tenant offered tokens in the window.

No I/O of its own and no clock: `PickerTasksReader` reads through the fetch its caller hands it, and time comes in
as arguments (controller/runtime/main.py `build_costs` wires it into the daemon).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from controller.core.workflow import profile_from_counts
from controller.types import StepProfile, TaskProfile

TaskKey = tuple[str, str, str]  # (class, tenant, outcome)
StepKey = tuple[str, int]  # (class, step index or steps ran)
# the profile counters of a picker's page: family → (PickerProfile field, label of the int key, or None: per tenant)
_PROFILE_FAMILIES = {"governor_picker_step_requests": ("step_requests", "step"),
                     "governor_picker_step_tokens": ("step_tokens", "step"),
                     "governor_picker_task_steps": ("task_steps", "steps"),
                     "governor_picker_tenant_tokens": ("tenant_tokens", None)}


@dataclass(frozen=True)
class PickerProfile:
    """The pickers' cumulative step-profile counters (controller/dataplane/task_book.py), summed over pickers."""

    step_requests: Mapping[StepKey, float] = field(default_factory=dict)
    step_tokens: Mapping[StepKey, float] = field(default_factory=dict)
    task_steps: Mapping[StepKey, float] = field(default_factory=dict)
    tenant_tokens: Mapping[str, float] = field(default_factory=dict)

    def plus(self, other: PickerProfile) -> PickerProfile:
        def add(a: Mapping, b: Mapping) -> dict:
            out = dict(a)
            for k, v in b.items():
                out[k] = out.get(k, 0.0) + v
            return out

        return PickerProfile(add(self.step_requests, other.step_requests), add(self.step_tokens, other.step_tokens),
                             add(self.task_steps, other.task_steps), add(self.tenant_tokens, other.tenant_tokens))

    def since(self, base: PickerProfile) -> PickerProfile:
        """The increase from `base` (a counter below its base restarted: its value is the increase)."""
        def inc(now: Mapping, then: Mapping) -> dict:
            return {k: (v - then.get(k, 0.0) if v >= then.get(k, 0.0) else v) for k, v in now.items()}

        return PickerProfile(inc(self.step_requests, base.step_requests), inc(self.step_tokens, base.step_tokens),
                             inc(self.task_steps, base.task_steps), inc(self.tenant_tokens, base.tenant_tokens))


@dataclass(frozen=True)
class PickerTasks:
    """One reading of the pickers' cumulative counters, summed over pickers."""

    tasks: Mapping[TaskKey, float]
    unlabelled: float = 0.0
    profile: PickerProfile = field(default_factory=PickerProfile)


class TaskProfileWindow:
    """The task profile over the last `window_s` of the pickers' readings (module docstring)."""

    def __init__(self, window_s: float = 600.0) -> None:
        if not window_s > 0:
            raise ValueError(f"task profile window_s must be > 0 (got {window_s!r})")
        self.window_s = window_s
        self._readings: deque[tuple[float, PickerProfile]] = deque()

    def observe(self, now_s: float, profile: PickerProfile) -> None:
        self._readings.append((now_s, profile))
        # keep the newest reading at least window_s old as the base, and everything after it
        while len(self._readings) > 2 and self._readings[1][0] <= now_s - self.window_s:
            self._readings.popleft()

    def profile(self) -> TaskProfile | None:
        if len(self._readings) < 2:
            return None
        (t0, base), (t1, newest) = self._readings[0], self._readings[-1]
        if t1 <= t0:
            return None
        d = newest.since(base)
        classes: dict[str, StepProfile] = {}
        for cls in sorted({c for c, _ in d.task_steps} | {c for c, _ in d.step_requests}):
            p = profile_from_counts({n: v for (c, n), v in d.task_steps.items() if c == cls},
                                    {s: v for (c, s), v in d.step_requests.items() if c == cls},
                                    {s: v for (c, s), v in d.step_tokens.items() if c == cls})
            if p is not None:
                classes[cls] = p
        tenants = {t: v / (t1 - t0) for t, v in d.tenant_tokens.items() if v > 0}
        out = TaskProfile(classes=classes, tenant_tokens_rps=tenants)
        return None if out.empty else out


@dataclass(frozen=True)
class CostSnapshot:
    spend_usd_per_hour: Mapping[str, float]  # per pool, at the last tick
    spend_usd: float  # since the first tick
    watched_s: float  # time the spend covers
    tasks: Mapping[TaskKey, float]  # since the first reading
    basis: str  # tasks | requests | none
    cost_per_success_usd: float | None

    def count(self, outcome: str) -> float:
        return sum(v for (_c, _t, o), v in self.tasks.items() if o == outcome)

    def success_share(self) -> float | None:
        """Completed over settled (completed, failed, abandoned) tasks so far; None before any settled."""
        ok, bad = self.count("completed"), self.count("failed") + self.count("abandoned")
        return ok / (ok + bad) if ok + bad > 0 else None

    def to_dict(self) -> dict:
        return {"spend_usd_per_hour": dict(self.spend_usd_per_hour), "spend_usd": self.spend_usd,
                "watched_s": self.watched_s, "basis": self.basis, "cost_per_success_usd": self.cost_per_success_usd,
                "tasks": {o: self.count(o) for o in ("started", "completed", "failed", "abandoned", "evicted")},
                "success_share": self.success_share()}


@dataclass
class TaskCost:
    prices: Mapping[str, float]  # pool → USD per replica-hour
    max_gap_s: float = 300.0
    spend_usd: float = 0.0
    watched_s: float = 0.0
    _last_s: float | None = None
    _rate: dict[str, float] = field(default_factory=dict)
    _last_counts: dict[TaskKey, float] | None = None
    _last_unlabelled: float = 0.0
    tasks: dict[TaskKey, float] = field(default_factory=dict)
    unlabelled: float = 0.0
    seen_picker: bool = False

    def observe(self, now_s: float, replicas: Mapping[str, float], picker: PickerTasks | None) -> CostSnapshot:
        """One tick: `replicas` the pools' ready + starting replicas (unknown pools left out); `picker` the
        pickers' counters (None: not read this tick)."""
        if self._last_s is not None:
            dt = min(max(0.0, now_s - self._last_s), self.max_gap_s)
            self.spend_usd += sum(self._rate.values()) * dt / 3600.0
            self.watched_s += dt
        self._last_s = now_s
        self._rate = {p: float(n) * self.prices.get(p, 0.0) for p, n in replicas.items()}
        if picker is not None:
            self._count(picker)
        return self.snapshot()

    def _count(self, picker: PickerTasks) -> None:
        if self._last_counts is None:  # the first reading is the baseline: what came before is not ours
            self._last_counts = dict(picker.tasks)
            self._last_unlabelled = picker.unlabelled
            self.seen_picker = True
            return
        for k, v in picker.tasks.items():
            last = self._last_counts.get(k, 0.0)
            self.tasks[k] = self.tasks.get(k, 0.0) + (v - last if v >= last else v)
        u = picker.unlabelled
        self.unlabelled += u - self._last_unlabelled if u >= self._last_unlabelled else u
        self._last_counts = dict(picker.tasks)
        self._last_unlabelled = u

    def snapshot(self) -> CostSnapshot:
        started = sum(v for (_c, _t, o), v in self.tasks.items() if o == "started")
        ok = sum(v for (_c, _t, o), v in self.tasks.items() if o == "completed")
        # every start an unlabelled request (or none yet): the tasks are requests
        labelled = "requests" if self.unlabelled >= started else "tasks"
        basis = labelled if self.seen_picker else "none"
        cost = self.spend_usd / ok if ok > 0 and basis != "none" else None
        return CostSnapshot(dict(self._rate), self.spend_usd, self.watched_s, dict(self.tasks), basis, cost)



def parse_picker_tasks(text: str) -> PickerTasks | None:
    """The task counters of one picker's /metrics page (None: the page has none: not a picker)."""
    tasks: dict[TaskKey, float] = {}
    unlabelled = 0.0
    found = False
    prof: dict[str, dict] = {f: {} for f, _ in _PROFILE_FAMILIES.values()}
    for fam in text_string_to_metric_families(text):
        spec = _PROFILE_FAMILIES.get(fam.name)
        if spec is not None:
            into, label = prof[spec[0]], spec[1]
            for s in fam.samples:
                if not s.name.endswith("_total"):
                    continue
                try:
                    pk: StepKey | str = ((s.labels.get("class", ""), int(s.labels.get(label, ""))) if label
                                         else s.labels.get("tenant", ""))
                except ValueError:
                    continue  # a bucket label that is not a count: not this picker's convention, left out
                into[pk] = into.get(pk, 0.0) + float(s.value)
        elif fam.name == "governor_picker_tasks":
            found = True
            for s in fam.samples:
                if s.name.endswith("_total"):
                    k = (s.labels.get("class", ""), s.labels.get("tenant", ""), s.labels.get("outcome", ""))
                    tasks[k] = tasks.get(k, 0.0) + float(s.value)
        elif fam.name == "governor_picker_unlabelled_requests":
            found = True
            unlabelled += sum(float(s.value) for s in fam.samples if s.name.endswith("_total"))
    return PickerTasks(tasks, unlabelled, PickerProfile(**prof)) if found else None


class PickerTasksReader:
    """The pickers' counters, read through `fetch(url, timeout_s) -> text` (the runtime passes the telemetry's
    fetch; reading is I/O, so it lives with its caller's fetch, not here)."""

    def __init__(self, urls: Sequence[str], fetch: Callable[[str, float], str], timeout_s: float = 1.0) -> None:
        self.urls = tuple(urls)
        self.timeout_s = timeout_s
        self._fetch = fetch
        self.errors = 0

    def read(self) -> PickerTasks | None:
        total: dict[TaskKey, float] = {}
        unlabelled = 0.0
        profile = PickerProfile()
        answered = False
        for url in self.urls:
            try:
                got = parse_picker_tasks(self._fetch(url, self.timeout_s))
            except Exception:  # noqa: BLE001 - a picker that cannot be read is left out of this tick
                self.errors += 1
                continue
            if got is None:
                continue
            answered = True
            for k, v in got.tasks.items():
                total[k] = total.get(k, 0.0) + v
            unlabelled += got.unlabelled
            profile = profile.plus(got.profile)
        return PickerTasks(total, unlabelled, profile) if answered else None


class CostTracker:
    """The daemon's cost per successful task: prices per pool, the pickers' reader, the accumulator."""

    def __init__(self, prices: Mapping[str, float], reader: PickerTasksReader | None,
                 profile_window_s: float = 600.0) -> None:
        self.cost = TaskCost(dict(prices))
        self.reader = reader
        self.window = TaskProfileWindow(profile_window_s)

    def observe(self, now_s: float, observation) -> CostSnapshot:
        replicas = {}
        for pool, p in observation.pools.items():
            n = (p.replicas_ready.value if p.replicas_ready.ok else 0.0) + (
                p.replicas_starting.value if p.replicas_starting.ok else 0.0)
            replicas[pool] = n
        picker = self.reader.read() if self.reader is not None else None
        if picker is not None:
            self.window.observe(now_s, picker.profile)
        return self.cost.observe(now_s, replicas, picker)

    def task_profile(self) -> TaskProfile | None:
        """The pickers' task profile over the window, as of the last reading (None: none measured)."""
        return self.window.profile()
