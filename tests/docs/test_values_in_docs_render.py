"""The values files the README and the cluster guide show are accepted by the chart (its schema
and templates, through the real `helm template`) and make what they say."""

import re

import pytest

from tests.helpers.helm_chart import of_kind, rendered_with
from tests.helpers.paths import REPO

PAGES = [REPO / "README.md", REPO / "docs" / "getting-started" / "cluster.md", REPO / "docs" / "guides" / "lora-rollouts.md"]


def values_blocks(text: str) -> list[str]:
    """The yaml blocks that are values files: they set a top-level chart key."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", text, flags=re.M | re.S)
    return [b for b in blocks if re.search(r"^(engine|image|model|gateway|adapterRollouts):", b, flags=re.M)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_values_file_shown_renders(page, tmp_path):
    blocks = values_blocks(page.read_text(encoding="utf-8"))
    assert blocks, f"{page.name} shows no values file"
    for block in blocks:
        rendered_with(block, tmp_path)


def test_the_readme_values_make_one_h100_pool_from_the_built_images(tmp_path):
    [block] = values_blocks((REPO / "README.md").read_text(encoding="utf-8"))
    objects = rendered_with(block, tmp_path)
    [pool] = of_kind(objects, "EnginePool")
    assert pool["metadata"]["name"] == "h100"
    assert pool["spec"]["image"] == "registry.example.com/k25-engine:0.1.0"
    images = {c["image"] for d in of_kind(objects, "Deployment") for c in d["spec"]["template"]["spec"]["containers"]}
    assert {"registry.example.com/k25-gateway:0.1.0", "registry.example.com/k25-chunker:0.1.0",
            "registry.example.com/k25-operator:0.1.0"} <= images
    assert not of_kind(objects, "PersistentVolumeClaim")
