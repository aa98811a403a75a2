"""`governor bench tasks --live`: agentic tasks through Envoy and `governor picker` beyond the fleet's capacity.

Setup (each its own process, as `governor bench dataplane`): `governor sim scenarios/dataplane/fleet.yaml` (two
A100 and two H100 Llama-3-8B replicas, calibrated engines serving the OpenAI API; a static fleet: nothing scales
it), `governor picker` and Envoy (deploy/envoy/loopback.yaml). A RoutingPolicy gives every replica an in-flight
cap of `--cap` and the standard class a queue budget of `--budget`; the picker holds the rest up to
`--hold-timeout` seconds.

Clients: tasks arrive open loop (Poisson, `--task-rate` a second, seeded) for `--duration` seconds. A task has S
steps, S uniform in [3, 8] (the agentic scenario's range); its lengths come from one request of the shared Azure
LLM conversation trace: step k sends the first (k + 1)/S of its context (`prompt_tokens`, the text growing with it
so the replicas' prefix caches see the shared part; within the model's context length, read from a replica's
/v1/models) and asks for that request's output length (at most `--max-output`); the next step leaves `--think`
seconds after the previous one returned (the agent's tool call). A step succeeds if it is answered 200, its
stream ends with [DONE] and its first token comes within `--slo-ttft`; a task succeeds if every step does; an
agent abandons its task at the first failed step.

Runs, on the same fleet with the same arrivals: step-aware admission (the picker's default) and step-blind
(`--step-blind`); then the two-tenant run: tenant `heavy` sends ten times the tokens of tenant `light` (five
times the tasks, twice the length; light at `--light-rate` tasks a second, below half the fleet's capacity),
each with its fairness id, against the same step-aware picker with equal weights, and again with no fairness id
(one tenant: held requests first come first served).

Reported per run: tasks started, completed, failed; completed tasks per dollar (the fleet's price × the longer of
the two compared runs' wall times: the same fleet stands for both, so the ratio is the ratio of completed
tasks); the GPU-seconds spent on
tasks that later failed (the fleet's GPU-seconds over the run × the share of the tokens served — prompt and
output — that went to steps of tasks that failed); requests counted at the replicas (`vllm:request_success_total`)
and at the client; per tenant, the share of its tasks completed on time. Bounded: `--duration` plus a drain of at
most `--drain` seconds per run. Figures from the loaded shared machine: compare within one run.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from controller.bench.dataplane import SCENARIO, _metric_sum, _scrape
from controller.dataplane.child import GovernorChild
from controller.dataplane.envoy import EnvoyProcess
from controller.dataplane.replay import send_one
from controller.dataplane.task_book import STEP_HEADER, STEPS_HEADER, TASK_HEADER, TENANT_HEADER
from controller.gen.governor.v1 import control_pb2 as pb
from controller.gen.governor.v1 import control_pb2_grpc as pb_grpc
from controller.paths import shared_data_dir

STEPS = (3, 8)  # the agentic scenario's steps per task (scenarios/agentic.yaml)
WORDS = ("plan", "tool", "call", "read", "file", "grep", "test", "patch", "diff", "build", "log", "trace")


@dataclass(frozen=True)
class TaskSpec:
    task_id: str
    tenant: str
    at_s: float
    steps: int
    context: int  # tokens of the last step's prompt
    output: int


@dataclass
class RunResult:
    started: int = 0
    completed: int = 0
    failed: int = 0
    ok_tokens: float = 0.0
    failed_task_tokens: float = 0.0
    by_tenant: dict[str, list[int]] = field(default_factory=dict)  # tenant → [tasks, completed]
    requests_client: int = 0
    refused: int = 0
    refused_first: int = 0  # tasks refused at their first step (never started at the picker)
    why_failed: dict[str, dict[str, int]] = field(default_factory=dict)  # tenant → cause → tasks


def trace_lengths() -> tuple[np.ndarray, np.ndarray]:
    import csv

    path = shared_data_dir() / "traces" / "azure2023_conv.csv"
    ctx, out = [], []
    with path.open() as f:
        for row in csv.DictReader(f):
            ctx.append(int(row["ContextTokens"]))
            out.append(int(row["GeneratedTokens"]))
    return np.asarray(ctx), np.asarray(out)


def make_tasks(rng: np.random.Generator, rate: float, duration_s: float, tenant: str, length_scale: float,
               ctx: np.ndarray, out: np.ndarray, max_output: int, prefix: str) -> list[TaskSpec]:
    t, tasks = 0.0, list[TaskSpec]()
    while True:
        t += float(rng.exponential(1.0 / rate))
        if t >= duration_s:
            return tasks
        j = int(rng.integers(len(ctx)))
        tasks.append(TaskSpec(f"{prefix}-{len(tasks)}", tenant, t, int(rng.integers(STEPS[0], STEPS[1] + 1)),
                              max(16, int(ctx[j] * length_scale)), max(1, min(max_output, int(out[j])))))


def _text(task_id: str, tokens: int) -> str:
    """A prompt of about `tokens` tokens (the replicas count ~4 characters a token) whose beginning is the
    task's own: a later step's prompt extends the earlier one's, as an agent's context grows."""
    words = [f"{task_id}:{WORDS[i % len(WORDS)]}{i}" for i in range(max(1, tokens // 4))]
    return " ".join(words)


class Rig:
    """Simulated replicas, a picker (step-aware or not) and Envoy on loopback."""

    def __init__(self, *, step_blind: bool, cap: int, budget: int, hold_timeout_s: float) -> None:
        self.args = (step_blind, cap, budget, hold_timeout_s)
        self._stack = ExitStack()

    def __enter__(self) -> Rig:
        step_blind, cap, budget, hold = self.args
        s = self._stack.__enter__()
        try:
            sim = GovernorChild(["sim", str(SCENARIO), "--step-wall", "0.005"])
            s.callback(sim.stop)
            self.replicas = sim.info["replicas"]
            models = json.loads(_scrape(f"http://{self.replicas[0]['address']}/v1/models"))
            self.max_model_len = int(models["data"][0]["max_model_len"])
            pools: dict[str, list[str]] = {}
            for r in self.replicas:
                pools.setdefault(r["pool"], []).append(r["address"])
            picker = GovernorChild(["picker", *[a for p, addrs in sorted(pools.items())
                                                for a in ("--pool", f"{p}={','.join(addrs)}")],
                                    "--extproc-port", "0", "--control-port", "0", "--metrics-port", "0",
                                    "--scrape-interval", "0.5", "--hold-timeout", f"{hold:g}",
                                    *(["--step-blind"] if step_blind else [])])
            s.callback(picker.stop)
            self.picker = picker
            host, port = picker.info["extproc"].rsplit(":", 1)
            envoy = EnvoyProcess(picker_address=host, picker_port=int(port), message_timeout_s=hold + 10)
            self.url = envoy.start()
            s.callback(envoy.stop)
            with grpc.insecure_channel(picker.info["router_control"]) as ch:
                msg = pb.RoutingPolicy(meta=pb.CommandMeta(decision_id="bench-tasks", generation=1,
                                                           valid_until_unix_s=time.time() + 3600,
                                                           issuer="governor bench tasks"))
                for p in sorted(pools):
                    msg.pools.add(pool=p, traffic_weight=1.0, inflight_cap=cap,
                                  weights=pb.ScorerWeights(prefix=3, queue=2, kv_usage=2))
                msg.admission.add(priority_class="standard", queue_budget=budget)
                ack = pb_grpc.RouterControlStub(ch).ApplyRoutingPolicy(msg, timeout=5)
                if ack.status != pb.ACK_STATUS_APPLIED:
                    raise RuntimeError(f"the picker refused the policy: {ack.message}")
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stack.__exit__(*exc)

    def served(self) -> float:
        return sum(_metric_sum(_scrape(r["metrics"]), "vllm:request_success_total") for r in self.replicas)

    def picker_counts(self, family: str, label: str) -> dict[str, float]:
        """The picker's `family` summed by `label` (e.g. tasks by outcome, rejections by reason)."""
        out: dict[str, float] = {}
        for line in _scrape(self.picker.info["metrics"]).splitlines():
            if line.startswith(family + "{") and f'{label}="' in line:
                key = line.split(f'{label}="', 1)[1].split('"', 1)[0]
                out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        return out


