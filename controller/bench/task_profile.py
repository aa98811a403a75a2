"""The task profile the bench hands the controller each tick, measured from the simulator's tasks as the picker's
task book measures a live fleet's (controller/dataplane/task_book.py; the daemon reads it from the picker).

Over the last `window_s` of the run: the tasks whose first step was sent (their step counts, as the client
declares them in `x-governor-task-steps`), and every step sent with its index and tokens (prompt + output, as the
picker estimates a step's tokens from its prompt and max_tokens): the step profile of each class
(controller/core/workflow.py `profile_from_samples`). None where the scenario labels no tasks (`tasks.kind: single`:
each request is a task of one step, as unlabelled requests are at the picker), so the planner plans exactly as it
does without a profile. Tenants are not reported: the simulator's router carries no tenant limits (controller/
levers.py), so a plan of them would move nothing.

Must not: mutate the fleet.
"""

from __future__ import annotations

import numpy as np

from controller.core.workflow import profile_from_samples
from controller.sim.fleet import Fleet
from controller.types import PRIORITY_CLASSES, StepProfile, TaskProfile

TASK_WINDOW_S = 600.0  # the picker's task expiry: a window that holds whole tasks of a few minutes


def sim_task_profile(fleet: Fleet, now_s: float, window_s: float = TASK_WINDOW_S) -> TaskProfile | None:
    """The step profile of each class over the last `window_s` (module docstring); None without labelled tasks."""
    if fleet.scenario.tasks.kind == "single" or not fleet.record_requests:
        return None
    wl = fleet.workload
    sent = fleet.request_records()["sent_s"]
    inwin = np.isfinite(sent) & (sent > now_s - window_s) & (sent <= now_s)
    if not inwin.any():
        return None
    step = np.asarray(wl.step)
    tokens = (np.asarray(wl.trace.prompt_tokens) + np.asarray(wl.trace.output_tokens)).astype(np.float64)
    prio = np.asarray(wl.priority)
    steps_in_task = np.asarray(wl.steps_in_task)
    classes: dict[str, StepProfile] = {}
    for k, name in enumerate(PRIORITY_CLASSES):
        mine = inwin & (prio == k)
        first = mine & (step == 0)
        if not first.any():
            continue
        p = profile_from_samples(steps_in_task[first], step[mine], tokens[mine])
        if p is not None:
            classes[name] = p
    return TaskProfile(classes=classes) if classes else None
