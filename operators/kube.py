"""The few Kubernetes calls the operator makes beyond kopf, over the official client,
as plain dicts (the same shapes kopf hands to handlers)."""

import json

import kubernetes


def load_client_configuration() -> kubernetes.client.Configuration:
    """In a pod: the service account; elsewhere: the current kube context."""
    configuration = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=configuration)
    return configuration


class KubeApi:
    def __init__(self, configuration: kubernetes.client.Configuration | None = None):
        self.client = kubernetes.client.ApiClient(configuration or load_client_configuration())
        self.apps = kubernetes.client.AppsV1Api(self.client)
        self.core = kubernetes.client.CoreV1Api(self.client)

    def close(self) -> None:
        self.client.close()

    def get_deployment(self, namespace: str, name: str) -> dict | None:
        try:
            return _json(self.apps.read_namespaced_deployment(name, namespace, _preload_content=False))
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return None
            raise

    def create_deployment(self, namespace: str, body: dict) -> dict:
        return _json(self.apps.create_namespaced_deployment(namespace, body, _preload_content=False))

    def patch_deployment(self, namespace: str, name: str, patch: dict) -> dict:
        """A JSON merge patch: the lists in it (containers, env, volumes) replace the stored ones
        whole, so what the operator no longer builds goes away. The client's default, a strategic
        merge, merges those lists by name and would keep an env entry the operator dropped, such
        as the CURVE key of a release that turned CURVE off."""
        return _json(self.apps.patch_namespaced_deployment(name, namespace, patch, _preload_content=False,
                                                           _content_type="application/merge-patch+json"))

    def delete_deployment(self, namespace: str, name: str) -> bool:
        """False when it was already gone."""
        try:
            self.apps.delete_namespaced_deployment(name, namespace, _preload_content=False)
            return True
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return False
            raise

    def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        """Through the scale subresource, so that only the replica count changes."""
        self.apps.patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": replicas}},
                                                    _preload_content=False)

    def list_deployments(self, namespace: str, label_selector: str) -> list[dict]:
        return _json(self.apps.list_namespaced_deployment(namespace, label_selector=label_selector,
                                                          _preload_content=False)).get("items", [])

    def list_pods(self, namespace: str, label_selector: str) -> list[dict]:
        return _json(self.core.list_namespaced_pod(namespace, label_selector=label_selector,
                                                   _preload_content=False)).get("items", [])


def _json(response) -> dict:
    return json.loads(response.data)
