"""The saved bench results docs/BENCHMARKS.md is rendered from: what each is, how it is made, how it is kept.

Each `Source` is one file `docs/bench/<name>.json`: the JSON object one command printed, wrapped in
an envelope that says where it came from (`wrap`):

    {"name", "command", "commit", "dirty", "recorded_on", "machine": {"cpus", "cpu_model", "python",
     "load_average_1m"}, "wall_s", "trimmed", "result": <the command's JSON>}

`command` is the command as a user types it (`governor bench planner --ticks 60 --json`): `run`
executes it with this checkout's interpreter (`governor` is `python -m controller`), and `commit` is
the checkout's HEAD when it ran (`dirty` if the tree had changes). `trimmed` names what `keep` left
out of a large output (fields no table reads and the command reproduces), or is None.

A `recorded` source is not run: it holds figures measured once by hand (a third-party load generator
in its own venv, a run on other hardware) and transcribed with their command and commit; the doc marks
the tables made from it as such.
Must not: write anywhere but the results folder it is given (and the bench's own --out defaults).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
RESULTS_DIR = ROOT / "docs" / "bench"


class SourceError(ValueError):
    """A result missing, unreadable or not what its source promises; the message names the file."""


# bench all: what each policy's entry keeps (the report's headline figures); the rest of an entry (the
# capacity profile it was handed, request-level attainment, decision counts, the oracle's candidates) is in
# the <out>/<scenario>.json the command writes, and reproduced by rerunning it.
_POLICY_KEYS = ("cost_per_successful_task_usd", "cost_usd", "successful_tasks", "tasks", "slo_attainment",
                "gpu_hours", "ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s", "hit_rate", "shed", "failed",
                "retried", "scaling_actions", "replicas_peak", "crash_recovery", "per_tenant", "slo_met")


def _headline_fields(result: dict[str, Any]) -> dict[str, Any]:
    """bench all: each scenario's row without its timings, each policy's entry cut to `_POLICY_KEYS`."""
    out = dict(result)
    scenarios = {}
    for name, row in (result.get("scenarios") or {}).items():
        row = {k: v for k, v in row.items() if k != "timings_s"}
        row["policies"] = {p: {k: e[k] for k in _POLICY_KEYS if k in e}
                           for p, e in (row.get("policies") or {}).items()}
        scenarios[name] = row
    out["scenarios"] = scenarios
    return out


_CASE_KEYS = ("index", "shape", "fleet", "mix", "classes", "fault", "beyond_max", "feasible", "static_replicas",
              "static_slo_met", "oracle_slo_met", "error")
_CASE_POLICY_KEYS = ("pass", "slo_attainment", "cost_ratio_vs_static", "cost_ratio_vs_oracle")


def _slim_cases(result: dict[str, Any]) -> dict[str, Any]:
    """bench robustness: each case row keeps what it was (shape, fleet, mix, fault) and each policy's pass,
    attainment and cost ratios; the generator's full spec, the case file's path and the policies' other
    figures go (case K of seed S is rerun alone by `--case K --seed S`)."""
    out = dict(result)
    rows = []
    for r in result.get("cases_detail") or []:
        row = {k: r[k] for k in _CASE_KEYS if k in r}
        row["policies"] = {p: {k: e.get(k) for k in _CASE_POLICY_KEYS}
                           for p, e in (r.get("policies") or {}).items()}
        rows.append(row)
    out["cases_detail"] = rows
    for e in (out.get("policies") or {}).values():
        if isinstance(e.get("worst_case"), dict):
            e["worst_case"] = {k: v for k, v in e["worst_case"].items() if k != "scenario_file"}
    return out


_FRONTIER_CASE_KEYS = ("index", "family", "family_index", "shape", "fleet", "mix", "classes", "fault", "beyond_max",
                       "feasible", "static_replicas", "error")
_FRONTIER_ENTRY_KEYS = ("pass", "slo_attainment", "cost_ratio_vs_static", "good_requests", "gpu_s")


def _slim_frontier(result: dict[str, Any]) -> dict[str, Any]:
    """bench frontier: each case row keeps what it was and, per reference and per (policy, setting), the
    pass, attainment, cost ratio, good requests and GPU-seconds; the generator's spec, the file path and
    the other figures go (case K alone: --case K)."""
    out = dict(result)

    def slim(e: dict[str, Any]) -> dict[str, Any]:
        return {k: e.get(k) for k in _FRONTIER_ENTRY_KEYS}

    rows = []
    for r in result.get("cases_detail") or []:
        row = {k: r[k] for k in _FRONTIER_CASE_KEYS if k in r}
        row["references"] = {n: slim(e) for n, e in (r.get("references") or {}).items()}
        row["points"] = {p: {lab: slim(e) for lab, e in pts.items()} for p, pts in (r.get("points") or {}).items()}
        rows.append(row)
    out["cases_detail"] = rows
    return out


@dataclass(frozen=True)
class Source:
    """One saved result: its file name, the command that makes it, what its JSON must hold."""

    name: str
    command: str  # as a user types it; "governor …" runs as `python -m controller …`
    what: str  # one line for `governor bench report --list` and the doc's provenance lines
    minutes: float  # about how long `command` takes on the 2-core reference machine, for --list
    keys: tuple[str, ...] = ()  # top-level keys the result must have (a check that it is the right output)
    keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    trimmed: str | None = None  # what `keep` leaves out, said in the envelope
    summary_event: str | None = None  # the command prints JSON lines; the result is the line with this event
    recorded: bool = False  # transcribed figures, not run by `run`


SOURCES: tuple[Source, ...] = (
    Source("all", "governor bench all --out bench-out --json",
           "every policy, the verified static fleet and the oracle on the 28 shipped scenarios (= make bench)",
           40.0, keys=("scenarios", "wall_s", "workers", "tick_s"), keep=_headline_fields,
           trimmed="each scenario's timings_s; each policy's entry keeps its headline figures (cost, tasks, "
                   "attainment, GPU-hours, latency percentiles, hit rate, shed / failed / retried, scaling actions, "
                   "peak replicas, crash recovery, per tenant); the rest is in the <out>/<scenario>.json it writes"),
    Source("robustness-seed1",
           "governor bench robustness --cases 200 --seed 1 --policies mpc,hpa,oracle --quiet --json",
           "the MPC, HPA, the oracle, the verified static fleet and the capacity ceiling on 200 generated cases",
           35.0, keys=("policies", "cases", "feasible_cases", "cases_detail"), keep=_slim_cases,
           trimmed="each case row's generator spec and file path, and its policies' figures but the pass, the "
                   "attainment and the cost ratios (case K alone: --case K --seed 1)"),
    Source("frontier", "governor bench frontier --cases 40 --seed 1 --quiet --json",
           "every online policy at every setting of its knob and the MPC at each reliability setting, on 40 "
           "generated cases (20 of robustness's, 20 of the arena family)", 30.0,
           keys=("policies", "dominance", "references", "cases", "feasible_cases", "cases_detail"), keep=_slim_frontier,
           trimmed="each case row's generator spec and file path, and its entries' figures but the pass, the "
                   "attainment, the cost ratio, the good requests and the GPU-seconds (case K alone: --case K)"),
    Source("planner-budget", "taskset -c 0 governor bench planner --ticks 60 --budget-ms 200 --json",
           "the MPC's time per tick for 10 pools on one core, within the daemon's 200 ms wall budget", 1.0,
           keys=("cpu_p99_ms", "wall_p99_ms", "objective_gap_p90")),
    Source("planner-count", "taskset -c 0 governor bench planner --ticks 60 --json",
           "the same with the search by count (4,000 candidate rows), as the bench replays run it", 1.0,
           keys=("cpu_p99_ms", "objective_gap_p90")),
    *(Source(f"planner-scale-{n}",
             f"taskset -c 0 governor bench planner --pools {n} --ticks 40 --budget-ms {b} --clock cpu --json",
             f"the MPC on {n} pools in route groups on one core within a {b} ms CPU-time budget, against the "
             "complete search", m, keys=("cpu_p99_ms", "wall_p99_ms", "objective_gap_p90", "search_group_sizes"))
      for n, b, m in ((10, 200, 1.0), (40, 400, 2.0), (100, 1000, 6.0))),
    Source("tick-mpc-100",
           "governor bench tick --pools 100 --replicas 2000 --source prometheus --policy mpc --budget-ms 1000 "
           "--clock cpu --one-core --ticks 30 --json",
           "read + step + actuate for 2,000 replicas in 100 pools through a real Prometheus, under the MPC", 4.0,
           keys=("tick_p99_ms", "phases_p99_ms")),
    Source("tick-prometheus", "governor bench tick --source prometheus --json",
           "read + step + actuate for 200 replicas in 10 pools through a real Prometheus with the recording rules",
           1.5, keys=("tick_p99_ms", "phases_p99_ms")),
    Source("tick-scrape", "governor bench tick --json",
           "the same by direct scrape of 201 /metrics pages (sidecar mode)", 1.5,
           keys=("tick_p99_ms", "phases_p99_ms")),
    Source("models", "governor bench models --json",
           "the learned models' accuracy on held-out windows, fit and bulk-predict time, the forecaster", 3.0,
           keys=("ttft_p95_mape", "tpot_p95_mape", "hit_rate_mae")),
    Source("dataplane", "governor bench dataplane --json",
           "Envoy + governor picker on loopback at 500 req/s: shares, pick latency, added latency", 1.0,
           keys=("share_error_max",)),
    Source("tasks-hostile", "governor bench tasks --json",
           "the picker's task book under a million distinct task ids and bad headers: decision time, memory", 1.5,
           keys=("hostile",)),
    Source("tasks-live",
           "governor bench tasks --skip-hostile --live --task-rate 6 --duration 30 --drain 40 --json",
           "agentic tasks through Envoy and the picker beyond a static fleet: step-aware vs step-blind, two tenants",
           6.0, keys=("live",)),
    Source("tasks-sim", "governor bench tasks --skip-hostile --sim --json",
           "step-aware vs step-blind admission in the simulator: agentic tasks beyond a pinned fleet, 3 loads x 3 "
           "seeds", 0.3, keys=("sim",)),
    Source("tasks-sim-mpc",
           "governor bench tasks --skip-hostile --sim-mpc --sim-seeds 11,12,13 --sim-loads 1,1.5,2 --json",
           "the MPC in the loop on the measured step profile vs the static steps-per-task weight: agentic tasks "
           "beyond a pinned fleet, 3 loads x 3 held-out seeds", 1.5, keys=("sim_mpc",)),
    Source("api-load", "governor bench api-load --json",
           "1,000 status/list + 50 override RPCs per second for 60 s while ticking, the picker beside it "
           "(= make loadtest)", 2.0, keys=("read_rps", "errors", "tick_overruns")),
    Source("sim-speed-azure-conv-rate1",
           "governor bench sim-speed --scenario scenarios/azure-conv.yaml --rate-scale 1 --json",
           "the simulator on the Azure conversation trace at its own rate, 16 replicas", 0.2,
           keys=("speedup", "peak_rss_mb")),
    Source("sim-speed-mooncake-conv", "governor bench sim-speed --scenario scenarios/mooncake-conv.yaml --json",
           "the simulator on the Mooncake conversations with prefix caching, 16 replicas", 0.2,
           keys=("speedup", "peak_rss_mb")),
    Source("sim-speed-azure-conv", "governor bench sim-speed --scenario scenarios/azure-conv.yaml --json",
           "the simulator on azure-conv as shipped (rate x4.5), 16 replicas", 0.5, keys=("speedup", "peak_rss_mb")),
    Source("roofline", "python -m controller.perf.roofline --json",
           "the roofline prior's sustainable rate against the calibrated model's on the calibrated pairs", 0.1,
           keys=("rows",)),
    Source("demo-live-mpc", "governor run --demo --for 120 --headless",
           "the demo as make run runs it (real time, 3 s tick), the MPC; its closing summary", 2.5,
           keys=("slo_attainment",), summary_event="summary"),
    Source("demo-live-slo-feedback", "governor run --demo --for 120 --headless --policy slo-feedback",
           "the same demo under slo-feedback", 2.5, keys=("slo_attainment",), summary_event="summary"),
    Source("demo-live-recorded", "governor run --demo --for 120 --headless [--policy slo-feedback]",
           "the live demo when the MPC became its policy, the MPC and slo-feedback, one run each (figures "
           "transcribed)", 5.0,
           keys=("runs",), recorded=True),
    Source("aiperf", "tools/loadgen/with_dataplane.py -- aiperf profile … (tools/loadgen/README.md)",
           "NVIDIA aiperf 0.13.0 through Envoy and the picker, four runs (figures transcribed)", 6.0,
           keys=("runs",), recorded=True),
)


def by_name() -> dict[str, Source]:
    return {s.name: s for s in SOURCES}


def select(names: str) -> list[Source]:
    """'all' (every source that runs) or a comma-separated list of names; SourceError names an unknown one."""
    known = by_name()
    if names.strip() == "all":
        return [s for s in SOURCES if not s.recorded]
    picked = []
    for n in (x.strip() for x in names.split(",") if x.strip()):
        if n not in known:
            raise SourceError(f"unknown result {n!r}; known: {', '.join(known)}")
        if known[n].recorded:
            raise SourceError(f"{n} holds figures measured by hand ({known[n].command}); it is not run")
        picked.append(known[n])
    if not picked:
        raise SourceError("no result named")
    return picked


def result_path(name: str, folder: Path = RESULTS_DIR) -> Path:
    return folder / f"{name}.json"


def load(name: str, folder: Path = RESULTS_DIR) -> dict[str, Any]:
    """The saved envelope of `name`; SourceError if it is missing or not a valid envelope."""
    path = result_path(name, folder)
    try:
        env = json.loads(path.read_text())
    except FileNotFoundError:
        raise SourceError(f"{path}: missing (make it with `governor bench report --run {name}`)") from None
    except (OSError, ValueError) as exc:
        raise SourceError(f"{path}: not readable JSON ({exc})") from None
    check_envelope(env, name, path)
    return env


def check_envelope(env: Any, name: str, path: Path | str) -> None:
    if not isinstance(env, dict):
        raise SourceError(f"{path}: expected a JSON object")
    for k in ("name", "command", "commit", "result"):
        if k not in env:
            raise SourceError(f"{path}: no {k!r} (every saved result says what made it)")
    if env["name"] != name:
        raise SourceError(f"{path}: holds {env['name']!r}, expected {name!r}")
    src = by_name().get(name)
    if src is None:
        raise SourceError(f"{path}: no source named {name!r} in controller/bench/benchdoc/sources.py")
    missing = [k for k in src.keys if k not in env["result"]]
    if missing:
        raise SourceError(f"{path}: the result lacks {', '.join(missing)} (is it the output of `{src.command}`?)")


def git_head(repo: Path = ROOT) -> tuple[str, bool]:
    """(HEAD's full hash, whether tracked files differ from it); ('unknown', True) outside a checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, check=True, timeout=30).stdout.strip() != ""
    except (OSError, subprocess.SubprocessError):
        return "unknown", True
    return head, dirty


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _load_average() -> float | None:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "cpu_model": _cpu_model(), "python": platform.python_version(),
            "load_average_1m": _load_average()}


