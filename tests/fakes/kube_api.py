"""An in-process fake of the few Kubernetes API endpoints the Kubernetes adapter uses, over loopback HTTP.

No API server can run here, so this serves the API's HTTP semantics to the real `kubernetes` client:
JSON bodies, `Status` errors (404 NotFound, 409 Conflict, 422 Invalid, 400, 415), a global
resourceVersion bumped on every write, optimistic concurrency on PUT (a stale resourceVersion → 409),
merge-patch on pods, graceful pod deletion (terminating; a Deployment's controller starts another),
equality label selectors on pod lists, the `/scale` subresource of Deployments,
StatefulSets and LeaderWorkerSets (`status.selector` included), HPA and KEDA ScaledObject lists (the
latter 404 unless KEDA is "installed").

Any other namespaced object of a group (`/apis/GROUP/VERSION/namespaces/NS/PLURAL[/NAME]`: Leases, custom
resources such as GovernorState and InferencePool, EndpointSlices) is served generically: GET (one, or a list
with an equality `labelSelector`), POST (409 AlreadyExists), PUT (409 Conflict on a stale resourceVersion, 404
when gone), DELETE; `put_object` seeds or changes one as a controller would (bumping its resourceVersion).

`forbidden` answers 403 for paths containing a fragment, as a missing RBAC rule would.
A small controller stands in for the ReplicaSet/StatefulSet/LWS controllers: after a scale write it
creates pods (not ready, no IP) or marks pods terminating (a Deployment removes not-ready pods, then the
lowest `controller.kubernetes.io/pod-deletion-cost`, then the youngest; the ordered kinds their highest
ordinals). `on_pod_created` / `on_pod_terminating` hooks let a test play the kubelet (`set_ready`,
`finish_delete`). `interfere(path)` makes a concurrent writer bump an object right after the next GET of
that path, so the following write conflicts.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

COST = "controller.kubernetes.io/pod-deletion-cost"
_APPS = r"/apis/apps/v1/namespaces/(?P<ns>[^/]+)/(?P<res>deployments|statefulsets)/(?P<name>[^/]+)(?P<scale>/scale)?"
_LWS = r"/apis/leaderworkerset\.x-k8s\.io/v1/namespaces/(?P<ns>[^/]+)/(?P<res>leaderworkersets)/(?P<name>[^/]+)" \
       r"(?P<scale>/scale)?"
_PODS = r"/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<name>[^/]+))?"
_HPA = r"/apis/autoscaling/v2/namespaces/(?P<ns>[^/]+)/horizontalpodautoscalers"
_KEDA = r"/apis/keda\.sh/v1alpha1/namespaces/(?P<ns>[^/]+)/scaledobjects"
_GENERIC = r"/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?"
KIND_OF = {"deployments": "Deployment", "statefulsets": "StatefulSet", "leaderworkersets": "LeaderWorkerSet"}


class ApiFailureError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def _merge(base: dict, patch: dict) -> dict:
    """RFC 7386 JSON merge patch."""
    out = dict(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _selector_string(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        k, _, v = term.partition("=")
        if labels.get(k) != v:
            return False
    return True


class FakeKubeApi:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.objects: dict[tuple[str, str, str], dict] = {}  # (resource, namespace, name) → object
        self.requests: list[tuple[str, str, str]] = []  # (method, path, content-type) in order
        self.keda_installed = False
        self.forbidden: set[str] = set()  # path fragments answered 403 (an RBAC rule left out)
        self.on_pod_created: Callable[[dict], None] | None = None
        self.on_pod_terminating: Callable[[dict], None] | None = None
        self._rv = itertools.count(100)
        self._names = itertools.count(1)
        self._clock = datetime(2026, 1, 1, tzinfo=UTC)
        self._interfere: dict[str, int] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ------------------------------------------------------------------ seeding objects

    def _now(self) -> str:
        self._clock += timedelta(seconds=1)  # every created object is one second younger than the last
        return self._clock.strftime("%Y-%m-%dT%H:%M:%SZ")

    def _meta(self, name: str, ns: str, **extra: Any) -> dict:
        return {"name": name, "namespace": ns, "uid": f"uid-{next(self._names)}",
                "resourceVersion": str(next(self._rv)), "creationTimestamp": self._now(), "generation": 1, **extra}

    @staticmethod
    def _template(labels: dict[str, str], container: str, args: list[str]) -> dict:
        return {"metadata": {"labels": dict(labels)},
                "spec": {"containers": [{"name": container, "image": "vllm/vllm-openai:latest", "args": list(args)}]}}

    def add_workload(self, kind: str, name: str, ns: str = "inference", *, replicas: int = 1,
                     labels: dict[str, str] | None = None, container: str = "vllm", args: list[str] | None = None,
                     size: int = 2) -> dict:
        labels = labels or {"app": name}
        args = args if args is not None else ["--model", "m", "--max-num-seqs=256"]
        with self.lock:
            if kind in ("Deployment", "StatefulSet"):
                res = "deployments" if kind == "Deployment" else "statefulsets"
                obj: dict[str, Any] = {"apiVersion": "apps/v1", "kind": kind, "metadata": self._meta(name, ns),
                       "spec": {"replicas": replicas, "selector": {"matchLabels": dict(labels)},
                                "template": self._template(labels, container, args)}}
                if kind == "StatefulSet":
                    obj["spec"]["serviceName"] = name
            elif kind == "LeaderWorkerSet":
                res = "leaderworkersets"
                obj = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": kind, "metadata": self._meta(name, ns),
                       "spec": {"replicas": replicas, "leaderWorkerTemplate": {
                           "size": size, "workerTemplate": self._template(labels, container, args)}}}
            else:
                raise ValueError(kind)
            self.objects[(res, ns, name)] = obj
            self._reconcile(res, ns, name)
            return obj

    def add_hpa(self, name: str, target_kind: str, target_name: str, ns: str = "inference") -> None:
        with self.lock:
            self.objects[("horizontalpodautoscalers", ns, name)] = {
                "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": self._meta(name, ns),
                "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": target_kind, "name": target_name},
                         "minReplicas": 1, "maxReplicas": 10}}

    def add_scaledobject(self, name: str, target_name: str, ns: str = "inference") -> None:
        with self.lock:
            self.keda_installed = True
            self.objects[("scaledobjects", ns, name)] = {
                "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": self._meta(name, ns),
                "spec": {"scaleTargetRef": {"name": target_name}}}

    def interfere(self, path: str, times: int = 1) -> None:
        """After the next `times` GETs of `path`, a concurrent writer bumps that object's resourceVersion."""
        self._interfere[path] = times

    # ------------------------------------------------------------------ the kubelet's side

    def pods(self, ns: str = "inference", selector: str = "") -> list[dict]:
        with self.lock:
            return sorted((copy.deepcopy(o) for (r, n, _), o in self.objects.items() if r == "pods" and n == ns
                           and _matches(o["metadata"].get("labels", {}), selector)),
                          key=lambda p: p["metadata"]["name"])

    def set_ready(self, name: str, ip: str, ns: str = "inference", ready: bool = True) -> None:
        with self.lock:
            pod = self.objects[("pods", ns, name)]
            pod["status"] = {"phase": "Running", "podIP": ip, "conditions": [
                {"type": "Ready", "status": "True" if ready else "False"}]}
            pod["metadata"]["resourceVersion"] = str(next(self._rv))

    def finish_delete(self, name: str, ns: str = "inference") -> None:
        with self.lock:
            self.objects.pop(("pods", ns, name), None)

    def workload(self, res: str, name: str, ns: str = "inference") -> dict:
        with self.lock:
            return copy.deepcopy(self.objects[(res, ns, name)])

    # ------------------------------------------------------------------ the controllers' side

    def _pod_labels(self, res: str, obj: dict) -> dict[str, str]:
        if res == "leaderworkersets":
            return dict(obj["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"])
        return dict(obj["spec"]["template"]["metadata"]["labels"])

    def _selector(self, res: str, obj: dict) -> str:
        if res == "leaderworkersets":
            name = obj["metadata"]["name"]
            return f"leaderworkerset.sigs.k8s.io/name={name},leaderworkerset.sigs.k8s.io/worker-index=0"
        return _selector_string(obj["spec"]["selector"]["matchLabels"])

    def _reconcile(self, res: str, ns: str, name: str) -> None:
        obj = self.objects[(res, ns, name)]
        want = obj["spec"]["replicas"]
        live = [p for p in self.pods(ns, self._selector(res, obj)) if "deletionTimestamp" not in p["metadata"]]
        created, leaving = [], []
        if res == "deployments":
            for _ in range(want - len(live)):
                created.append(f"{name}-{next(self._names):05d}")

            def rank(p: dict) -> tuple:
                ready = any(c["type"] == "Ready" and c["status"] == "True"
                            for c in p.get("status", {}).get("conditions", []))
                cost = int(p["metadata"].get("annotations", {}).get(COST, "0"))
                return (ready, cost, [-ord(ch) for ch in p["metadata"]["creationTimestamp"]])
            leaving = sorted(live, key=rank)[:max(0, len(live) - want)]
        else:
            have = {int(p["metadata"]["name"].rsplit("-", 1)[1]) for p in live}
            created = [f"{name}-{i}" for i in range(want) if i not in have]
            leaving = [p for p in live if int(p["metadata"]["name"].rsplit("-", 1)[1]) >= want]
        for pod_name in created:
            labels = self._pod_labels(res, obj)
            if res == "statefulsets":
                labels["apps.kubernetes.io/pod-index"] = pod_name.rsplit("-", 1)[1]
            if res == "leaderworkersets":
                labels.update({"leaderworkerset.sigs.k8s.io/name": name,
                               "leaderworkerset.sigs.k8s.io/worker-index": "0",
                               "leaderworkerset.sigs.k8s.io/group-index": pod_name.rsplit("-", 1)[1]})
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": self._meta(pod_name, ns, labels=labels),
                   "spec": {"containers": [{"name": "engine", "image": "x"}]}, "status": {"phase": "Pending"}}
            self.objects[("pods", ns, pod_name)] = pod
            if self.on_pod_created:
                self.on_pod_created(copy.deepcopy(pod))
        for p in leaving:
            stored = self.objects[("pods", ns, p["metadata"]["name"])]
            stored["metadata"]["deletionTimestamp"] = self._now()
            if self.on_pod_terminating:
                self.on_pod_terminating(copy.deepcopy(stored))

    # ------------------------------------------------------------------ HTTP

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _serve(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                url = urlparse(self.path)
                ctype = self.headers.get("Content-Type", "")
                with api.lock:
                    api.requests.append((self.command, url.path, ctype))
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    self._reply(400, _status(400, "BadRequest", "the request body is not JSON"))
                    return
                try:
                    code, out = api.route(self.command, url.path, parse_qs(url.query), body, ctype)
                except ApiFailureError as f:
                    self._reply(f.code, _status(f.code, f.reason, f.message))
                    return
                self._reply(code, out)

            do_GET = do_PUT = do_PATCH = do_POST = do_DELETE = _serve  # noqa: N815 - http.server's method names

        return Handler

    def route(self, method: str, path: str, query: dict, body: Any, ctype: str) -> tuple[int, dict]:
        with self.lock:
            if any(f in path for f in self.forbidden):
                raise ApiFailureError(403, "Forbidden", f'{method} {path} is forbidden: User '
                                      '"system:serviceaccount:inference:governor" cannot do this')
            for pattern, fn in ((_APPS, self._workload), (_LWS, self._workload), (_PODS, self._pods),
                                (_HPA, self._hpas), (_KEDA, self._keda)):
                m = re.fullmatch(pattern, path)
                if m:
                    out = fn(method, m.groupdict(), query, body, ctype)
                    if method == "GET" and self._interfere.get(path, 0) > 0:
                        self._interfere[path] -= 1
                        self._bump(m.groupdict())
                    return out
            m = re.fullmatch(_GENERIC, path)
            if m:
                out = self._generic(method, m.groupdict(), query, body)
                g = m.groupdict()
                key = (f"{g['group']}/{g['plural']}", g["ns"], g["name"] or "")
                if method == "GET" and self._interfere.get(path, 0) > 0 and key in self.objects:
                    self._interfere[path] -= 1
                    self.objects[key]["metadata"]["resourceVersion"] = str(next(self._rv))
                return out
        raise ApiFailureError(404, "NotFound", f"the server could not find the requested resource ({path})")

    # ------------------------------------------------------------------ any other namespaced object

    def put_object(self, group: str, plural: str, obj: dict, ns: str = "inference") -> dict:
        """Create or replace an object as its controller would (no resourceVersion check); returns the stored copy."""
        with self.lock:
            name = obj["metadata"]["name"]
            key = (f"{group}/{plural}", ns, name)
            old = self.objects.get(key)
            stored = copy.deepcopy(obj)
            meta = stored.setdefault("metadata", {})
            if old is None:
                meta.update(self._meta(name, ns, **{k: v for k, v in meta.items() if k not in ("name", "namespace")}))
            else:
                meta.update({k: old["metadata"][k] for k in ("uid", "creationTimestamp")})
                meta.update(namespace=ns, resourceVersion=str(next(self._rv)))
            self.objects[key] = stored
            return copy.deepcopy(stored)

    def get_object(self, group: str, plural: str, name: str, ns: str = "inference") -> dict | None:
        with self.lock:
            obj = self.objects.get((f"{group}/{plural}", ns, name))
            return copy.deepcopy(obj) if obj is not None else None

    def delete_object(self, group: str, plural: str, name: str, ns: str = "inference") -> None:
        with self.lock:
            self.objects.pop((f"{group}/{plural}", ns, name), None)

    def _generic(self, method: str, g: dict, query: dict, body: Any) -> tuple[int, dict]:
        res, ns, name = f"{g['group']}/{g['plural']}", g["ns"], g["name"]
        what = f'{g["plural"]}.{g["group"]}'
        if name is None:
            if method == "GET":
                selector = (query.get("labelSelector") or [""])[0]
                items = [copy.deepcopy(o) for (r, n, _), o in sorted(self.objects.items())
                         if r == res and n == ns and _matches(o["metadata"].get("labels") or {}, selector)]
                return 200, {"kind": "List", "apiVersion": f"{g['group']}/{g['version']}",
                             "metadata": {"resourceVersion": str(next(self._rv))}, "items": items}
            if method != "POST" or not isinstance(body, dict):
                raise ApiFailureError(405, "MethodNotAllowed", f"{method} on the {what} collection")
            name = (body.get("metadata") or {}).get("name")
            if not name:
                raise ApiFailureError(422, "Invalid", f"{what}: metadata.name: Required value")
            if (res, ns, name) in self.objects:
                raise ApiFailureError(409, "AlreadyExists", f'{what} "{name}" already exists')
            stored = copy.deepcopy(body)
            meta = stored.setdefault("metadata", {})
            meta.pop("resourceVersion", None)
            meta.update(self._meta(name, ns, **{k: v for k, v in meta.items() if k not in ("name", "namespace")}))
            self.objects[(res, ns, name)] = stored
            return 201, copy.deepcopy(stored)
        obj = self.objects.get((res, ns, name))
        if obj is None:
            raise ApiFailureError(404, "NotFound", f'{what} "{name}" not found')
        if method == "GET":
            return 200, copy.deepcopy(obj)
        if method == "DELETE":
            del self.objects[(res, ns, name)]
            return 200, _status(200, "", "deleted") | {"status": "Success"}
        if method != "PUT" or not isinstance(body, dict):
            raise ApiFailureError(405, "MethodNotAllowed", f"{method} on {what} is not supported here")
        if (body.get("metadata") or {}).get("name") not in (None, name):
            raise ApiFailureError(400, "BadRequest", "the name of the object does not match the name on the URL")
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if rv is not None and rv != obj["metadata"]["resourceVersion"]:
            raise ApiFailureError(409, "Conflict", f'Operation cannot be fulfilled on {what} "{name}": the object '
                                  "has been modified; please apply your changes to the latest version and try again")
        stored = copy.deepcopy(body)
        stored["metadata"] = {**stored.get("metadata", {}), **{k: obj["metadata"][k] for k in
                                                              ("uid", "creationTimestamp", "namespace", "name")},
                              "resourceVersion": str(next(self._rv))}
        self.objects[(res, ns, name)] = stored
        return 200, copy.deepcopy(stored)

    def _bump(self, g: dict) -> None:
        key = (g.get("res") or "pods", g["ns"], g.get("name") or "")
        if key in self.objects:
            self.objects[key]["metadata"]["resourceVersion"] = str(next(self._rv))

    def _get(self, res: str, ns: str, name: str) -> dict:
        obj = self.objects.get((res, ns, name))
        if obj is None:
            group = "apps" if res in ("deployments", "statefulsets") else "leaderworkerset.x-k8s.io"
            raise ApiFailureError(404, "NotFound", f'{res}.{group} "{name}" not found')
        return obj

    @staticmethod
    def _check_rv(obj: dict, body: dict) -> None:
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if rv is not None and rv != obj["metadata"]["resourceVersion"]:
            raise ApiFailureError(409, "Conflict", f'Operation cannot be fulfilled on {obj["kind"].lower()}s '
                             f'"{obj["metadata"]["name"]}": the object has been modified; please apply your changes '
                             "to the latest version and try again")

    def _scale_of(self, res: str, obj: dict) -> dict:
        m = obj["metadata"]
        live = [p for p in self.pods(m["namespace"], self._selector(res, obj))
                if "deletionTimestamp" not in p["metadata"]]
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": m["name"], "namespace": m["namespace"], "uid": m["uid"],
                             "resourceVersion": m["resourceVersion"], "creationTimestamp": m["creationTimestamp"]},
                "spec": {"replicas": obj["spec"]["replicas"]},
                "status": {"replicas": len(live), "selector": self._selector(res, obj)}}

    def _workload(self, method: str, g: dict, query: dict, body: Any, ctype: str) -> tuple[int, dict]:
        res, ns, name = g["res"], g["ns"], g["name"]
        obj = self._get(res, ns, name)
        if method == "GET":
            return 200, copy.deepcopy(self._scale_of(res, obj) if g["scale"] else obj)
        if method != "PUT" or not isinstance(body, dict):
            raise ApiFailureError(405, "MethodNotAllowed", f"{method} is not supported on {g['res']} here")
        if (body.get("metadata") or {}).get("name") not in (None, name):
            raise ApiFailureError(400, "BadRequest", "the name of the object does not match the name on the URL")
        self._check_rv(obj, body)
        if g["scale"]:
            if body.get("kind") != "Scale":
                raise ApiFailureError(400, "BadRequest", f"expected a Scale, got kind {body.get('kind')!r}")
            replicas = (body.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise ApiFailureError(422, "Invalid", f'Scale.autoscaling "{name}" is invalid: spec.replicas: Invalid '
                                 f"value: {replicas!r}: must be greater than or equal to 0")
            obj["spec"]["replicas"] = replicas
        else:
            if body.get("kind") != obj["kind"]:
                raise ApiFailureError(400, "BadRequest", f"expected kind {obj['kind']}, got {body.get('kind')!r}")
            if body.get("spec", {}).get("replicas", 0) < 0:
                raise ApiFailureError(422, "Invalid",
                                      f"{obj['kind']} \"{name}\" is invalid: spec.replicas must be >= 0")
            template_changed = body["spec"] != obj["spec"]
            meta = obj["metadata"]
            obj.clear()
            obj.update(copy.deepcopy(body))
            obj["metadata"] = {**meta, "labels": body["metadata"].get("labels"),
                               "generation": meta["generation"] + (1 if template_changed else 0)}
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        self._reconcile(res, ns, name)
        return 200, copy.deepcopy(self._scale_of(res, obj) if g["scale"] else obj)

    def _pods(self, method: str, g: dict, query: dict, body: Any, ctype: str) -> tuple[int, dict]:
        ns, name = g["ns"], g["name"]
        if name is None:
            if method != "GET":
                raise ApiFailureError(405, "MethodNotAllowed", "only GET on the pod collection here")
            items = self.pods(ns, (query.get("labelSelector") or [""])[0])
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(next(self._rv))},
                         "items": items}
        pod = self.objects.get(("pods", ns, name))
        if pod is None:
            raise ApiFailureError(404, "NotFound", f'pods "{name}" not found')
        if method == "GET":
            return 200, copy.deepcopy(pod)
        if method == "DELETE":  # graceful: terminating now; its Deployment starts another at once
            pod["metadata"]["deletionTimestamp"] = self._now()
            pod["metadata"]["resourceVersion"] = str(next(self._rv))
            if self.on_pod_terminating:
                self.on_pod_terminating(copy.deepcopy(pod))
            for (res, wns, wname), obj in list(self.objects.items()):
                if res == "deployments" and wns == ns and _matches(pod["metadata"].get("labels", {}),
                                                                  self._selector(res, obj)):
                    self._reconcile(res, ns, wname)
            return 200, copy.deepcopy(pod)
        if method != "PATCH":
            raise ApiFailureError(405, "MethodNotAllowed", f"{method} on a pod is not supported here")
        if not ctype.startswith("application/merge-patch+json"):
            raise ApiFailureError(415, "UnsupportedMediaType", f"this fake takes merge patches only, got {ctype!r}")
        cost = ((body.get("metadata") or {}).get("annotations") or {}).get(COST)
        if cost is not None and not re.fullmatch(r"-?\d+", str(cost)):
            raise ApiFailureError(422, "Invalid", f'Pod "{name}" is invalid: metadata.annotations[{COST}]: '
                                  f"Invalid value: {cost!r}: must be a 32bit integer")
        merged = _merge(pod, body)
        merged["metadata"]["resourceVersion"] = str(next(self._rv))
        self.objects[("pods", ns, name)] = merged
        return 200, copy.deepcopy(merged)

    def _hpas(self, method: str, g: dict, query: dict, body: Any, ctype: str) -> tuple[int, dict]:
        items = [copy.deepcopy(o) for (r, n, _), o in self.objects.items()
                 if r == "horizontalpodautoscalers" and n == g["ns"]]
        return 200, {"kind": "HorizontalPodAutoscalerList", "apiVersion": "autoscaling/v2", "metadata": {},
                     "items": items}

    def _keda(self, method: str, g: dict, query: dict, body: Any, ctype: str) -> tuple[int, dict]:
        if not self.keda_installed:
            raise ApiFailureError(404, "NotFound", "the server could not find the requested resource")
        items = [copy.deepcopy(o) for (r, n, _), o in self.objects.items() if r == "scaledobjects" and n == g["ns"]]
        return 200, {"kind": "ScaledObjectList", "apiVersion": "keda.sh/v1alpha1", "metadata": {}, "items": items}
