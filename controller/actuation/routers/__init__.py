"""Adapters for routers people already run (vllm-router, sglang-router): worker membership follows the
replicas the autoscaler adapter reports (membership.py), and the routers' own metrics are read back.

These routers fix their routing policy at launch, so of Governor's routing levers they carry only
membership (which replicas serve); docs/OPERATING.md §14 lists which levers each one carries and
which not."""
