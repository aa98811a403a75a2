"""What the MPC policy estimates for itself, tick by tick, from telemetry and its own memory.

All of it lives in the frozen `MpcState` the policy carries (never in the policy object):

- (the fleet's demand history and class mix the forecaster reads are the core's estimate's,
  controller/core/estimate.py);
- per pool (`MpcPoolMemory`): this tick's replica accounting, copied from the core's estimate
  (`accounted`: ETAs, warm slots, serving, crash replacements, the prompt/output mix; the estimator
  is controller/core/estimate.py, built once a tick by `Controller.step`), the traffic's reuse
  (`reuse`: what an infinite cache would hit, and the working set the observed hit implies), the
  caps it decided, its scale-down records and correction factors (corrections.py).

Driven without a Controller (tests), the policy advances the same core estimator itself from the
last estimate it keeps (`MpcState.estimate`).

Must not: do I/O or read a clock; decide anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from controller.core.coupling import router_affinity
from controller.core.mpc import Plan
from controller.core.mpc_model import PlanModel, QueueingPrior
from controller.policies.common import value
from controller.policies.mpc.forecasting import Scoreboard
from controller.policies.mpc.reserve import Spills
from controller.types import (
    FleetEstimate,
    PolicyInput,
    PoolDecision,
    PoolObservation,
    PoolSpec,
)


@dataclass(frozen=True)
class MpcPoolMemory:
    etas: tuple[float, ...] = ()  # absolute times the starting replicas should be ready
    warm: tuple[float, ...] = ()  # times replicas were drained (their slots stay warm for a while)
    serving: int | None = None  # ready + starting after the last accounting
    target: int | None = None  # target in force at the last accounting
    log_k_ttft: float = 0.0
    log_k_tpot: float = 0.0
    err: float = 0.7  # EWMA of |log(observed / predicted)| with corrections (0.7 ≈ a factor of 2)
    burst: float = 0.0  # burst length, s (learned from p95 TPOT above what smooth arrivals explain)
    samples: int = 0
    inf_hit: float = 0.0
    prompt_tokens: float | None = None
    output_tokens: float | None = None
    recs: tuple[tuple[float, int], ...] = ()  # (t, desired replicas) for scale-down stabilisation
    caps: tuple[int, int] | None = None  # engine (max_num_seqs, max_num_batched_tokens) in force
    caps_changed_s: float = -math.inf
    unordered: int = 0  # replicas the fleet started this tick that nobody ordered (crash replacements)
    # old-cap replicas still to be replaced by the rolling restart a batch-cap change set off: the
    # fleet starts their surge replicas itself (one at a time, warm), and those are not losses
    rollout_left: int = 0
    rollout_seen_s: float = -math.inf  # the caps change or the latest surge replica seen


@dataclass(frozen=True)
class MpcState:
    pools: Mapping[str, MpcPoolMemory] = field(default_factory=dict)
    plan: Plan | None = None
    plan_at_s: float | None = None
    last_s: float | None = None
    shed_in_force: Mapping[str, float] = field(default_factory=dict)
    need_now: Mapping[str, int] = field(default_factory=dict)  # replicas the last plan's first step needed
    waiting: Mapping[str, float] = field(default_factory=dict)  # engine queue per pool last tick (feedback.py)
    forecast_board: Scoreboard = field(default_factory=Scoreboard)  # the forecasters' online scores
    # driven without a Controller (tests): the core's estimate, advanced by the policy itself (None otherwise)
    estimate: FleetEstimate | None = None
    # step-aware admission stays on until then after the last plan that chose it (task_levers.py)
    step_aware_until_s: float = -math.inf
    # with a timer: how far recent ticks ran past the search's deadline (reserve.py sizes the next reserve)
    spills: Spills | None = None


def ewma(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new


def accounted(state: MpcState, inp: PolicyInput, est: FleetEstimate,
              prior: QueueingPrior) -> tuple[dict[str, MpcPoolMemory], dict[str, int]]:
    """Per pool: the memory with this tick's replica accounting from the core's estimate (ETAs, warm
    slots, serving, crash replacements, the traffic mix: controller/core/estimate.py), and the target
    in force."""
    fleet = inp.fleet
    mem: dict[str, MpcPoolMemory] = {}
    targets: dict[str, int] = {}
    for spec in fleet.pools:
        m0 = state.pools.get(spec.name)
        if m0 is None:  # first sight: corrections start from the seeded prior (1 without a profile)
            j = [p.name for p in fleet.pools].index(spec.name)
            m0 = MpcPoolMemory(caps=(spec.max_num_seqs, spec.max_num_batched_tokens),
                               log_k_ttft=math.log(prior.ttft_correction[j]),
                               log_k_tpot=math.log(prior.tpot_correction[j]))
        a = est.pools[spec.name]
        targets[spec.name] = int(a.target) if a.target is not None else 0
        mem[spec.name] = replace(m0, etas=a.etas, warm=a.warm, serving=a.serving, target=a.target,
                                 prompt_tokens=a.prompt_tokens, output_tokens=a.output_tokens,
                                 unordered=a.unordered, rollout_left=a.rollout_left, rollout_seen_s=a.rollout_seen_s)
    return mem, targets


def reuse(spec: PoolSpec, m: MpcPoolMemory, po: PoolObservation | None, pd: PoolDecision | None,
          prior: PlanModel, j: int, ready: float) -> tuple[float, float]:
    """(inf_hit, working set tokens) consistent with today's hit at today's affinity and replicas."""
    hit = value(po.hit_rate) if po is not None else None
    if m.inf_hit <= 0.01 or hit is None:
        return m.inf_hit, 0.0
    kv = float(prior.kv_tokens()[j])
    aff = float(router_affinity(np.array(pd.prefix_weight if pd else 3.0),
                         np.array((pd.queue_weight + pd.kv_weight) if pd else 4.0)))
    k_eff = kv * 0.8 * (aff * max(ready, 1.0) + 1.0 - aff)
    cover = (min(hit, m.inf_hit) / m.inf_hit) ** 2
    ws = k_eff * 0.5 if cover >= 0.97 else k_eff / max(cover, 0.02)
    return m.inf_hit, ws
