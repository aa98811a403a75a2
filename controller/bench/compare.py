"""`governor bench compare OLD NEW`: are two bench runs' results the same, wall times aside?

OLD and NEW are `--out` folders of `bench all` or `bench policies` (or two JSON files).
Every `*.json` report in OLD is matched by name in NEW and compared value by value,
leaving out what measures the machine rather than the policies: keys that hold wall
times, speed-ups and memory, the scenario file's path and the profile cache's key
(`WALL_KEYS`). Floats compare exactly unless `--rel-tol` is given. This is the check that a
change meant to keep behaviour (a refactor, a move of code) kept it: the bench replays are
deterministic for a seed.

Exit codes: 0 identical, 1 differences (each named by file and JSON path, up to
`--max-diffs`), 2 bad input (a folder missing, a report missing on one side, bad JSON).
Must not: write anything.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Keys whose values depend on the machine and its load, on where the scenario was read from (a
# checkout's path), or on the source text (the profile cache's key hashes the simulator's files, so
# moving code changes it), not on what was simulated.
WALL_KEYS = frozenset({
    "wall_s", "wall_seconds", "timings_s", "sim_speed_wall_s", "policies_wall_s", "speedup",
    "peak_rss_mb", "elapsed_s", "workers", "scenario_file", "cache_key", "run_seconds", "file",
    # bench robustness / frontier: each case's wall and CPU seconds, their total, per replay and per policy
    "case_wall_s", "case_cpu_s", "cpu_s_total", "cpu_s_per_replay", "cpu_s_by_policy", "resumed_cases",
})


class CompareError(ValueError):
    """Bad input to the comparison; the message is what the user sees."""


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CompareError(f"{path}: cannot read JSON ({e})") from e


def _same_float(a: float, b: float, rel_tol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b if rel_tol == 0.0 else math.isclose(a, b, rel_tol=rel_tol, abs_tol=0.0)


def diff_values(old: Any, new: Any, path: str = "$", rel_tol: float = 0.0) -> Iterator[str]:
    """Each difference between two JSON values as 'path: old -> new', wall-time keys left out."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new)):
            if k in WALL_KEYS:
                continue
            if k not in new:
                yield f"{path}.{k}: only in old"
            elif k not in old:
                yield f"{path}.{k}: only in new"
            else:
                yield from diff_values(old[k], new[k], f"{path}.{k}", rel_tol)
    elif isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            yield f"{path}: {len(old)} items -> {len(new)}"  # then the common prefix
        for i, (a, b) in enumerate(zip(old, new, strict=False)):
            yield from diff_values(a, b, f"{path}[{i}]", rel_tol)
    elif isinstance(old, bool) or isinstance(new, bool) or not (
            isinstance(old, (int, float)) and isinstance(new, (int, float))):
        if old != new or isinstance(old, bool) != isinstance(new, bool):
            yield f"{path}: {old!r} -> {new!r}"
    elif not _same_float(float(old), float(new), rel_tol):
        yield f"{path}: {old!r} -> {new!r}"


def _reports(root: Path) -> dict[str, Path]:
    if root.is_file():
        return {root.name: root}
    if not root.is_dir():
        raise CompareError(f"{root}: no such folder or file")
    found = {p.name: p for p in sorted(root.glob("*.json"))}
    if not found:
        raise CompareError(f"{root}: no *.json reports in it")
    return found


def compare(old_root: Path, new_root: Path, *, rel_tol: float = 0.0) -> dict[str, list[str]]:
    """{report name: differences} for every report of OLD (empty lists: identical)."""
    old, new = _reports(old_root), _reports(new_root)
    if old_root.is_file() and new_root.is_file():
        return {old_root.name: list(diff_values(_load(old_root), _load(new_root), rel_tol=rel_tol))}
    missing = sorted(set(old) - set(new))
    if missing:
        raise CompareError(f"{new_root}: missing {', '.join(missing)} (present in {old_root})")
    return {name: list(diff_values(_load(old[name]), _load(new[name]), rel_tol=rel_tol)) for name in old}


def cmd_bench_compare(args: argparse.Namespace) -> int:
    try:
        result = compare(Path(args.old), Path(args.new), rel_tol=args.rel_tol)
    except CompareError as e:
        print(f"governor bench compare: {e}", file=sys.stderr)
        return 2
    differing = {k: v for k, v in result.items() if v}
    if args.json:
        print(json.dumps({"reports": len(result), "identical": len(result) - len(differing),
                          "differences": {k: v[: args.max_diffs] for k, v in differing.items()}}))
    else:
        for name, diffs in differing.items():
            print(f"{name}: {len(diffs)} difference(s)")
            for d in diffs[: args.max_diffs]:
                print(f"  {d}")
        print(f"{len(result) - len(differing)} of {len(result)} report(s) identical"
              + (f" (rel-tol {args.rel_tol:g})" if args.rel_tol else ""))
    return 1 if differing else 0
