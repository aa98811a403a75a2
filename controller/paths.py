"""Where the shared data lives: `../shared/data` beside the project, or $GOVERNOR_SHARED_DATA.

Neutral ground for every layer that reads the shared traces or calibration CSVs (the simulator,
the performance model, the bench, the learning CLI). Must not read anything but the directory
listing it needs to find the data.
"""

from __future__ import annotations

import os
from pathlib import Path

_PROJECT_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """The shared traces and calibration data (read-only). Raises FileNotFoundError naming where it looked."""
    env = os.environ.get("GOVERNOR_SHARED_DATA")
    candidates = [Path(env)] if env else []
    candidates += [_PROJECT_ROOT.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    for c in candidates:
        if (c / "traces").is_dir() and (c / "calibration").is_dir():
            return c.resolve()
    raise FileNotFoundError(
        "shared data not found; looked in " + ", ".join(str(c) for c in candidates) + " (set GOVERNOR_SHARED_DATA)"
    )
