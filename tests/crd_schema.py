"""Custom resources checked as the API server would: the CRD's own openAPIV3Schema (run by
the `jsonschema` package once OpenAPI 3.0's boolean exclusiveMinimum/Maximum are turned
into JSON Schema's numbers), then its CEL rules on the spec with the schema's defaults."""

import jsonschema

from test_k8s_manifests import cel_holds, with_defaults


def as_json_schema(schema):
    if isinstance(schema, list):
        return [as_json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {key: as_json_schema(value) for key, value in schema.items() if not key.startswith("x-kubernetes-")}
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if converted.get(bound) is True:
            converted[bound] = converted.pop(limit)
        elif converted.get(bound) is False:
            del converted[bound]
    if converted.pop("nullable", False) and "type" in converted:
        converted["type"] = [converted["type"], "null"]
    return converted


def crd_for(obj: dict, crds: list[dict]) -> dict | None:
    group, _, version = obj["apiVersion"].rpartition("/")
    for crd in crds:
        if crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == obj["kind"]:
            if any(v["name"] == version and v["served"] for v in crd["spec"]["versions"]):
                return crd
    return None


def custom_resource_errors(obj: dict, crd: dict) -> list[str]:
    version = obj["apiVersion"].rpartition("/")[2]
    [schema] = [v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version]
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    validator = jsonschema.Draft202012Validator(as_json_schema(schema))
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in validator.iter_errors(body)]
    if errors:
        return errors
    spec_schema = schema.get("properties", {}).get("spec", {})
    spec = with_defaults(spec_schema, obj.get("spec", {}))
    return [rule["message"] for rule in spec_schema.get("x-kubernetes-validations", []) if not cel_holds(rule["rule"], spec)]
