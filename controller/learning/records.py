"""JSON form of observation records (one line per tick), shared by the history file and recordings;
`Recording` is a recording in memory.

A recording file is JSON lines: first a header `{"kind": "header", "version": 1, "physics":
{pool: PoolPhysics fields}, "window_s": 60, "tick_s": 15, "source": ...}`, then one
`{"kind": "tick", "at_s": ..., "pools": {...}, "classes": {...}, "settings": {...}, "reuse": {...}}`
per tick. A Reading is stored as its value when OK and as `{"status": "missing"|"nan"|"stale",
"value": v|null}` otherwise, so a missing series stays missing after a round trip.

Must not: hold state; errors name the file, the line and the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from controller.core.coupling import PoolPhysics
from controller.core.observations import ObservationRecord, PoolSettings, ReuseProfile
from controller.types import ClassObservation, FleetObservation, PoolObservation, Reading, SignalStatus

RECORD_VERSION = 1
# the pool's own readings (per-replica series are not recorded: the models are fitted per pool)
_POOL_FIELDS = tuple(f.name for f in fields(PoolObservation) if f.name not in ("pool", "replicas"))
_CLASS_FIELDS = tuple(f.name for f in fields(ClassObservation) if f.name != "priority_class")
_SETTINGS_FIELDS = tuple(f.name for f in fields(PoolSettings))


class RecordError(ValueError):
    """A recording or history line is malformed; the message names file, line and field."""


@dataclass(frozen=True)
class Recording:
    """A recording in memory: its records, the pools' physics and how it was read."""

    label: str
    records: tuple[ObservationRecord, ...]
    physics: Mapping[str, PoolPhysics]  # per pool
    window_s: float
    tick_s: float
    meta: Mapping[str, object] = field(default_factory=dict)


def merge_physics(recordings: Sequence[Recording]) -> dict[str, PoolPhysics]:
    """Physics per pool over several recordings (the first recording naming a pool wins)."""
    out: dict[str, PoolPhysics] = {}
    for r in recordings:
        for pool, ph in r.physics.items():
            out.setdefault(pool, ph)
    return out


def _reading_out(r: Reading) -> Any:
    finite = math.isfinite(r.value)
    if r.ok and finite:
        return r.value
    status = r.status.value if not r.ok else SignalStatus.NAN.value
    return {"status": status, "value": r.value if finite else None}


def _reading_in(v: Any, where: str) -> Reading:
    if v is None:
        return Reading.missing()
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return Reading(float(v))
    if isinstance(v, dict):
        try:
            status = SignalStatus(v.get("status", "missing"))
        except ValueError:
            raise RecordError(f"{where}: unknown status {v.get('status')!r}; allowed: "
                              f"{[s.value for s in SignalStatus]}") from None
        val = v.get("value")
        return Reading(math.nan if val is None else float(val), status)
    raise RecordError(f"{where}: expected a number, null or {{status, value}}, got {type(v).__name__}")


def record_to_dict(rec: ObservationRecord) -> dict[str, Any]:
    obs = rec.observation
    return {
        "kind": "tick",
        "at_s": rec.at_s,
        "pools": {name: {f: _reading_out(getattr(p, f)) for f in _POOL_FIELDS} for name, p in obs.pools.items()},
        "classes": {name: {f: _reading_out(getattr(c, f)) for f in _CLASS_FIELDS} for name, c in obs.classes.items()},
        "source": obs.source,
        "settings": {name: {f: getattr(s, f) for f in _SETTINGS_FIELDS} for name, s in rec.settings.items()},
        "reuse": {name: list(p.hit_at) for name, p in rec.reuse.items()},
    }


