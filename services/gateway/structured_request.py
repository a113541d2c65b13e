"""What a chat request's structured-output and tool fields ask of the engine: checked (a 400
naming the field for anything K25 cannot honour), then turned into the constraint the wire
carries, the messages the chat template renders, and whether the answer is read for calls.

Pure: the compile check of the constraint (grammar_check.py) comes after, in the route."""

import json
from dataclasses import dataclass, field

from proto import k25_pb2
from services.gateway.errors import OpenAIError, invalid_request
from services.gateway.schema_policy import SchemaRefused, check_schema
from services.gateway.structured_fields import JsonObjectFormat, JsonSchemaFormat, NamedToolChoice
from services.gateway.tool_grammar import tool_call_grammar
from services.gateway.tool_prompt import CHOICE_HINTS, template_renders_tools, tool_messages

# OpenAI's own limit on the tools of one request
MAX_TOOLS = 128


@dataclass(frozen=True)
class StructuredPlan:
    messages: list[dict]  # for the chat template
    constraint: k25_pb2.Constraint | None = None  # None: free text
    constraint_param: str | None = None  # the request field the constraint comes from
    tool_names: frozenset[str] = frozenset()  # empty: the answer is not read for tool calls
    template_kwargs: dict = field(default_factory=dict)


def plan_structured(body, chat_template: str | None) -> StructuredPlan:
    """Raises OpenAIError (400) for what cannot be honoured; `body` is a ChatCompletionRequest."""
    messages = [message.template_dict() for message in body.messages]
    _check_tool_history(body)
    constraint, param = _response_constraint(body)
    choice = body.tool_choice if body.tool_choice is not None else ("auto" if body.tools else "none")
    if not body.tools:
        if choice != "none":
            raise invalid_request("tool_choice needs tools; send the functions the model may call in `tools`",
                                  "tool_choice")
        return StructuredPlan(tool_messages(messages, [], "", False), constraint, param)
    _check_tools(body.tools)
    if choice == "none":
        return StructuredPlan(tool_messages(messages, [], "", False), constraint, param)
    if constraint is not None:
        raise invalid_request("response_format cannot be combined with tools the model may call; "
                              "set tool_choice to \"none\" or leave response_format out", "response_format")
    tools = body.tools
    if isinstance(choice, NamedToolChoice):
        tools = [t for t in tools if t.function.name == choice.function.name]
        if not tools:
            raise invalid_request(f"tool_choice names the function {choice.function.name!r}, which is not among `tools`",
                                  "tool_choice")
        hint = f"Answer with a call of the function {choice.function.name}."
    else:
        hint = CHOICE_HINTS[choice]
    parallel = body.parallel_tool_calls and not isinstance(choice, NamedToolChoice)
    grammar = tool_call_grammar(tools, parallel, free_text=choice == "auto")
    native = template_renders_tools(chat_template)
    tool_dicts = [t.model_dump(exclude_none=True) for t in body.tools]
    return StructuredPlan(
        tool_messages(messages, tool_dicts, hint, native), k25_pb2.Constraint(lark=grammar), "tools",
        frozenset(t.function.name for t in tools), {"tools": tool_dicts} if native else {},
    )


def _response_constraint(body) -> tuple[k25_pb2.Constraint | None, str | None]:
    response_format = body.response_format
    if isinstance(response_format, JsonObjectFormat):
        return k25_pb2.Constraint(json_schema='{"type":"object"}'), "response_format"
    if isinstance(response_format, JsonSchemaFormat):
        schema = response_format.json_schema.json_schema
        _check(schema, "response_format.json_schema.schema")
        return k25_pb2.Constraint(json_schema=json.dumps(schema, ensure_ascii=False)), "response_format.json_schema.schema"
    return None, None


def _check_tools(tools) -> None:
    if len(tools) > MAX_TOOLS:
        raise invalid_request(f"{len(tools)} tools sent; at most {MAX_TOOLS} are accepted", "tools")
    seen = set()
    for i, tool in enumerate(tools):
        name = tool.function.name
        if name in seen:
            raise invalid_request(f"two tools are named {name!r}; function names must be unique", f"tools[{i}].function.name")
        seen.add(name)
        schema = tool.function.parameters_schema()
        _check(schema, f"tools[{i}].function.parameters")
        if schema.get("type", "object") != "object":
            raise invalid_request("a function's parameters must be a schema of type \"object\"",
                                  f"tools[{i}].function.parameters")


def _check(schema: dict, param: str) -> None:
    try:
        check_schema(schema)
    except SchemaRefused as exc:
        raise invalid_request(f"{param}: {exc}", param, "invalid_schema") from None


def _check_tool_history(body) -> None:
    """Every tool message answers a call an earlier assistant message made."""
    called: set[str] = set()
    for i, message in enumerate(body.messages):
        if message.role == "assistant" and message.tool_calls:
            called.update(call.id for call in message.tool_calls)
        if message.role == "tool" and message.tool_call_id not in called:
            raise invalid_request(f"messages[{i}] answers tool call {message.tool_call_id!r}, which no earlier assistant "
                                  "message made", f"messages[{i}].tool_call_id")


def constraint_refused(param: str, why: str) -> OpenAIError:
    return invalid_request(f"{param}: {why}", param, "invalid_schema")
