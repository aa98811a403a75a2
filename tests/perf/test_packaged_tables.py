"""The performance tables the package ships so an installed daemon (and the demo's simulator) reads no
shared data: each is what its generator makes from ../shared/data, and reading it gives what the
profiles give (exactly for the priors' physics; within the profiles' noise for the step-time grids)."""

from __future__ import annotations

import numpy as np
import pytest

from controller.core.coupling import TOKEN_GRID
from controller.learning.physics import build_physics, physics_for_pool_spec
from controller.perf import iteration, physics_gen, steps_gen
from controller.perf.iteration import IterationModel
from controller.perf.physics_table import PHYSICS
from controller.perf.steps_table import STEP_GRIDS
from controller.types import PoolSpec


def test_the_physics_table_is_what_its_generator_probes():
    assert physics_gen.main(["--check"]) == 0
    assert tuple(int(x) for x in TOKEN_GRID) == physics_gen.TOKEN_GRID
    assert "llama-3-8b/a100-80gb/tp1" in PHYSICS and "llama-3-70b/h100-80gb/tp4" in PHYSICS
    assert "llama-3-70b/a100-80gb/tp1" not in PHYSICS  # 131 GiB of weights do not fit one GPU


def test_the_step_grid_table_is_what_its_generator_fits():
    assert steps_gen.main(["--check"]) == 0
    assert set(STEP_GRIDS) == set(PHYSICS)


@pytest.mark.parametrize("key", ["llama-3-8b/a100-80gb/tp1", "llama-3-70b/h100-80gb/tp4", "llama-2-7b/h100-80gb/tp2"])
def test_a_daemon_pool_gets_exactly_the_probed_physics(key):
    model, sku, tp = key.split("/")
    pool = PoolSpec("p", model, sku, gpus_per_replica=int(tp[2:]), max_num_seqs=128, max_num_batched_tokens=4096)
    assert physics_for_pool_spec(pool) == build_physics(model, sku, int(tp[2:]), max_num_seqs=128,
                                                        max_num_batched_tokens=4096)


def test_a_pool_outside_the_table_gets_the_roofline_or_the_reason_it_cannot_run():
    with pytest.raises(ValueError, match="tp=3 does not divide the 32 attention heads"):
        physics_for_pool_spec(PoolSpec("p", "llama-3-8b", "a100-80gb", gpus_per_replica=3))
    ph = physics_for_pool_spec(PoolSpec("p", "qwen-2.5-7b", "l40s-48gb", gpus_per_replica=1))
    assert ph.key == "qwen-2.5-7b/l40s-48gb/tp1" and ph.key not in PHYSICS
    # memory-bound decode: one step reads the 15.2 GB of weights at 0.7 x 864 GB/s, about 25 ms
    assert ph.decode_step_s[0] == pytest.approx(7_615_616_512 * 2 / (0.7 * 864e9), rel=0.05)


def test_the_packaged_grid_times_steps_as_the_profiles_do(monkeypatch):
    """Without the shared data the model is built from the packaged grid: every step of a service-like
    mix within a few % of the profiled model (the grid averages the profiles' run-to-run noise)."""
    profiled = IterationModel.build("llama-3-8b", "h100-80gb", 1)

    def hidden():
        raise FileNotFoundError("shared data hidden")

    monkeypatch.setattr(iteration, "shared_data_dir", hidden)
    packaged = IterationModel.build("llama-3-8b", "h100-80gb", 1)
    assert packaged is not profiled and "packaged" in packaged.provenance
    errs = []
    for seqs in (0, 1, 8, 64, 256):
        for chunk in (0, 128, 1024, 4096):
            if seqs + chunk == 0:
                continue
            work = chunk * (1000 + chunk / 2)
            want = profiled.step_time_s(chunk, work, seqs, seqs * 1500)
            errs.append(abs(packaged.step_time_s(chunk, work, seqs, seqs * 1500) / want - 1))
    assert np.median(errs) < 0.02 and max(errs) < 0.06, (np.median(errs), max(errs))
    assert packaged.kv_capacity_blocks(0.9, 16) == profiled.kv_capacity_blocks(0.9, 16)


@pytest.mark.parametrize("a, b, same", [
    ("x = 0.010107362960377599,", "x = 0.010107362960377592,", True),  # the last digits of a fit on another CPU
    ("x = (1.0, 2.5e-05)", "x = (1.0, 2.5000000000001e-05)", True),
    ("x = 0.0101", "x = 0.0102", False),  # a real change of a figure
    ("x = 1", "y = 1", False),  # the text around the numbers must be the same
    ("x = (1, 2)", "x = (1, 2, 3)", False),
])
def test_check_accepts_rounding_in_the_last_digits_only(a, b, same) -> None:
    from controller.perf.generated import same_up_to_rounding

    assert same_up_to_rounding(a, b) is same
