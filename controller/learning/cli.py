"""`governor record --config` and `governor fit`: training data from a live fleet to a file, models from files.

    governor record --config governor.yaml --for 3600 --out runs/live.jsonl     (a live fleet, wall clock)
    governor fit runs/*.jsonl --out models/

The simulated side is a bench driver's (controller/bench/learning_cli.py): `governor record
--scenario` runs the simulator, and `governor fit --defaults` (what `make models` runs) records
simulated runs on the shared traces and hands them to `fit_shipped_coupling` and
`fit_shipped_forecaster` here.

Progress goes to stderr; the last line on stdout is a one-line summary. Exit codes: 0 ok, 2 bad
input (the message names the file, line and field).

Must not: import the simulator, or be imported by the daemon's hot path.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from controller.core.coupling import CouplingModels, with_physics
from controller.core.forecast import ForecastConfig, ForecasterModel, fit_forecaster, fit_series
from controller.core.observations import forecast_series
from controller.learning.evaluate import evaluate
from controller.learning.fit import fit_coupling
from controller.learning.records import (
    RecordError,
    Recording,
    dumps,
    header_dict,
    merge_physics,
    read_recording,
    record_to_dict,
)
from controller.learning.store import ModelStore, clean_json
from controller.learning.training_data import build_training_data, concat_training_data

HOLDOUT_FRAC = 0.2


def error(msg: str) -> int:
    """Print a bad-input message and return exit code 2."""
    print(f"governor: {msg}", file=sys.stderr)
    return 2


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- record


def check_record_args(args) -> str | None:
    """The message for bad `governor record` arguments (None if fine); shared by both sides."""
    if bool(args.scenario) == bool(args.config):
        return "record: give exactly one of --scenario (simulate in-process) or --config (a live fleet)"
    if args.tick <= 0:
        return f"record: --tick must be > 0 (got {args.tick})"
    if args.for_s is not None and args.for_s <= 0:
        return f"record: --for must be > 0 (got {args.for_s})"
    out = Path(args.out)
    if out.parent and not out.parent.exists():
        return f"record: --out: directory {out.parent} does not exist"
    return None


def cmd_record(args) -> int:
    """`governor record --config`: a live fleet on the wall clock (`--scenario` is the bench's)."""
    msg = check_record_args(args)
    if msg is not None:
        return error(msg)
    if args.scenario:
        return error("record: --scenario simulates the fleet: run it through `governor record` "
                     "(controller/bench/learning_cli.py)")
    return _record_live(args, Path(args.out))


def _record_live(args, out: Path) -> int:
    from controller.clock import WallClock
    from controller.config import ConfigError, load_settings
    from controller.core.observations import ObservationRecord, PoolSettings
    from controller.learning.physics import physics_for_pool_spec
    from controller.telemetry import build_source

    try:
        settings = load_settings(args.config)
    except (ConfigError, ValueError) as exc:
        return error(f"record: {exc}")
    clock = WallClock()
    source = build_source(settings, clock)
    physics = {}
    engines = settings.engines()  # the config's declared models and SKUs count too
    for p in settings.pools:
        try:
            physics[p.name] = physics_for_pool_spec(p, engines.get(p.name))
        except ValueError as exc:
            progress(f"record: pool {p.name}: no physics ({exc}); its rows will not train the coupling models")
    window_s = float(settings.telemetry.window_s)
    header = header_dict(physics, window_s=window_s, tick_s=args.tick, source=f"live:{args.config}")
    stop = clock.monotonic_s() + (args.for_s if args.for_s is not None else math.inf)
    n = 0
    tmp = out.with_name(out.name + ".tmp")
    try:
        with tmp.open("w") as f:
            f.write(dumps(header) + "\n")
            next_t = clock.monotonic_s()
            while clock.monotonic_s() < stop:
                now = clock.now_s()
                obs = source.read(now)
                st = {}
                for p in settings.pools:
                    po = obs.pools.get(p.name)
                    ready = po.replicas_ready.value if po is not None and po.replicas_ready.ok else 0.0
                    # the applied levers are not observable from telemetry: the engine caps come from
                    # the config, the replica count from what is ready, the router from its defaults
                    st[p.name] = PoolSettings(replicas=int(ready), max_num_seqs=p.max_num_seqs,
                                              max_num_batched_tokens=p.max_num_batched_tokens)
                f.write(dumps(record_to_dict(ObservationRecord(now, obs, st))) + "\n")
                f.flush()
                n += 1
                next_t += args.tick
                clock.sleep(max(0.0, min(next_t, stop) - clock.monotonic_s()))
    except KeyboardInterrupt:
        pass
    tmp.replace(out)
    print(json.dumps({"out": str(out), "ticks": n}))
    return 0


# --------------------------------------------------------------------------- fit


def _split_data(records, physics, window_s: float):
    t = [r.at_s for r in records]
    if not t:
        return None
    split = t[-1] - HOLDOUT_FRAC * (t[-1] - t[0])
    tr = [r for r in records if r.at_s < split]
    ho = [r for r in records if r.at_s >= split]
    return (build_training_data(tr, physics, window_s=window_s), build_training_data(ho, physics, window_s=window_s),
            build_training_data(records, physics, window_s=window_s))


def _holdout_errors(models: CouplingModels, data, physics) -> dict[str, float]:
    e = evaluate(with_physics(models, physics), data)
    out = {f"{k}_mape": v for k, v in e.mape.items()}
    out["hit_rate_mae"] = e.hit_rate_mae
    out["gpu_busy_frac_mae"] = e.gpu_busy_frac_mae
    out.update({f"{k}_log_q90": v for k, v in e.log_q90.items()})
    out.update({f"rows_{k}": float(v) for k, v in e.rows.items()})
    return {k: float(v) for k, v in out.items()}


def cmd_fit(args) -> int:
    store = ModelStore(args.out)
    if args.defaults:
        return error("fit: --defaults simulates its training runs: run it through `governor fit` "
                     "(controller/bench/learning_cli.py)")
    if not args.files:
        return error("fit: give one or more recordings (made by `governor record`), or --defaults")
    t0 = time.perf_counter()
    train_parts, hold_parts, all_parts = [], [], []
    series: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for path in args.files:
        try:
            header, physics, records = read_recording(Path(path))
        except RecordError as exc:
            return error(f"fit: {exc}")
        if not physics:
            progress(f"fit: {path}: no pool physics in the header; only the forecaster learns from it")
        elif records:
            tr, ho, al = _split_data(records, physics, float(header.get("window_s", 60.0)))
            train_parts.append(tr)
            hold_parts.append(ho)
            all_parts.append(al)
        for name, (t, y) in forecast_series(records).items():
            if name not in series or len(t) > len(series[name][0]):
                series[name] = (t, y)
        progress(f"fit: {path}: {len(records)} ticks")
    rng = np.random.default_rng(args.seed)
    result: dict = {"out": str(store.dir)}
    if all_parts:
        tr, tr_ph = concat_training_data(train_parts)
        ho, ho_ph = concat_training_data(hold_parts)
        al, al_ph = concat_training_data(all_parts)
        cand = fit_coupling(tr, tr_ph, np.random.default_rng(args.seed), seed=args.seed)
        errors = _holdout_errors(cand, ho, ho_ph)
        final = fit_coupling(al, al_ph, rng, seed=args.seed)
        final = replace(final, seed=args.seed, holdout_errors=errors)
        store.save_coupling(final, training={"sources": [str(p) for p in args.files], "rows": len(al),
                                             "steady_rows": int(al.steady.sum()),
                                             "holdout": f"last {HOLDOUT_FRAC:.0%} of each recording"})
        result["coupling_holdout"] = {k: v for k, v in errors.items() if k.endswith(("_mape", "_mae"))}
    if series:
        fc = fit_forecaster(series)
        prev = _shipped_default_series(store)
        if prev is not None:
            fc = ForecasterModel(fc.config, fc.series, prev)
        store.save_forecaster(fc, training={"sources": [str(p) for p in args.files]}, seed=args.seed)
        result["forecast_series"] = sorted(series)
    result["fit_seconds"] = round(time.perf_counter() - t0, 3)
    print(json.dumps(clean_json(result)))
    return 0


def _shipped_default_series(store: ModelStore):
    try:
        fc, _ = store.load_forecaster()
        return fc.default
    except Exception:  # noqa: BLE001  # any unreadable shipped forecaster: no series to carry over
        return None


# --------------------------------------------------------------------------- the shipped priors


def fit_shipped_coupling(store: ModelStore, train_recs: Sequence[Recording], test_recs: Sequence[Recording],
                         seed: int) -> dict[str, float]:
    """Fit the shipped coupling models on the training recordings, score them on the test
    recordings (their holdout errors, returned) and save them with how they were trained."""
    train = concat_training_data([build_training_data(r.records, r.physics, window_s=r.window_s) for r in train_recs])
    test = concat_training_data([build_training_data(r.records, r.physics, window_s=r.window_s) for r in test_recs])
    models = fit_coupling(train[0], train[1], np.random.default_rng(seed), seed=seed)
    errors = _holdout_errors(models, test[0], test[1])
    models = replace(models, seed=seed, holdout_errors=errors)
    store.save_coupling(models, training={
        "sources": [r.label for r in train_recs], "holdout_sources": [r.label for r in test_recs],
        "rows": len(train[0]), "steady_rows": int(train[0].steady.sum()),
        "runs": {r.label: dict(r.meta) for r in train_recs},
        "physics": sorted(merge_physics(train_recs))})
    return errors


def default_forecaster(t_s: np.ndarray, arrivals_rps: np.ndarray) -> tuple[ForecasterModel, dict[str, float]]:
    """A scale-free default series model fitted on an arrival-rate series (no seasonality: a daily
    shape learnt on one provider's clock would be wrong for another fleet until its own history
    has two days). The shipped one is fitted on ServeGen m-small arrivals (1.5 days, 60 s bins)."""
    # damping = 1 only: a damped level pulls towards the training series' mean, which is not scale-free
    cfg = ForecastConfig(dampings=(1.0,))
    default = fit_series("default", t_s, arrivals_rps, cfg)
    return ForecasterModel(config=ForecastConfig(), series={}, default=default), {
        "default_backtest_mae_rel": float(default.backtest_mae / max(np.mean(arrivals_rps), 1e-9))}


def fit_shipped_forecaster(store: ModelStore, t_s: np.ndarray, arrivals_rps: np.ndarray, *, source: str,
                           seed: int) -> None:
    """Fit the shipped default forecaster on an arrival-rate series and save it."""
    fc, fc_err = default_forecaster(t_s, arrivals_rps)
    store.save_forecaster(fc, training={"sources": [source]}, holdout_errors=fc_err, seed=seed)
