"""Custom resources checked as the API server would: the CRD's own openAPIV3Schema (run by
the `jsonschema` package once OpenAPI 3.0's boolean exclusiveMinimum/Maximum are turned
into JSON Schema's numbers), then, on the spec with the schema's defaults filled in, its
CEL rules at every level (run by a real CEL evaluator, cel-python) and its list-type sets."""

import celpy
import jsonschema


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


def with_defaults(schema: dict, value):
    """`value` with the schema's defaults filled in, at every level, as the API server stores it."""
    if schema.get("type") == "object" and isinstance(value, dict):
        value = dict(value)
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = sub["default"]
            if name in value:
                value[name] = with_defaults(sub, value[name])
    return value


def _is_sorted(values):
    """Kubernetes' CEL list library `isSorted()`, which plain CEL lacks."""
    items = list(values)
    return celpy.celtypes.BoolType(all(a <= b for a, b in zip(items, items[1:])))


def cel_errors(schema: dict, value, path: str = "spec") -> list[str]:
    """The x-kubernetes-validations rules and list-type sets at every level of `schema`."""
    errors = []
    for rule in schema.get("x-kubernetes-validations", []):
        environment = celpy.Environment()
        program = environment.program(environment.compile(rule["rule"]), functions={"isSorted": _is_sorted})
        if not program.evaluate({"self": celpy.json_to_cel(value)}):
            errors.append(f"{path}: {rule['message']}")
    if schema.get("x-kubernetes-list-type") == "set" and len(set(value)) != len(value):
        errors.append(f"{path}: duplicate entries in a set")
    if isinstance(value, dict):
        for name, sub in value.items():
            if name in schema.get("properties", {}):
                errors += cel_errors(schema["properties"][name], sub, f"{path}.{name}")
    return errors


def crd_for(obj: dict, crds: list[dict]) -> dict | None:
    group, _, version = obj["apiVersion"].rpartition("/")
    for crd in crds:
        if crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == obj["kind"]:
            if any(v["name"] == version and v["served"] for v in crd["spec"]["versions"]):
                return crd
    return None


def custom_resource_errors(obj: dict, crd: dict) -> list[str]:
    """What the API server would answer when `obj` is applied: [] or the reasons for refusing."""
    version = obj["apiVersion"].rpartition("/")[2]
    [schema] = [v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version]
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    validator = jsonschema.Draft202012Validator(as_json_schema(schema))
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in validator.iter_errors(body)]
    if errors:
        return errors
    spec_schema = schema.get("properties", {}).get("spec", {})
    return cel_errors(spec_schema, with_defaults(spec_schema, obj.get("spec", {})))
