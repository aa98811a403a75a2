"""Refits survive restarts: at start the daemon loads, per model kind, the refit under state_dir/models that
the validation gate passed (its manifest checked as any artifact's), and falls back to the shipped prior
when there is none, when it is not marked as passing the gate, or when its manifest refuses it."""

from __future__ import annotations

import dataclasses
import logging

from controller.clock import VirtualClock
from controller.learning.store import SHIPPED_MODELS_DIR, ModelStore
from controller.runtime.learning import Learning
from controller.types import FleetSpec, PoolSpec, SloSpec

FLEET = FleetSpec(pools=(PoolSpec("p", "llama-3-8b", "a100-80gb", gpus_per_replica=1),),
                  slos={c: SloSpec(2.5, 0.1) for c in ("critical", "standard", "sheddable")})
GATE = {"source": "daemon history", "gate": {"passed": True, "at_s": 1.0e9}}


def _learning(state_dir, caplog=None) -> Learning:
    return Learning(FLEET, state_dir, clock=VirtualClock(1.0e9), logger=logging.getLogger("test-refit-restart"))


def _refit(state_dir, training) -> int:
    shipped, _ = ModelStore(SHIPPED_MODELS_DIR).load_coupling()
    marked = dataclasses.replace(shipped, seed=shipped.seed + 4242)
    ModelStore(state_dir / "models").save_coupling(marked, training=training)
    return marked.seed


def test_a_refit_the_gate_passed_is_loaded_after_a_restart(tmp_path):
    seed = _refit(tmp_path, GATE)
    first = _learning(tmp_path)
    assert first.slot.get().source == "coupling refit, forecast shipped"
    assert first.slot.get().coupling.seed == seed
    first.stop()
    again = _learning(tmp_path)  # a second start reads the same artifacts
    assert again.slot.get().coupling.seed == seed


def test_without_a_refit_the_shipped_prior_loads(tmp_path):
    learning = _learning(tmp_path)
    shipped, _ = ModelStore(SHIPPED_MODELS_DIR).load_coupling()
    assert learning.slot.get().source == "shipped" and learning.slot.get().coupling.seed == shipped.seed


def test_a_refit_not_marked_by_the_gate_or_tampered_with_is_refused(tmp_path, caplog):
    shipped, _ = ModelStore(SHIPPED_MODELS_DIR).load_coupling()
    _refit(tmp_path, {"source": "hand-made"})
    with caplog.at_level(logging.WARNING, logger="test-refit-restart"):
        unmarked = _learning(tmp_path)
    assert unmarked.slot.get().source == "shipped" and unmarked.slot.get().coupling.seed == shipped.seed
    assert "not marked as passing the refit gate" in caplog.text

    _refit(tmp_path, GATE)
    art = tmp_path / "models" / "coupling.skops"
    art.write_bytes(art.read_bytes() + b"\0")  # no longer what the manifest's sha256 says
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="test-refit-restart"):
        tampered = _learning(tmp_path)
    assert tampered.slot.get().source == "shipped"
    assert "sha256" in caplog.text
