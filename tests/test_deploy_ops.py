"""Deployment files for operations (issue 19): high availability on a Lease (RBAC, PDB, replicas), the
alerting rules, and the systemd watchdog against the config. Separate from tests/test_deploy.py, which
checks the manifests' ports, volumes and configs."""

from __future__ import annotations

from pathlib import Path

import yaml

from controller.config import parse_settings

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "kubernetes"


def _docs() -> list[dict]:
    return [d for p in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def _one(kind: str, name: str) -> dict:
    found = [d for d in _docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def _config():
    cm = _one("ConfigMap", "governor-config")
    return parse_settings(cm["data"]["governor.yaml"], "ConfigMap/governor-config")


def test_rbac_reaches_only_the_lease_the_config_contends_for():
    s = _config()
    le = s.leader_election
    assert le.enabled
    lease, pools = le.lease_and_pools(s.pool_names())
    assert pools == s.pool_names()
    roles = [d for d in _docs() if d["kind"] in ("Role", "ClusterRole")]
    assert [r["metadata"]["name"] for r in roles] == ["governor-leader-election"]
    (rule,) = roles[0]["rules"]
    assert rule == {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [lease],
                    "verbs": ["get", "update"]}
    assert roles[0]["metadata"]["namespace"] == le.namespace
    # create cannot be limited by name: the Lease ships with the manifests
    assert _one("Lease", lease)["metadata"]["namespace"] == le.namespace
    binding = _one("RoleBinding", "governor-leader-election")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "governor-leader-election"}
    dep = _one("Deployment", "governor")
    pod = dep["spec"]["template"]["spec"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                                    "namespace": le.namespace}]


def test_two_replicas_a_disruption_budget_and_the_pod_identity():
    s = _config()
    dep = _one("Deployment", "governor")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pdb = _one("PodDisruptionBudget", "governor")
    assert pdb["spec"]["minAvailable"] == 1 and pdb["spec"]["minAvailable"] < dep["spec"]["replicas"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    (c,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "governor"]
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"  # the identity
    assert s.leader_election.identity is None
    assert env["GOVERNOR_LEADER_ELECTION__ADDRESS"]["value"] == "$(POD_IP):50051"
    # a follower's takeover (lease duration) is shorter than the grace a stopping leader gets
    grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert s.leader_election.lease_duration_s < grace
