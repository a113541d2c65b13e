"""Which images an EnginePool may run: a repository entry allows any tag or digest of that
repository only, a `prefix/*` entry every repository under it, no entries any image."""

import pytest

from operators.image_policy import image_refusal, repository


@pytest.mark.parametrize("image, expected", [
    ("k25-engine", "k25-engine"),
    ("k25-engine:0.1.0", "k25-engine"),
    ("registry:5000/team/engine:1.2", "registry:5000/team/engine"),
    ("registry:5000/team/engine", "registry:5000/team/engine"),
    ("ghcr.io/acme/engine@sha256:" + "a" * 64, "ghcr.io/acme/engine"),
    ("ghcr.io/acme/engine:1.2@sha256:" + "a" * 64, "ghcr.io/acme/engine"),
])
def test_the_repository_is_the_image_without_tag_or_digest(image, expected):
    assert repository(image) == expected


ALLOWED = ("ghcr.io/acme/k25-engine", "registry:5000/team/*")


@pytest.mark.parametrize("image, allowed", [
    ("ghcr.io/acme/k25-engine:1.2", True),
    ("ghcr.io/acme/k25-engine@sha256:" + "0" * 64, True),
    ("registry:5000/team/anything:3", True),
    ("registry:5000/team/nested/engine", True),
    ("ghcr.io/acme/k25-engine-evil:1.2", False),  # a longer name is another repository
    ("ghcr.io/acme/k25-engine/evil:1.2", False),
    ("registry:5000/teamx/engine", False),  # the prefix ends at its slash
    ("evil.io/ghcr.io/acme/k25-engine:1.2", False),
    ("k25-engine:latest", False),
])
def test_only_the_allowed_repositories_run(image, allowed):
    refusal = image_refusal(image, ALLOWED)
    assert (refusal is None) is allowed
    if not allowed:
        assert repr(image) in refusal and "--allowed-image" in refusal


def test_without_entries_any_image_runs():
    assert image_refusal("anything.example/whatever:1", ()) is None
