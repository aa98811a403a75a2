"""The MPC policy (`MpcPolicy`, registered as "mpc"), split by concern: policy.py composes
memory.py (its own memory), corrections.py (online learning), plan_inputs.py (the planning
problem), first_step.py (the plan's first step → decisions) and reasons.py (explanations)."""

from controller.policies.mpc.policy import MpcPolicy

__all__ = ["MpcPolicy"]
