"""No two modules under controller/ share a name unless the name is a role every package may have one of.

A newcomer who reads `models.py` or `policy.py` in a traceback must know which one it is; issue 31 found
`problem.py`, `estimate.py`, `tails.py` and `features.py` twice with different meanings, and later work
added `models.py`, `policy.py` and `tasks.py` beside another of the same name. The names below are a
package's own instance of one role (its command line, its server, its store...), so a second one means the
same thing in another package; any other repeated name fails this test, naming the files.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import controller

ROOT = Path(controller.__file__).parent

# role -> what every module of that name is, in its own package
ROLES = {
    "cli.py": "the package's command line (argparse) under `governor`",
    "server.py": "the package's gRPC/HTTP server",
    "store.py": "the package's persisted state (overrides and audit; model bundles)",
    "state.py": "the package's state carried from tick to tick",
    "report.py": "the package's rendered report (bench tables, `governor report`, perf tables)",
    "fit.py": "the package's fitting from samples",
    "catalogue.py": "the GPU/price catalogue: its config schema and its figures",
    "prometheus.py": "the package's Prometheus side: config of the source, the source itself",
    "scrape.py": "scraping engines' /metrics: the daemon's source, the picker's load view",
    "physics.py": "the physical prior of the coupling model: its formulas, its fitted figures",
    "corrections.py": "online corrections on top of a prior: the coupling model's, the MPC's",
}


def test_no_two_modules_share_a_name_that_means_different_things():
    seen: dict[str, list[str]] = defaultdict(list)
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if path.name == "__init__.py" or rel.parts[0] == "gen":  # gen/: protoc's output, named by the protos
            continue
        seen[path.name].append(str(rel))
    clashes = {name: sorted(paths) for name, paths in seen.items() if len(paths) > 1 and name not in ROLES}
    assert clashes == {}, f"module names used twice under controller/ with different meanings: {clashes}"


def test_every_role_name_is_still_used_more_than_once():
    """A role left with one module is no longer a shared name: drop it from ROLES so the list stays true."""
    counts: dict[str, int] = defaultdict(int)
    for path in ROOT.rglob("*.py"):
        if path.relative_to(ROOT).parts[0] != "gen":
            counts[path.name] += 1
    assert {n for n in ROLES if counts[n] < 2} == set()
