"""The MPC planner: every lever of every pool chosen together over a horizon, first step applied.

`solve(problem, model, config, rng, warm=None, timer=None) -> PlanResult` searches plans for
the next `horizon_steps` × `step_s` seconds (default 10 × 30 s) and returns the best one
found, never nothing. A plan holds, per pool, a replica target for every step and, for the
first step, the warm-standby count, routing cache-affinity (prefix) weight, per-replica
in-flight cap, traffic weight within its route group and engine batch caps; per priority
class, a shed fraction. The policy applies the first step and re-plans next tick.

Where things are:

- problem.py: MpcConfig, the problem (PoolInput, ClassInput, PlanProblem) and the result
  (Plan, PoolPlan, PlanResult), with the rules the policy shares (plan_steps, ...);
- score.py: the Evaluator, which scores a batch of candidates (candidates.py) through four
  stages — dynamics.py (replicas ready and billed), traffic.py (requests per pool after
  shedding), latency.py (hit rate, latency, the backlog's wait), risk.py (late share per
  class, with the tail probabilities of tails.py; the normal and log-normal maths under them is
  controller/core/distributions.py) — and the objective
  (controller/core/objective.py); the hot loops of stages 1, 3 and 4 run compiled
  (controller/core/mpc_kernel.py, numba) where numba is installed, mirroring the numpy;
- search.py, trajectories.py, vectors.py (the continuous levers as flat vectors): the search; solve.py: one
  tick; groups.py: the same search route group by route group on a large fleet, coordinated through what
  couples the groups.

Search (deterministic for a given rng): structured enumeration of replica trajectories per
pool (constant levels, hold-then-change templates and a "need-ahead" trajectory around
anchors computed from the model), pool by pool with the others at the incumbent; then
cross-entropy refinement of the continuous levers (affinity, in-flight cap, traffic
weights, shed fractions) around the warm start; then another replica sweep with the new
levers; then the slow batch-cap options when a review is due. The budget is a count of
evaluated candidate × pool rows (`max_evaluations`; see MpcConfig), or wall time through an
injected monotonic `timer`, counted from the tick's start (the core reads no clock itself).
A fleet of `group_search_min_pools` pools or more in several route groups runs these moves per
route group, each scored against the rest of the fleet at its best plan, with the shed moves
fleet-wide (groups.py): the search's cost then grows linearly with the pools, not as their square.

This package's names below are the planner's public interface (the MPC policy, the tests and
the bench import them from here); its modules' other names are internal.

Must not: do I/O, read the clock, draw randomness other than from the Generator passed in,
or import the simulator.
"""

from controller.core.mpc.problem import (
    LEVERS,
    ClassInput,
    MpcConfig,
    Plan,
    PlanProblem,
    PlanResult,
    PoolInput,
    PoolPlan,
    Timer,
    applied_router_weights,
    first_reserve_s,
    hop,
    plan_steps,
    serving_first_step,
)
from controller.core.mpc.solve import solve
from controller.core.mpc.vectors import delay_ladder, ladder_level

__all__ = [
    "ClassInput",
    "LEVERS",
    "MpcConfig",
    "Plan",
    "PlanProblem",
    "PlanResult",
    "PoolInput",
    "PoolPlan",
    "Timer",
    "applied_router_weights",
    "delay_ladder",
    "first_reserve_s",
    "hop",
    "ladder_level",
    "plan_steps",
    "serving_first_step",
    "solve",
]
