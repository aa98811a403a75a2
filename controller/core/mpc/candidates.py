"""Candidate plans as arrays, the plan in force as one of them, and the scorer's reusable work arrays.

`Candidates` holds C plans at once (one row each) so the evaluator scores a batch in a few
vectorised passes; it is mutable scratch of the search and never leaves the planner (the
search turns its best row into a `Plan`, see solve.py).

Must not: score candidates (score.py) or choose them (search.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from controller.core.mpc.problem import PlanProblem, PoolInput

CAND_FIELDS = ("repl", "standby", "pw", "cap", "tw", "mbt", "mns", "shed")


@dataclass
class Candidates:
    """C candidate plans as arrays (mutable scratch, never leaves the planner)."""

    repl: np.ndarray  # (C, P, H) int
    standby: np.ndarray  # (C, P) int
    pw: np.ndarray  # (C, P) prefix weight
    cap: np.ndarray  # (C, P) in-flight cap (>= max_num_seqs means none)
    tw: np.ndarray  # (C, P) traffic weight
    mbt: np.ndarray  # (C, P) max_num_batched_tokens
    mns: np.ndarray  # (C, P) max_num_seqs
    shed: np.ndarray  # (C, K)

    @property
    def n(self) -> int:
        return int(self.repl.shape[0])

    def take(self, idx: np.ndarray) -> Candidates:
        return Candidates(*(getattr(self, f)[idx] for f in CAND_FIELDS))

    def tile(self, n: int) -> Candidates:
        return self.take(np.zeros(n, dtype=np.intp))

    @staticmethod
    def concat(parts: Sequence[Candidates]) -> Candidates:
        return Candidates(*(np.concatenate([getattr(p, f) for p in parts]) for f in CAND_FIELDS))


def incumbent(prob: PlanProblem, H: int, tw_per_replica: np.ndarray) -> Candidates:
    """The plan in force as one candidate: today's targets held over the horizon, the levers in force
    (within the breaker's ceilings); `tw_per_replica` is its (1, P) router weights per serving replica
    (see Traffic.per_replica_weights)."""
    pools = prob.pools
    repl = np.array([[p.target] * H for p in pools], dtype=float)[None]

    def cap_of(p: PoolInput) -> float:
        cap = float(p.inflight_cap if p.inflight_cap > 0 else p.max_num_seqs)
        return min(cap, float(p.max_inflight_cap)) if p.max_inflight_cap else cap

    def pw_of(p: PoolInput) -> float:
        return min(p.prefix_weight, p.max_prefix_weight) if p.max_prefix_weight is not None else p.prefix_weight

    return Candidates(
        repl=repl, standby=np.array([[p.standby for p in pools]], dtype=float),
        pw=np.array([[pw_of(p) for p in pools]]),
        cap=np.array([[cap_of(p) for p in pools]], dtype=float),
        tw=tw_per_replica,
        mbt=np.array([[p.max_num_batched_tokens for p in pools]], dtype=float),
        mns=np.array([[p.max_num_seqs for p in pools]], dtype=float),
        shed=np.array([[c.shed_now for c in prob.classes]]))


class WorkArrays:
    """Work arrays reused from one `score` call to the next, by key (contents undefined on return).

    The large per-class arrays are ~0.5 MB; fresh ones cost page faults on every tick,
    reused ones do not. Nothing `score` returns may be one of these."""

    def __init__(self) -> None:
        self._scratch: dict[str, np.ndarray] = {}

    def get(self, key: str, shape: tuple[int, ...]) -> np.ndarray:
        """A work array of `shape` under `key` (contents undefined)."""
        n = math.prod(shape)
        flat = self._scratch.get(key)
        if flat is None or flat.size < n:
            flat = np.empty(n)
            self._scratch[key] = flat
        return flat[:n].reshape(shape)
