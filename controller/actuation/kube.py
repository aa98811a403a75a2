"""The Kubernetes autoscaler adapter: Governor's scaling plan applied to workloads through the official client.

Per pool, one workload (`KubeTarget`): a Deployment, a StatefulSet or a LeaderWorkerSet
(`leaderworkerset.x-k8s.io/v1`, a custom resource with a scale subresource). What each lever becomes:

- replicas → read the `/scale` subresource, write it back with its resourceVersion (optimistic
  concurrency: a 409 re-reads and retries, bounded);
- removal → drain first: `plan_pool` names the pods that will go (a Deployment's ReplicaSet deletes
  the lowest `controller.kubernetes.io/pod-deletion-cost` first, so those pods are annotated with
  DELETION_COST; a StatefulSet or LeaderWorkerSet always removes its highest ordinals, so those are
  named and nothing is annotated); the caller takes them out of its routers, then `execute` scales;
- warm standby → the `/scale` of a second Deployment whose pods carry no serving label (no Service,
  router or picker sends to them); without one a warm_standby above 0 is reported as not carried;
- engine batch caps → the engine container's args (`--max-num-seqs`, `--max-num-batched-tokens` for
  vLLM) rewritten in the pod template and the workload replaced with its resourceVersion. That is a
  rolling restart of every replica: the slow lever;
- it refuses a pool whose workload (or standby) is also the target of a HorizontalPodAutoscaler or a
  KEDA ScaledObject, naming it, instead of fighting it.

Errors are `KubeError` with a message naming the object, the pool and what the API said (404, 409
after the retries, 422 with the API's reason, 403 with the verb the RBAC lacks). This module does not
decide replica counts, does not talk to routers (the actuator in kube_actuator.py orders router and scale
calls) and never deletes a pod itself.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from controller.actuation.outcome import PoolStateView
from controller.actuation.routers.membership import DRAINING, READY, STANDBY, STARTING, Endpoint

DEPLOYMENT = "Deployment"
STATEFULSET = "StatefulSet"
LEADERWORKERSET = "LeaderWorkerSet"
KINDS = (DEPLOYMENT, STATEFULSET, LEADERWORKERSET)
LWS_GROUP, LWS_VERSION, LWS_PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
KEDA_GROUP, KEDA_VERSION, KEDA_PLURAL = "keda.sh", "v1alpha1", "scaledobjects"
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
DELETION_COST = "-1000"  # below the default 0 of every other pod: the ReplicaSet removes these first
ENGINE_FLAGS = {"vllm": ("--max-num-seqs", "--max-num-batched-tokens"),
                "sglang": ("--max-running-requests", "--chunked-prefill-size")}


class KubeError(RuntimeError):
    """A Kubernetes call failed or the cluster refuses the plan; the message says which object and why."""

    def __init__(self, message: str, *, invalid: bool = False) -> None:
        super().__init__(message)
        self.invalid = invalid  # True: the plan itself is refused (nothing applied), not a transient failure


@dataclass(frozen=True, slots=True)
class KubeTarget:
    """The workload that serves one pool."""

    pool: str
    kind: str  # one of KINDS
    name: str
    namespace: str
    container: str  # the engine container whose args carry the batch caps
    port: int  # the engine's HTTP port in the pod (router membership URL)
    engine: str = "vllm"
    standby: str | None = None  # name of the unserved standby Deployment, if any
    flags: tuple[str, str] | None = None  # (max_num_seqs flag, max_num_batched_tokens flag); None = by engine
    # the pool's cold start-up time: a replica asked for and not ready after this long (unschedulable, a quota,
    # an image that cannot be pulled) is reported as unavailable, not starting
    startup_s: float = math.inf

    def engine_flags(self) -> tuple[str, str]:
        return self.flags or ENGINE_FLAGS[self.engine]


@dataclass
class PoolPlan:
    """What `execute` will do for one pool; `leaving` are the pods to drain before the scale-down."""

    target: KubeTarget
    current: int
    replicas: int
    warm_standby: int
    max_num_seqs: int  # 0 = unchanged
    max_num_batched_tokens: int  # 0 = unchanged
    leaving: list[Endpoint] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # slow replicas to replace (PoolDecision.replace): deleted, so their controller makes new ones
    replacing: list[Endpoint] = field(default_factory=list)


def set_flag(args: Sequence[str], flag: str, value: int) -> list[str]:
    """args with `flag` set to value: `--f=N` and `--f N` are rewritten in place, else `--f=N` is appended."""
    out = list(args)
    for i, a in enumerate(out):
        if a == flag and i + 1 < len(out):
            out[i + 1] = str(value)
            return out
        if a.startswith(flag + "="):
            out[i] = f"{flag}={value}"
            return out
    return [*out, f"{flag}={value}"]


def get_flag(args: Sequence[str], flag: str) -> int:
    """The integer value of `flag` in args, 0 when absent or not an integer."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            raw: str | None = args[i + 1]
        else:
            raw = a[len(flag) + 1:] if a.startswith(flag + "=") else None
        if raw is not None:
            return int(raw) if raw.strip().isdigit() else 0
    return 0


