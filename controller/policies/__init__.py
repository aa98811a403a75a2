"""Baseline policies behind the same `Policy` interface as the MPC.

Each module is one pure policy class (state in, state out, time from
`PolicyInput.now_s`) faithful to a published autoscaler/router and its defaults:

- static: fixed per-pool replica counts, least-loaded routing (static.py)
- hpa: Kubernetes HPA autoscaling/v2 on GPU utilisation or queue depth (hpa.py)
- kpa: Knative KPA on in-flight concurrency (kpa.py)
- sla_planner: NVIDIA Dynamo-style SLA planner with forecasts, KV-aware routing, shedding (sla_planner.py)
- scorer_kpa: llm-d scorer routing + AIBrix KPA on KV-cache usage (scorer_kpa.py)
- slo_feedback: Governor's SLO/queue feedback policy (slo_feedback.py)

Composed stacks (issue 16): what operators deploy — a cache-aware router, an autoscaler and
flow control, each layer at its project's own defaults, built from the pieces above:
- llm_d_stack: llm-d scorer routing + Workload Variant Autoscaler saturation scaling + Gateway
  API Inference Extension flow control (llm_d_stack.py)
- aibrix_stack: AIBrix prefix-cache routing + KPA/APA + the GPU optimizer's SKU mix (aibrix_stack.py)
- dynamo_stack: Dynamo KV-router cost + SLA planner (prefill/decode apart) + load shedding (dynamo_stack.py)

`build_policy(name, fleet, params)` in registry.py builds one by name. Nothing in
this package does I/O, reads the clock, or imports telemetry/actuation/api/
runtime/gen, grpc or prometheus clients.
"""

from controller.perf.replica_capacity import ReplicaCapacity, capacity_from_samples
from controller.policies.aibrix_stack import AibrixStackPolicy
from controller.policies.common import LEAST_LOADED, SCORER_DEFAULT, RoutingWeights
from controller.policies.dynamo_stack import DynamoStackPolicy
from controller.policies.hpa import HpaPolicy
from controller.policies.kpa import KpaPolicy
from controller.policies.llm_d_stack import LlmdStackPolicy
from controller.policies.registry import POLICY_NAMES, build_policy, policy_params
from controller.policies.scorer_kpa import ScorerKpaPolicy
from controller.policies.sla_planner import KV_AWARE, SlaPlannerPolicy
from controller.policies.slo_feedback import SloFeedbackPolicy
from controller.policies.static import StaticPolicy

__all__ = [
    "KV_AWARE", "LEAST_LOADED", "POLICY_NAMES", "SCORER_DEFAULT",
    "AibrixStackPolicy", "DynamoStackPolicy", "HpaPolicy", "KpaPolicy", "LlmdStackPolicy", "ReplicaCapacity",
    "RoutingWeights", "ScorerKpaPolicy", "SlaPlannerPolicy", "SloFeedbackPolicy", "StaticPolicy", "build_policy",
    "capacity_from_samples", "policy_params",
]
