"""The project's root directory (scenarios, models and docs are found from it).

The shared data directory is located by `controller.paths.shared_data_dir`.
"""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
