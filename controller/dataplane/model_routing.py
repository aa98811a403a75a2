"""Which route group serves a request's model, and which replicas an InferencePool has.

Model-aware routing (the Gateway API Inference Extension's body-based routing, done in the picker): the
OpenAI request's `model` field names a base model or a LoRA adapter; `ModelRoutes` maps it to the route
group whose pools serve it. A pool's names come from

- its declaration: `--model POOL=NAME[,NAME...]` (the served model name, `vllm serve --served-model-name`,
  and the adapters it loads), or the InferencePool's annotation `governor.llm-d.ai/models`. Declared names
  are what lets a request wait for a pool that is scaled to zero (no replica to ask);
- what its replicas report at `GET /v1/models` (vLLM lists the base model and every LoRA adapter loaded,
  the adapters with `parent` set to the base): read every `models_interval_s` and remembered per pool, so a
  pool that scales to zero keeps the names it last served.

A model that no group serves, while the picker knows any model at all, is refused 404 with OpenAI's
error shape (`model_not_found`); a picker that knows no model (nothing declared, nothing reported) routes
by its route-group header as before.

Membership from Kubernetes (`InferencePoolMembership`): for each pool, an InferencePool
(`inference.networking.k8s.io/v1`: `spec.selector.matchLabels`, `spec.targetPorts[0].number`) and the
EndpointSlices of the headless Service of the same name (`kubernetes.io/service-name`) over the same pods:
every endpoint whose `conditions.ready` is true, at the InferencePool's target port. Read with the
official client (blocking: the server runs it in a worker thread).

Must not: decide anything but the route group of a model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MODELS_ANNOTATION = "governor.llm-d.ai/models"
IP_GROUP, IP_VERSION, IP_PLURAL = "inference.networking.k8s.io", "v1", "inferencepools"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


class ModelNotServedError(LookupError):
    """No route group serves the requested model; the message lists what is served (bounded)."""


def request_model(req: Any) -> str | None:
    """The `model` of a decoded OpenAI request body (None: absent or not a string)."""
    if isinstance(req, dict):
        m = req.get("model")
        if isinstance(m, str) and m.strip():
            return m.strip()
    return None


def served_names(body: bytes) -> set[str]:
    """The model ids in an OpenAI `GET /v1/models` answer: the base model and any LoRA adapters."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return set()
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return set()
    return {str(m["id"]) for m in items if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]}


@dataclass
class ModelRoutes:
    """Model name → route group, from declared and reported names per pool."""

    groups: Mapping[str, Sequence[str]]  # route group → pools
    declared: dict[str, set[str]] = field(default_factory=dict)  # pool → names
    reported: dict[str, set[str]] = field(default_factory=dict)  # pool → names its replicas last listed

    def __post_init__(self) -> None:
        self._group_of_pool = {p: g for g, ps in self.groups.items() for p in ps}
        unknown = sorted(set(self.declared) - set(self._group_of_pool))
        if unknown:
            raise ValueError(f"models: pools {unknown} are in no route group")

    def names(self, pool: str) -> set[str]:
        return self.declared.get(pool, set()) | self.reported.get(pool, set())

    def report(self, pool: str, names: Iterable[str]) -> None:
        found = set(names)
        if found:
            self.reported[pool] = found

    def knows_models(self) -> bool:
        return any(self.names(p) for p in self._group_of_pool)

    def group_for(self, model: str | None, header_group: str | None) -> str | None:
        """The route group for a request: the one whose pools serve `model` (the header's when several do and it
        is one of them); without a model, or when no model is known, the header's group (None: the default)."""
        if model is None or not self.knows_models():
            return header_group
        serving = [g for g, pools in self.groups.items() if any(model in self.names(p) for p in pools)]
        if not serving:
            known = sorted({n for p in self._group_of_pool for n in self.names(p)})
            shown = ", ".join(known[:20]) + (f", … ({len(known)} in all)" if len(known) > 20 else "")
            raise ModelNotServedError(f"The model `{model[:200]}` does not exist or is not served here "
                                      f"(served: {shown})")
        return header_group if header_group in serving else serving[0]


def pool_groups_serving_different_models(groups: Mapping[str, Sequence[str]],
                                         names: Mapping[str, set[str]]) -> list[str]:
    """Route groups whose pools declare different models (the picker would mix them): one line each."""
    out = []
    for g, pools in groups.items():
        declared = {p: frozenset(names[p]) for p in pools if names.get(p)}
        if len(set(declared.values())) > 1:
            out.append(f"route group {g!r} mixes models: " + "; ".join(f"{p} serves {sorted(n)}"
                                                                      for p, n in sorted(declared.items())))
    return out


# --------------------------------------------------------------------------- InferencePool membership


@dataclass(frozen=True)
class PoolRef:
    namespace: str
    name: str


class InferencePoolMembership:
    """Ready endpoints of each pool's InferencePool, through the official client (CustomObjectsApi, DiscoveryV1Api)."""

    def __init__(self, refs: Mapping[str, PoolRef], api_client: Any, *, timeout_s: float = 2.0) -> None:
        from kubernetes import client

        self.refs = dict(refs)
        self.custom = client.CustomObjectsApi(api_client)
        self.discovery = client.DiscoveryV1Api(api_client)
        self.timeout_s = timeout_s

    @classmethod
    def from_kubeconfig(cls, refs: Mapping[str, PoolRef], kubeconfig: str | None) -> InferencePoolMembership:
        from kubernetes import client, config

        cfg = client.Configuration()
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        else:
            config.load_incluster_config(client_configuration=cfg)
        return cls(refs, client.ApiClient(cfg))

    def read(self, pool: str) -> tuple[list[str], set[str]]:
        """(ready host:port endpoints, names the InferencePool declares) of one pool; raises on API errors."""
        ref = self.refs[pool]
        ip = self.custom.get_namespaced_custom_object(IP_GROUP, IP_VERSION, ref.namespace, IP_PLURAL, ref.name,
                                                      _request_timeout=self.timeout_s)
        spec = ip.get("spec") or {}
        ports = spec.get("targetPorts") or []
        if not ports or not isinstance(ports[0], dict) or "number" not in ports[0]:
            raise ValueError(f"InferencePool {ref.namespace}/{ref.name}: spec.targetPorts[0].number is missing")
        port = int(ports[0]["number"])
        annotation = ((ip.get("metadata") or {}).get("annotations") or {}).get(MODELS_ANNOTATION, "")
        declared = {n.strip() for n in annotation.split(",") if n.strip()}
        slices = self.discovery.list_namespaced_endpoint_slice(
            ref.namespace, label_selector=f"{SERVICE_NAME_LABEL}={ref.name}", _request_timeout=self.timeout_s)
        addrs = set()
        for sl in slices.items or []:
            for ep in sl.endpoints or []:
                cond = ep.conditions
                if cond is not None and cond.ready is False:
                    continue  # not ready (starting, or terminating): no new requests
                for a in ep.addresses or []:
                    addrs.add(f"[{a}]:{port}" if ":" in a else f"{a}:{port}")
        return sorted(addrs), declared
