"""The chart refuses to expose a gateway without API keys outside the cluster: an Ingress, a
LoadBalancer or a NodePort Service needs keys, or gateway.allowAnonymous set on purpose.
Inside the cluster (the default ClusterIP Service) the gateway may run without keys."""

import pytest

from tests.helpers.helm_chart import named, of_kind, render_error, rendered, rendered_with

INGRESS = "gateway:\n  ingress: {enabled: true, host: llm.example.com}\n"
KEYS = "  apiKeys:\n    entries: [{sha256: \"" + "ab" * 32 + "\", tenant: acme}]\n"


@pytest.mark.parametrize("values, exposure", [
    (INGRESS, "gateway.ingress.enabled is true"),
    ("gateway:\n  service: {type: LoadBalancer}\n", "gateway.service.type is LoadBalancer"),
    ("gateway:\n  service: {type: NodePort}\n", "gateway.service.type is NodePort"),
])
def test_a_public_gateway_without_api_keys_is_refused_with_what_to_do(values, exposure, tmp_path):
    error = render_error(values, tmp_path)
    assert exposure in error and "has no API keys" in error
    assert "gateway.apiKeys.entries" in error and "gateway.allowAnonymous: true" in error


@pytest.mark.parametrize("values", [
    INGRESS + KEYS,
    INGRESS + "  apiKeys: {existingSecret: my-keys}\n",
    INGRESS + "  allowAnonymous: true\n",
    "gateway:\n  service: {type: LoadBalancer}\n" + KEYS,
])
def test_a_public_gateway_with_keys_or_an_explicit_choice_renders(values, tmp_path):
    objects = rendered_with(values, tmp_path)
    assert named(objects, "Deployment", "k25-gateway")


def test_by_default_the_gateway_is_reachable_only_inside_the_cluster():
    objects = rendered(None)
    assert named(objects, "Service", "k25-gateway")["spec"]["type"] == "ClusterIP"
    assert not of_kind(objects, "Ingress")
