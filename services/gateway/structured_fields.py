"""The OpenAI request fields of structured outputs and tool calling: `response_format`,
`tools`, `tool_choice`, and the assistant `tool_calls` and `tool` messages of a conversation.

These types check shapes only; what a schema may hold, and whether it compiles, is
schema_policy.py's, and what goes to the engine is structured_request.py's."""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# OpenAI's own spelling of a function's or a schema's name
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]


class TextFormat(BaseModel):
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    type: Literal["json_object"]


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: Name
    description: str | None = None
    # `schema` would shadow a BaseModel method: the field keeps OpenAI's name on the wire only
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None  # K25 constrains to the schema either way


class JsonSchemaFormat(BaseModel):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class FunctionSpec(BaseModel):
    name: Name
    description: str | None = None
    parameters: dict[str, Any] | None = None  # None: a function that takes no arguments
    strict: bool | None = None

    def parameters_schema(self) -> dict[str, Any]:
        return self.parameters if self.parameters is not None else {"type": "object", "properties": {}}


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(BaseModel):
    name: Name


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(BaseModel):
    name: Name
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: Annotated[str, Field(min_length=1)]
    type: Literal["function"] = "function"
    function: CalledFunction