def record_from_dict(d: Mapping[str, Any], where: str = "record") -> ObservationRecord:
    if not isinstance(d, Mapping) or d.get("kind") != "tick":
        raise RecordError(f"{where}: not a tick record (expected \"kind\": \"tick\")")
    try:
        at_s = float(d["at_s"])
    except (KeyError, TypeError, ValueError):
        raise RecordError(f"{where}: at_s: missing or not a number") from None
    pools = {}
    for name, p in (d.get("pools") or {}).items():
        if not isinstance(p, Mapping):
            raise RecordError(f"{where}: pools.{name}: expected an object")
        unknown = set(p) - set(_POOL_FIELDS)
        if unknown:
            raise RecordError(f"{where}: pools.{name}: unknown field(s) {sorted(unknown)}")
        readings: dict[str, Any] = {f: _reading_in(p.get(f), f"{where}: pools.{name}.{f}") for f in _POOL_FIELDS}
        pools[name] = PoolObservation(pool=name, **readings)
    classes = {}
    for name, c in (d.get("classes") or {}).items():
        if not isinstance(c, Mapping):
            raise RecordError(f"{where}: classes.{name}: expected an object")
        classes[name] = ClassObservation(priority_class=name, **{
            f: _reading_in(c.get(f), f"{where}: classes.{name}.{f}") for f in _CLASS_FIELDS})
    settings = {}
    for name, s in (d.get("settings") or {}).items():
        if not isinstance(s, Mapping):
            raise RecordError(f"{where}: settings.{name}: expected an object")
        unknown = set(s) - set(_SETTINGS_FIELDS)
        if unknown:
            raise RecordError(f"{where}: settings.{name}: unknown field(s) {sorted(unknown)}")
        try:
            settings[name] = PoolSettings(**s)
        except TypeError as exc:
            raise RecordError(f"{where}: settings.{name}: {exc}") from None
    reuse = {}
    for name, h in (d.get("reuse") or {}).items():
        try:
            reuse[name] = ReuseProfile(tuple(float(v) for v in h))
        except (TypeError, ValueError) as exc:
            raise RecordError(f"{where}: reuse.{name}: {exc}") from None
    obs = FleetObservation(at_s=at_s, pools=pools, classes=classes, source=str(d.get("source", "")))
    return ObservationRecord(at_s=at_s, observation=obs, settings=settings, reuse=reuse)


def header_dict(physics: Mapping[str, PoolPhysics], *, window_s: float, tick_s: float, source: str,
                meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"kind": "header", "version": RECORD_VERSION, "window_s": window_s, "tick_s": tick_s, "source": source,
            "physics": {pool: p.to_dict() for pool, p in physics.items()}, "meta": dict(meta or {})}


def dumps(d: Mapping[str, Any]) -> str:
    return json.dumps(d, separators=(",", ":"), allow_nan=False)


def write_recording(path: Path, header: Mapping[str, Any], records: Iterable[ObservationRecord]) -> int:
    """Write header + records; returns the number of tick lines. Atomic (temp file + rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with tmp.open("w") as f:
        f.write(dumps(header) + "\n")
        for rec in records:
            f.write(dumps(record_to_dict(rec)) + "\n")
            n += 1
    tmp.replace(path)
    return n


def iter_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        f = Path(path).open()  # noqa: SIM115  # closed by the `with f:` below; opened apart to tell a read error
    except OSError as exc:
        raise RecordError(f"{path}: cannot read: {exc.strerror}") from None
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RecordError(f"{path}:{lineno}: not valid JSON: {exc.msg}") from None
            if not isinstance(d, dict):
                raise RecordError(f"{path}:{lineno}: expected a JSON object")
            yield lineno, d


def read_recording(path: Path) -> tuple[dict[str, Any], dict[str, PoolPhysics], list[ObservationRecord]]:
    """(header, physics per pool, records). The first line must be the header."""
    header: dict[str, Any] | None = None
    physics: dict[str, PoolPhysics] = {}
    records: list[ObservationRecord] = []
    for lineno, d in iter_lines(path):
        if header is None:
            if d.get("kind") != "header":
                raise RecordError(f"{path}:{lineno}: the first line must be the header (\"kind\": \"header\"); "
                                  "is this a file written by `governor record`?")
            if d.get("version") != RECORD_VERSION:
                raise RecordError(f"{path}:{lineno}: version: unsupported recording version {d.get('version')!r} "
                                  f"(this governor reads {RECORD_VERSION})")
            header = d
            for pool, p in (d.get("physics") or {}).items():
                try:
                    physics[pool] = PoolPhysics.from_dict(p)
                except (TypeError, ValueError) as exc:
                    raise RecordError(f"{path}:{lineno}: physics.{pool}: {exc}") from None
            continue
        records.append(record_from_dict(d, f"{path}:{lineno}"))
    if header is None:
        raise RecordError(f"{path}: empty file (no header line)")
    return header, physics, records
