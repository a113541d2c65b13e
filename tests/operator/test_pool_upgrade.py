"""One pool's engines roll at a time: a Deployment counts as rolling out as `kubectl rollout
status` judges it, and a pool whose template changes waits while another is rolling."""

import pytest

from operators.pool_upgrade import rolling_elsewhere, still_rolling, template_hash


def deployment(name: str, replicas: int = 2, generation: int = 3, **status) -> dict:
    return {"metadata": {"name": name, "generation": generation}, "spec": {"replicas": replicas},
            "status": status}


DONE = {"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}


@pytest.mark.parametrize("status, rolling", [
    (DONE, False),
    ({**DONE, "observedGeneration": 2}, True),  # the controller has not seen the new template yet
    ({**DONE, "updatedReplicas": 1}, True),  # one pod still on the old template
    ({**DONE, "availableReplicas": 1}, True),  # a new pod not available yet
    ({**DONE, "replicas": 3}, True),  # an old pod still terminating
    ({}, False),  # no status yet: not known to be rolling
])
def test_still_rolling_as_kubectl_rollout_status_judges(status, rolling):
    assert still_rolling(deployment("a", **status)) is rolling


def test_a_pool_waits_for_another_rolling_pool_never_for_itself():
    done, rolling = deployment("a-engine", **DONE), deployment("b-engine", **{**DONE, "updatedReplicas": 0})
    assert rolling_elsewhere([done, rolling], "a-engine") == "b-engine"
    assert rolling_elsewhere([done, rolling], "b-engine") is None
    assert rolling_elsewhere([], "a-engine") is None


def test_the_template_hash_changes_with_the_template_only():
    template = {"spec": {"containers": [{"image": "k25-engine:1", "args": ["k25", "engine"]}]}}
    assert template_hash(template) == template_hash({"spec": {"containers": [{"args": ["k25", "engine"],
                                                                              "image": "k25-engine:1"}]}})
    assert template_hash(template) != template_hash({"spec": {"containers": [{"image": "k25-engine:2"}]}})
