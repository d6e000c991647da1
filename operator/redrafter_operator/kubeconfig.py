"""Where the Kubernetes client's configuration comes from, for every command that talks to the API server
(`run`, `cache`, `check`): one rule, so they all reach the same cluster."""

from __future__ import annotations

from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config


async def load_configuration(kubeconfig: str | None = None, context: str | None = None) -> k8s_client.Configuration:
    """In-cluster service account first (unless a kubeconfig is named), else the kubeconfig."""
    cfg = k8s_client.Configuration()
    if not kubeconfig:
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            return cfg
        except k8s_config.ConfigException:
            pass
    await k8s_config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    return cfg
