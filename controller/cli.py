"""The `governor` command line: argument parsing and dispatch only.

Each command's work lives in the package that owns it; the handler is imported
only when its command runs, so `governor --help` stays fast and a command's
heavy dependencies load only when needed. Handlers take the parsed arguments
and return a process exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from controller import __version__
from controller.names import POLICY_NAMES, PROFILES

EPILOG = """\
examples:
  governor run --demo                       simulated fleet + daemon + live view
  governor run --config governor.yaml       the daemon against a real fleet
  governor config validate governor.yaml    check a config file
  governor sim scenarios/azure-conv.yaml    serve a simulated fleet on loopback
  governor bench policies --scenario scenarios/azure-conv.yaml
  governor status                           ask a running daemon what it is doing
  governor explain d-00000042               why was that decision made?
"""


JSON_HELP = "print exactly one JSON object on stdout (progress and logs go to stderr)"


def _handler(target: str):
    module, func = target.split(":")

    def run(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(module), func)(args)

    return run


def _by_flag(flag: str, when_set: str, otherwise: str):
    """A handler that picks its target by one argument: the simulated side of a learning command
    (`record --scenario`, `fit --defaults`) is a bench driver's, the rest the learning edge's."""
    on, off = _handler(when_set), _handler(otherwise)

    def run(args: argparse.Namespace) -> int:
        return (on if getattr(args, flag) else off)(args)

    return run


def _api_client_args(p: argparse.ArgumentParser, *, again: bool = False) -> None:
    """The connection flags of an operator command. `again`: the same flags on a sub-action (`override set
    ... --api X`), defaulting to SUPPRESS so that a flag given before the action is not reset."""
    def d(value: object) -> object:
        return argparse.SUPPRESS if again else value

    p.add_argument("--api", default=d(None),
                   help="PolicyService address host:port (default: from --config, else 127.0.0.1:50051)")
    p.add_argument("--config", default=d(None), help="daemon config file, to find the API address and token")
    p.add_argument("--token", default=d(None), help="bearer token (default: $GOVERNOR_API_TOKEN or the config's)")
    p.add_argument("--json", action="store_true", default=d(False), help="print JSON instead of text")
    p.add_argument("--tls-ca", default=d(None), metavar="FILE",
                   help="connect over TLS, verifying the daemon's certificate with this CA bundle "
                   "(TLS is also used, with the system's roots, when the --config file sets api.tls.cert)")
    p.add_argument("--tls-cert", default=d(None), metavar="FILE",
                   help="client certificate, when the daemon requires mTLS")
    p.add_argument("--tls-key", default=d(None), metavar="FILE", help="client private key (with --tls-cert)")
    p.add_argument("--tls-server-name", default=d(None), metavar="NAME",
                   help="name to check in the daemon's certificate instead of the address' host")


def _case_selection(b: argparse.ArgumentParser) -> None:
    """The options that pick generated cases (bench robustness, bench frontier: controller/bench/robustness.py
    case_options checks them)."""
    b.add_argument("--cases", type=int, default=40, help="number of generated cases, 0..N-1 (default 40)")
    b.add_argument("--case", type=int, default=None, metavar="K",
                   help="run only case K of the family (reproduces its row of a larger run)")
    b.add_argument("--seed", type=int, default=1, help="seed of the case family (default 1)")


def _case_running(b: argparse.ArgumentParser) -> None:
    """How generated cases are run and reported (bench robustness, bench frontier)."""
    b.add_argument("--workers", type=int, default=2, help="worker processes (default 2; results do not depend on it)")
    b.add_argument("--tick", dest="tick_s", type=float, default=None, metavar="SECONDS",
                   help="control-loop tick of every replay, simulated seconds (default 15, the daemon's)")
    b.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    b.add_argument("--json", action="store_true", help=JSON_HELP)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="governor",
        description="Governor: a control plane for LLM inference fleets. It reads fleet telemetry, "
        "decides replicas, routing, batching and admission every tick, and sends the decisions over gRPC.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"governor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    # ---- run
    p = sub.add_parser("run", help="run the daemon (or the embedded demo with --demo)",
                       description="Run the Governor daemon: read telemetry, decide every tick, actuate.")
    p.add_argument("--config", default=None, help="YAML config file (see deploy/governor.example.yaml)")
    p.add_argument("--demo", action="store_true", help="start a small simulated fleet on loopback and govern it")
    p.add_argument("--for", dest="for_s", type=float, default=None, metavar="SECONDS",
                   help="stop after SECONDS (wall time)")
    p.add_argument("--once", action="store_true", help="run one tick and exit")
    p.add_argument("--mode", choices=["active", "shadow", "paused"], default=None, help="override the configured mode")
    p.add_argument("--policy", default=None, metavar="NAME",
                   help=f"override the configured policy ({', '.join(POLICY_NAMES)}); the demo runs mpc, e.g. "
                        "`--demo --policy slo-feedback` to compare")
    p.add_argument("--headless", action="store_true", help="print JSON lines instead of the live view")
    p.add_argument("--dataplane", choices=["envoy"], default=None,
                   help="with --demo: send the demo's traffic through Envoy and `governor picker` to replicas that "
                        "serve the OpenAI API; Governor actuates the picker")
    p.set_defaults(func=_handler("controller.runtime.main:cmd_run"))

    # ---- sim
    p = sub.add_parser("sim", help="serve a simulated fleet on loopback (metrics + control gRPC)",
                       description="Run a scenario in real time (or faster) and serve /metrics per replica, "
                       "per node and for the router, plus RouterControl and AutoscalerControl over gRPC.")
    p.add_argument("scenario", help="scenario YAML file (see scenarios/ and docs/SIMULATOR.md)")
    p.add_argument("--for", dest="for_s", type=float, default=None, metavar="SECONDS",
                   help="stop after SECONDS of wall time")
    p.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall second (default 1)")
    p.add_argument("--host", default="127.0.0.1", help="loopback address to listen on")
    p.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    p.add_argument("--step-wall", type=float, default=0.05, metavar="SECONDS",
                   help="wall seconds between advances of the simulated clock, (0, 0.1] (default 0.05); the "
                        "replicas' HTTP API answers at this granularity")
    p.set_defaults(func=_handler("controller.sim.live:cmd_sim"))

    # ---- data plane
    p = sub.add_parser("picker", help="endpoint picker for Envoy's ext_proc that applies Governor's routing policy",
                       description="Serve Envoy's ext_proc (pick a replica per request: traffic weights, prefix "
                       "affinity, in-flight caps, per-class admission) and RouterControl for Governor.")
    from controller.dataplane.cli import add_arguments as _picker_args

    _picker_args(p)
    p.set_defaults(func=_handler("controller.dataplane.cli:cmd_picker"))
    p = sub.add_parser("replay", help="replay a trace against an OpenAI-compatible URL (bounded; client TTFT/TPOT)",
                       description="Send a trace's requests at their arrival times to URL (streaming), bounded in "
                       "concurrency, requests and time; print one JSON summary line.")
    from controller.dataplane.cli import add_replay_arguments

    add_replay_arguments(p)
    p.set_defaults(func=_handler("controller.dataplane.replay:cmd_replay"))

    # ---- bench
    p = sub.add_parser("bench", help="benchmarks: simulator speed, policies side by side, models, tick overhead")
    bsub = p.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    b = bsub.add_parser("sim-speed", help="simulated seconds per wall second and peak memory")
    b.add_argument("--scenario", required=True, help="scenario YAML file (see scenarios/)")
    b.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    b.add_argument("--rate-scale", type=float, default=None,
                   help="replace the scenario's trace.rate_scale (e.g. 1 for the trace's own rate)")
    b.add_argument("--json", action="store_true", help=JSON_HELP)
    b.set_defaults(func=_handler("controller.bench.sim_speed:cmd_bench_sim_speed"))
    b = bsub.add_parser("dataplane", help="Envoy + governor picker on loopback: pool shares, pick latency, "
                        "added latency, errors")
    b.add_argument("--rate", type=float, default=500.0, help="requests per second, open loop (default 500)")
    b.add_argument("--requests", type=int, default=3000, help="requests per phase (direct, through Envoy)")
    b.add_argument("--weights", default="0.7,0.3", help="traffic weights of the two pools (default 0.7,0.3)")
    b.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS", help="bound on the whole run")
    b.add_argument("--json", action="store_true", help=JSON_HELP)
    b.set_defaults(func=_handler("controller.bench.dataplane:cmd_bench_dataplane"))
    b = bsub.add_parser("tasks", help="the picker's task book under hostile ids: decision time per request, memory "
                        "bounded (a million distinct task ids, headers that break the convention)")
    b.add_argument("--requests", type=int, default=1_000_000, help="hostile requests, each a new task id")
    b.add_argument("--tenants", type=int, default=10_000, help="distinct tenant ids among them")
    b.add_argument("--bad-every", type=int, default=100,
                   help="one request in this many breaks the header convention (0 = none)")
    b.add_argument("--max-tasks", type=int, default=100_000, help="the picker's --max-tasks")
    b.add_argument("--max-tenants", type=int, default=64, help="the picker's --max-tenants")
    b.add_argument("--seed", type=int, default=0, help="seed of the ids (and of the live run's arrivals)")
    b.add_argument("--live", action="store_true",
                   help="also agentic tasks through Envoy and the picker beyond a static fleet's capacity: step-aware "
                        "vs step-blind admission, then two tenants (one sending 10x the other's tokens)")
    b.add_argument("--sim", action="store_true",
                   help="also step-aware vs step-blind admission inside the simulator: the agentic scenario pinned at "
                        "--sim-replicas per pool beyond its capacity, the same arrivals both ways")
    b.add_argument("--sim-mpc", action="store_true",
                   help="also the MPC in the loop at the same pinned fleet: planning on the step profile measured from "
                        "the simulator's tasks (it turns step-aware admission on where it predicts shedding) vs on the "
                        "static steps-per-task weight; the same --sim-* options")
    b.add_argument("--sim-scenario", default="scenarios/agentic.yaml", help="sim: the scenario")
    b.add_argument("--sim-replicas", type=int, default=2, help="sim: replicas per pool, fixed (default 2)")
    b.add_argument("--sim-loads", default="0.6,1,1.5",
                   help="sim: multipliers of the scenario's arrival rate, comma-separated (default 0.6,1,1.5)")
    b.add_argument("--sim-seeds", default="1,2,3", help="sim: seeds, comma-separated (default 1,2,3)")
    b.add_argument("--sim-duration", type=float, default=600.0, metavar="SECONDS",
                   help="sim: seconds of the trace (default 600)")
    b.add_argument("--skip-hostile", action="store_true", help="only the --live / --sim / --sim-mpc parts")
    b.add_argument("--task-rate", type=float, default=1.5, help="live: tasks per second (default 1.5)")
    b.add_argument("--duration", type=float, default=60.0, metavar="SECONDS", help="live: arrivals for this long")
    b.add_argument("--drain", type=float, default=60.0, metavar="SECONDS",
                   help="live: at most this long after the last arrival for tasks under way")
    b.add_argument("--cap", type=int, default=4, help="live and sim: in-flight cap per replica (default 4)")
    b.add_argument("--budget", type=int, default=16,
                   help="live: the standard class's queue budget; sim: standard's and sheddable's (default 16)")
    b.add_argument("--hold-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="live and sim: the router's hold timeout (default 10)")
    b.add_argument("--think", type=float, default=1.0, metavar="SECONDS", help="live: time between a task's steps")
    b.add_argument("--slo-ttft", type=float, default=10.0, metavar="SECONDS", help="live: a step's TTFT bound")
    b.add_argument("--length-scale", type=float, default=1.0, help="live: scale the trace's context lengths")
    b.add_argument("--max-output", type=int, default=128, help="live: cap a step's output tokens")
    b.add_argument("--no-tenants", action="store_true", help="live: skip the two-tenant runs")
    b.add_argument("--tenants-only", action="store_true", help="live: only the two-tenant runs")
    b.add_argument("--light-rate", type=float, default=0.5,
                   help="live: the light tenant's tasks per second (the heavy one sends 5x the tasks, 2x as long)")
    b.add_argument("--json", action="store_true", help=JSON_HELP)
    b.set_defaults(func=_handler("controller.bench.tasks:cmd_bench_tasks"))
    b = bsub.add_parser("api-load", help="the PolicyService under load while the daemon ticks, the picker beside "
                        "it: latency per RPC, errors, tick overruns (make loadtest)")
    b.add_argument("--duration", type=float, default=60.0, metavar="SECONDS", help="load window (default 60)")
    b.add_argument("--rps", type=float, default=1000.0, help="status/list calls per second (default 1000)")
    b.add_argument("--write-rps", type=float, default=50.0,
                   help="override changes per second, set then clear (default 50)")
    b.add_argument("--picker-rate", type=float, default=500.0,
                   help="requests per second through Envoy and the picker meanwhile (default 500, the dataplane "
                        "bench's rate; 0 = no picker)")
    b.add_argument("--json", action="store_true", help=JSON_HELP)
    b.set_defaults(func=_handler("controller.bench.api_load:cmd_bench_api_load"))
    b = bsub.add_parser("policies", help="replay a scenario once per policy and compare")
    b.add_argument("--scenario", required=True, help="scenario YAML file (see scenarios/)")
    b.add_argument("--policies", default=None,
                   help="comma-separated policy names (default: every baseline and its variants, mpc and the "
                        "oracle; mpc-learned, the MPC on the learned models, and ceiling, every pool at its maximum "
                        "with the sheddable class shed, only when named)")
    seeds = b.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=int, default=None, help="override the scenario's seed (arrivals, routing draws)")
    seeds.add_argument("--seeds", default=None, metavar="LIST",
                       help="comma-separated seeds, e.g. 1,2,3: replay every policy once per seed and summarise how "
                            "each policy's figures spread across them (per-seed reports are written too)")
    b.add_argument("--out", default=None, help="directory for the JSON and PNG (default bench-out/)")
    b.add_argument("--tick", dest="tick_s", type=float, default=None, metavar="SECONDS",
                   help="control-loop tick of every replay, simulated seconds (default 15, the daemon's)")
    b.add_argument("--ablate", action="store_true",
                   help="also replay the MPC once per lever (affinity, in-flight cap, traffic split, standby, "
                        "batch caps, admission) with that lever held: the JSON's lever_ablation says how much of "
                        "the MPC's gain each lever carries")
    b.add_argument("--profile", default="balanced", choices=PROFILES,
                   help="objective profile every replay runs under, as the daemon's `profile` (only the MPC "
                        "reads it; default balanced)")
    b.add_argument("--json", action="store_true", help=JSON_HELP)
    b.set_defaults(func=_handler("controller.bench.side_by_side:cmd_bench_policies"))
    b = bsub.add_parser("compare", help="are two bench runs' results the same, wall times aside? (exit 1 if not)")
    b.add_argument("old", help="--out folder (or JSON report) of the earlier run")
    b.add_argument("new", help="--out folder (or JSON report) of the later run")
    b.add_argument("--rel-tol", type=float, default=0.0, metavar="FRAC",
                   help="relative tolerance for floats (default 0: exact)")
    b.add_argument("--max-diffs", type=int, default=20, metavar="N", help="differences listed per report (default 20)")
    b.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    b.set_defaults(func=_handler("controller.bench.compare:cmd_bench_compare"))
    b = bsub.add_parser("oracle-lag", help="the hindsight oracle's schedule replayed late: how much of its lead is "
                                           "foresight no online policy has")
    b.add_argument("--scenario", required=True, help="scenario YAML file (see scenarios/)")
    b.add_argument("--seed", type=int, default=None, help="override the scenario's seed (arrivals, routing draws)")
    b.add_argument("--lags", default="0,15,30,60", metavar="LIST",
                   help="comma-separated delays, simulated seconds (0-600), each applied to every change of the "
                        "oracle's schedule (default 0,15,30,60)")
    b.add_argument("--holds", default="0,2,4", metavar="LIST",
                   help="comma-separated extra 60 s windows (0-30) each schedule level is held, the hedge a late "
                        "controller needs against the next burst (default 0,2,4)")
    b.add_argument("--extras", default="0,1", metavar="LIST",
                   help="comma-separated replicas (0-16) added to every window, the hedge against a ramp followed "
                        "late (default 0,1)")
    b.add_argument("--out", default=None, help="directory for the JSON (default bench-out/)")
    b.add_argument("--json", action="store_true", help=JSON_HELP)
    b.set_defaults(func=_handler("controller.bench.oracle_lag:cmd_bench_oracle_lag"))
    b = bsub.add_parser("tick", help="tick overhead (read + step + actuate) for a large fleet")
    b.add_argument("--pools", type=int, default=10, help="pools in the synthetic fleet (default 10)")
    b.add_argument("--replicas", type=int, default=200, help="replicas across the pools (default 200)")
    b.add_argument("--ticks", type=int, default=200, help="ticks to time (default 200)")
    b.add_argument("--source", choices=["scrape", "prometheus"], default="scrape",
                   help="read the fleet by direct scrape (sidecar mode) or through a real Prometheus")
    b.add_argument("--no-recording-rules", action="store_true",
                   help="with --source prometheus: run the raw queries instead of reading Governor's recorded series")
    b.add_argument("--scrape-interval", type=float, default=10.0,
                   help="with --source prometheus: Prometheus' scrape and rule-evaluation interval, s (default 10)")
    b.add_argument("--policy", choices=["slo-feedback", "mpc"], default="slo-feedback",
                   help="the policy each tick steps: slo-feedback (default, cheap: the plumbing alone) or mpc (the "
                        "planner's search too, on the planner bench's fleet of regions and route groups)")
    b.add_argument("--budget-ms", type=float, default=None, metavar="MS",
                   help="with --policy mpc: the search's time budget per tick (default the policy's, 200 ms)")
    b.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="with --policy mpc: what the budget counts, wall time (the daemon's) or this thread's CPU time")
    b.add_argument("--one-core", action="store_true",
                   help="run the daemon's side (read, step, actuate) on one CPU, once the fleet's side (the /metrics "
                        "server, Prometheus) has started on any")
    b.add_argument("--json", action="store_true", help=JSON_HELP)
    b.set_defaults(func=_handler("controller.bench.tick:cmd_bench_tick"))
    b = bsub.add_parser("models", help="accuracy, fit time and bulk-predict time of the learned models")
    b.add_argument("--seed", type=int, default=0, help="seed of the recorded runs and the fits (default 0)")
    b.add_argument("--json", action="store_true", help=JSON_HELP)
    b.set_defaults(func=_handler("controller.bench.models:cmd_bench_models"))
    b = bsub.add_parser("planner", help="the MPC planner's time per tick and plan quality against the complete "
                                        "search, for a fleet of N pools in route groups, on one core")
    b.add_argument("--pools", default="10", metavar="N[,N...]",
                   help="pools in the planned fleet, regions of ten route groups (default 10); several counts, "
                        "comma-separated, run one after another (--json: {\"runs\": [...]})")
    b.add_argument("--ticks", type=int, default=120, help="ticks to time (default 120)")
    b.add_argument("--budget-ms", type=float, default=None, metavar="MS",
                   help="search within this time budget per tick, as the daemon does, and report how much worse "
                        "its plans score than the complete search (default: a fixed count of candidates, as the "
                        "bench replays do)")
    b.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="what --budget-ms counts: wall time (the daemon's default) or this thread's CPU time, which "
                        "a loaded machine does not eat into (default wall)")
    b.add_argument("--reference-every", type=int, default=None, metavar="K",
                   help="run the complete search every K ticks (default: every tick below 20 pools, else every 4th; "
                        "the output says when it is a sample)")
    b.add_argument("--json", action="store_true", help=JSON_HELP)
    b.set_defaults(func=_handler("controller.bench.planner:cmd_bench_planner"))
    b = bsub.add_parser("robustness", help="every policy on N generated cases (traffic shapes x shipped fleets x "
                                           "faults): SLO pass rate, worst case, cost against static and the oracle")
    _case_selection(b)
    b.add_argument("--policies", default=None,
                   help="comma-separated policy names (default: every registered policy, mpc when it builds, and "
                        "the oracle; static is always run, it is the cost reference, and so is the ceiling, every "
                        "pool at its maximum with the sheddable class shed: which cases are feasible at all)")
    b.add_argument("--out", default=None,
                   help="directory for the report, the plot and the generated cases (default bench-out/robustness)")
    _case_running(b)
    b.set_defaults(func=_handler("controller.bench.robustness:cmd_bench_robustness"))
    b = bsub.add_parser("frontier", help="every policy swept over its own knob on N generated cases: SLO pass rate "
                                         "against cost, one curve per policy, and where the MPC dominates",
                        description="Each policy is replayed at every setting of the knob its project documents "
                        "(HPA's target utilisation, KPA's target concurrency, slo-feedback's margin, the SLA "
                        "planner's and Dynamo's SLA targets, scorer-kpa's and AIBrix's KV target, llm-d's WVA "
                        "saturation thresholds, the MPC's reliability dial; controller/bench/frontier.py KNOBS) on "
                        "the generated cases of `bench robustness` and the Autoscaling Arena's traffic patterns, "
                        "against the verified static fleet and the capacity ceiling of each case.")
    _case_selection(b)
    b.add_argument("--family", default="all", choices=["all", "robustness", "arena"],
                   help="the cases: robustness's (its cases 0, 1, ...), arena (staircase, flash crowd, diurnal, "
                        "sinusoid slower than a cold start, ramps) or all (default: the two interleaved)")
    b.add_argument("--policies", default=None, metavar="LIST",
                   help="comma-separated policies, each optionally with some of its settings: hpa,kpa:20:70,mpc "
                        "(default: every policy at every setting; static and the ceiling are always run)")
    b.add_argument("--out", default=None,
                   help="directory for the report, the plot and the generated cases (default bench-out/frontier)")
    b.add_argument("--png", default=None, metavar="PATH",
                   help="where to draw the frontier (default OUT/frontier-seedS.png)")
    b.add_argument("--resume", action="store_true",
                   help="reuse the rows an interrupted run into the same --out saved for the same cases, settings, "
                        "tick and sources (OUT/rows/); without it every case is run")
    _case_running(b)
    b.set_defaults(func=_handler("controller.bench.frontier:cmd_bench_frontier"))
    b = bsub.add_parser("report", help="rewrite docs/BENCHMARKS.md's tables and plots from the saved results in "
                                       "docs/bench/ (--check: are they current? --run: rerun benches first)",
                        description="Each table of docs/BENCHMARKS.md (and README's figures) sits between "
                        "<!-- bench:NAME begin/end --> markers and is rendered from docs/bench/*.json, the saved "
                        "--json output of a bench command with the commit it ran at. Without options: rewrite "
                        "them and the plots. make benchmarks-doc = --run all (slow: every bench).")
    b.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 if a generated region differs from what the saved results render")
    b.add_argument("--run", default=None, metavar="LIST",
                   help="rerun these results' commands first and save them (comma-separated names from --list, or "
                        "all: about 90 minutes on 2 cores)")
    b.add_argument("--import", dest="import_name", default=None, metavar="NAME",
                   help="save the output of NAME's command that was run elsewhere (--file, --commit)")
    b.add_argument("--file", default=None, help="with --import: the file holding the command's stdout")
    b.add_argument("--commit", default=None, help="with --import: the commit the command ran at")
    b.add_argument("--wall-s", type=float, default=None, help="with --import: how long it ran, s (optional)")
    b.add_argument("--ran-as", default=None, metavar="COMMAND",
                   help="with --import: the command line as typed, if it differs only in its --out folder")
    b.add_argument("--list", action="store_true", help="list the saved results, their commands and commits")
    b.add_argument("--json", action="store_true", help=JSON_HELP)
    b.set_defaults(func=_handler("controller.bench.benchdoc.command:cmd_bench_report"))
    b = bsub.add_parser("all", help="every shipped scenario: sim speed and policies")
    b.add_argument("--out", default=None, help="directory for each scenario's JSON and PNG (default bench-out/)")
    b.add_argument("--json", action="store_true", help=JSON_HELP)
    b.set_defaults(func=_handler("controller.bench.all:cmd_bench_all"))

    # ---- config
    p = sub.add_parser("config", help="validate a config file or print its JSON schema")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    c = csub.add_parser("validate", help="exit 0 if FILE is valid, else name the bad field")
    c.add_argument("file", help="config YAML file")
    c.set_defaults(func=_handler("controller.runtime.preflight:cmd_validate"))
    c = csub.add_parser("schema", help="print the config's JSON schema")
    c.set_defaults(func=_handler("controller.config:cmd_schema"))

    # ---- reports
    p = sub.add_parser("report", help="render the control-loop dashboard's key panels to a PNG from Prometheus")
    p.add_argument("--prometheus", required=True, metavar="URL",
                   help="the Prometheus that scrapes the daemon's /metrics, e.g. http://prometheus:9090")
    p.add_argument("--from", dest="start", default="now-1h",
                   help="start: unix seconds, ISO 8601 (UTC unless an offset), or relative: now-1h (default), -30m")
    p.add_argument("--to", dest="end", default="now", help="end, in the same forms (default: now)")
    p.add_argument("--step", type=float, default=None, help="seconds between points (default: ~300 per series)")
    p.add_argument("--pool", default=".*", help="regex of the pools to show (the dashboard's $pool; default all)")
    p.add_argument("--scrape-interval", type=float, default=15.0,
                   help="the daemon's scrape interval in seconds, for rate windows (default 15)")
    p.add_argument("--out", default="governor-report.png", help="PNG to write; the panel list goes to OUT.json")
    p.set_defaults(func=_handler("controller.obs.report:cmd_report"))

    # ---- learned models
    p = sub.add_parser("record", help="record observations from a live or simulated fleet to a file (training data)")
    p.add_argument("--scenario", default=None, help="simulate this scenario in-process (virtual clock) and record it")
    p.add_argument("--config", default=None, help="record from the fleet a daemon config points at (wall clock)")
    p.add_argument("--for", dest="for_s", type=float, default=None, metavar="SECONDS", help="how long to record")
    p.add_argument("--tick", type=float, default=15.0, help="seconds between observations")
    p.add_argument("--seed", type=int, default=None, help="with --scenario: override the scenario's seed")
    p.add_argument("--out", required=True, help="output file (JSON lines)")
    p.set_defaults(func=_by_flag("scenario", "controller.bench.learning_cli:cmd_record",
                                  "controller.learning.cli:cmd_record"))
    p = sub.add_parser("fit", help="fit the learned models offline from recorded observations")
    p.add_argument("files", nargs="*", help="recordings made by `governor record`")
    p.add_argument("--defaults", action="store_true",
                   help="fit the shipped prior models on the shared traces (make models)")
    p.add_argument("--out", default="models", help="directory for the skops artifacts and manifests")
    p.add_argument("--seed", type=int, default=0, help="seed of the fits (and of the default recordings)")
    p.set_defaults(func=_by_flag("defaults", "controller.bench.learning_cli:cmd_fit_defaults",
                                  "controller.learning.cli:cmd_fit"))

    # ---- operator commands against a running daemon
    p = sub.add_parser("status", help="mode, last tick, health of sources and actuators, pools")
    _api_client_args(p)
    p.set_defaults(func=_handler("controller.api.client:cmd_status"))
    p = sub.add_parser("decisions", help="list recent decisions")
    _api_client_args(p)
    p.add_argument("--limit", type=int, default=20, help="at most this many, newest first (default 20)")
    p.add_argument("--pool", default="", help="only decisions that include this pool")
    p.add_argument("--since", default=None, help="Unix seconds or HH:MM (today, local time)")
    p.set_defaults(func=_handler("controller.api.client:cmd_decisions"))
    p = sub.add_parser("explain", help="explain one decision: inputs, predictions, constraints, overrides")
    _api_client_args(p)
    p.add_argument("decision_id", help="a decision id as `governor decisions` lists it, e.g. d-00000042")
    p.set_defaults(func=_handler("controller.api.client:cmd_explain"))
    p = sub.add_parser("override", help="set, list or delete operator overrides")
    _api_client_args(p)
    osub = p.add_subparsers(dest="override_command", metavar="ACTION", required=True)
    o = osub.add_parser("set", help="set an override with a TTL")
    o.add_argument("kind", choices=["pin", "min", "max", "freeze", "admission", "slo-ttft", "slo-tpot", "profile",
                                    "reliability", "tenant-rate", "tenant-inflight", "tenant-weight",
                                    "step-admission"],
                   help="pin/min/max: a pool's replicas; freeze: a pool as it is; admission: a class's shed "
                        "fraction; slo-ttft/slo-tpot: a class's SLO in seconds; profile: the objective's profile; "
                        "reliability: the MPC's dial, the probability (0.5-0.99) that demand through the longest "
                        "start-up stays within the capacity it plans (higher buys more replicas); "
                        "tenant-rate/tenant-inflight/tenant-weight: a tenant's requests per second (0 = unlimited), "
                        "requests in flight (0 = unlimited) or fair-share weight (> 0) at the router; "
                        "step-admission: aware (hold new tasks' first steps before later steps under pressure) or "
                        "blind")
    o.add_argument("--pool", default="", help="the pool (pin, min, max, freeze)")
    o.add_argument("--tenant", default="",
                   help="the tenant, its x-gateway-inference-fairness-id (tenant-*); * = every tenant not named")
    o.add_argument("--class", dest="priority_class", default="",
                   help="the priority class (admission, slo-ttft, slo-tpot)")
    o.add_argument("--value", default=None,
                   help="number (the profile name for 'profile', aware or blind for 'step-admission')")
    o.add_argument("--ttl", required=True, help="time to live, e.g. 900, 15m, 2h")
    o.add_argument("--author", default=None, help="who sets it (default: $USER)")
    o.add_argument("--reason", default="", help="why, for the audit log (shown by `governor override list`)")
    _api_client_args(o, again=True)
    o.set_defaults(func=_handler("controller.api.client:cmd_override_set"))
    o = osub.add_parser("list", help="list active overrides")
    _api_client_args(o, again=True)
    o.add_argument("--all", action="store_true", help="include expired ones")
    o.set_defaults(func=_handler("controller.api.client:cmd_override_list"))
    o = osub.add_parser("delete", help="delete an override by id")
    o.add_argument("override_id", help="an id as `governor override list` shows it")
    o.add_argument("--author", default=None, help="who deletes it (default: $USER)")
    _api_client_args(o, again=True)
    o.set_defaults(func=_handler("controller.api.client:cmd_override_delete"))
    p = sub.add_parser("mode", help="switch the daemon between active, shadow and paused")
    _api_client_args(p)
    p.add_argument("mode", choices=["active", "shadow", "paused"],
                   help="active: decide and actuate; shadow: decide and log, actuate nothing; paused: stop deciding "
                        "(actuators keep the last settings until their deadline)")
    p.add_argument("--author", default=None, help="who switches it (default: $USER)")
    p.add_argument("--reason", default="", help="why, for the audit log")
    p.set_defaults(func=_handler("controller.api.client:cmd_mode"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from controller.runtime.allocator import tune_allocator

    tune_allocator()  # the planner and bulk predicts allocate large temporaries every tick (see there)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
