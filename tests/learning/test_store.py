"""Model artifacts: skops + manifest round trip, and refusal of files the store must not trust."""

from __future__ import annotations

import hashlib
import json
import pickle

import numpy as np
import pytest

from controller.core.coupling import LatencyInputs
from controller.core.forecast import fit_forecaster
from controller.core.observations import forecast_series
from controller.learning.fit import fit_coupling
from controller.learning.store import ModelLoadError, ModelStore
from controller.learning.training_data import build_training_data
from tests.learning.helpers import physics_by_pool, synthetic_records


@pytest.fixture(scope="module")
def fitted():
    recs = synthetic_records(300, seed=1)
    data, phys = build_training_data(recs, physics_by_pool())
    models = fit_coupling(data, phys, np.random.default_rng(0), seed=0)
    forecaster = fit_forecaster(forecast_series(recs))
    return models, forecaster


def _rehash(store: ModelStore, kind: str) -> None:
    """Make the manifest agree with whatever the artifact now holds (a forger's move)."""
    mp = store.manifest_path(kind)
    man = json.loads(mp.read_text())
    man["sha256"] = hashlib.sha256(store.artifact_path(kind).read_bytes()).hexdigest()
    mp.write_text(json.dumps(man))


def test_round_trip_predicts_the_same(tmp_path, fitted):
    models, forecaster = fitted
    store = ModelStore(tmp_path)
    store.save_coupling(models, training={"sources": ["synthetic"]})
    store.save_forecaster(forecaster)
    loaded, manifest = store.load_coupling()
    fc, _ = store.load_forecaster()
    x = LatencyInputs.build(4, physics_index=0, arrival_rps_per_replica=np.array([0.5, 1, 2, 3.0]),
                            prompt_tokens=1200, output_tokens=200, hit_rate=0.2)
    assert np.array_equal(models.predict_latency(x)[0]["ttft_p95_s"], loaded.predict_latency(x)[0]["ttft_p95_s"])
    assert loaded.calibration == models.calibration
    m = manifest.data
    assert m["kind"] == "coupling" and m["format"] == "governor-coupling/1"
    assert {"scikit-learn", "skops", "numpy", "python"} <= set(m["library_versions"])
    assert m["features"]["latency"][0] == "log_prior" and m["seed"] == 0 and m["training"]["sources"] == ["synthetic"]
    assert set(fc.series) == set(forecaster.series)
    json.loads(store.manifest_path("coupling").read_text())  # strict JSON (no NaN)


def test_tampered_artifact_is_refused(tmp_path, fitted):
    store = ModelStore(tmp_path)
    store.save_coupling(fitted[0])
    art = store.artifact_path("coupling")
    data = bytearray(art.read_bytes())
    data[len(data) // 2] ^= 0xFF
    art.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="sha256 .* does not match"):
        store.load_coupling()


def test_a_pickle_is_refused_even_with_a_matching_manifest(tmp_path, fitted):
    store = ModelStore(tmp_path)
    store.save_coupling(fitted[0])
    store.artifact_path("coupling").write_bytes(pickle.dumps({"format": "governor-coupling/1"}))
    _rehash(store, "coupling")
    with pytest.raises(ModelLoadError, match="not a readable skops file"):
        store.load_coupling()


def test_types_outside_the_allow_list_are_refused(tmp_path, fitted):
    import skops.io as sio
    from sklearn.ensemble import HistGradientBoostingRegressor

    store = ModelStore(tmp_path)
    store.save_coupling(fitted[0])
    est = HistGradientBoostingRegressor(max_iter=3).fit(np.random.default_rng(0).random((20, 2)), np.arange(20.0))
    store.artifact_path("coupling").write_bytes(sio.dumps({"format": "governor-coupling/1", "x": est}))
    _rehash(store, "coupling")
    with pytest.raises(ModelLoadError, match="outside the allow-list"):
        store.load_coupling()


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(kind="forecast"), "is for a 'forecast' model"),
    (lambda m: m.update(manifest_version=99), "manifest_version 99 is not supported"),
    (lambda m: m["library_versions"].update({"scikit-learn": "0.24.2"}), "written with scikit-learn 0.24.2"),
    (lambda m: m.update(artifact="other.skops"), "names artifact 'other.skops'"),
])
def test_foreign_or_mismatched_manifest_is_refused(tmp_path, fitted, edit, message):
    store = ModelStore(tmp_path)
    store.save_coupling(fitted[0])
    mp = store.manifest_path("coupling")
    man = json.loads(mp.read_text())
    edit(man)
    mp.write_text(json.dumps(man))
    with pytest.raises(ModelLoadError, match=message):
        store.load_coupling()


def test_missing_or_unreadable_manifest_is_refused(tmp_path, fitted):
    store = ModelStore(tmp_path)
    store.save_coupling(fitted[0])
    store.manifest_path("coupling").write_text("{ not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        store.load_coupling()
    store.manifest_path("coupling").unlink()
    with pytest.raises(ModelLoadError, match="no manifest"):
        store.load_coupling()


def test_swapped_artifacts_are_refused(tmp_path, fitted):
    """A forecaster artifact renamed as the coupling one: its own manifest would not match."""
    store = ModelStore(tmp_path)
    store.save_coupling(fitted[0])
    store.save_forecaster(fitted[1])
    store.artifact_path("coupling").write_bytes(store.artifact_path("forecast").read_bytes())
    with pytest.raises(ModelLoadError, match="does not match"):
        store.load_coupling()
    _rehash(store, "coupling")
    with pytest.raises(ModelLoadError, match="format 'governor-forecast/1' differs"):
        store.load_coupling()
