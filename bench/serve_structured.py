"""The structured workloads of `k25 bench serve --structured`: chat requests that ask for JSON
by schema (`json`), for calls of tools (`tools`), or the same JSON questions without a
constraint (`free`, the baseline a constraint's cost is read against). The mixes are plain
data; `is_valid` says whether an answer holds: JSON that validates against its schema, or at
least one call whose name is a tool's and whose arguments validate."""

import json

import jsonschema

STRUCTURED_KINDS = ("json", "tools", "free")

SCHEMA_MIX = [
    ("person", {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["engineer", "doctor", "teacher"]}, "email": {"type": ["string", "null"], "maxLength": 40}},
        "required": ["name", "age", "role", "email"], "additionalProperties": False}),
    ("order", {"type": "object", "properties": {
        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object", "properties": {
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
            "quantity": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["sku", "quantity"], "additionalProperties": False}},
        "express": {"type": "boolean"}}, "required": ["items", "express"], "additionalProperties": False}),
    ("contract clause", {"type": "object", "properties": {
        "party": {"type": "string", "maxLength": 30}, "obligation": {"type": "string", "maxLength": 60},
        "deadline_days": {"type": ["integer", "null"], "minimum": 1, "maximum": 365},
        "penalty": {"type": "object", "properties": {"amount": {"type": "number", "minimum": 0},
                                                     "currency": {"enum": ["EUR", "USD", "GBP"]}},
                    "required": ["amount", "currency"], "additionalProperties": False}},
        "required": ["party", "obligation", "deadline_days", "penalty"], "additionalProperties": False}),
]

TOOL_MIX = [
    {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "maxLength": 30},
                                          "unit": {"enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "convert_currency", "description": "Convert an amount",
                                      "parameters": {"type": "object", "properties": {
                                          "amount": {"type": "number", "minimum": 0},
                                          "from": {"enum": ["EUR", "USD", "GBP"]}, "to": {"enum": ["EUR", "USD", "GBP"]}},
                                          "required": ["amount", "from", "to"], "additionalProperties": False}}},
]
TOOL_QUESTIONS = ["What is the weather in Lisbon?", "How much is 120 euros in dollars?", "Is it raining in Oslo?"]


def structured_body(kind: str, index: int) -> dict:
    """The chat body (without model, max_tokens and stream) of the index-th request of `kind`."""
    if kind == "tools":
        question = TOOL_QUESTIONS[index % len(TOOL_QUESTIONS)]
        return {"messages": [{"role": "user", "content": question}], "tools": TOOL_MIX, "tool_choice": "required",
                "parallel_tool_calls": False}
    name, schema = SCHEMA_MIX[index % len(SCHEMA_MIX)]
    body = {"messages": [{"role": "user", "content": f"Give me an example {name} as JSON."}]}
    if kind == "json":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": name.replace(" ", "_"), "schema": schema,
                                                                            "strict": True}}
    return body


def is_valid(body: dict, content: str, calls: list[dict]) -> bool:
    """Whether the answer to `body` holds (a `free` answer holds when it is JSON of its schema)."""
    if "tools" in body:
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in body["tools"]}
        return bool(calls) and all(_validates(call.get("arguments", ""), schemas.get(call.get("name"))) for call in calls)
    name = body["messages"][0]["content"].removeprefix("Give me an example ").removesuffix(" as JSON.")
    return _validates(content, dict(SCHEMA_MIX)[name])


def _validates(text: str, schema: dict | None) -> bool:
    if schema is None:
        return False
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def add_tool_call_deltas(calls: list[dict], deltas: list[dict]) -> None:
    """Fold streamed tool-call deltas (OpenAI's shape) into whole calls, by index."""
    for delta in deltas:
        index = delta.get("index", 0)
        while len(calls) <= index:
            calls.append({"name": "", "arguments": ""})
        function = delta.get("function") or {}
        calls[index]["name"] += function.get("name") or ""
        calls[index]["arguments"] += function.get("arguments") or ""
