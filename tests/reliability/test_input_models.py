"""Model artifacts (issue 21): a forged artifact is refused without running any of its code. tests/learning/
test_store.py covers tampering (sha256), foreign manifests and types outside the skops allow-list; this test
makes the forgery hostile: a pickle whose loading would create a file, with a manifest rehashed to match."""

from __future__ import annotations

import hashlib
import json
import pickle

import numpy as np
import pytest

from controller.learning.fit import fit_coupling
from controller.learning.store import ModelLoadError, ModelStore
from controller.learning.training_data import build_training_data
from tests.learning.helpers import physics_by_pool, synthetic_records


class _Payload:
    """Unpickling this calls open(marker, "w"): code execution on load, if the loader unpickles."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_hostile_pickle_is_refused_and_never_runs(tmp_path):
    recs = synthetic_records(40, seed=2)
    data, phys = build_training_data(recs, physics_by_pool())
    store = ModelStore(tmp_path / "models")
    store.save_coupling(fit_coupling(data, phys, np.random.default_rng(0), seed=0))
    marker = tmp_path / "code-ran"
    art = store.artifact_path("coupling")
    art.write_bytes(pickle.dumps(_Payload(str(marker))))
    man_path = store.manifest_path("coupling")
    man = json.loads(man_path.read_text())
    man["sha256"] = hashlib.sha256(art.read_bytes()).hexdigest()  # the forger rehashes the manifest
    man_path.write_text(json.dumps(man))
    with pytest.raises(ModelLoadError):
        store.load_coupling()
    assert not marker.exists()