def wrap(src: Source, result: Mapping[str, Any], *, commit: str, dirty: bool, wall_s: float | None,
         recorded_on: str | None = None, machine_info: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The envelope saved for `src` around the command's JSON `result` (trimmed by `src.keep`)."""
    body = src.keep(dict(result)) if src.keep else dict(result)
    return {"name": src.name, "command": src.command, "commit": commit, "dirty": dirty,
            "recorded_on": recorded_on or _dt.date.today().isoformat(),
            "machine": dict(machine_info) if machine_info is not None else machine(),
            "wall_s": None if wall_s is None else round(wall_s, 1),
            "trimmed": src.trimmed if src.keep else None, "result": body}


def argv_of(command: str, python: str = sys.executable) -> list[str]:
    """The argv that runs `command` here: `governor` → this interpreter's `-m controller`, `python` → this
    interpreter; a `taskset` prefix is dropped where taskset is missing."""
    words = shlex.split(command)
    prefix: list[str] = []
    if words[:1] == ["taskset"]:  # taskset -c CPUS COMMAND...
        prefix, words = words[:3], words[3:]
        if shutil.which("taskset") is None:
            prefix = []
    if words[:1] == ["governor"]:
        words = [python, "-m", "controller", *words[1:]]
    elif words[:1] == ["python"]:
        words = [python, *words[1:]]
    return prefix + words


def parse_output(src: Source, stdout: str) -> dict[str, Any]:
    """The command's JSON: the one object it printed, or with `summary_event` the line carrying that event."""
    if src.summary_event is None:
        try:
            obj = json.loads(stdout)
        except ValueError as exc:
            raise SourceError(f"{src.name}: `{src.command}` did not print one JSON object ({exc})") from None
        if not isinstance(obj, dict):
            raise SourceError(f"{src.name}: `{src.command}` printed JSON that is not an object")
        return obj
    for line in reversed(stdout.splitlines()):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("event") == src.summary_event:
            return {k: v for k, v in obj.items() if k != "event"}
    raise SourceError(f"{src.name}: `{src.command}` printed no {src.summary_event!r} line")


def run(src: Source, *, repo: Path = ROOT, folder: Path = RESULTS_DIR, commit: str | None = None,
        head: tuple[str, bool] | None = None,
        log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> Path:
    """Run `src.command` in `repo`, save its JSON in its envelope, return the file written.

    `repo` is a checkout (its HEAD is the commit recorded, or `head`: `git_head` taken by the caller before
    a list of runs) or, with `commit`, an export of that commit (`git archive`), for running an older
    commit's bench with this one's renderer."""
    if src.recorded:
        raise SourceError(f"{src.name} holds figures measured by hand; it is not run")
    argv = argv_of(src.command)
    commit, dirty = (commit, False) if commit else (head if head is not None else git_head(repo))
    info = machine()
    log(f"{src.name}: {src.command} (about {src.minutes:g} min here)")
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=repo, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise SourceError(f"{src.name}: `{src.command}` exited {proc.returncode}: {tail}")
    result = parse_output(src, proc.stdout)
    env = wrap(src, result, commit=commit, dirty=dirty, wall_s=wall, machine_info=info)
    return save(env, folder)


def import_output(src: Source, file: Path, *, commit: str, dirty: bool = False, wall_s: float | None = None,
                  recorded_on: str | None = None, machine_info: Mapping[str, Any] | None = None,
                  ran_as: str | None = None, folder: Path = RESULTS_DIR) -> Path:
    """Save the output of `src.command` someone already ran (`file`), at `commit`; `ran_as` is the command
    line as it was typed when it differs from `src.command` only in where it wrote its files (`--out`)."""
    try:
        text = file.read_text()
    except OSError as exc:
        raise SourceError(f"{file}: cannot read ({exc})") from None
    result = parse_output(src, text)
    env = wrap(src, result, commit=commit, dirty=dirty, wall_s=wall_s, recorded_on=recorded_on,
               machine_info=machine_info or {"cpus": None, "cpu_model": None, "python": None,
                                             "load_average_1m": None})
    if ran_as:
        env["ran_as"] = ran_as
    return save(env, folder)


def dumps(value: Any, depth: int = 0, fold_at: int = 5) -> str:
    """JSON, sorted, one key per line down to `fold_at` levels and one line per value below (a policy's
    entry, a case's row): readable diffs without a line per number."""
    if depth >= fold_at or not isinstance(value, (dict, list)) or not value:
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, list):
        return "[\n" + ",\n".join(inner + dumps(v, depth + 1, fold_at) for v in value) + "\n" + pad + "]"
    items = sorted(value.items())
    return "{\n" + ",\n".join(f"{inner}{json.dumps(k, ensure_ascii=False)}: {dumps(v, depth + 1, fold_at)}"
                               for k, v in items) + "\n" + pad + "}"


def save(env: Mapping[str, Any], folder: Path = RESULTS_DIR) -> Path:
    check_envelope(env, str(env.get("name")), f"{env.get('name')} (not yet saved)")
    folder.mkdir(parents=True, exist_ok=True)
    path = result_path(str(env["name"]), folder)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(dumps(env) + "\n")
    tmp.replace(path)
    return path


def describe(names: Sequence[str] | None = None, folder: Path = RESULTS_DIR) -> list[dict[str, Any]]:
    """Each source with its command, estimate and the saved file's commit (or None when missing)."""
    out = []
    for s in SOURCES:
        if names is not None and s.name not in names:
            continue
        path = result_path(s.name, folder)
        saved: dict[str, Any] | None = None
        if path.is_file():
            try:
                env = json.loads(path.read_text())
                saved = {"commit": env.get("commit"), "recorded_on": env.get("recorded_on")}
            except ValueError:
                saved = {"error": "unreadable"}
        out.append({"name": s.name, "command": s.command, "what": s.what, "minutes": s.minutes,
                    "recorded": s.recorded, "file": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT)
                    else str(path), "saved": saved})
    return out
