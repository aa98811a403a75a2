"""The case generator: reproducible per (seed, case), shapes as drawn, lengths and gaps from the traces."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from controller.bench import generator as gen
from controller.sim.scenario import load_scenario
from controller.sim.traces import detect_format, read_trace_file

grid = np.arange(0.0, 1201.0, 1.0)
D = 1200.0


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gen-cache")


def make(seed: int, k: int, folder: Path, cache: Path) -> gen.Case:
    return gen.generate_case(seed, k, work_dir=folder, cache_dir=cache)


def read_jsonl(path: Path):
    return read_trace_file(path, "jsonl")


# --------------------------------------------------------------------------- determinism


def test_same_seed_and_case_give_the_same_case(tmp_path: Path, cache: Path) -> None:
    a = make(3, 5, tmp_path / "a", cache)
    b = make(3, 5, tmp_path / "b", cache)
    assert a.spec == b.spec
    assert (tmp_path / "a" / "gen-s3-c0005.jsonl").read_bytes() == (tmp_path / "b" / "gen-s3-c0005.jsonl").read_bytes()
    assert a.scenario.model_dump(exclude={"base_dir"}) == b.scenario.model_dump(exclude={"base_dir"})


def test_different_seeds_or_cases_differ(tmp_path: Path, cache: Path) -> None:
    a = make(3, 5, tmp_path, cache)
    b = make(4, 5, tmp_path, cache)
    c = make(3, 6, tmp_path, cache)
    ta, tb, tc = (read_jsonl(x.scenario.trace_path()) for x in (a, b, c))
    assert a.spec.to_dict() != b.spec.to_dict() and a.spec.to_dict() != c.spec.to_dict()
    assert not (len(ta) == len(tb) and np.array_equal(ta.arrival_s, tb.arrival_s))
    assert not (len(ta) == len(tc) and np.array_equal(ta.arrival_s, tc.arrival_s))


def test_written_yaml_loads_back_as_the_same_scenario(tmp_path: Path, cache: Path) -> None:
    case = make(1, 2, tmp_path, cache)
    again = load_scenario(case.scenario_path)
    assert again.model_dump(exclude={"base_dir"}) == case.scenario.model_dump(exclude={"base_dir"})
    assert again.trace_path() == case.scenario.trace_path()


def test_every_shape_meets_every_fleet_in_one_cycle() -> None:
    n = len(gen.shipped_fleets())
    assert math.gcd(len(gen.SHAPES), n) == 1  # else some pairs never meet
    pairs = {gen.case_plan(7, k, n) for k in range(len(gen.SHAPES) * n)}
    assert len(pairs) == len(gen.SHAPES) * n
    assert gen.case_plan(7, 3, n) != gen.case_plan(8, 3, n) or gen.case_plan(7, 4, n) != gen.case_plan(8, 4, n)


def test_fleets_are_the_shipped_pool_definitions() -> None:
    fleets = gen.shipped_fleets()
    names = [f.name for f in fleets]
    assert len(names) == len(set(names)) >= 3
    for f in fleets:
        for p in f.scenario.pools:  # model, SKU and start-up as shipped
            assert p.startup_cold_s > 0 and p.model and p.sku
        # a request trace: Azure or Mooncake, or the demo's packaged cut of the Azure trace (generic CSV)
        assert detect_format(f.lengths_path) in ("azure", "mooncake", "csv")


def test_bad_case_index_is_refused(tmp_path: Path) -> None:
    with pytest.raises(gen.GeneratorError, match="case index"):
        gen.generate_case(1, -1, work_dir=tmp_path)


# --------------------------------------------------------------------------- shapes


def draw(shape: str, seed: int = 0) -> tuple[dict[str, float], np.ndarray]:
    p = gen.draw_shape_params(shape, D, np.random.default_rng(seed))
    return p, gen.rate_multiplier(shape, p, grid, D)


@pytest.mark.parametrize("seed", range(5))
def test_step_rises_and_falls_by_its_factor(seed: int) -> None:
    p, m = draw("step-up", seed)
    assert 1.5 <= p["factor"] <= 5.0
    before, after = m[grid < p["at_s"]], m[grid >= p["at_s"]]
    assert np.allclose(after / before.max(), p["factor"])
    p, m = draw("step-down", seed)
    assert np.allclose(m[grid < p["at_s"]] / m[grid >= p["at_s"]].max(), p["factor"])


@pytest.mark.parametrize("seed", range(5))
def test_ramps_are_monotone_over_their_span(seed: int) -> None:
    p, up = draw("ramp-up", seed)
    span = (grid >= p["start_s"]) & (grid <= p["start_s"] + p["span_s"])
    assert np.all(np.diff(up) >= 0) and np.all(np.diff(up[span]) > 0)
    assert up[0] == pytest.approx(1.0 / p["factor"]) and up[-1] == pytest.approx(1.0)
    p, down = draw("ramp-down", seed)
    assert np.all(np.diff(down) <= 0) and down[-1] == pytest.approx(1.0 / p["factor"])
    p, both = draw("ramp-up-down", seed)
    top = int(np.argmax(both))
    assert np.all(np.diff(both[: top + 1]) >= 0) and np.all(np.diff(both[top:]) <= 0)


def test_flash_crowd_rises_fast_and_decays_to_its_base() -> None:
    p, m = draw("flash-crowd", 1)
    base = 1.0 / p["factor"]
    assert m[0] == pytest.approx(base)
    top = p["at_s"] + p["rise_s"]
    assert m[int(np.ceil(top)) + 1] == pytest.approx(1.0)
    held = p["at_s"] + p["rise_s"] + p["hold_s"]
    after = grid > held
    assert np.all(np.diff(m[after]) < 0)  # decays towards the base with time constant decay_s
    assert np.allclose(m[after] - base, (1.0 - base) * np.exp(-(grid[after] - held) / p["decay_s"]))


def test_bursts_are_sub_minute_at_their_factor() -> None:
    p, m = draw("bursts", 2)
    assert int(p["bursts"]) >= 1
    assert set(np.round(np.unique(m), 9)) <= {round(1.0 / p["factor"], 9), 1.0}
    for i in range(int(p["bursts"])):
        assert 5.0 <= p[f"burst{i}_s"] <= 40.0


def test_quiet_and_decay_and_diurnal() -> None:
    p, m = draw("quiet", 3)
    quiet = (grid >= p["at_s"]) & (grid < p["at_s"] + p["quiet_s"])
    assert np.all(m[quiet] <= 0.05) and np.all(m[~quiet] == 1.0)
    assert p["quiet_s"] >= 0.3 * D  # a long quiet period, not a dip
    p, m = draw("slow-decay", 3)
    assert np.all(np.diff(m) < 0) and m[-1] == pytest.approx(1.0 / p["factor"])
    p, m = draw("diurnal", 3)
    assert m.max() == pytest.approx(1.0) and m.min() > 0
    assert m.max() / m.min() > 1.5  # a ServeGen day swings (m-small: ~3x between night and evening)


def test_unknown_shape_is_named() -> None:
    with pytest.raises(gen.ShapeError, match="unknown shape 'wobble'"):
        gen.rate_multiplier("wobble", {}, grid, D)


def test_generated_step_case_rate_rises_by_its_factor(tmp_path: Path, cache: Path) -> None:
    n = len(gen.shipped_fleets())
    k = next(k for k in range(40) if gen.case_plan(1, k, n)[0] == "step-up")
    case = make(1, k, tmp_path, cache)
    p = case.spec.shape_params
    before = case.rate_rps[case.t_s < p["at_s"]]
    after = case.rate_rps[case.t_s >= p["at_s"]]
    assert after.min() / before.max() == pytest.approx(p["factor"])
    arr = read_jsonl(case.scenario.trace_path()).arrival_s
    rate_before = np.sum(arr < p["at_s"]) / p["at_s"]
    rate_after = np.sum(arr >= p["at_s"]) / (case.spec.duration_s - p["at_s"])
    # The arrivals follow it, with the trace's clustering as noise.
    assert rate_after / rate_before == pytest.approx(p["factor"], rel=0.35)


# --------------------------------------------------------------------------- lengths and gaps


def test_trace_mix_draws_the_traces_own_lengths() -> None:
    path = gen.shared_traces_dir() / "azure2023_conv.csv"
    src = read_trace_file(path, "azure")
    idx = gen.draw_lengths(src, "trace", 20_000, np.random.default_rng(4))
    qs = [10, 25, 50, 75, 90]
    for col in (src.prompt_tokens, src.output_tokens):
        want = np.percentile(col, qs)
        got = np.percentile(col[idx], qs)
        assert np.allclose(got, want, rtol=0.08, atol=2)
    # The other mixes lean on one side of the same pairs (means move by x1.5-1.7 and x0.5-0.6 here).
    for mix, col, lo, hi in (("long-prompts", src.prompt_tokens, 1.4, 2.2),
                             ("short-prompts", src.prompt_tokens, 0.3, 0.7),
                             ("long-outputs", src.output_tokens, 1.3, 2.0),
                             ("short-outputs", src.output_tokens, 0.4, 0.7)):
        idx = gen.draw_lengths(src, mix, 20_000, np.random.default_rng(4))
        assert lo < col[idx].mean() / col.mean() < hi, mix


def test_case_requests_are_pairs_of_the_source_trace(tmp_path: Path, cache: Path) -> None:
    case = make(1, 2, tmp_path, cache)
    fleet = next(f for f in gen.shipped_fleets() if f.name == case.spec.fleet)
    src = read_trace_file(fleet.lengths_path, detect_format(fleet.lengths_path))
    pairs = set(zip(src.prompt_tokens.tolist(), src.output_tokens.tolist(), strict=True))
    tr = read_jsonl(case.scenario.trace_path())
    assert len(tr) == case.spec.requests > 100
    assert all(pair in pairs for pair in zip(tr.prompt_tokens.tolist(), tr.output_tokens.tolist(), strict=True))
    assert tr.arrival_s[-1] <= case.spec.duration_s


def test_unit_gaps_keep_the_traces_burstiness() -> None:
    path = gen.shared_traces_dir() / "azure2023_code.csv"
    g = gen.unit_gaps(str(path))
    raw = np.diff(read_trace_file(path, "azure").arrival_s)
    assert np.mean(g) == pytest.approx(1.0)
    cv = float(np.std(g) / np.mean(g))
    assert cv > 1.2  # burstier than Poisson (CV 1), as the code trace is
    assert cv == pytest.approx(float(np.std(raw) / np.mean(raw)), rel=0.5)


def test_shaped_arrivals_follow_the_rate() -> None:
    rate = np.where(grid < 600, 2.0, 8.0)
    gaps = np.random.default_rng(0).exponential(1.0, 5000)
    a = gen.shaped_arrivals(gaps, grid, rate, np.random.default_rng(1))
    assert np.all(np.diff(a) >= 0) and a[-1] <= D
    assert np.sum(a < 600) / 600 == pytest.approx(2.0, rel=0.15)
    assert np.sum(a >= 600) / 600 == pytest.approx(8.0, rel=0.1)


# --------------------------------------------------------------------------- sizing and faults


def test_cases_are_sized_to_the_fleet(tmp_path: Path, cache: Path) -> None:
    for k in range(8):
        case = make(2, k, tmp_path, cache)
        s = case.spec
        top = {p.name: p.max_replicas for p in case.scenario.pools}
        assert all(1 <= v <= gen.CASE_MAX_REPLICAS for v in top.values())
        if s.beyond_max:
            assert gen.BEYOND_MAX[0] <= s.peak_level <= gen.BEYOND_MAX[1]
            assert gen.CLASS_SHARES[s.classes][2] >= gen.BEYOND_MIN_SHEDDABLE
            assert s.fault == "none" and not case.scenario.faults
        else:
            assert s.peak_level <= gen.PEAK_FILL + 1e-9
        # The busiest minute's arrivals are what the drawn level asks of the binding pool.
        share = 1.0 / len(top)
        bind = min(top[n] * s.capacity_rps[n] / share for n in top)
        assert s.realised_peak_rps == pytest.approx(s.peak_level * bind, rel=0.25)
        assert gen.DURATION_S[0] <= s.duration_s <= gen.DURATION_S[1]
        for p in case.scenario.pools:
            assert p.min_replicas <= p.replicas <= p.max_replicas
        cold = max(p.startup_cold_s for p in case.scenario.pools)
        for f in case.scenario.faults:  # after the first cold start-up could serve, before the end
            assert f.kind == s.fault and f.at_s is not None
            assert min(cold + 60.0, s.duration_s / 2) <= f.at_s < s.duration_s - 60.0


def test_a_case_beyond_max_has_room_to_shed_and_no_fault(tmp_path: Path, cache: Path) -> None:
    case = make(1, 5, tmp_path, cache)  # seed 1's case 5 is drawn beyond max_replicas
    s = case.spec
    assert s.beyond_max and gen.BEYOND_MAX[0] <= s.peak_level <= gen.BEYOND_MAX[1]
    sheddable = gen.CLASS_SHARES[s.classes][2]
    assert sheddable >= gen.BEYOND_MIN_SHEDDABLE
    assert s.peak_level * (1.0 - sheddable) <= gen.PEAK_FILL + 1e-9  # critical + standard alone fit
    assert s.fault == "none" and not case.scenario.faults


def test_a_fault_lands_in_the_busiest_minute_after_the_first_cold_start(tmp_path: Path, cache: Path) -> None:
    case = make(2, 4, tmp_path, cache)  # seed 2's case 4: a crash on the azure-conv fleet
    (f,) = case.scenario.faults
    assert f.kind == "crash" and f.count >= 1 and f.at_s is not None
    arr = read_jsonl(case.scenario.trace_path()).arrival_s
    cold = max(p.startup_cold_s for p in case.scenario.pools)
    starts = np.arange(min(cold + 60.0, case.spec.duration_s / 2), case.spec.duration_s - 120.0, 1.0)
    counts = np.searchsorted(arr, starts + 60.0) - np.searchsorted(arr, starts)
    best = float(starts[int(np.argmax(counts))])
    assert best <= f.at_s <= best + 60.0
