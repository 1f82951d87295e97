"""The Kubernetes ApiClient from settings: kubeconfig path, else in-cluster, else ~/.kube/config."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from backfill.settings import Settings


class KubeConfigError(Exception):
    """No usable Kubernetes configuration (one-line message)."""


def api_client(settings: Settings) -> client.ApiClient:
    """An ApiClient for the configured cluster.

    Raises:
        KubeConfigError: the kubeconfig is missing or invalid, or no configuration is found.
    """
    if settings.kubeconfig is not None:
        path = Path(settings.kubeconfig).expanduser()
        if not path.is_file():
            raise KubeConfigError(f"kubeconfig {path} does not exist")
        try:
            return config.new_client_from_config(config_file=str(path))
        except (ConfigException, ValueError, OSError) as exc:
            raise KubeConfigError(f"kubeconfig {path}: {str(exc).splitlines()[0]}") from None
    try:
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(cfg)
    except ConfigException:
        pass
    default = Path("~/.kube/config").expanduser()
    if not default.is_file():
        raise KubeConfigError("no Kubernetes configuration: not in a cluster, no --kubeconfig and no ~/.kube/config")
    try:
        return config.new_client_from_config(config_file=str(default))
    except (ConfigException, ValueError, OSError) as exc:
        raise KubeConfigError(f"kubeconfig {default}: {str(exc).splitlines()[0]}") from None
