"""The learned models' lifecycle inside the daemon: load, record history, track error, refit.

Built once in the composition root. Each tick the daemon hands it what it
observed and what was in force; it appends that to the persisted history, scores
the current models' predictions against what happened, and exposes the error for
metrics and `governor status`. Refits run on the RefitJob's own thread, never on
the tick path. The MPC with `planning_model: learned` reads the current coupling models through
`slot.get()` every tick (runtime/main.py hands it the slot); other policies do not use them.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from controller.core.coupling import CouplingModels, PoolPhysics, with_physics
from controller.core.forecast import Forecast
from controller.core.observations import ObservationRecord, PoolSettings
from controller.learning.history import HistoryBuffer
from controller.learning.physics import physics_for_pool_spec
from controller.learning.refit import ModelSet, ModelSlot, RefitConfig, RefitJob
from controller.learning.store import SHIPPED_MODELS_DIR, ModelLoadError, ModelStore
from controller.learning.tracker import ModelTracker
from controller.types import Decision, FleetObservation, FleetSpec

FORECAST_SERIES = "arrival_rps"  # the fleet's arrivals, as controller/core/features.forecast_series names them
# arrivals kept for the tracker's forecast: a few half-lives of its smoothers (an hour at 15 s ticks)
FORECAST_HISTORY = 240


class Learning:
    def __init__(self, fleet: FleetSpec, state_dir: str | Path, *, clock, logger: logging.Logger, seed: int = 0,
                 models_dir: str | Path = SHIPPED_MODELS_DIR, refit_interval_s: float = 900.0,
                 history_capacity: int = 5760, physics: Mapping[str, PoolPhysics] | None = None) -> None:
        self.log = logger
        # `physics` by pool name (the composition root resolves the config's engines); else the built-in catalogue
        self.physics = dict(physics) if physics is not None else {p.name: physics_for_pool_spec(p) for p in fleet.pools}
        coupling, forecaster, source = self._load(Path(models_dir), Path(state_dir) / "models")
        self.slot = ModelSlot(ModelSet(coupling, forecaster, source=source))
        self.history = HistoryBuffer(capacity=history_capacity, state_dir=str(state_dir))
        self.tracker = ModelTracker(self.physics, window=240)
        self._arrivals: deque[tuple[float, float]] = deque(maxlen=FORECAST_HISTORY)
        self.job = RefitJob(self.history, self.slot, self.physics, clock=clock, logger=logger,
                            store=ModelStore(Path(state_dir) / "models"),
                            config=RefitConfig(interval_s=refit_interval_s), seed=seed)

    def _load(self, models_dir: Path, refit_dir: Path):
        """The newest refit the gate passed (state_dir/models, manifest checked) for each kind, else the
        shipped prior; the physical prior alone when neither loads."""
        physics = list(self.physics.values())
        refit = ModelStore(refit_dir)
        shipped = ModelStore(models_dir)
        loaded: dict[str, tuple[object, str]] = {}
        for kind, load in (("coupling", ModelStore.load_coupling), ("forecast", ModelStore.load_forecaster)):
            if refit.exists(kind):
                try:
                    manifest = refit.read_manifest(kind)
                    if not (manifest.data.get("training") or {}).get("gate", {}).get("passed"):
                        raise ModelLoadError(f"{refit.manifest_path(kind)}: not marked as passing the refit gate")
                    loaded[kind] = (load(refit)[0], "refit")
                    continue
                except ModelLoadError as exc:
                    self.log.warning(f"refitted {kind} model refused, using the shipped one: {exc}",
                                     extra={"event": "models"})
            try:
                loaded[kind] = (load(shipped)[0], "shipped")
            except ModelLoadError as exc:
                self.log.warning(f"shipped {kind} model refused: {exc}", extra={"event": "models"})
        forecaster = loaded["forecast"][0] if "forecast" in loaded else None
        if "coupling" not in loaded:
            self.log.warning("learned models refused, running on the physical prior alone",
                             extra={"event": "models"})
            return CouplingModels.prior_only(physics), forecaster, "prior"
        sources = {k: src for k, (_, src) in loaded.items()}
        source = "refit" if "refit" in sources.values() else "shipped"
        if source == "refit" and len(set(sources.values())) > 1:
            source = ", ".join(f"{k} {v}" for k, v in sorted(sources.items()))
        self.log.info(f"learned models loaded: {sources}", extra={"event": "models", "sources": sources})
        return with_physics(loaded["coupling"][0], physics), forecaster, source  # type: ignore[arg-type]

    def set_physics(self, physics: Mapping[str, PoolPhysics]) -> None:
        """The configured pools changed (a config reload): the tracker scores, the refit job trains and the
        models in the slot plan with these pools' physics from the next tick on (without this they kept the
        start-up pool list). Each holder takes a new dict: a reader mid-tick sees the old or the new, whole."""
        self.physics = dict(physics)
        self.tracker.physics_by_pool = dict(physics)
        self.job.physics_by_pool = dict(physics)
        models = self.slot.get()
        self.slot.swap(coupling=with_physics(models.coupling, list(physics.values())), source=models.source)
        self.log.info(f"learning follows the reloaded pools: {sorted(physics)}", extra={"event": "models"})

    def start(self) -> None:
        self.job.start()

    def stop(self) -> None:
        self.job.stop()

    def on_tick(self, now_s: float, observation: FleetObservation, in_force: Decision | None) -> None:
        """Record the tick and score the models' predictions (cheap: one small predict per pool, and
        one forecast of the fleet's arrivals by the forecaster in the slot, scored when its horizon
        comes: the tracker's forecast_ae, which `governor status` and governor_model_error show)."""
        settings = {name: PoolSettings.from_decision(d) for name, d in in_force.pools.items()} if in_force else {}
        record = ObservationRecord(at_s=now_s, observation=observation, settings=settings)
        self.history.append(record)
        models = self.slot.get()
        self.tracker.update(record, models.coupling, self._forecast(now_s, observation, models.forecaster))

    def _forecast(self, now_s: float, observation: FleetObservation, forecaster) -> Forecast | None:
        """The slot's forecast of the fleet's arrivals at the tracker's horizon, from the arrivals seen."""
        arrivals = [p.arrival_rps.value for p in observation.pools.values() if p.arrival_rps.ok]
        if arrivals:
            self._arrivals.append((now_s, float(sum(arrivals))))
        if forecaster is None or not self._arrivals:
            return None
        t = np.array([a for a, _ in self._arrivals])
        y = np.array([b for _, b in self._arrivals])
        try:
            return forecaster.predict({FORECAST_SERIES: (t, y)}, now_s, [self.tracker.forecast_horizon_s])
        except (ValueError, FloatingPointError) as exc:  # a model that cannot forecast this series: no score
            self.log.debug(f"forecast for the error tracker failed: {exc}", extra={"event": "models"})
            return None

    def status(self) -> dict:
        snap = self.tracker.snapshot().to_dict()
        last = self.job.last
        return {"source": self.slot.get().source, "tracker": snap, "last_refit": last.to_dict() if last else None}