_ORDINAL = re.compile(r"-(\d+)$")


def _ordinal(pod: k8s.V1Pod, kind: str) -> int:
    labels = pod.metadata.labels or {}
    key = "leaderworkerset.sigs.k8s.io/group-index" if kind == LEADERWORKERSET else "apps.kubernetes.io/pod-index"
    if labels.get(key, "").isdigit():
        return int(labels[key])
    m = _ORDINAL.search(pod.metadata.name)
    return int(m.group(1)) if m else -1


def _ready(pod: k8s.V1Pod) -> bool:
    conds = (pod.status.conditions or []) if pod.status else []
    return any(c.type == "Ready" and c.status == "True" for c in conds) and bool(pod.status.pod_ip)


def _url(ip: str, port: int) -> str:
    return f"http://[{ip}]:{port}" if ":" in ip else f"http://{ip}:{port}"


def _reason(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
        return str(body.get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


class KubernetesAutoscaler:
    """Reads and scales the pools' workloads. `targets` by pool; `api` a configured kubernetes ApiClient."""

    def __init__(self, targets: Mapping[str, KubeTarget], api: k8s.ApiClient, *, conflict_retries: int = 3,
                 timeout_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        for pool, t in targets.items():
            if t.kind not in KINDS:
                raise ValueError(f"pool {pool!r}: kind {t.kind!r} is not one of {', '.join(KINDS)}")
        if conflict_retries < 0 or timeout_s <= 0:
            raise ValueError(f"conflict_retries must be >= 0 and timeout_s > 0 (got {conflict_retries}, {timeout_s})")
        self.targets = dict(targets)
        self.api = api
        self._apps = k8s.AppsV1Api(api)
        self._core = k8s.CoreV1Api(api)
        self._hpa = k8s.AutoscalingV2Api(api)
        self._custom = k8s.CustomObjectsApi(api)
        self._retries = int(conflict_retries)
        self._timeout = float(timeout_s)
        self._leaving: dict[str, set[str]] = {}  # pool → pod names chosen to go, until they are gone
        self._clock = clock
        self._first_seen: dict[str, float] = {}  # pod uid → when this adapter first saw it not ready
        self._short_since: dict[str, float] = {}  # pool → since when fewer pods exist than its target

    # ------------------------------------------------------------------ API calls, errors named

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, _request_timeout=self._timeout, **kwargs)
        except ApiException as exc:
            if exc.status == 404:
                raise KubeError(f"{what}: not found (404): {_reason(exc)}", invalid=True) from None
            if exc.status == 403:
                raise KubeError(f"{what}: forbidden (403): the service account lacks this permission; "
                                f"see the Role in deploy/kubernetes/kubernetes-adapter.yaml: {_reason(exc)}") from None
            if exc.status == 422:
                raise KubeError(f"{what}: rejected as invalid (422): {_reason(exc)}", invalid=True) from None
            raise KubeError(f"{what}: HTTP {exc.status}: {_reason(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - urllib3 connection errors and timeouts: one clear message
            raise KubeError(f"{what}: the API server did not answer: {exc}") from None

    def _read_scale(self, kind: str, name: str, ns: str) -> tuple[int, str, str]:
        """(spec.replicas, resourceVersion, status.selector) of a workload's /scale."""
        what = f"read {kind}/{name} scale in namespace {ns}"
        if kind == LEADERWORKERSET:
            s = self._call(what, self._custom.get_namespaced_custom_object_scale, LWS_GROUP, LWS_VERSION, ns,
                           LWS_PLURAL, name)
            return (int(s.get("spec", {}).get("replicas", 0)), s["metadata"]["resourceVersion"],
                    s.get("status", {}).get("selector", ""))
        fn = self._apps.read_namespaced_deployment_scale if kind == DEPLOYMENT else \
            self._apps.read_namespaced_stateful_set_scale
        v = self._call(what, fn, name, ns)
        return int(v.spec.replicas or 0), v.metadata.resource_version, (v.status.selector or "") if v.status else ""

    def _write_scale(self, kind: str, name: str, ns: str, replicas: int) -> int:
        """Set spec.replicas through /scale with optimistic concurrency; returns the previous value."""
        for attempt in range(self._retries + 1):
            current, rv, _ = self._read_scale(kind, name, ns)
            if current == replicas:
                return current
            what = f"scale {kind}/{name} in namespace {ns} to {replicas}"
            try:
                if kind == LEADERWORKERSET:
                    body: Any = {"apiVersion": "autoscaling/v1", "kind": "Scale",
                                 "metadata": {"name": name, "namespace": ns, "resourceVersion": rv},
                                 "spec": {"replicas": replicas}}
                    self._custom.replace_namespaced_custom_object_scale(LWS_GROUP, LWS_VERSION, ns, LWS_PLURAL, name,
                                                                        body, _request_timeout=self._timeout)
                else:
                    body = k8s.V1Scale(api_version="autoscaling/v1", kind="Scale",
                                       metadata=k8s.V1ObjectMeta(name=name, namespace=ns, resource_version=rv),
                                       spec=k8s.V1ScaleSpec(replicas=replicas))
                    fn = self._apps.replace_namespaced_deployment_scale if kind == DEPLOYMENT else \
                        self._apps.replace_namespaced_stateful_set_scale
                    fn(name, ns, body, _request_timeout=self._timeout)
                return current
            except ApiException as exc:
                if exc.status == 409 and attempt < self._retries:
                    continue  # someone wrote in between: read the new version and try again
                self._call(what, _raise, exc)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _pods(self, selector: str, ns: str, what: str) -> list[k8s.V1Pod]:
        if not selector:
            raise KubeError(f"{what}: the /scale subresource reports no status.selector, so its pods cannot be "
                            "found (has the workload's controller observed it yet?)")
        return list(self._call(f"list pods of {what}", self._core.list_namespaced_pod, ns,
                               label_selector=selector).items)

    # ------------------------------------------------------------------ conflicts with other autoscalers

    def autoscaler_conflict(self, t: KubeTarget) -> str | None:
        """The HPA or KEDA ScaledObject that also scales this pool's workload (or its standby), if any."""
        names = {(t.kind, t.name)} | ({(DEPLOYMENT, t.standby)} if t.standby else set())
        hpas = self._call(f"list HorizontalPodAutoscalers in namespace {t.namespace}",
                          self._hpa.list_namespaced_horizontal_pod_autoscaler, t.namespace)
        for h in hpas.items:
            ref = h.spec.scale_target_ref
            if (ref.kind, ref.name) in names:
                return (f"HorizontalPodAutoscaler {t.namespace}/{h.metadata.name} scales {ref.kind}/{ref.name}; "
                        "Governor will not fight it: delete the HPA (or its KEDA ScaledObject) or leave this pool "
                        "to it (use actuators.keda instead)")
        try:
            sos = self._custom.list_namespaced_custom_object(KEDA_GROUP, KEDA_VERSION, t.namespace, KEDA_PLURAL,
                                                             _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status == 404:  # KEDA is not installed: no ScaledObjects
                return None
            self._call(f"list KEDA ScaledObjects in namespace {t.namespace}", _raise, exc)
        for so in sos.get("items", []):
            ref = so.get("spec", {}).get("scaleTargetRef", {})
            if (ref.get("kind", DEPLOYMENT), ref.get("name")) in names:
                return (f"KEDA ScaledObject {t.namespace}/{so['metadata']['name']} scales "
                        f"{ref.get('kind', DEPLOYMENT)}/{ref.get('name')}; Governor will not fight it: remove the "
                        "ScaledObject or point it at Governor's external scaler (actuators.keda) instead")
        return None

    # ------------------------------------------------------------------ plan and execute

    def plan_pool(self, pool: str, replicas: int, warm_standby: int, max_num_seqs: int,
                  max_num_batched_tokens: int, replace: Sequence[str] = ()) -> PoolPlan:
        """Read the pool's workload and name the pods that go; raises KubeError (invalid=True: refused).
        `replace`: replicas to replace, by pod name or by the host:port Governor's telemetry names them
        (the pod's IP and the target's port); a name that matches no live pod is noted and skipped."""
        t = self.targets.get(pool)
        if t is None:
            raise KubeError(f"pool {pool!r} has no Kubernetes target (configured: {sorted(self.targets)})",
                            invalid=True)
        if replicas < 0 or warm_standby < 0 or max_num_seqs < 0 or max_num_batched_tokens < 0:
            raise KubeError(f"pool {pool!r}: replicas, warm_standby and batch caps must be >= 0", invalid=True)
        conflict = self.autoscaler_conflict(t)
        if conflict:
            raise KubeError(f"pool {pool!r}: {conflict}", invalid=True)
        current, _, selector = self._read_scale(t.kind, t.name, t.namespace)
        plan = PoolPlan(t, current, replicas, warm_standby, max_num_seqs, max_num_batched_tokens)
        if warm_standby and not t.standby:
            plan.notes.append(f"warm_standby {warm_standby} not carried: pool {pool!r} has no standby Deployment")
        if replicas < current or replace:
            pods = [p for p in self._pods(selector, t.namespace, f"{t.kind}/{t.name}")
                    if p.metadata.deletion_timestamp is None]
            if replicas < current:
                victims = self._victims(t, pods, current - replicas, replicas)
                plan.leaving = [self._endpoint(t, p, DRAINING) for p in victims]
            going = {e.id for e in plan.leaving}
            for name in replace:
                pod = next((p for p in pods if name in (p.metadata.name, self._address(t, p))), None)
                if pod is None:
                    plan.notes.append(f"{pool}: replica {name!r} to replace is not a live pod of {t.kind}/{t.name}")
                elif pod.metadata.name not in going:  # already leaving with the scale-down: nothing more to do
                    plan.replacing.append(self._endpoint(t, pod, DRAINING))
        return plan

    @staticmethod
    def _address(t: KubeTarget, pod: k8s.V1Pod) -> str:
        ip = pod.status.pod_ip if pod.status else None
        return f"{ip}:{t.port}" if ip else ""

    @staticmethod
    def _victims(t: KubeTarget, pods: list[k8s.V1Pod], n: int, keep: int) -> list[k8s.V1Pod]:
        if t.kind != DEPLOYMENT:  # ordered controllers remove the highest ordinals, whatever we would prefer
            return sorted((p for p in pods if _ordinal(p, t.kind) >= keep), key=lambda p: -_ordinal(p, t.kind))
        # Not-ready pods first (the ReplicaSet removes those first anyway), then the youngest ready ones
        # (the least warmed cache), name as the tie-break so the choice is deterministic.
        def rank(p: k8s.V1Pod) -> tuple[bool, float, str]:
            ts = p.metadata.creation_timestamp
            return (_ready(p), -(ts.timestamp() if ts else 0.0), p.metadata.name)
        return sorted(pods, key=rank)[:n]

    def execute(self, plan: PoolPlan) -> list[str]:
        """Annotate the leaving pods, then write the scale, the standby and the engine args. Returns notes."""
        t = plan.target
        notes = list(plan.notes)
        if t.kind == DEPLOYMENT:
            for e in plan.leaving:
                self._call(f"annotate pod {t.namespace}/{e.id} with {DELETION_COST_ANNOTATION}",
                           self._core.patch_namespaced_pod, e.id, t.namespace,
                           {"metadata": {"annotations": {DELETION_COST_ANNOTATION: DELETION_COST}}},
                           _content_type="application/merge-patch+json")
        self._leaving.setdefault(t.pool, set()).update(e.id for e in plan.leaving)
        for e in plan.replacing:  # a deleted pod: its controller makes a new one (the target is unchanged)
            self._call(f"delete pod {t.namespace}/{e.id} (a slow replica, replaced)", self._core.delete_namespaced_pod,
                       e.id, t.namespace)
            self._leaving.setdefault(t.pool, set()).add(e.id)
            notes.append(f"{t.pool}: pod {e.id} replaced (deleted; {t.kind}/{t.name} starts another)")
        before = self._write_scale(t.kind, t.name, t.namespace, plan.replicas)
        if before != plan.replicas:
            notes.append(f"{t.pool}: {t.kind}/{t.name} {before} → {plan.replicas}")
        if t.standby:
            sb = self._write_scale(DEPLOYMENT, t.standby, t.namespace, plan.warm_standby)
            if sb != plan.warm_standby:
                notes.append(f"{t.pool}: standby Deployment/{t.standby} {sb} → {plan.warm_standby}")
        if plan.max_num_seqs or plan.max_num_batched_tokens:
            changed = self._set_engine_caps(t, plan.max_num_seqs, plan.max_num_batched_tokens)
            if changed:
                notes.append(f"{t.pool}: engine args of {t.kind}/{t.name} set to {changed} (rolling restart)")
        return notes

    # ------------------------------------------------------------------ engine args (the slow lever)

    def _containers(self, t: KubeTarget, obj: Any) -> list[Any]:
        """The engine containers of a workload (for an LWS: in the worker and, if set, the leader template)."""
        if t.kind == LEADERWORKERSET:
            lwt = obj["spec"]["leaderWorkerTemplate"]
            templates = [lwt["workerTemplate"]] + ([lwt["leaderTemplate"]] if lwt.get("leaderTemplate") else [])
            found = [c for tpl in templates for c in tpl["spec"]["containers"] if c["name"] == t.container]
        else:
            found = [c for c in obj.spec.template.spec.containers if c.name == t.container]
        if not found:
            raise KubeError(f"pool {t.pool!r}: {t.kind}/{t.name} has no container named {t.container!r} "
                            "(set the pool's container in actuators.kubernetes.pools)", invalid=True)
        return found

    @staticmethod
    def _args(c: Any) -> list[str]:
        return list((c["args"] if isinstance(c, dict) else c.args) or [])

    def _read_workload(self, t: KubeTarget) -> Any:
        what = f"read {t.kind}/{t.name} in namespace {t.namespace}"
        if t.kind == LEADERWORKERSET:
            return self._call(what, self._custom.get_namespaced_custom_object, LWS_GROUP, LWS_VERSION, t.namespace,
                              LWS_PLURAL, t.name)
        fn = self._apps.read_namespaced_deployment if t.kind == DEPLOYMENT else self._apps.read_namespaced_stateful_set
        return self._call(what, fn, t.name, t.namespace)

    def _set_engine_caps(self, t: KubeTarget, seqs: int, tokens: int) -> dict[str, int]:
        seq_flag, tok_flag = t.engine_flags()
        wanted = {f: v for f, v in ((seq_flag, seqs), (tok_flag, tokens)) if v}
        for attempt in range(self._retries + 1):
            obj = self._read_workload(t)
            containers = self._containers(t, obj)
            if all(get_flag(self._args(c), f) == v for c in containers for f, v in wanted.items()):
                return {}
            for c in containers:
                args = self._args(c)
                for f, v in wanted.items():
                    args = set_flag(args, f, v)
                if isinstance(c, dict):
                    c["args"] = args
                else:
                    c.args = args
            try:  # the read object carries its resourceVersion: a write in between answers 409
                if t.kind == LEADERWORKERSET:
                    self._custom.replace_namespaced_custom_object(LWS_GROUP, LWS_VERSION, t.namespace, LWS_PLURAL,
                                                                  t.name, obj, _request_timeout=self._timeout)
                else:
                    fn = self._apps.replace_namespaced_deployment if t.kind == DEPLOYMENT else \
                        self._apps.replace_namespaced_stateful_set
                    fn(t.name, t.namespace, obj, _request_timeout=self._timeout)
                return wanted
            except ApiException as exc:
                if exc.status == 409 and attempt < self._retries:
                    continue
                self._call(f"update the engine args of {t.kind}/{t.name} in namespace {t.namespace}", _raise, exc)
        raise AssertionError("unreachable")  # pragma: no cover

    # ------------------------------------------------------------------ what is running

    def _endpoint(self, t: KubeTarget, pod: k8s.V1Pod, phase: str) -> Endpoint:
        ip = pod.status.pod_ip if pod.status else None
        return Endpoint(t.pool, pod.metadata.name, _url(ip, t.port) if ip else "", phase)

    def _phase(self, t: KubeTarget, pod: k8s.V1Pod) -> str:
        if pod.metadata.deletion_timestamp is not None or pod.metadata.name in self._leaving.get(t.pool, set()):
            return DRAINING
        return READY if _ready(pod) else STARTING

    def pool_endpoints(self, pool: str) -> tuple[int, list[Endpoint]]:
        """(target replicas, the serving and standby pods with their phases) of one pool."""
        t = self.targets[pool]
        target, _, selector = self._read_scale(t.kind, t.name, t.namespace)
        pods = self._pods(selector, t.namespace, f"{t.kind}/{t.name}")
        names = {p.metadata.name for p in pods}
        self._leaving[pool] = self._leaving.get(pool, set()) & names  # forget pods that are gone
        out = [self._endpoint(t, p, self._phase(t, p)) for p in pods]
        if t.standby:
            _, _, sb_selector = self._read_scale(DEPLOYMENT, t.standby, t.namespace)
            out += [self._endpoint(t, p, STANDBY) for p in self._pods(sb_selector, t.namespace,
                                                                        f"Deployment/{t.standby}")
                    if p.metadata.deletion_timestamp is None and _ready(p)]
        return target, sorted(out, key=lambda e: e.id)

    def endpoints(self) -> list[Endpoint]:
        return [e for pool in self.targets for e in self.pool_endpoints(pool)[1]]

    def _not_coming(self, pool: str, target: int, eps: list[Endpoint]) -> int:
        """Replicas asked for that are not coming: pods not ready past the pool's start-up time (Pending for want
        of a node or a GPU, an image that cannot be pulled) and, past it too, pods the workload's controller has
        not created (a quota). Timed on this adapter's own clock from when it first saw each one."""
        t = self.targets[pool]
        now = self._clock()
        starting = [e.id for e in eps if e.phase == STARTING]
        seen = {f"{pool}/{name}" for name in starting}
        for key in [k for k in self._first_seen if k.startswith(f"{pool}/") and k not in seen]:
            del self._first_seen[key]  # ready, or gone
        stuck = sum(1 for key in seen if now - self._first_seen.setdefault(key, now) >= t.startup_s)
        missing = max(0, target - sum(1 for e in eps if e.phase in (READY, STARTING)))
        if missing == 0:
            self._short_since.pop(pool, None)
        elif now - self._short_since.setdefault(pool, now) >= t.startup_s:
            stuck += missing
        return stuck

    def pool_state(self, pool: str) -> tuple[PoolStateView, list[Endpoint]]:
        t = self.targets[pool]
        target, eps = self.pool_endpoints(pool)
        count = {ph: sum(1 for e in eps if e.phase == ph) for ph in (READY, STARTING, DRAINING, STANDBY)}
        unavailable = self._not_coming(pool, target, eps)
        stuck_pods = min(unavailable, count[STARTING])
        containers = self._containers(t, self._read_workload(t))
        seq_flag, tok_flag = t.engine_flags()
        args = self._args(containers[0])
        view = PoolStateView(pool=pool, target_replicas=target, ready=count[READY],
                             starting=count[STARTING] - stuck_pods, draining=count[DRAINING], standby=count[STANDBY],
                             max_num_seqs=get_flag(args, seq_flag), max_num_batched_tokens=get_flag(args, tok_flag),
                             unavailable=unavailable)
        return view, eps


def _raise(exc: ApiException, **_: Any) -> None:
    raise exc


def api_client(*, kubeconfig: str | None = None, context: str | None = None, host: str | None = None) -> k8s.ApiClient:
    """An ApiClient: in-cluster (the pod's service account) unless a kubeconfig is named; `host` is for tests."""
    from kubernetes import config as kconfig

    cfg = k8s.Configuration()
    try:
        if host is not None:
            cfg.host = host
        elif kubeconfig is not None:
            kconfig.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
        else:
            kconfig.load_incluster_config(client_configuration=cfg)
    except (kconfig.ConfigException, OSError, ValueError, TypeError) as exc:
        where = f"kubeconfig {kubeconfig!r}" + (f" context {context!r}" if context else "") if kubeconfig else \
            "the in-cluster service account (set actuators.kubernetes.kubeconfig when not running in a pod)"
        raise ValueError(f"actuators.kubernetes: cannot load {where}: {exc}") from None
    return k8s.ApiClient(cfg)
