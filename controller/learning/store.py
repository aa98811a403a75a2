"""Model artifacts on disk: skops files plus a JSON manifest each. Never pickle.

Layout of a models directory (the shipped `controller/models/` or `<state_dir>/models/`):

    coupling.skops            the CouplingModels state (plain values + fitted scikit-learn estimators)
    coupling.manifest.json    kind, format, features, targets, training window/rows/sources, seed,
                              library versions, holdout errors, sha256 of the .skops file
    forecast.skops / forecast.manifest.json   the same for the load forecaster

Loading refuses, with a message naming the file and the reason:
- a missing or unreadable manifest, or one of another kind or format version;
- an artifact whose sha256 differs from the manifest's (tampered or swapped);
- an artifact skops cannot read (a pickle, a truncated file, another program's file);
- an artifact holding any type outside the allow-list (`skops.io.get_untrusted_types`), before
  anything in it is constructed;
- a scikit-learn version (major.minor) other than the one that wrote it;
- a state that does not validate (wrong shapes, unknown targets).

Writes are atomic (temporary file + rename), the artifact before its manifest.

Must not: load anything without checking the manifest first.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.core.coupling import (
    ALL_TARGETS,
    CACHE_FEATURE_NAMES,
    LATENCY_FEATURE_NAMES,
    CouplingModels,
    coupling_from_state,
    coupling_to_state,
)
from controller.core.forecast import ForecasterModel, forecaster_from_state, forecaster_to_state

# the prior artifacts shipped with Governor, package data of the wheel (`make models` refits them)
SHIPPED_MODELS_DIR = Path(__file__).resolve().parents[1] / "models"
MANIFEST_VERSION = 1
KINDS = ("coupling", "forecast")
# The only non-builtin types an artifact may contain. QuantileRegressor is what `fit_coupling`
# produces; skops trusts numpy arrays/dtypes and builtins itself.
ALLOWED_TYPES = frozenset({
    "sklearn.linear_model._quantile.QuantileRegressor",
})


class ModelLoadError(ValueError):
    """An artifact was refused: the message names the file and why."""


@dataclass(frozen=True)
class Manifest:
    kind: str
    data: Mapping[str, Any]

    @property
    def sha256(self) -> str:
        return str(self.data.get("sha256", ""))


def library_versions() -> dict[str, str]:
    import numpy
    import scipy
    import sklearn
    import skops

    from controller import __version__

    return {"python": platform.python_version(), "numpy": numpy.__version__, "scipy": scipy.__version__,
            "scikit-learn": sklearn.__version__, "skops": skops.__version__, "governor": __version__}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def clean_json(x: Any) -> Any:
    """NaN/inf → None, tuples → lists, numpy scalars → floats: strict JSON for manifests."""
    if isinstance(x, Mapping):
        return {str(k): clean_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean_json(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, (str, int)):
        return x
    try:
        f = float(x)
    except (TypeError, ValueError):
        return str(x)
    return f if f == f and f not in (float("inf"), float("-inf")) else None


def _minor(v: str) -> str:
    return ".".join(v.split(".")[:2])


class ModelStore:
    """Save and load the coupling models and the forecaster under one directory."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)

    def artifact_path(self, kind: str) -> Path:
        return self.dir / f"{kind}.skops"

    def manifest_path(self, kind: str) -> Path:
        return self.dir / f"{kind}.manifest.json"

    def exists(self, kind: str) -> bool:
        return self.artifact_path(kind).exists() and self.manifest_path(kind).exists()

    # ------------------------------------------------------------------ save

    def save_coupling(self, models: CouplingModels, *, training: Mapping[str, Any] | None = None) -> Path:
        extra = {
            "features": {"latency": list(LATENCY_FEATURE_NAMES), "cache": list(CACHE_FEATURE_NAMES)},
            "targets": list(ALL_TARGETS),
            "model_class": "QuantileRegressor (median; q=0.9 upper bands for the p95s) on prior-derived features",
            "physics": [p.key for p in models.physics],
            "training_rows": models.n_train,
            "training_window_s": list(models.train_window_s),
            "seed": models.seed,
            "holdout_errors": dict(models.holdout_errors),
        }
        return self._save("coupling", coupling_to_state(models), extra, training)

    def save_forecaster(self, model: ForecasterModel, *, training: Mapping[str, Any] | None = None,
                        holdout_errors: Mapping[str, float] | None = None, seed: int = 0) -> Path:
        extra = {
            "features": {"series": sorted(model.series), "default": model.default is not None},
            "model_class": "seasonal (daily/weekly) × level (last value | damped EWMA | damped Holt), "
                           "chosen by walk-forward backtest; empirical quantile bands",
            "seed": seed,
            "holdout_errors": dict(holdout_errors or {}),
        }
        return self._save("forecast", forecaster_to_state(model), extra, training)

    def _save(self, kind: str, state: Mapping[str, Any], extra: Mapping[str, Any],
              training: Mapping[str, Any] | None) -> Path:
        import skops.io as sio

        self.dir.mkdir(parents=True, exist_ok=True)
        data = sio.dumps(dict(state))
        art = self.artifact_path(kind)
        _atomic_write_bytes(art, data)
        manifest = {
            "manifest_version": MANIFEST_VERSION,
            "kind": kind,
            "format": state["format"],
            "artifact": art.name,
            "sha256": hashlib.sha256(data).hexdigest(),
            "library_versions": library_versions(),
            "training": dict(training or {}),
            **extra,
        }
        text = json.dumps(clean_json(manifest), indent=2, sort_keys=True, allow_nan=False) + "\n"
        _atomic_write_bytes(self.manifest_path(kind), text.encode())
        return art

    # ------------------------------------------------------------------ load

    def read_manifest(self, kind: str) -> Manifest:
        if kind not in KINDS:
            raise ModelLoadError(f"unknown model kind {kind!r}; known: {list(KINDS)}")
        mp = self.manifest_path(kind)
        try:
            data = json.loads(mp.read_text())
        except FileNotFoundError:
            raise ModelLoadError(f"{mp}: no manifest; refusing to load {self.artifact_path(kind).name} without one "
                                 "(write models with `governor fit`)") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"{mp}: cannot read the manifest: {exc}") from None
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"{mp}: the manifest is not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(data, dict):
            raise ModelLoadError(f"{mp}: the manifest must be a JSON object")
        if data.get("manifest_version") != MANIFEST_VERSION:
            raise ModelLoadError(f"{mp}: manifest_version {data.get('manifest_version')!r} is not supported "
                                 f"(this governor reads {MANIFEST_VERSION})")
        if data.get("kind") != kind:
            raise ModelLoadError(f"{mp}: the manifest is for a {data.get('kind')!r} model, expected {kind!r}")
        if data.get("artifact") != self.artifact_path(kind).name:
            raise ModelLoadError(f"{mp}: the manifest names artifact {data.get('artifact')!r}, "
                                 f"expected {self.artifact_path(kind).name!r}")
        return Manifest(kind, data)

    def _load_state(self, kind: str) -> tuple[Mapping[str, Any], Manifest]:
        import sklearn
        import skops.io as sio

        man = self.read_manifest(kind)
        art = self.artifact_path(kind)
        try:
            digest = _sha256(art)
        except FileNotFoundError:
            raise ModelLoadError(f"{art}: missing (its manifest {self.manifest_path(kind).name} exists)") from None
        except OSError as exc:
            raise ModelLoadError(f"{art}: cannot read: {exc.strerror}") from None
        if digest != man.sha256:
            raise ModelLoadError(f"{art}: sha256 {digest[:12]}… does not match the manifest's {man.sha256[:12]}…; "
                                 "the file was modified or replaced — refusing to load it")
        written = str((man.data.get("library_versions") or {}).get("scikit-learn", ""))
        if _minor(written) != _minor(sklearn.__version__):
            raise ModelLoadError(f"{art}: written with scikit-learn {written or '?'}, this is {sklearn.__version__}; "
                                 "refit with `governor fit` rather than load estimators across versions")
        try:
            untrusted = sio.get_untrusted_types(file=art)
        except Exception as exc:  # noqa: BLE001  # skops raises assorted errors on foreign files (zip, json, key)
            raise ModelLoadError(f"{art}: not a readable skops file ({type(exc).__name__}: {exc}); "
                                 "pickles and other formats are refused") from None
        bad = sorted(set(untrusted) - ALLOWED_TYPES)
        if bad:
            raise ModelLoadError(f"{art}: contains types outside the allow-list: {bad}; refusing to load it")
        try:
            state = sio.load(art, trusted=sorted(untrusted))
        except Exception as exc:  # noqa: BLE001  # whatever skops raises is reported as one ModelLoadError
            raise ModelLoadError(f"{art}: skops could not load it ({type(exc).__name__}: {exc})") from None
        if not isinstance(state, dict):
            raise ModelLoadError(f"{art}: expected a model state (a dict), found {type(state).__name__}")
        if state.get("format") != man.data.get("format"):
            raise ModelLoadError(f"{art}: format {state.get('format')!r} differs from the manifest's "
                                 f"{man.data.get('format')!r}")
        return state, man

    def load_coupling(self) -> tuple[CouplingModels, Manifest]:
        state, man = self._load_state("coupling")
        try:
            return coupling_from_state(state), man
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{self.artifact_path('coupling')}: invalid coupling state: {exc}") from None

    def load_forecaster(self) -> tuple[ForecasterModel, Manifest]:
        state, man = self._load_state("forecast")
        try:
            return forecaster_from_state(state), man
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{self.artifact_path('forecast')}: invalid forecaster state: {exc}") from None
