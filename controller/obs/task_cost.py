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

No I/O of its own and no clock: `PickerTasksReader` reads through the fetch its caller hands it, and time comes in
as arguments (controller/runtime/main.py `build_costs` wires it into the daemon).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

TaskKey = tuple[str, str, str]  # (class, tenant, outcome)


@dataclass(frozen=True)
class PickerTasks:
    """One reading of the pickers' cumulative counters, summed over pickers."""

    tasks: Mapping[TaskKey, float]
    unlabelled: float = 0.0


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
    for fam in text_string_to_metric_families(text):
        if fam.name == "governor_picker_tasks":
            found = True
            for s in fam.samples:
                if s.name.endswith("_total"):
                    k = (s.labels.get("class", ""), s.labels.get("tenant", ""), s.labels.get("outcome", ""))
                    tasks[k] = tasks.get(k, 0.0) + float(s.value)
        elif fam.name == "governor_picker_unlabelled_requests":
            found = True
            unlabelled += sum(float(s.value) for s in fam.samples if s.name.endswith("_total"))
    return PickerTasks(tasks, unlabelled) if found else None


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
        return PickerTasks(total, unlabelled) if answered else None


class CostTracker:
    """The daemon's cost per successful task: prices per pool, the pickers' reader, the accumulator."""

    def __init__(self, prices: Mapping[str, float], reader: PickerTasksReader | None) -> None:
        self.cost = TaskCost(dict(prices))
        self.reader = reader

    def observe(self, now_s: float, observation) -> CostSnapshot:
        replicas = {}
        for pool, p in observation.pools.items():
            n = (p.replicas_ready.value if p.replicas_ready.ok else 0.0) + (
                p.replicas_starting.value if p.replicas_starting.ok else 0.0)
            replicas[pool] = n
        return self.cost.observe(now_s, replicas, self.reader.read() if self.reader is not None else None)
