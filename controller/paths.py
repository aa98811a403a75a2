"""Where the project's own files are, and where the shared data lives.

`PROJECT_ROOT` is the repository root (models/ and scenarios/ beside controller/);
`shared_data_dir()` finds the shared traces and calibration CSVs: $GOVERNOR_SHARED_DATA,
else `../shared/data` beside the project or beside the working directory. Neutral: any layer
may import it. Must not: import anything from controller/, or read anything but the directory
listing it needs to find the data.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """The shared traces and calibration data (read-only). Raises FileNotFoundError naming where it looked."""
    env = os.environ.get("GOVERNOR_SHARED_DATA")
    candidates = [Path(env)] if env else []
    candidates += [PROJECT_ROOT.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    for c in candidates:
        if (c / "traces").is_dir() and (c / "calibration").is_dir():
            return c.resolve()
    raise FileNotFoundError(
        "shared data not found; looked in " + ", ".join(str(c) for c in candidates) + " (set GOVERNOR_SHARED_DATA)"
    )
