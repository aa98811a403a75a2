"""Reading what cost per successful task needs, once a tick: the pools' replicas (the tick's observation) and the
pickers' task counters (their /metrics: the telemetry's router targets that expose `governor_picker_tasks_total`).

controller/obs/task_cost.py accumulates; this module does the I/O (each picker read bounded by `timeout_s`; a
picker that does not answer is left out of that tick, and a tick none answers has no reading).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from prometheus_client.parser import text_string_to_metric_families

from controller.obs.task_cost import CostSnapshot, PickerTasks, TaskCost, TaskKey
from controller.telemetry.scrape import fetch_text


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
    def __init__(self, urls: Sequence[str], timeout_s: float = 1.0,
                 fetch: Callable[[str, float], str] = fetch_text) -> None:
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
