"""Trace loaders on the real shared traces, the transforms, and errors on malformed files."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from controller.paths import shared_data_dir
from controller.sim.scenario import ScenarioError, ServeGenSpec, SurgeSpec, SyntheticPrefixSpec, TraceSpec
from controller.sim.trace_servegen import _gamma_renewal, read_servegen_rates
from controller.sim.trace_transforms import (
    add_surge,
    add_synthetic_prefixes,
    compress,
    scale_rate,
    surge_multiplier,
    window,
)
from controller.sim.trace_types import Trace, TraceError
from controller.sim.traces import detect_format, load_trace, save_trace

TRACES = shared_data_dir() / "traces"


def _load(path: str | Path, seed: int = 0, **kw) -> Trace:
    return load_trace(TraceSpec(path=str(path), **kw), TRACES, np.random.default_rng(seed))


def _infinite_cache_block_hit(hashes) -> float:
    seen: set[int] = set()
    hits = total = 0
    for h in hashes:
        for b in h:
            total += 1
            hits += b in seen
            seen.add(b)
    return hits / total


def _trace(arrivals, prompts=None, outputs=None, hashes=None, block=512) -> Trace:
    n = len(arrivals)
    return Trace(
        name="t",
        arrival_s=np.asarray(arrivals, dtype=np.float64),
        prompt_tokens=np.asarray(prompts if prompts is not None else [100] * n, dtype=np.int64),
        output_tokens=np.asarray(outputs if outputs is not None else [10] * n, dtype=np.int64),
        block_hashes=hashes,
        hash_block_tokens=block,
    )


@pytest.fixture(scope="module")
def mooncake() -> Trace:
    return _load("mooncake_conversation.jsonl")


# --------------------------------------------------------------------------- real files


@pytest.mark.parametrize(
    ("file", "fmt", "count", "duration_s", "prompt_mean", "output_mean"),
    [
        # Figures from shared/data/README.md.
        ("azure2023_conv.csv", "azure", 19_366, 3_502, 1_155, 211),
        ("azure2023_code.csv", "azure", 8_819, 3_436, 2_048, 28),
        ("mooncake_conversation.jsonl", "mooncake", 12_031, 3_537, 12_035, 343),
    ],
)
def test_real_trace_counts_and_means(file, fmt, count, duration_s, prompt_mean, output_mean):
    assert detect_format(TRACES / file) == fmt
    tr = _load(file)
    assert len(tr) == count
    assert tr.arrival_s[0] == 0.0
    assert np.all(np.diff(tr.arrival_s) >= 0)
    assert tr.duration_s == pytest.approx(duration_s, abs=1.0)
    assert tr.prompt_tokens.mean() == pytest.approx(prompt_mean, abs=1.0)
    assert tr.output_tokens.mean() == pytest.approx(output_mean, abs=1.0)
    assert tr.prompt_tokens.dtype == np.int64 and tr.output_tokens.dtype == np.int64
    assert tr.prompt_tokens.min() >= 1 and tr.output_tokens.min() >= 1


def test_azure_timestamps_keep_sub_millisecond_digits():
    tr = _load("azure2023_conv.csv")
    # Lines 2 and 3: 18:15:46.6805900 and 18:15:50.9951690 → 4.314579 s apart.
    assert tr.arrival_s[1] == pytest.approx(4.314579, abs=1e-7)


def test_mooncake_hash_blocks_and_infinite_cache_hit(mooncake):
    assert mooncake.hash_block_tokens == 512
    assert mooncake.block_hashes is not None
    n_blocks = np.array([len(h) for h in mooncake.block_hashes])
    assert np.array_equal(n_blocks, -(-mooncake.prompt_tokens // 512))
    # README: "an infinite cache would hit ~37% of blocks"; computed: 36.6%.
    assert _infinite_cache_block_hit(mooncake.block_hashes) == pytest.approx(0.366, abs=0.005)


def test_trace_arrays_are_read_only(mooncake):
    with pytest.raises(ValueError):
        mooncake.arrival_s[0] = 5.0


# --------------------------------------------------------------------------- ServeGen


@pytest.fixture(scope="module")
def servegen_day() -> Trace:
    spec = ServeGenSpec(tier="m-small", mean_rps=0.5, days=1, start_day=0)
    return _load("servegen_14day_rates.csv", seed=3, servegen=spec)


def test_servegen_follows_the_rate_shape(servegen_day):
    rates = read_servegen_rates(TRACES / "servegen_14day_rates.csv")
    hourly_rate = rates.rate_rps["m-small"][:144].reshape(24, 6).mean(axis=1)
    hourly_count = np.histogram(servegen_day.arrival_s, bins=24, range=(0, 86_400))[0]
    # Mean rate rescaled to 0.5 req/s: 43,200 expected over the day.
    assert len(servegen_day) == pytest.approx(43_200, rel=0.03)
    assert np.corrcoef(hourly_count, hourly_rate)[0, 1] > 0.97
    # The evening peak is ~3x the night trough in the source; the draws keep the ratio.
    expected = hourly_rate / hourly_rate.mean() * 0.5 * 3600
    assert np.all(np.abs(hourly_count - expected) < 0.15 * expected)


def test_servegen_lengths_are_lognormal_around_the_means(servegen_day):
    # Clipping at 8x the mean trims ~2% off the prompt mean (lognormal sigma 1.0).
    assert servegen_day.prompt_tokens.mean() == pytest.approx(1024, rel=0.04)
    assert servegen_day.output_tokens.mean() == pytest.approx(200, rel=0.04)
    assert servegen_day.prompt_tokens.max() <= 8 * 1024
    assert np.log(servegen_day.prompt_tokens).std() == pytest.approx(1.0, abs=0.1)


def test_servegen_time_scale_and_start_day():
    spec = ServeGenSpec(tier="m-large", mean_rps=0.2, days=0.5, start_day=2.25)
    tr = _load("servegen_14day_rates.csv", seed=1, servegen=spec, time_scale=24)
    assert tr.name.endswith("m-large")
    assert tr.duration_s <= 43_200 / 24
    assert len(tr) == pytest.approx(0.2 * 43_200, rel=0.06)


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0, 4.0])
def test_gamma_renewal_has_the_requested_cv(cv):
    rng = np.random.default_rng(7)
    pts = _gamma_renewal(rng, 200_000.0, 1.0 / cv**2)
    gaps = np.diff(pts)
    assert len(pts) == pytest.approx(200_000, rel=0.05 * cv)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


def test_gamma_renewal_starts_stationary():
    # An ordinary start (first point one Gamma gap after 0) expects 10 + (CV² - 1) / 2 = 17.5 points
    # on [0, 10) at CV 4; the stationary start (length-biased first gap) expects exactly 10.
    rng = np.random.default_rng(11)
    counts = [len(_gamma_renewal(rng, 10.0, 1 / 16)) for _ in range(4000)]
    assert np.mean(counts) == pytest.approx(10.0, rel=0.1)


# --------------------------------------------------------------------------- generic formats


def test_generic_jsonl_and_csv_round_trip(tmp_path):
    jl = tmp_path / "g.jsonl"
    jl.write_text(
        '{"arrival_s": 1.5, "prompt_tokens": 700, "output_tokens": 5, "hash_ids": [1, 2]}\n'
        "\n"
        '{"arrival_s": 0.25, "prompt_tokens": 40, "output_tokens": 9, "hash_ids": [1]}\n'
        '{"arrival_s": 3, "prompt_tokens": 1500, "output_tokens": 1, "hash_ids": [1]}\n'
    )
    tr = load_trace(TraceSpec(path="g.jsonl"), tmp_path, np.random.default_rng(0))
    # Out-of-order arrivals are sorted, not rejected; arrival_s is kept as given (not re-based).
    assert tr.arrival_s.tolist() == [0.25, 1.5, 3.0]
    assert tr.prompt_tokens.tolist() == [40, 700, 1500]
    # Short hash lists are completed with fresh unique ids up to ceil(prompt / 512) blocks.
    assert tr.block_hashes is not None
    assert tr.block_hashes[0] == (1,) and tr.block_hashes[1] == (1, 2)
    assert tr.block_hashes[2][0] == 1 and len(tr.block_hashes[2]) == 3 and min(tr.block_hashes[2][1:]) > 2
    out = tmp_path / "copy.jsonl"
    save_trace(tr, out)
    again = load_trace(TraceSpec(path=str(out)), tmp_path, np.random.default_rng(0))
    assert again.arrival_s.tolist() == tr.arrival_s.tolist() and again.block_hashes == tr.block_hashes

    csv_path = tmp_path / "g.csv"
    csv_path.write_text("prompt_tokens,arrival_s,output_tokens\n10,2.0,3\n20,0.5,4\n")
    assert detect_format(csv_path) == "csv"
    tr = load_trace(TraceSpec(path="g.csv"), tmp_path, np.random.default_rng(0))
    assert tr.arrival_s.tolist() == [0.5, 2.0] and tr.prompt_tokens.tolist() == [20, 10]
    assert tr.block_hashes is None


def test_non_monotonic_azure_timestamps_are_sorted(tmp_path):
    p = tmp_path / "az.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:05.0000000,10,1\n"
        "2023-11-16 18:00:01.5000000,20,2\n"
        "2023-11-16 18:00:03.0000000,30,3\n"
    )
    tr = load_trace(TraceSpec(path=str(p)), tmp_path, np.random.default_rng(0))
    assert tr.arrival_s.tolist() == [0.0, 1.5, 3.5]
    assert tr.prompt_tokens.tolist() == [20, 30, 10]


# --------------------------------------------------------------------------- malformed input

AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW = "2023-11-16 18:00:00.0000000,10,1\n"


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("az.csv", AZ + ROW + "2023-11-16 18:00:01.0000000,10,x\n", ":3: GeneratedTokens: not an integer ('x')"),
        ("az.csv",
         AZ + ROW + ROW + "2023-11-16 18:00:01.0000000,0,4\n",
         ":4: ContextTokens: must be an integer >= 1 (got 0)"),
        ("az.csv",
         AZ + ROW + "2023-11-16 18:00:01.0000000,12,-3\n",
         ":3: GeneratedTokens: must be an integer >= 1 (got -3)"),
        ("az.csv", AZ + "yesterday,10,1\n", ":2: TIMESTAMP: not a timestamp"),
        ("az.csv", AZ + ROW + "2023-11-16 18:00:01.0000000,10\n", ":3: expected 3 fields"),
        ("az.csv", AZ, "empty trace"),
        ("empty.csv", "", "empty trace"),
        ("az.csv", "TIMESTAMP,Context,GeneratedTokens\n" + ROW, ":1: unknown CSV trace header"),
        ("mc.jsonl",
         '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}\n'
         '{"timestamp": 5, "input_length": 600, "hash_ids": [0]}\n',
         ":2: output_length: missing"),
        ("mc.jsonl",
         '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}\n'
         '{"timestamp": 5, "input_length": 60\n',
         ":2: not valid JSON"),
        ("mc.jsonl",
         '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [0, 1, 2]}\n',
         ":1: hash_ids: 3 blocks of 512 tokens exceed the 600-token prompt"),
        ("mc.jsonl",
         '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}\n'
         '{"timestamp": 1, "input_length": 6.5, "output_length": 2, "hash_ids": [0]}\n',
         ":2: input_length: not an integer (6.5)"),
        ("mc.jsonl",
         '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": "ab"}\n',
         ":1: hash_ids: must be a list of integers >= 0"),
        ("g.jsonl",
         '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 2, "tenant": "a"}\n',
         ":1: tenant: unknown field"),
        ("g.jsonl",
         '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 2}\n'
         '{"arrival_s": -1, "prompt_tokens": 5, "output_tokens": 2}\n',
         ":2: arrival_s: must be a finite number >= 0 (got -1)"),
        ("g.jsonl",
         '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 2, "hash_ids": [0]}\n'
         '{"arrival_s": 1, "prompt_tokens": 5, "output_tokens": 2}\n',
         ":2: hash_ids: present on some records and not others"),
        ("g.jsonl",
         '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": true}\n',
         ":1: output_tokens: not an integer (True)"),
        ("g.csv", "arrival_s,prompt_tokens,output_tokens\n0,5,2\nsoon,5,2\n", ":3: arrival_s: not a number ('soon')"),
        ("sg.csv", "window_start_s,m-large_rate\n0,1.0\n600,2\n", "missing column(s)"),
    ],
)
def test_malformed_traces_name_file_line_and_field(tmp_path, name, content, expected):
    (tmp_path / name).write_text(content)
    with pytest.raises(TraceError) as exc:
        load_trace(TraceSpec(path=name), tmp_path, np.random.default_rng(0))
    assert str(tmp_path / name) in str(exc.value)
    assert expected in str(exc.value)
    assert isinstance(exc.value, ValueError) and isinstance(exc.value, ScenarioError)


def test_missing_trace_file_is_a_clear_error(tmp_path):
    with pytest.raises(TraceError, match=r"nope\.csv: trace file not found"):
        load_trace(TraceSpec(path="nope.csv"), tmp_path, np.random.default_rng(0))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (TraceSpec(path="mooncake_conversation.jsonl", hash_block_tokens=256),
         "hash_block_tokens: Mooncake hash_ids cover 512-token blocks"),
        (TraceSpec(path="mooncake_conversation.jsonl", prefixes=SyntheticPrefixSpec()),
         "trace.prefixes: the trace has its own hash_ids"),
        (TraceSpec(path="azure2023_code.csv", prefixes=SyntheticPrefixSpec(prefix_tokens=256)),
         "prefix_tokens (256) is below trace.hash_block_tokens (512)"),
        (TraceSpec(path="azure2023_code.csv", start_s=5000, duration_s=10), "window [5000, 5010) s holds no requests"),
        (TraceSpec(path="azure2023_code.csv", servegen=ServeGenSpec()),
         "trace.servegen is set but the file is a 'azure' trace"),
        (TraceSpec(path="azure2023_code.csv", format="mooncake"), ":1: not valid JSON"),
    ],
)
def test_spec_mismatches_are_errors(spec, expected):
    with pytest.raises(TraceError) as exc:
        load_trace(spec, TRACES, np.random.default_rng(0))
    assert expected in str(exc.value)


# --------------------------------------------------------------------------- transforms


def test_window_and_time_scale():
    full = _load("azure2023_conv.csv")
    tr = _load("azure2023_conv.csv", start_s=600, duration_s=300, time_scale=2)
    inside = (full.arrival_s >= 600) & (full.arrival_s < 900)
    assert len(tr) == int(inside.sum())
    np.testing.assert_allclose(tr.arrival_s, (full.arrival_s[inside] - 600) / 2)
    assert tr.prompt_tokens.tolist() == full.prompt_tokens[inside].tolist()
    assert tr.duration_s < 150
    assert compress(full, 1.0) is full and window(full, 0.0, None) is full


@pytest.mark.parametrize("rate_scale", [0.3, 0.5, 2.0, 3.5])
def test_rate_scale_multiplies_the_count_and_keeps_the_shape(rate_scale):
    base = _load("azure2023_conv.csv")
    tr = _load("azure2023_conv.csv", seed=5, rate_scale=rate_scale)
    assert len(tr) == pytest.approx(rate_scale * len(base), rel=0.03)
    assert np.all(np.diff(tr.arrival_s) >= 0) and tr.arrival_s[0] >= 0
    assert tr.duration_s <= base.duration_s
    # Per-5-minute counts scale uniformly: the rate shape survives.
    bins = np.arange(0, 3600, 300)
    ratio = np.histogram(tr.arrival_s, bins)[0] / np.histogram(base.arrival_s, bins)[0]
    assert np.all(np.abs(ratio - rate_scale) < 0.15 * rate_scale)
    assert tr.prompt_tokens.mean() == pytest.approx(base.prompt_tokens.mean(), rel=0.05)


def test_rate_scale_copies_land_between_their_neighbours():
    base = _trace([0.0, 10.0, 12.0, 40.0])
    tr = scale_rate(base, 3.0, np.random.default_rng(0))
    assert len(tr) == 12  # rate_scale 3.0: exactly 2 copies each
    # Cells: [0, 5], [5, 11], [11, 26], [26, 40].
    for lo, hi in [(0, 5), (5, 11), (11, 26), (26, 40)]:
        assert np.sum((tr.arrival_s >= lo) & (tr.arrival_s <= hi)) >= 3


def test_copies_keep_shared_blocks_and_get_fresh_private_ones():
    hashes = ((0, 1), (0, 1, 2), (0, 3))  # 0 and 1 are shared; 2 and 3 belong to one request each
    base = _trace([0.0, 1.0, 2.0], prompts=[1024, 1500, 1024], hashes=hashes)
    tr = scale_rate(base, 2.0, np.random.default_rng(0))
    assert len(tr) == 6
    assert tr.block_hashes is not None
    ids = [b for h in tr.block_hashes for b in h]
    assert ids.count(2) == 1 and ids.count(3) == 1  # private content is never repeated
    for h in tr.block_hashes:
        assert h[0] == 0
    assert sum(1 for h in tr.block_hashes if h[:2] == (0, 1)) == 4


def test_mooncake_rate_scale_keeps_hash_invariant(mooncake):
    tr = scale_rate(mooncake, 1.5, np.random.default_rng(2))
    assert tr.block_hashes is not None
    n_blocks = np.array([len(h) for h in tr.block_hashes])
    assert np.array_equal(n_blocks, -(-tr.prompt_tokens // 512))
    assert 0.3 < _infinite_cache_block_hit(tr.block_hashes) < 0.5


@pytest.mark.parametrize(
    ("t_s", "expected"),
    [(99.9, 1.0), (100.0, 1.0), (130.0, 3.0), (160.0, 5.0), (339.9, 5.0), (340.0, 1.0), (1000.0, 1.0)],
)
def test_surge_multiplier(t_s, expected):
    surge = SurgeSpec(at_s=100, factor=5, ramp_s=60, duration_s=240)
    assert surge_multiplier(np.array([t_s]), surge)[0] == pytest.approx(expected)


def test_surge_adds_requests_only_inside_the_surge():
    base = _load("azure2023_conv.csv", time_scale=2)
    surge = SurgeSpec(at_s=600, factor=5, ramp_s=60, duration_s=300)
    tr = add_surge(base, surge, np.random.default_rng(4))

    def count(t, lo, hi):
        return int(np.sum((t.arrival_s >= lo) & (t.arrival_s < hi)))

    assert count(tr, 0, 595) == count(base, 0, 595)
    assert count(tr, 905, 2000) == count(base, 905, 2000)
    # Plateau [660, 900): 5x.
    assert count(tr, 660, 900) == pytest.approx(5 * count(base, 660, 900), rel=0.05)
    # Ramp [600, 660): on average 3x.
    assert count(tr, 600, 660) == pytest.approx(3 * count(base, 600, 660), rel=0.15)
    # Through load_trace the surge applies after time_scale.
    via_spec = _load("azure2023_conv.csv", seed=4, time_scale=2, surge=surge)
    assert count(via_spec, 660, 900) == pytest.approx(count(tr, 660, 900), rel=0.05)


def test_synthetic_prefixes():
    base = _trace(np.arange(6.0), prompts=[100, 512, 700, 1024, 1600, 5000])
    spec = SyntheticPrefixSpec(groups=4, zipf_a=1.5, prefix_tokens=1024)
    tr = add_synthetic_prefixes(base, spec, np.random.default_rng(0))
    # Shared blocks = floor(min(1024, prompt) / 512): 0, 1, 1, 2, 2, 2; total = ceil(prompt / 512).
    shared = [0, 1, 1, 2, 2, 2]
    group_ids = range(4 * 2)
    assert tr.block_hashes is not None
    for h, p, s in zip(tr.block_hashes, base.prompt_tokens, shared, strict=True):
        assert len(h) == math.ceil(p / 512)
        assert all(b in group_ids for b in h[:s])
        assert all(b >= 8 for b in h[s:])
        if s:
            g = h[0] // 2
            assert h[:s] == tuple(range(2 * g, 2 * g + s))
    own = [b for h, s in zip(tr.block_hashes, shared, strict=True) for b in h[s:]]
    assert len(own) == len(set(own))


def test_synthetic_prefix_popularity_is_zipf():
    base = _load("azure2023_conv.csv")
    tr = add_synthetic_prefixes(base, SyntheticPrefixSpec(groups=64, zipf_a=1.2, prefix_tokens=512),
                                np.random.default_rng(0))
    assert tr.block_hashes is not None
    first = np.array([h[0] for h in tr.block_hashes if h and h[0] < 64])
    share = np.bincount(first, minlength=64) / len(first)
    weights = np.arange(1, 65) ** -1.2
    np.testing.assert_allclose(share[:4], (weights / weights.sum())[:4], atol=0.01)


def test_same_seed_same_trace_and_different_seed_differs():
    kw = dict(
        rate_scale=2.3,
        prefixes=SyntheticPrefixSpec(),
        surge=SurgeSpec(at_s=500, factor=4),
        time_scale=1.5,
    )
    a = _load("azure2023_code.csv", seed=9, **kw)
    b = _load("azure2023_code.csv", seed=9, **kw)
    c = _load("azure2023_code.csv", seed=10, **kw)
    assert np.array_equal(a.arrival_s, b.arrival_s) and a.block_hashes == b.block_hashes
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert len(a) != len(c) or not np.array_equal(a.arrival_s, c.arrival_s)
