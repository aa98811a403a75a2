"""The dependency ranges of pyproject.toml against constraints.txt's exact versions (`make lowest`, `make lock`).

    python tools/deps.py lowest            # `name==floor` for every runtime dependency: pip's constraints
                                           # file for an install at the lowest versions the ranges allow
    python tools/deps.py check             # every dependency (runtime and dev) pinned in constraints.txt,
                                           # each pin inside its range; exit 1 naming what is not
    python tools/deps.py pin NAME          # the version constraints.txt pins NAME at (the Makefile's
                                           # opentelemetry-proto reinstall)
    python tools/deps.py demo-summary DIR  # `make lowest`'s report: the versions installed in DIR/freeze.txt
                                           # and what the demo in DIR/run did, as one JSON object

"Lowest" is for the direct dependencies only (uv's `--resolution lowest-direct`): what they pull in
resolves as usual. A range without a floor has no lowest version and is reported as an error.
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def requirements(extra: str | None = None) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    raw = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return [Requirement(r) for r in raw]


def pins(path: Path = ROOT / "constraints.txt", *, strict: bool = True) -> dict[str, Version]:
    """name → pinned version; `strict`: every line must be an exact pin (a `pip freeze` may hold `name @ url`)."""
    out: dict[str, Version] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep and not strict:
            continue
        if not sep:
            raise ValueError(f"{path.name}: {line!r} is not an exact pin (name==version)")
        out[canonicalize_name(name)] = Version(version.strip())
    return out


def floor(req: Requirement) -> Version:
    lows = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
    if not lows:
        raise ValueError(f"{req}: no lower bound (>=) to install at")
    return max(lows)


def problems(constraints: Path = ROOT / "constraints.txt") -> list[str]:
    have = pins(constraints)
    out = []
    for req in requirements() + requirements("dev"):
        pinned = have.get(canonicalize_name(req.name))
        if pinned is None:
            out.append(f"{req.name}: not pinned in constraints.txt (run `make lock`)")
        elif not req.specifier.contains(pinned, prereleases=True):
            out.append(f"{req.name}: constraints.txt pins {pinned}, outside pyproject's range {req.specifier}")
    return out


def demo_summary(folder: Path) -> dict:
    """The direct dependencies' installed versions, and the demo's ticks, outcomes, SLO attainment and models."""
    installed = pins(folder / "freeze.txt", strict=False)
    versions = {r.name: str(installed.get(canonicalize_name(r.name), "missing")) for r in requirements()}
    decisions: set[str] = set()
    outcomes: dict[str, int] = {}
    summary: dict = {}
    for line in (folder / "run" / "demo.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "tick" and event.get("decision_id") not in decisions:
            decisions.add(event.get("decision_id"))
            outcomes[event.get("outcome")] = outcomes.get(event.get("outcome"), 0) + 1
        elif event.get("event") == "summary":
            summary = event
    models = [json.loads(line).get("msg") for line in (folder / "run" / "demo.log").read_text().splitlines()
              if line.startswith("{") and "models" in json.loads(line).get("msg", "")][:3]
    return {"versions": versions, "ticks": len(decisions), "outcomes": outcomes,
            "slo_attainment": summary.get("slo_attainment"), "tasks_resolved": summary.get("tasks_resolved"),
            "models": models}


def main(argv: list[str]) -> int:
    if argv[:1] == ["lowest"]:
        for req in requirements():
            print(f"{req.name}=={floor(req)}")
        return 0
    if argv[:1] == ["check"]:
        found = problems()
        for p in found:
            print(p, file=sys.stderr)
        return 1 if found else 0
    if len(argv) == 2 and argv[0] == "demo-summary":
        print(json.dumps(demo_summary(Path(argv[1])), indent=1))
        return 0
    if len(argv) == 2 and argv[0] == "pin":
        print(pins()[canonicalize_name(argv[1])])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
