"""CURVE on the ZMQ links: the gateway, the chunker and every engine the operator starts read
the release's one key from the same Secret (as K25_CURVE_SECRET_KEY), a key the processes
accept; the chart makes that Secret, or names one of yours; off, no process gets a key."""

import pytest
import zmq

from common.zmq_curve import ENV, KEY_CHARS, NEXT_ENV, PREVIOUS_ENV, checked_secret_key
from tests.helpers.helm_chart import (
    VALUE_SETS,
    engine_deployments,
    of_kind,
    operator_env,
    process_containers,
    render_error,
    rendered,
    rendered_with,
    secret_values,
    value_set_id,
)

value_sets = pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
# the parts that speak ZMQ: the gateway dials the chunker and the engines
ZMQ_PARTS = ("k25-gateway", "k25-chunker")


def zmq_containers(objects) -> dict[str, dict]:
    """The containers of the gateway, the chunker and the engines the operator builds."""
    return process_containers(objects, ZMQ_PARTS)


def key_source(container: dict) -> dict | None:
    [entry] = [e for e in container.get("env", []) if e["name"] == ENV] or [None]
    return entry and entry["valueFrom"]["secretKeyRef"]


@value_sets
def test_every_zmq_party_reads_one_key_from_the_releases_secret_and_no_pod_spec_holds_it(values):
    objects = rendered(values)
    secret = operator_env(objects)["K25_CURVE_SECRET"]  # which the operator hands to the engines
    assert secret == "k25-transport"
    containers = zmq_containers(objects)
    assert len(containers) > len(ZMQ_PARTS)  # engines among them
    assert {name: key_source(c) for name, c in containers.items()} == {
        name: {"name": secret, "key": "curve-secret-key"} for name in containers}
    key = secret_values(objects)[secret]["curve-secret-key"]
    assert len(key) == KEY_CHARS
    # what every part checks at start, and what CURVE derives the public key from
    assert checked_secret_key(key) == key.encode()
    assert len(zmq.curve_public(key.encode())) == KEY_CHARS
    pods = str([o["spec"]["template"] for o in [*objects, *engine_deployments(objects)]
                if o["kind"] in ("Deployment", "StatefulSet")])
    assert key not in pods


def test_a_secret_of_yours_is_read_and_the_chart_makes_none(tmp_path):
    objects = rendered_with("transport:\n  curve:\n    existingSecret: my-curve\n", tmp_path)
    assert "k25-transport" not in secret_values(objects)
    assert operator_env(objects)["K25_CURVE_SECRET"] == "my-curve"
    assert {name: key_source(c) for name, c in zmq_containers(objects).items()} == {
        name: {"name": "my-curve", "key": "curve-secret-key"} for name in zmq_containers(objects)}


def test_off_no_process_gets_a_key_and_the_network_policies_stay(tmp_path):
    objects = rendered_with("transport:\n  curve:\n    enabled: false\n", tmp_path)
    assert "k25-transport" not in secret_values(objects)
    assert "K25_CURVE_SECRET" not in operator_env(objects)
    deployments = [*of_kind(objects, "Deployment"), *engine_deployments(objects)]
    assert [d["metadata"]["name"] for d in deployments
            if any(e["name"] == ENV for c in d["spec"]["template"]["spec"]["containers"] for e in c.get("env", []))] == []
    assert {p["metadata"]["name"] for p in of_kind(objects, "NetworkPolicy")} >= {"k25-engine", "k25-chunker"}


@pytest.mark.parametrize("values, message", [
    ("transport:\n  curve:\n    enabled: \"yes\"\n", "/transport/curve/enabled': got string, want boolean"),
    ("transport:\n  curve:\n    existingSecret: My_Key\n", "/transport/curve/existingSecret': 'My_Key' does not match"),
    ("transport:\n  curv:\n    enabled: true\n", "additional properties 'curv' not allowed"),
    ("transport:\n  curve:\n    enabled: false\n    existingSecret: my-curve\n",
     "transport.curve.existingSecret names the CURVE key's Secret, but transport.curve.enabled is false"),
])
def test_wrong_transport_values_are_refused(values, message, tmp_path):
    assert message in render_error(values, tmp_path)


@value_sets
def test_every_zmq_party_reads_a_rotations_second_key_when_the_secret_holds_one(values):
    """Optional references: a Secret without a rotation under way starts every pod as before."""
    objects = rendered(values)
    for name, container in zmq_containers(objects).items():
        sources = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if e["name"] in (NEXT_ENV, PREVIOUS_ENV)}
        assert sources == {NEXT_ENV: {"name": "k25-transport", "key": "curve-secret-key-next", "optional": True},
                           PREVIOUS_ENV: {"name": "k25-transport", "key": "curve-secret-key-previous", "optional": True}}, name


def test_the_rotation_word_rolls_every_pod_that_reads_the_key(tmp_path):
    from tests.chart.test_chart_secret_rollout import checksums

    before = checksums(rendered_with("redis: {auth: {password: one}}", tmp_path))
    after = checksums(rendered_with("redis: {auth: {password: one}}\ntransport: {curve: {rotation: add-next}}", tmp_path))
    readers = {name for name, container in zmq_containers(rendered(None)).items()}
    assert readers <= set(after)
    assert all(after[name] != before[name] for name in readers)
