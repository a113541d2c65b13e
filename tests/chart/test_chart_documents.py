"""The chart's stored-document settings (`gateway.documents`) reach `k25 gateway` as its parser
reads them: by default the gateway's own defaults, and values that are set."""

import yaml

from k25.cli import build_parser
from tests.helpers.helm_chart import of_kind, rendered, rendered_with

FIELDS = ("document_passages_read", "max_document_bytes", "max_tenant_document_bytes", "max_tenant_documents",
          "document_ttl_s")


def gateway_args(objects):
    deployment = next(d for d in of_kind(objects, "Deployment") if d["metadata"]["name"].endswith("-gateway"))
    return build_parser().parse_args(deployment["spec"]["template"]["spec"]["containers"][0]["args"][1:])


def test_by_default_the_gateway_s_own_document_settings():
    args, defaults = gateway_args(rendered(None)), build_parser().parse_args(["gateway"])
    assert [getattr(args, f) for f in FIELDS] == [getattr(defaults, f) for f in FIELDS]


def test_document_settings_reach_the_gateway(tmp_path):
    objects = rendered_with(yaml.safe_dump({"gateway": {"documents": {
        "passagesRead": 6, "maxDocumentBytes": 1 << 20, "maxTenantBytes": 8 << 30, "maxTenantDocuments": 50, "ttlS": 3600,
    }}}), tmp_path)
    assert [getattr(gateway_args(objects), f) for f in FIELDS] == [6, 1 << 20, 8 << 30, 50, 3600]
