"""`governor record --scenario` and `governor fit --defaults`: the learning commands whose data the
simulator makes. This side drives the simulator; the fitting and the files are the learning edge's
(controller/learning/cli.py), which never imports the simulator.

    governor record --scenario scenarios/mooncake-conv.yaml --for 1800 --out runs/mooncake.jsonl
    governor fit --defaults            (what `make models` runs: the shipped priors, from the shared traces)

Progress goes to stderr; the last line on stdout is a one-line summary. Exit codes: 0 ok, 2 bad
input (the message names the file, line and field).

Must not: be imported by the daemon.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np

from controller.learning.cli import (
    check_record_args,
    error,
    fit_shipped_coupling,
    fit_shipped_forecaster,
    progress,
)
from controller.learning.records import dumps, header_dict, record_to_dict
from controller.learning.store import ModelStore, clean_json

# what the shipped default forecaster is fitted on (servegen_default_arrivals)
DEFAULT_FORECAST_SOURCE = "servegen_14day_rates.csv m-small day 0-1.5 (arrivals, 60 s)"


def cmd_record(args) -> int:
    """`governor record --scenario`: simulate the scenario in-process (virtual clock) and record it."""
    msg = check_record_args(args)
    if msg is not None:
        return error(msg)
    return _record_sim(args, Path(args.out))


def _record_sim(args, out: Path) -> int:
    from controller.bench.recordings import SimRecorder
    from controller.learning.physics import physics_for_scenario_pool
    from controller.sim.fleet import Fleet
    from controller.sim.scenario import ScenarioError, load_scenario

    try:
        sc = load_scenario(args.scenario)
        fleet = Fleet(sc, seed=args.seed, record_requests=True)  # send times: the reuse profile
        physics = {p.name: physics_for_scenario_pool(p) for p in sc.pools}
    except (ScenarioError, ValueError) as exc:
        return error(f"record: {exc}")
    window_s = 60.0
    rec = SimRecorder(fleet, window_s=window_s)
    stop = args.for_s if args.for_s is not None else math.inf
    header = header_dict(physics, window_s=window_s, tick_s=args.tick, source=f"sim:{args.scenario}",
                         meta={"scenario": sc.name, "seed": fleet.seed})
    n = 0
    t = 0.0
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w") as f:
        f.write(dumps(header) + "\n")
        while not fleet.done and t + args.tick <= stop + 1e-9:
            t += args.tick
            fleet.run_until(t)
            f.write(dumps(record_to_dict(rec.read(t))) + "\n")
            n += 1
            if n % 40 == 0:
                progress(f"record: {t:.0f} simulated s, {n} ticks")
    tmp.replace(out)
    print(json.dumps({"out": str(out), "ticks": n, "simulated_s": t, "scenario": sc.name}))
    return 0


def servegen_default_arrivals(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(bin centres s, arrivals/s): ServeGen m-small arrivals over 1.5 days in 60 s bins, drawn
    from the shared 14-day rate shape (the shipped default forecaster's training series)."""
    from controller.paths import shared_data_dir
    from controller.sim.scenario import ServeGenSpec
    from controller.sim.trace_servegen import read_servegen_rates, servegen_arrivals

    rates = read_servegen_rates(shared_data_dir() / "traces" / "servegen_14day_rates.csv")
    tr = servegen_arrivals(rates, ServeGenSpec(tier="m-small", mean_rps=2.0, days=1.5, start_day=0.0),
                           np.random.default_rng(seed))
    edges = np.arange(0.0, tr.arrival_s[-1] + 60.0, 60.0)
    counts = np.histogram(tr.arrival_s, bins=edges)[0] / 60.0
    return edges[:-1] + 30.0, counts


def cmd_fit_defaults(args) -> int:
    """`governor fit --defaults`: record the default suite in the simulator, fit the shipped priors."""
    store = ModelStore(args.out)
    if args.files:
        return error("fit: give recordings or --defaults, not both")
    return _fit_defaults(store, args.seed)


def _fit_defaults(store: ModelStore, seed: int) -> int:
    from controller.bench.recordings import default_suite, record_cached

    t0 = time.perf_counter()
    train_specs, test_specs = default_suite(seed)
    progress(f"fit --defaults: {len(train_specs)} training and {len(test_specs)} test runs of the simulator")
    recs = record_cached(list(train_specs) + list(test_specs), os.environ.get("GOVERNOR_RECORDING_CACHE"),
                         progress=progress)
    train_recs, test_recs = recs[: len(train_specs)], recs[len(train_specs):]
    errors = fit_shipped_coupling(store, train_recs, test_recs, seed)
    t_s, arrivals_rps = servegen_default_arrivals(seed)
    fit_shipped_forecaster(store, t_s, arrivals_rps, source=DEFAULT_FORECAST_SOURCE, seed=seed)
    out = {"out": str(store.dir), "fit_seconds": round(time.perf_counter() - t0, 1),
           "holdout": {k: v for k, v in errors.items() if k.endswith(("_mape", "_mae"))}}
    print(json.dumps(clean_json(out)))
    return 0
