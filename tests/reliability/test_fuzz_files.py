"""Fuzz config files and trace files (issue 21): a clear error naming what is wrong (ConfigError from
`governor config validate`, TraceError from the trace readers), never a traceback.

Configs: the shipped example with one value replaced, one key dropped or one unknown key added, at any
depth, plus YAML that is not a mapping at all. Traces: the JSONL (generic, Mooncake) and CSV (generic,
Azure) readers on records with missing, extra, mistyped and out-of-range fields, and on bytes.
Default run: FUZZ_CASES per test (seeded); GOVERNOR_FUZZ_FULL=1: 10,000 (with pytest -p no:timeout: a full run is
longer than the suite's 300 s per-test timeout).
"""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.config import ConfigError
from controller.runtime.preflight import preflight
from controller.sim.trace_types import TraceError
from controller.sim.traces import detect_format, read_trace_file

FULL = os.environ.get("GOVERNOR_FUZZ_FULL") == "1"
FUZZ_CASES = 10_000 if FULL else 40
FUZZ = settings(max_examples=FUZZ_CASES, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "governor.example.yaml"

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                    st.text(max_size=30), st.sampled_from(["", "0", "1e9", "-1", ".nan", "true", "llama-3.1-8b",
                                                          "127.0.0.1:0", "0.0.0.0:80"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=10), inner, max_size=3)),
                      max_leaves=6)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


BASE = yaml.safe_load(EXAMPLE.read_text())
PATHS = [p for p in _paths(BASE) if p]


@st.composite
def mutated_configs(draw) -> str:
    data = copy.deepcopy(BASE)
    path = draw(st.sampled_from(PATHS))
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    action = draw(st.sampled_from(["replace", "drop", "add"]))
    if action == "replace":
        parent[path[-1]] = draw(values)
    elif action == "drop" and isinstance(parent, dict):
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[draw(st.text(min_size=1, max_size=12))] = draw(values)
    return yaml.safe_dump(data, allow_unicode=True)


def _validate(text: str, state_dir: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "g.yaml"
        path.write_text(text.replace("state_dir: governor-state", f"state_dir: {state_dir}"))
        try:
            preflight(path)
        except ConfigError as exc:  # the one acceptable failure: it names what is wrong
            assert exc.problems and all(p.strip() for p in exc.problems)
            assert "Traceback" not in str(exc)


@FUZZ
@given(mutated_configs())
def test_config_validate_on_mutated_configs(tmp_path_factory, text):
    _validate(text, str(tmp_path_factory.getbasetemp() / "state"))


@FUZZ
@given(st.one_of(values.map(lambda v: yaml.safe_dump(v, allow_unicode=True)), st.text(max_size=200)))
def test_config_validate_on_arbitrary_yaml(tmp_path_factory, text):
    _validate(text, str(tmp_path_factory.getbasetemp() / "state"))


# --------------------------------------------------------------------------- traces

trace_values = st.one_of(st.integers(-5, 5000), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                         st.booleans(), st.none(), st.text(max_size=8), st.lists(st.integers(-3, 2**65), max_size=4))
GENERIC = ("arrival_s", "prompt_tokens", "output_tokens", "hash_ids")
MOONCAKE = ("timestamp", "input_length", "output_length", "hash_ids")


@st.composite
def jsonl_traces(draw) -> bytes:
    keys = draw(st.sampled_from([GENERIC, MOONCAKE]))
    lines = []
    for _ in range(draw(st.integers(1, 6))):
        rec = {k: draw(st.one_of(st.integers(0, 3000), trace_values)) for k in keys if draw(st.integers(0, 5))}
        rec[keys[0]] = rec.get(keys[0], 1)  # keep the format recognisable on line 1 most of the time
        if draw(st.integers(0, 4)) == 0:
            rec[draw(st.text(max_size=6))] = draw(trace_values)
        lines.append(json.dumps(rec) if draw(st.integers(0, 9)) else draw(st.text(max_size=20)))
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")


@st.composite
def csv_traces(draw) -> bytes:
    header = draw(st.sampled_from([["TIMESTAMP", "ContextTokens", "GeneratedTokens"],
                                   ["arrival_s", "prompt_tokens", "output_tokens"]]))
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(header)
    for _ in range(draw(st.integers(0, 6))):
        w.writerow([str(draw(trace_values)) for _ in range(draw(st.integers(1, 4)))])
    return out.getvalue().encode("utf-8", "surrogatepass")


def _read(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.data"
        path.write_bytes(data)
        try:
            read_trace_file(path, detect_format(path))
        except TraceError as exc:
            assert str(exc).startswith(str(path)), str(exc)  # names the file (and the line and field)


@FUZZ
@given(st.one_of(jsonl_traces(), csv_traces(), st.binary(max_size=200)))
def test_trace_readers_on_malformed_files(data):
    _read(data)
