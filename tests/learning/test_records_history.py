"""Observation records as JSON lines, and the daemon's persisted ring buffer."""

from __future__ import annotations

import json
import math

import pytest

from controller.learning.history import HISTORY_FILE, HistoryBuffer
from controller.learning.records import (
    RecordError,
    header_dict,
    read_recording,
    record_from_dict,
    record_to_dict,
    write_recording,
)
from controller.types import Reading, SignalStatus
from tests.learning.helpers import physics_by_pool, synthetic_records


def test_record_round_trip_keeps_missing_and_stale_readings():
    rec = synthetic_records(1)[0]
    p0 = rec.observation.pools["p0"]
    from dataclasses import replace

    obs = replace(rec.observation, pools={**rec.observation.pools,
                                          "p0": replace(p0, waiting=Reading.missing(),
                                                        ttft_p95_s=Reading(2.0, SignalStatus.STALE, 300.0))})
    rec = replace(rec, observation=obs)
    back = record_from_dict(json.loads(json.dumps(record_to_dict(rec))))
    q = back.observation.pools["p0"]
    assert q.waiting.status is SignalStatus.MISSING and math.isnan(q.waiting.value)
    assert q.ttft_p95_s.status is SignalStatus.STALE and q.ttft_p95_s.value == 2.0
    assert back.settings == rec.settings and back.reuse == rec.reuse
    critical = rec.observation.classes["critical"]
    assert back.observation.classes["critical"].arrival_rps.value == critical.arrival_rps.value


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("at_s"), "at_s"),
    (lambda d: d["pools"]["p0"].update(bogus=1.0), "pools.p0: unknown field"),
    (lambda d: d["settings"]["p0"].update(replicaz=3), "settings.p0: unknown field"),
    (lambda d: d["pools"]["p0"].update(ttft_p95_s={"status": "weird"}), "unknown status"),
    (lambda d: d["reuse"].update(p0=[0.1, 0.2]), "reuse.p0"),
])
def test_bad_record_names_the_field(mutate, message):
    d = record_to_dict(synthetic_records(1)[0])
    mutate(d)
    with pytest.raises(RecordError, match=message):
        record_from_dict(d, "file.jsonl:7")


def test_recording_file_round_trip_and_errors(tmp_path):
    recs = synthetic_records(5)
    path = tmp_path / "run.jsonl"
    write_recording(path, header_dict(physics_by_pool(), window_s=60, tick_s=15, source="test"), recs)
    header, physics, back = read_recording(path)
    assert header["tick_s"] == 15 and set(physics) == {"p0", "p1"} and len(back) == 5
    (tmp_path / "noheader.jsonl").write_text(json.dumps(record_to_dict(recs[0])) + "\n")
    with pytest.raises(RecordError, match="noheader.jsonl:1: the first line must be the header"):
        read_recording(tmp_path / "noheader.jsonl")
    lines = path.read_text().splitlines()
    (tmp_path / "broken.jsonl").write_text("\n".join(lines[:3] + ["{not json"]) + "\n")
    with pytest.raises(RecordError, match="broken.jsonl:4: not valid JSON"):
        read_recording(tmp_path / "broken.jsonl")


def test_history_is_bounded_and_survives_a_restart(tmp_path):
    recs = synthetic_records(25)
    h = HistoryBuffer(capacity=10, state_dir=tmp_path)
    for r in recs:
        h.append(r)
    assert len(h) == 10 and h.snapshot()[0].at_s == recs[15].at_s
    # the file was compacted once it held twice the capacity: it never grows without bound
    lines = (tmp_path / HISTORY_FILE).read_text().splitlines()
    assert len(lines) < 20
    again = HistoryBuffer(capacity=10, state_dir=tmp_path)
    assert [r.at_s for r in again.snapshot()] == [r.at_s for r in h.snapshot()]


def test_history_skips_a_torn_line(tmp_path):
    h = HistoryBuffer(capacity=50, state_dir=tmp_path)
    for r in synthetic_records(3):
        h.append(r)
    with (tmp_path / HISTORY_FILE).open("a") as f:
        f.write('{"kind": "tick", "at_s": 1')  # a crash mid-write
    again = HistoryBuffer(capacity=50, state_dir=tmp_path)
    assert len(again) == 3 and again.skipped_lines == 1


def test_history_without_a_state_dir_keeps_memory_only():
    h = HistoryBuffer(capacity=3)
    for r in synthetic_records(5):
        h.append(r)
    assert len(h) == 3 and h.path is None and h.span_s() == 30.0
