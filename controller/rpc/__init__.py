"""gRPC as Governor speaks it, beside the generated code (controller/gen/):

- `transport.py`: the plumbing every server and client shares: TLS, bearer tokens and roles,
  channels, health and reflection, binding, the listen-address safety check;
- `command_rules.py`: RouterControl's command rules (generation order, replay, validity deadline, the
  RoutingPolicy fields), obeyed alike by the picker (controller/dataplane/) and the simulator's
  control plane. Pure: no clock, no gRPC;
- `kubeclient.py`: the Kubernetes API client for leader election's Lease and the shared GovernorState
  (a kubeconfig, or the pod's service account).

Nothing here decides anything; the edges (actuation, api, dataplane) and the simulator import it.
"""
