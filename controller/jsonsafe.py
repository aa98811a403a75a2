"""Strict-JSON values out of results: the one NaN → None cleaner (pure; a leaf any layer may use).

`json.dumps` writes NaN and ±inf as bare `NaN` / `Infinity`, which strict JSON readers
(browsers, jq, Prometheus' HTTP SD) refuse; results use NaN for "no data", so every
JSON edge passes its values through `json_safe` first.

Must not import anything from controller/ or do I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any


def json_safe(x: Any) -> Any:
    """NaN/±inf → None; mappings → dicts with str keys; lists and tuples → lists; dataclass instances →
    dicts of their fields; numpy scalars → Python values. Anything else is returned as it is."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: json_safe(getattr(x, f.name)) for f in dataclasses.fields(x)}
    item = getattr(x, "item", None)  # numpy scalars
    if callable(item):
        return json_safe(item())
    return x
