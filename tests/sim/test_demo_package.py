"""The demo ships in the package: its scenario and trace cut sit under controller/sim/demo, the cut is
what its generator makes from the shared trace, and it replays exactly the requests the window of
the full trace gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from controller.paths import PROJECT_ROOT
from controller.runtime.main import DEMO_SCENARIO
from controller.sim import demo_trace
from controller.sim.scenario import load_scenario
from controller.sim.traces import load_trace


def test_the_cut_is_what_its_generator_makes():
    assert demo_trace.main(["--check"]) == 0
    assert (demo_trace.DEMO_DIR / "NOTICE" ".md").read_text().count("CC-BY 4.0") == 1


def test_the_demo_is_package_data_and_scenarios_links_to_it():
    assert DEMO_SCENARIO.resolve().parent == demo_trace.DEMO_DIR
    assert (PROJECT_ROOT / "scenarios" / "demo.yaml").resolve() == DEMO_SCENARIO.resolve()
    sc = load_scenario(DEMO_SCENARIO)
    assert sc.trace_path() == demo_trace.CUT_PATH


def test_the_cut_replays_the_full_traces_window(tmp_path):
    packaged = load_scenario(DEMO_SCENARIO)
    full_trace = packaged.trace.model_copy(update={
        "path": str(demo_trace.shared_data_dir().joinpath(*demo_trace.SOURCE)),
        "start_s": demo_trace.START_S})
    a = load_trace(packaged.trace, Path(packaged.base_dir), np.random.default_rng(1))
    b = load_trace(full_trace, Path(packaged.base_dir), np.random.default_rng(1))
    assert len(a) == len(b) > 8000
    for field in ("arrival_s", "prompt_tokens", "output_tokens"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
