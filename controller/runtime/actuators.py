"""Which actuator the daemon drives, chosen by the config (actuators.* in deploy/governor.example.yaml).

- `actuators.kubernetes.enabled: true` → `FleetActuator`: the Kubernetes adapter scales the pools'
  workloads, `actuators.kubernetes.routers` (vllm-router, sglang-router) follow the ready replicas, and
  `actuators.router.address` (a gRPC RouterControl such as the picker), if set, gets the routing policy;
- otherwise `actuators.router.address` / `actuators.autoscaler.address` → `GrpcActuator`;
- neither → None (decisions are only recorded).

The config has already refused the combinations that cannot work (config.py `_adapter_problems`).
This module only builds objects; it decides nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from controller.actuation.grpc_actuator import GrpcActuator
from controller.actuation.kube import ENGINE_FLAGS, KubernetesAutoscaler, KubeTarget, api_client
from controller.actuation.kube_actuator import FleetActuator, MembershipLoop
from controller.actuation.routers.membership import MembershipRouter
from controller.actuation.routers.sglang_router import SglangRouter
from controller.actuation.routers.vllm_router import VllmRouter
from controller.clock import Clock
from controller.config import Settings
from controller.config.sections import ActuatorSettings
from controller.rpc.transport import ClientTls


def _tls(t: ActuatorSettings) -> ClientTls | None:
    return ClientTls(ca_file=t.tls.ca, cert_file=t.tls.cert, key_file=t.tls.key) if (t.tls.ca or t.tls.cert) else None


def kube_targets(settings: Settings) -> dict[str, KubeTarget]:
    kube = settings.actuators.kubernetes
    engines = {p.name: p.engine for p in settings.pools}
    startup = {p.name: p.startup_cold_s for p in settings.pools}  # past it, a replica not ready is not coming
    out = {}
    for w in kube.pools:
        pool = w.pool
        flags = None
        if w.max_num_seqs_flag or w.max_num_batched_tokens_flag:
            seq, tok = ENGINE_FLAGS[engines.get(pool, "vllm")]
            flags = (w.max_num_seqs_flag or seq, w.max_num_batched_tokens_flag or tok)
        out[pool] = KubeTarget(pool=pool, kind=w.kind, name=w.name, namespace=w.namespace or kube.namespace,
                               container=w.container, port=w.port, engine=engines.get(pool, "vllm"),
                               standby=w.standby, flags=flags, startup_s=startup.get(pool, math.inf))
    return out


def membership_routers(settings: Settings) -> list[MembershipRouter]:
    out: list[MembershipRouter] = []
    for r in settings.actuators.kubernetes.routers:
        cls = VllmRouter if r.kind == "vllm-router" else SglangRouter
        out.append(cls(r.url, metrics_url=r.metrics_url, pools=tuple(r.pools), timeout_s=r.timeout_s))
    return out


def build_actuator(settings: Settings, clock: Clock, *,
                   api_host: str | None = None) -> tuple[Any, list[Callable[[], None]]]:
    """(the actuator or None, what to call on shutdown, last first). `api_host` points the Kubernetes client
    at a given API server URL instead of the kubeconfig or in-cluster config (tests)."""
    acts = settings.actuators
    closers: list[Callable[[], None]] = []
    if acts.kubernetes.enabled:
        kube = acts.kubernetes
        grpc_router = None
        if acts.router.address:
            grpc_router = GrpcActuator(acts.router.address, None, clock=clock, call_timeout_s=acts.router.timeout_s,
                                       retries=acts.router.retries, backoff_s=acts.router.backoff_s,
                                       tls=_tls(acts.router))
        api = api_client(kubeconfig=kube.kubeconfig, context=kube.context, host=api_host)
        autoscaler = KubernetesAutoscaler(kube_targets(settings), api, conflict_retries=kube.conflict_retries,
                                          timeout_s=kube.timeout_s)
        actuator = FleetActuator(autoscaler, membership_routers(settings), clock=clock, grpc_router=grpc_router)
        closers.append(actuator.close)
        if actuator.routers:
            loop = MembershipLoop(actuator, kube.membership_sync_s)
            loop.start()
            closers.append(loop.stop)
        return actuator, closers
    if acts.router.address or acts.autoscaler.address:
        t = acts.autoscaler if acts.autoscaler.address else acts.router
        grpc_actuator = GrpcActuator(acts.router.address, acts.autoscaler.address, clock=clock,
                                     call_timeout_s=max(acts.router.timeout_s, acts.autoscaler.timeout_s),
                                     retries=max(acts.router.retries, acts.autoscaler.retries),
                                     backoff_s=max(acts.router.backoff_s, acts.autoscaler.backoff_s), tls=_tls(t))
        closers.append(grpc_actuator.close)
        return grpc_actuator, closers
    return None, closers
