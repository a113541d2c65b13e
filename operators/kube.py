"""The few Kubernetes calls the operator makes beyond kopf, over the official client,
as plain dicts (the same shapes kopf hands to handlers)."""

import json

import kubernetes

from operators.workload import WorkloadKind


def load_client_configuration() -> kubernetes.client.Configuration:
    """In a pod: the service account; elsewhere: the current kube context."""
    configuration = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=configuration)
    return configuration


class ApiMissing(Exception):
    """The cluster does not serve this kind of object (its CRD is not installed)."""


class KubeApi:
    """A pool's workload, a Deployment or a LeaderWorkerSet (operators/workload.py), through the
    same calls: both are served at /apis/GROUP/VERSION/namespaces/NS/PLURAL, which the client's
    custom-objects API addresses for any group."""

    def __init__(self, configuration: kubernetes.client.Configuration | None = None):
        self.client = kubernetes.client.ApiClient(configuration or load_client_configuration())
        self.objects = kubernetes.client.CustomObjectsApi(self.client)
        self.core = kubernetes.client.CoreV1Api(self.client)

    def close(self) -> None:
        self.client.close()

    def get_workload(self, kind: WorkloadKind, namespace: str, name: str) -> dict | None:
        """None when there is none (or the cluster does not serve the kind)."""
        try:
            return _json(self.objects.get_namespaced_custom_object(*_where(kind, namespace), name,
                                                                   _preload_content=False))
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return None
            raise

    def create_workload(self, kind: WorkloadKind, namespace: str, body: dict) -> dict:
        """Raises ApiMissing when the cluster does not serve the kind."""
        try:
            return _json(self.objects.create_namespaced_custom_object(*_where(kind, namespace), body,
                                                                      _preload_content=False))
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                raise ApiMissing(f"this cluster serves no {kind.kind} ({kind.api_version})") from error
            raise

    def patch_workload(self, kind: WorkloadKind, namespace: str, name: str, patch: dict) -> dict:
        """A JSON merge patch: the lists in it (containers, env, volumes) replace the stored ones
        whole, so what the operator no longer builds goes away. A strategic merge (kubectl's
        default for Deployments) merges those lists by name and would keep an env entry the
        operator dropped, such as the CURVE key of a release that turned CURVE off."""
        return _json(self.objects.patch_namespaced_custom_object(*_where(kind, namespace), name, patch,
                                                                 _preload_content=False,
                                                                 _content_type="application/merge-patch+json"))

    def delete_workload(self, kind: WorkloadKind, namespace: str, name: str) -> bool:
        """False when it was already gone."""
        try:
            self.objects.delete_namespaced_custom_object(*_where(kind, namespace), name, _preload_content=False)
            return True
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return False
            raise

    def scale_workload(self, kind: WorkloadKind, namespace: str, name: str, replicas: int) -> None:
        """Through the scale subresource, so that only the replica count changes."""
        self.objects.patch_namespaced_custom_object_scale(*_where(kind, namespace), name, {"spec": {"replicas": replicas}},
                                                          _preload_content=False,
                                                          _content_type="application/merge-patch+json")

    def list_workloads(self, kind: WorkloadKind, namespace: str, label_selector: str) -> list[dict]:
        """[] when the cluster does not serve the kind."""
        try:
            return _json(self.objects.list_namespaced_custom_object(*_where(kind, namespace), label_selector=label_selector,
                                                                    _preload_content=False)).get("items", [])
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return []
            raise

    def list_pods(self, namespace: str, label_selector: str) -> list[dict]:
        return _json(self.core.list_namespaced_pod(namespace, label_selector=label_selector,
                                                   _preload_content=False)).get("items", [])


def _where(kind: WorkloadKind, namespace: str) -> tuple[str, str, str, str]:
    return kind.group, kind.version, namespace, kind.plural


def _json(response) -> dict:
    return json.loads(response.data)
