"""The wire to the Kubernetes API: an ApiClient of the official `kubernetes` client for leader election and the
shared state, from a kubeconfig file when one is named, else from the pod's service account (in-cluster).
Errors name the setting to fix."""

from __future__ import annotations

from typing import Any


def api_client_for(kubeconfig: str | None, setting: str = "leader_election") -> Any:
    """The configured ApiClient; ValueError naming `setting` when the kubeconfig or the service account cannot
    configure it."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        if kubeconfig:
            return config.new_client_from_config(config_file=kubeconfig)
        config.load_incluster_config()
        return client.ApiClient()
    except ConfigException as exc:
        where = f"kubeconfig {kubeconfig!r}" if kubeconfig else "the pod's service account (in-cluster)"
        raise ValueError(f"{setting}: cannot configure the Kubernetes client from {where}: {exc} "
                         f"(outside a pod, set {setting}.kubeconfig)") from None
