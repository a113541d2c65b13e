"""Prefix caching through the chart: a pool's `prefixCaching: false` reaches its engines as
`--no-prefix-caching` (valid against the CRD; so does `cudaGraphs: false`, as
`--no-cuda-graphs`), and the gateway's routing-index bound and
tenant sharing reach `k25 gateway` as its parser reads them."""

import yaml

from k25.cli import build_parser
from operators.deployment import engine_args
from operators.pool_spec import parse_pool_spec
from tests.helpers.crd_schema import crd_for, custom_resource_errors
from tests.helpers.helm_chart import RELEASE, of_kind, rendered, rendered_with


def gateway_args(objects):
    deployment = next(d for d in of_kind(objects, "Deployment") if d["metadata"]["name"].endswith("-gateway"))
    return build_parser().parse_args(deployment["spec"]["template"]["spec"]["containers"][0]["args"][1:])


def test_by_default_engines_cache_and_tenants_do_not_share():
    objects = rendered(None)
    args = gateway_args(objects)
    assert (args.prefix_index_max_blocks, args.share_prefix_cache_across_tenants) == (262_144, False)
    # the bounds on one caller's work: the gateway's own defaults
    assert (args.max_document_passages, args.body_timeout_s, args.max_body_bytes_in_flight) == (256, 30.0, 512 << 20)
    for pool in of_kind(objects, "EnginePool"):
        assert "prefixCaching" not in pool["spec"]  # the CRD's default: on


def test_a_pool_that_turns_caching_off_and_a_gateway_that_shares(tmp_path):
    objects = rendered_with(yaml.safe_dump({
        "gateway": {"prefixIndexMaxBlocks": 1000, "sharePrefixCacheAcrossTenants": True, "maxDocumentPassages": 64,
                    "bodyTimeoutS": 2.5, "maxBodyBytesInFlight": 64 << 20},
        "engine": {"pools": [{"name": "cpu", "nodeType": "CPU", "chunkSize": 256, "maxChunkPerGpu": 4, "gpusPerReplica": 0,
                              "prefixCaching": False, "cudaGraphs": False}]},
    }), tmp_path)
    args = gateway_args(objects)
    assert (args.prefix_index_max_blocks, args.share_prefix_cache_across_tenants) == (1000, True)
    assert (args.max_document_passages, args.body_timeout_s, args.max_body_bytes_in_flight) == (64, 2.5, 64 << 20)
    (pool,) = of_kind(objects, "EnginePool")
    assert pool["spec"]["prefixCaching"] is False
    crds = of_kind(objects, "CustomResourceDefinition")
    assert custom_resource_errors(pool, crd_for(pool, crds)) == []
    # the operator turns the spec into the engine's command line
    engine = build_parser().parse_args(engine_args(parse_pool_spec(pool["spec"]), "cpu", RELEASE)[1:])
    assert (engine.prefix_caching, engine.cuda_graphs) == (False, False)
