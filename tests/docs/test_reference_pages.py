"""The reference pages under docs/reference/ are generated from the code (docs/gen_reference.py):
the CLI from its argparse parser, the chart values from values.schema.json, the CRD fields from
charts/k25/crds/, the metric families from each part's registry, the error codes from the proto enum.
A committed page that differs from a fresh generation fails here, with the command to run."""

import importlib.util

from tests.helpers.paths import REPO


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_reference", REPO / "docs" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_reference_pages_match_the_code():
    generator = load_generator()
    pages = generator.generate()
    stale = generator.stale_pages(pages)
    assert not stale, (f"docs/reference/{', '.join(stale)} out of date with the code: regenerate with "
                       f"`{generator.REGENERATE}` and commit the result")


def test_every_generated_page_is_in_the_site_nav():
    nav = (REPO / "mkdocs.yml").read_text()
    generator = load_generator()
    assert [name for name in generator.PAGES if f"reference/{name}" not in nav] == []


def test_the_reference_covers_every_command_metric_and_error_code():
    """Spot checks that the walk reaches the leaves, not only that it ran."""
    generator = load_generator()
    pages = generator.generate()
    assert "## k25 bench profile" in pages["cli.md"] and "`--max-chunk-per-gpu`" in pages["cli.md"]
    assert "`engine.pools[]`" in pages["chart-values.md"] and "`ttftSloSeconds`" in pages["chart-values.md"]
    assert "`spec.maxChunkPerGpu`" in pages["crds.md"] and "`spec.canary.sha256`" in pages["crds.md"]
    for family in ("k25_engine_kv_usage_ratio", "k25_gateway_requests_total", "k25_chunker_requests_total",
                   "k25_lora_inference_latency_seconds"):
        assert f"`{family}`" in pages["metrics.md"]
    assert "`adapter_name`, `ab_group`" in pages["metrics.md"]
    for code in ("INVALID_ARGUMENT", "CHUNK_SIZE_MISMATCH", "RESOURCE_EXHAUSTED", "ADAPTER_NOT_FOUND",
                 "DEADLINE_EXCEEDED", "CANCELLED", "INTERNAL"):
        assert f"`{code}`" in pages["errors.md"]
