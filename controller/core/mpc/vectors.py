"""The continuous levers as the search's flat vectors, and the delay ladder that orders shedding.

`continuous_bounds` lists the levers the cross-entropy step moves (affinity and in-flight cap per
pool, traffic weights within a hop, one delay level), `apply_vec` / `to_vec` map between those
vectors and candidates, and `delay_ladder` / `ladder_level` map a delay level to per-class
shed fractions (least protected class first) and back.

Must not: score plans or keep the best (search.py); read the clock or draw randomness.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from controller.core.mpc.candidates import Candidates
from controller.core.mpc.problem import ClassInput, MpcConfig, PlanProblem, hop
from controller.levers import LEVERS

# a candidate array's lever (controller/levers.py's `array` column): "pw" → prefix_weight, "cap" → inflight_cap, ...
_BY_ARRAY = {lv.array: lv for lv in LEVERS if lv.array}


def continuous_bounds(prob: PlanProblem, cfg: MpcConfig) -> tuple[np.ndarray, np.ndarray, list[tuple[str, int]]]:
    """Flat vector of continuous levers: (lower, upper, names)."""
    lo: list[float] = []
    hi: list[float] = []
    names: list[tuple[str, int]] = []
    group_first: dict[tuple[str, bool], list[int]] = {}
    for j, p in enumerate(prob.pools):
        if p.frozen or p.levers_fixed:
            continue
        top_pw = cfg.prefix_weight_range[1] if p.max_prefix_weight is None else min(cfg.prefix_weight_range[1],
                                                                                 p.max_prefix_weight)
        lo.append(cfg.prefix_weight_range[0])
        hi.append(max(top_pw, cfg.prefix_weight_range[0]))
        names.append(("pw", j))
        top_cap = float(p.max_num_seqs)
        if p.max_inflight_cap:
            top_cap = min(top_cap, float(p.max_inflight_cap))
        lo.append(float(min(cfg.min_inflight_cap, top_cap)))
        hi.append(top_cap)
        names.append(("cap", j))
        group_first.setdefault(hop(p), []).append(j)
    for members in group_first.values():
        if len(members) > 1:
            for j in members:
                lo.append(0.0)
                hi.append(1.0)
                names.append(("tw", j))
    if prob.classes:
        lo.append(0.0)
        hi.append(float(len(prob.classes)))
        names.append(("delay", 0))
    return np.array(lo), np.array(hi), names


def delay_ladder(level: np.ndarray, classes: Sequence[ClassInput]) -> np.ndarray:
    """Shed fractions (…, K) from a delay level on the lever ladder (classes most protected first):
    level 0..1 sheds the least protected class, 1..2 the next one (the first staying fully shed),
    and so on; the breaker's floors and each class's ceiling still apply.
    Example with (critical, standard, sheddable): 0.5 → (0, 0, 0.5); 1.3 → (0, 0.3, 1); 2.0 → (0, 1, 1)."""
    level = np.asarray(level, dtype=float)
    K = len(classes)
    out = np.empty(level.shape + (K,))
    for k in range(K):
        rank = K - 1 - k  # 0 for the least protected class
        out[..., k] = np.clip(level - rank, 0.0, 1.0)
    floor = np.array([c.min_shed for c in classes])
    ceil = np.array([max(c.max_shed, c.min_shed) for c in classes])
    res: np.ndarray = np.minimum(np.maximum(out, floor), ceil)
    return res


def ladder_level(shed: np.ndarray) -> float:
    """The delay level of shed fractions (inverse of delay_ladder, for the lever order's shape)."""
    K = len(shed)
    return float(sum(min(max(float(shed[k]), 0.0), 1.0) for k in range(K)))


def lever_order(shed: np.ndarray) -> np.ndarray:
    """Delay in the order the issue fixes: a class is never shed more than any less protected one
    (classes are ordered most protected first): sheddable ≥ standard ≥ critical.
    Example: (0.2, 0.5, 0.1) → (0.2, 0.5, 0.5)."""
    return np.maximum.accumulate(shed, axis=1)


def apply_vec(base: Candidates, X: np.ndarray, names: list[tuple[str, int]],
              classes: Sequence[ClassInput]) -> Candidates:
    c = base.tile(X.shape[0])  # fresh arrays (take copies)
    for col, (kind, j) in enumerate(names):
        if kind == "delay":
            c.shed = delay_ladder(X[:, col], classes)
        else:  # a lever's candidate array: an integer lever's value is rounded
            getattr(c, kind)[:, j] = np.round(X[:, col]) if _BY_ARRAY[kind].kind is int else X[:, col]
    c.shed = lever_order(c.shed)
    return c


def to_vec(c: Candidates, names: list[tuple[str, int]]) -> np.ndarray:
    out = np.empty(len(names))
    for col, (kind, j) in enumerate(names):
        out[col] = ladder_level(c.shed[0]) if kind == "delay" else getattr(c, kind)[0, j]
    return out

