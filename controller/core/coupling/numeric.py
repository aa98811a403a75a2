"""Small array helpers of the coupling models' vectorised paths (shared by the priors and the corrections).

Must not: hold state or know about the models; numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def as_rows(x: Any, n: int, name: str) -> np.ndarray:
    """A scalar broadcast to n rows, or an array checked to have shape (n,) (ValueError names `name`)."""
    a = np.asarray(x, dtype=float)
    if a.ndim == 0:
        return np.full(n, float(a))
    if a.shape != (n,):
        raise ValueError(f"{name}: expected shape ({n},) or a scalar, got {a.shape}")
    return a


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def clamp(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """np.clip without its Python-level dispatch (it runs a few hundred times per bulk predict)."""
    res: np.ndarray = np.minimum(np.maximum(x, lo), hi)
    return res


def stack_columns(cols: Sequence[np.ndarray]) -> np.ndarray:
    """np.column_stack for the bulk path: the (n, m) result is a view of a feature-major (m, n)
    array, filled by m contiguous row copies (column_stack writes strided)."""
    out = np.empty((len(cols), len(cols[0])))
    for j, c in enumerate(cols):
        out[j] = c
    return out.T


def logit(p: np.ndarray) -> np.ndarray:
    p = clamp(p, 1e-4, 1 - 1e-4)
    res: np.ndarray = np.log(p) - np.log1p(-p)
    return res