async def _run_task(url: str, t: TaskSpec, t0: float, res: RunResult, *, think_s: float, slo_ttft_s: float,
                    timeout_s: float, fairness_id: bool, max_model_len: int) -> None:
    await asyncio.sleep(max(0.0, t0 + t.at_s - time.monotonic()))  # its arrival time (open loop)
    res.started += 1
    tenant = res.by_tenant.setdefault(t.tenant, [0, 0])
    tenant[0] += 1
    spent = 0.0
    for k in range(t.steps):
        # within the model's context with its output (a longer one is the client's mistake: 400)
        n = max(1, min(t.context * (k + 1) // t.steps, max_model_len - t.output))
        body = json.dumps({"prompt": _text(t.task_id, n), "prompt_tokens": n, "max_tokens": t.output,
                           "stream": True}).encode()
        headers = {"x-governor-class": "standard", TASK_HEADER: t.task_id, STEP_HEADER: str(k),
                   STEPS_HEADER: str(t.steps)}
        if fairness_id:
            headers[TENANT_HEADER] = t.tenant
        r = await send_one(url, "/v1/completions", body, headers, timeout_s)
        res.requests_client += 1
        if r.status in (429, 503):
            res.refused += 1
            res.refused_first += k == 0
        ok = r.status == 200 and not r.error and r.ttft_s <= slo_ttft_s
        if r.status == 200:
            spent += n + r.tokens  # what the replica computed for it (before any prefix-cache hit)
        if not ok:
            cause = (str(r.status) if r.status != 200 else "late" if r.ttft_s > slo_ttft_s else "cut") \
                if r.status else "no answer"
            why = res.why_failed.setdefault(t.tenant, {})
            why[cause] = why.get(cause, 0) + 1
            res.failed += 1
            res.failed_task_tokens += spent
            res.ok_tokens += spent
            return
        if k + 1 < t.steps:
            await asyncio.sleep(think_s)  # the agent's tool call between two model calls
    res.completed += 1
    tenant[1] += 1
    res.ok_tokens += spent


class DaemonCosts:
    """The daemon's own cost accounting (runtime/costs.py, obs/task_cost.py, obs/daemon_metrics.py) beside the run:
    it ticks every second, reads the picker's /metrics and the static fleet, and its /metrics text says what a
    successful task cost — the figure `governor status` and the dashboard show, to compare with the bench's."""

    def __init__(self, rig: Rig, prices: dict[str, float]) -> None:
        import threading

        from controller.obs.daemon_metrics import DaemonMetrics
        from controller.obs.task_cost import CostTracker, PickerTasksReader
        from controller.types import FleetObservation, PoolObservation, Reading

        counts: dict[str, int] = {}
        for r in rig.replicas:
            counts[r["pool"]] = counts.get(r["pool"], 0) + 1
        self._obs = FleetObservation(at_s=0.0, pools={p: PoolObservation(p, replicas_ready=Reading(float(n)),
                                                                         replicas_starting=Reading(0.0))
                                                      for p, n in counts.items()})
        self.metrics = DaemonMetrics()
        self.tracker = CostTracker(prices, PickerTasksReader([rig.picker.info["metrics"]],
                                                             lambda url, _timeout: _scrape(url)))
        self._stop = threading.Event()
        self.tick()  # the baseline, before the first task
        self._thread = threading.Thread(target=self._loop, name="daemon-costs", daemon=True)
        self._thread.start()

    def tick(self, at_s: float | None = None) -> None:
        self.metrics.observe_costs(self.tracker.observe(time.monotonic() if at_s is None else at_s, self._obs))

    def _loop(self) -> None:
        while not self._stop.wait(1.0):  # the daemon's tick period in the demo is 3 s; a second is finer
            self.tick()

    def stop(self, end_s: float) -> dict[str, float]:
        """A last tick as of `end_s` (when the run's last task ended; its counts read after the picker settled
        them), then the cost per successful task as the daemon's /metrics shows it, by basis."""
        from prometheus_client import generate_latest

        self._stop.set()
        self._thread.join(5.0)
        self.tick(end_s)
        out = {}
        for line in generate_latest(self.metrics.registry).decode().splitlines():
            if line.startswith("governor_cost_per_successful_task_usd{"):
                out[line.split('basis="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
        return out


def run_one(tasks: list[TaskSpec], *, step_blind: bool, fairness_id: bool, cap: int, budget: int, hold_s: float,
            think_s: float, slo_ttft_s: float, drain_s: float, prices: dict[str, float],
            gpus_per_replica: dict[str, int]) -> dict:
    with Rig(step_blind=step_blind, cap=cap, budget=budget, hold_timeout_s=hold_s) as rig:
        served0 = rig.served()
        res = RunResult()
        daemon = DaemonCosts(rig, prices)

        async def main() -> tuple[float, float]:
            t0 = time.monotonic()
            horizon = max(t.at_s for t in tasks) + drain_s
            jobs = [asyncio.create_task(_run_task(rig.url, t, t0, res, think_s=think_s, slo_ttft_s=slo_ttft_s,
                                                  timeout_s=hold_s + slo_ttft_s + 60,
                                                  fairness_id=fairness_id, max_model_len=rig.max_model_len))
                    for t in tasks]
            done, pending = await asyncio.wait(jobs, timeout=horizon)
            for j in pending:  # past the drain: unfinished tasks count as failed (not completed)
                j.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            return t0, time.monotonic()

        t0, t_end = asyncio.run(main())
        wall = t_end - t0
        # the picker settles the last steps on Envoy's access log (flushed every 0.2 s): its counts stop moving
        deadline, last, still = time.monotonic() + 3.0, -1.0, 0
        while time.monotonic() < deadline and still < 5:
            got = rig.picker_counts("governor_picker_tasks_total", "outcome")
            now = got.get("completed", 0) + got.get("failed", 0)
            still = still + 1 if now == last else 0
            last = now
            time.sleep(0.1)  # polling a condition under a deadline
        daemon_cost = daemon.stop(t_end)
        served = rig.served() - served0
        picker = rig.picker_counts("governor_picker_tasks_total", "outcome")
        rejected = rig.picker_counts("governor_picker_rejected_total", "reason")
        usd_per_hour = sum(prices[r["pool"]] for r in rig.replicas)
        gpus = sum(gpus_per_replica[r["pool"]] for r in rig.replicas)
    unfinished = res.started - res.completed - res.failed
    cost = usd_per_hour * wall / 3600.0
    gpu_s = gpus * wall
    return {"step_blind": step_blind, "fairness_id": fairness_id, "wall_s": round(wall, 1), "tasks": len(tasks),
            "started": res.started, "completed": res.completed, "failed": res.failed + unfinished,
            "tasks_per_usd": res.completed / cost if cost > 0 else None, "cost_usd": cost,
            "gpu_s": gpu_s, "wasted_gpu_s": gpu_s * res.failed_task_tokens / res.ok_tokens if res.ok_tokens else 0.0,
            "requests_client": res.requests_client, "requests_served_replicas": served, "refused": res.refused,
            "refused_first_steps": res.refused_first,
            "by_tenant": {k: {"tasks": v[0], "completed": v[1], "on_time": v[1] / v[0] if v[0] else None,
                              "failed_by": res.why_failed.get(k, {})}
                          for k, v in sorted(res.by_tenant.items())},
            "picker_tasks": picker, "picker_rejected": rejected,
            # the daemon's /metrics against the bench's own figure for the same run (cost / tasks completed)
            "daemon_cost_per_success_usd": daemon_cost.get("tasks"),
            "bench_cost_per_success_usd": cost / res.completed if res.completed else None}


def _bill_alike(*runs: dict) -> None:
    """Bill the runs of one comparison for the same time (the longest of their walls): the fleet is the same and
    stands for the whole experiment, so a run whose tasks settled sooner is not cheaper for it."""
    billed = max(r["wall_s"] for r in runs)
    for r in runs:
        scale = billed / r["wall_s"] if r["wall_s"] else 1.0
        r["billed_s"] = billed
        r["cost_usd"] *= scale
        r["gpu_s"] *= scale
        r["tasks_per_usd"] = r["completed"] / r["cost_usd"] if r["cost_usd"] else None


def run_live(*, task_rate: float, duration_s: float, cap: int, budget: int, hold_s: float, think_s: float,
             slo_ttft_s: float, drain_s: float, length_scale: float, max_output: int, seed: int,
             tenants: bool, light_rate: float = 0.5, steps: bool = True) -> dict:
    from controller.sim.fleetspec import fleet_spec_from_scenario
    from controller.sim.scenario import load_scenario

    spec = fleet_spec_from_scenario(load_scenario(SCENARIO))
    prices = {p.name: p.usd_per_replica_hour for p in spec.pools}
    ctx, out = trace_lengths()
    common: dict[str, Any] = {"cap": cap, "budget": budget, "hold_s": hold_s, "think_s": think_s,
                              "slo_ttft_s": slo_ttft_s, "drain_s": drain_s, "prices": prices,
                              "gpus_per_replica": {p.name: p.gpus_per_replica for p in spec.pools}}
    rng = np.random.default_rng(seed)
    tasks = make_tasks(rng, task_rate, duration_s, "default", length_scale, ctx, out, max_output, "agent")
    res: dict[str, Any] = {"config": {"task_rate": task_rate, "duration_s": duration_s, "cap": cap, "budget": budget,
                                      "hold_s": hold_s, "think_s": think_s, "slo_ttft_s": slo_ttft_s,
                                      "length_scale": length_scale, "max_output": max_output, "seed": seed,
                                      "light_rate": light_rate}}
    if steps:
        aware = run_one(tasks, step_blind=False, fairness_id=True, **common)
        blind = run_one(tasks, step_blind=True, fairness_id=True, **common)
        _bill_alike(aware, blind)
        res |= {"step_aware": aware, "step_blind": blind,
                "tasks_per_usd_ratio": (aware["tasks_per_usd"] / blind["tasks_per_usd"]
                                        if aware["tasks_per_usd"] and blind["tasks_per_usd"] else None),
                "wasted_gpu_s_ratio": (aware["wasted_gpu_s"] / blind["wasted_gpu_s"]
                                       if blind["wasted_gpu_s"] else None)}
    if tenants:
        rng = np.random.default_rng(seed + 1)
        # heavy: five times light's tasks, twice as long: ten times its tokens
        light = make_tasks(rng, light_rate, duration_s, "light", length_scale, ctx, out, max_output, "light")
        heavy = make_tasks(rng, light_rate * 5, duration_s, "heavy", length_scale * 2, ctx, out, max_output,
                           "heavy")
        mixed = sorted(light + heavy, key=lambda t: t.at_s)
        fair = run_one(mixed, step_blind=False, fairness_id=True, **common)
        one_queue = run_one(mixed, step_blind=False, fairness_id=False, **common)
        _bill_alike(fair, one_queue)
        res["tenants_fair"], res["tenants_one_queue"] = fair, one_queue
    return res
