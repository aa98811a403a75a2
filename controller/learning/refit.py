"""Scheduled refits of the coupling models and the forecaster, off the tick path, behind a validation gate.

Wiring (the daemon's composition root does this):

    slot = ModelSlot(ModelSet(coupling=shipped_or_prior, forecaster=shipped_default))
    job = RefitJob(history, slot, physics_by_pool, clock=clock, logger=log, store=ModelStore(state_dir / "models"))
    job.start()                      # its own BackgroundScheduler thread; every config.interval_s
    ...each tick: models = slot.get()  # a reference read, never blocks on a refit
    job.stop()

A refit takes a snapshot of the history (a tuple copy), splits it in time — the last
`holdout_frac` of the span is the held-out recent window — fits candidates on the earlier part
and scores candidate and current model on the held-out window. A candidate replaces the current
model only if it scores better (by `min_improvement`); either way one structured log line says
what happened and why. The fit itself is bounded: at most `CorrectionConfig.max_fit_rows` rows
per estimator and a wall-clock budget (`max_fit_s`) after which the candidate is dropped.

Must not: touch the history's lock while fitting, or raise into the scheduler (errors are
outcomes).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from controller.core.coupling import CouplingModels, with_physics
from controller.core.forecast import ForecastConfig, ForecasterModel, fit_forecaster, holdout_mae
from controller.core.observations import forecast_series
from controller.learning.evaluate import evaluate
from controller.learning.fit import CorrectionConfig, fit_coupling
from controller.learning.history import HistoryBuffer
from controller.learning.store import ModelStore
from controller.learning.training_data import build_training_data


@dataclass(frozen=True)
class ModelSet:
    """What the planner uses this tick."""

    coupling: CouplingModels
    forecaster: ForecasterModel | None = None
    version: int = 0  # bumped on every swap
    source: str = "prior"  # prior | shipped | refit


class ModelSlot:
    """The current ModelSet; `get` is a plain reference read (atomic), `swap` replaces it."""

    def __init__(self, initial: ModelSet) -> None:
        self._current = initial
        self._lock = threading.Lock()  # serialises writers only

    def get(self) -> ModelSet:
        return self._current

    def swap(self, coupling: CouplingModels | None = None, forecaster: ForecasterModel | None = None,
             source: str = "refit") -> ModelSet:
        with self._lock:
            cur = self._current
            new = ModelSet(coupling=coupling if coupling is not None else cur.coupling,
                           forecaster=forecaster if forecaster is not None else cur.forecaster,
                           version=cur.version + 1, source=source)
            self._current = new
            return new


@dataclass(frozen=True)
class RefitConfig:
    interval_s: float = 900.0  # how often the job runs
    holdout_frac: float = 0.2  # the most recent share of the history is held out
    min_rows: int = 40  # fewer steady training rows: no coupling candidate (the current model stays)
    min_improvement: float = 0.0  # relative: the candidate must score below current × (1 − this)
    max_fit_s: float = 60.0  # a candidate taking longer is dropped
    window_s: float = 60.0  # the telemetry window of the history's observations
    settle_s: float = 30.0
    forecast_horizon_s: float = 600.0
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    forecast: ForecastConfig = field(default_factory=ForecastConfig)

    def __post_init__(self) -> None:
        if not 0.05 <= self.holdout_frac <= 0.5:
            raise ValueError(f"RefitConfig.holdout_frac = {self.holdout_frac} must be in [0.05, 0.5]")
        if self.interval_s <= 0 or self.max_fit_s <= 0:
            raise ValueError("RefitConfig: interval_s and max_fit_s must be > 0")


@dataclass(frozen=True)
class RefitOutcome:
    at_s: float
    coupling_swapped: bool
    forecast_swapped: bool
    reason: str  # one line: what happened to each model and why
    rows_train: int = 0
    rows_holdout: int = 0
    coupling_candidate_score: float = math.nan  # ModelErrors.score() on the holdout (lower is better)
    coupling_current_score: float = math.nan
    forecast_candidate_mae: float = math.nan  # relative MAE at forecast_horizon_s on the holdout
    forecast_current_mae: float = math.nan
    duration_s: float = 0.0

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in self.__dict__.items()}


class RefitJob:
    def __init__(self, history: HistoryBuffer, slot: ModelSlot, physics_by_pool: Mapping, *, clock,
                 logger: logging.Logger | None = None, config: RefitConfig = RefitConfig(),
                 store: ModelStore | None = None, seed: int = 0,
                 on_outcome: Callable[[RefitOutcome], None] | None = None) -> None:
        self.history = history
        self.slot = slot
        self.physics_by_pool = dict(physics_by_pool)
        self.clock = clock
        self.log = logger or logging.getLogger("governor.refit")
        self.config = config
        self.store = store
        self.seed = int(seed)
        self.on_outcome = on_outcome
        self.last: RefitOutcome | None = None
        self.runs = 0
        self._scheduler = None
        self._run_lock = threading.Lock()

    # ------------------------------------------------------------------ scheduling

    def start(self, *, first_run_after_s: float | None = None) -> None:
        """Run every config.interval_s on a BackgroundScheduler of its own (one worker thread,
        never two refits at once, missed runs coalesced)."""
        from datetime import datetime, timedelta

        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.schedulers.background import BackgroundScheduler

        if self._scheduler is not None:
            return
        sched = BackgroundScheduler(executors={"default": ThreadPoolExecutor(1)},
                                    job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": None})
        delay = self.config.interval_s if first_run_after_s is None else first_run_after_s
        sched.add_job(self._safe_run, "interval", seconds=self.config.interval_s, id="governor-refit",
                      next_run_time=datetime.now() + timedelta(seconds=delay))
        sched.start()
        self._scheduler = sched

    def stop(self, wait: bool = True) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=wait)
            self._scheduler = None

    def _safe_run(self) -> None:
        try:
            self.run_once()
        except Exception as exc:  # noqa: BLE001  # never let the scheduler thread die
            self.log.error(f"model refit failed: {exc!r}", extra={"event": "model_refit_error"})

    # ------------------------------------------------------------------ one refit

    def run_once(self) -> RefitOutcome:
        with self._run_lock:
            out = self._run()
        self.last = out
        self.runs += 1
        level = logging.INFO
        self.log.log(level, f"model refit: {out.reason}", extra={"event": "model_refit", **out.to_dict()})
        if self.on_outcome is not None:
            self.on_outcome(out)
        return out

    def _run(self) -> RefitOutcome:
        cfg = self.config
        t0 = self.clock.monotonic_s()
        now_s = self.clock.now_s()
        records = self.history.snapshot()
        if len(records) < 8:
            return RefitOutcome(now_s, False, False, f"history too short ({len(records)} ticks): nothing to fit",
                                duration_s=self.clock.monotonic_s() - t0)
        t_first, t_last = records[0].at_s, records[-1].at_s
        split_s = t_last - cfg.holdout_frac * (t_last - t_first)
        train = [r for r in records if r.at_s < split_s]
        hold = [r for r in records if r.at_s >= split_s]
        current = self.slot.get()
        parts: list[str] = []

        # ---- coupling models
        coupling_new: CouplingModels | None = None
        cand_score = cur_score = math.nan
        rows_train = rows_hold = 0
        try:
            data_tr, phys = build_training_data(train, self.physics_by_pool, window_s=cfg.window_s,
                                                settle_s=cfg.settle_s)
            data_ho, phys_ho = build_training_data(hold, self.physics_by_pool, window_s=cfg.window_s,
                                                   settle_s=cfg.settle_s)
            rows_train, rows_hold = int(data_tr.steady.sum()), int(data_ho.steady.sum())
            if rows_train < cfg.min_rows:
                parts.append(f"coupling kept: {rows_train} steady training rows < {cfg.min_rows}")
            elif rows_hold < 5:
                parts.append(f"coupling kept: only {rows_hold} steady rows in the held-out window")
            else:
                rng = np.random.default_rng(np.random.SeedSequence([self.seed, self.runs]))
                cand = fit_coupling(data_tr, phys, rng, cfg.correction, seed=self.seed)
                elapsed = self.clock.monotonic_s() - t0
                if elapsed > cfg.max_fit_s:
                    parts.append(f"coupling candidate dropped: fit took {elapsed:.1f} s > {cfg.max_fit_s:.0f} s")
                else:
                    cand_err = evaluate(with_physics(cand, phys_ho), data_ho)
                    cur_err = evaluate(with_physics(current.coupling, phys_ho), data_ho)
                    cand_score, cur_score = cand_err.score(), cur_err.score()
                    if cand_score < cur_score * (1.0 - cfg.min_improvement) or not math.isfinite(cur_score):
                        coupling_new = replace(cand, holdout_errors={
                            **{f"{k}_mape": v for k, v in cand_err.mape.items()}, "hit_rate_mae": cand_err.hit_rate_mae,
                            "gpu_busy_frac_mae": cand_err.gpu_busy_frac_mae,
                            **{f"{k}_log_q90": v for k, v in cand_err.log_q90.items()}})
                        parts.append(f"coupling swapped: holdout score {cand_score:.3f} < current {cur_score:.3f}")
                    else:
                        parts.append(f"coupling kept: candidate {cand_score:.3f} is not better than current "
                                     f"{cur_score:.3f}")
        except Exception as exc:  # noqa: BLE001  # a bad history must not take the daemon down
            parts.append(f"coupling kept: fit failed ({type(exc).__name__}: {exc})")

        # ---- forecaster
        forecaster_new: ForecasterModel | None = None
        f_cand = f_cur = math.nan
        try:
            series_tr = forecast_series(train)
            series_all = forecast_series(records)
            if not series_tr:
                parts.append("forecaster kept: no arrival series in the history")
            else:
                cand_f = fit_forecaster(series_tr, cfg.forecast)
                if current.forecaster is not None and current.forecaster.default is not None:
                    cand_f = ForecasterModel(cand_f.config, cand_f.series, current.forecaster.default)
                f_cand = holdout_mae(cand_f, series_all, split_s, cfg.forecast_horizon_s).get("mean", math.nan)
                f_cur = (holdout_mae(current.forecaster, series_all, split_s,
                                     cfg.forecast_horizon_s).get("mean", math.nan)
                         if current.forecaster is not None else math.inf)
                if math.isfinite(f_cand) and (not math.isfinite(f_cur) or f_cand < f_cur * (1.0 - cfg.min_improvement)):
                    forecaster_new = cand_f
                    parts.append(f"forecaster swapped: holdout MAE {f_cand:.3f} < current {f_cur:.3f}")
                else:
                    parts.append(f"forecaster kept: candidate MAE {f_cand:.3f} is not better than {f_cur:.3f}")
        except Exception as exc:  # noqa: BLE001  # as for the coupling: a failed fit keeps the current model
            parts.append(f"forecaster kept: fit failed ({type(exc).__name__}: {exc})")

        elapsed = self.clock.monotonic_s() - t0
        if elapsed > cfg.max_fit_s and (coupling_new is not None or forecaster_new is not None):
            parts.append(f"all candidates dropped: refit took {elapsed:.1f} s > {cfg.max_fit_s:.0f} s")
            coupling_new = forecaster_new = None
        if coupling_new is not None or forecaster_new is not None:
            self.slot.swap(coupling=coupling_new, forecaster=forecaster_new, source="refit")
            if self.store is not None:
                try:
                    # `gate` marks an artifact the validation gate passed: only those are loaded at start
                    training = {"source": "daemon history", "window_s": [t_first, split_s], "rows": rows_train,
                                "gate": {"passed": True, "at_s": now_s}}
                    if coupling_new is not None:
                        self.store.save_coupling(coupling_new, training=training)
                    if forecaster_new is not None:
                        self.store.save_forecaster(forecaster_new, training=training, seed=self.seed,
                                                   holdout_errors={"relative_mae": f_cand})
                except OSError as exc:
                    parts.append(f"(could not save: {exc.strerror})")
        return RefitOutcome(at_s=now_s, coupling_swapped=coupling_new is not None,
                            forecast_swapped=forecaster_new is not None, reason="; ".join(parts),
                            rows_train=rows_train, rows_holdout=rows_hold, coupling_candidate_score=cand_score,
                            coupling_current_score=cur_score, forecast_candidate_mae=f_cand,
                            forecast_current_mae=f_cur, duration_s=self.clock.monotonic_s() - t0)
