"""The OpenAI request and response bodies the gateway accepts and returns.

Unknown request fields are ignored (clients send many); fields K25 cannot honour are
refused with a clear message rather than silently dropped. Text that is not Unicode (a lone
surrogate such as "\ud800", which JSON can spell but UTF-8 cannot) is refused wherever it
stands in a request body, before anything else reads it; a top_p so small that the engine's
float32 would read it as 0 ("off") is raised to the smallest positive float32 it can read.
"""

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from services.gateway.structured_fields import ResponseFormat, Tool, ToolCall, ToolChoice


# characters per token when a prompt's tokens are estimated before tokenising (as OpenAI's rate limits do)
CHARS_PER_TOKEN = 4


# the smallest positive normal float32: smaller values flush to 0 on the wire or on a GPU
FLOAT32_TINY = 1.1754943508222875e-38


def estimated_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def lone_surrogate_at(value, path: str = "") -> str | None:
    """Where in a decoded JSON value the first string (value or key) holding a lone surrogate
    stands, e.g. "messages[0].content"; None when every string is Unicode. Iterative: a deeply
    nested body costs no recursion."""
    pending = [(path, value)]
    while pending:
        where, item = pending.pop()
        if isinstance(item, str):
            if not _is_unicode(item):
                return where or "the body"
        elif isinstance(item, dict):
            for key, inner in reversed(item.items()):
                inner_path = f"{where}.{key}" if where else str(key)
                if isinstance(key, str) and not _is_unicode(key):
                    return f"a key of {where}" if where else "a key of the body"
                pending.append((inner_path, inner))
        elif isinstance(item, list):
            pending.extend((f"{where}[{i}]", inner) for i, inner in reversed(list(enumerate(item))))
    return None


def _is_unicode(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # only surrogates fail: every other code point has a UTF-8 form
        return False
    return True


class UnicodeBody(BaseModel):
    """A request body whose every string must be Unicode text."""

    @model_validator(mode="before")
    @classmethod
    def _unicode_only(cls, body):
        where = lone_surrogate_at(body)
        if where is not None:
            raise ValueError(f"{where} holds a lone surrogate (U+D800..U+DFFF), which is not text; send valid Unicode")
        return body


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # the call a tool message answers

    @model_validator(mode="after")
    def _tool_fields(self):
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        return self

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""

    def template_dict(self) -> dict:
        """The message as a chat template takes it (a developer message is a system one)."""
        message = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        return message


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(UnicodeBody):
    """What chat and completion requests share."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=2**31 - 1, description="K25 extension: sample from the k most likely tokens (0 = off)")
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    user: str | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0,
                                      description="K25 extension: >1 discourages the prompt's and answer's tokens (1 = off)")
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = Field(None, max_length=300)
    # OpenAI fields K25 does not honour: refused when set, never dropped
    functions: list | None = None
    function_call: str | dict | None = None
    prediction: dict | None = None
    audio: dict | None = None
    modalities: list[str] | None = None

    @field_validator("top_p")
    @classmethod
    def _readable_top_p(cls, top_p: float) -> float:
        """A top_p below float32's range would reach the engine as 0, which reads as "off":
        the smallest one it can read keeps the client's meaning (the most likely token only)."""
        return max(top_p, FLOAT32_TINY)

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, bias):
        if bias and not all(key.isascii() and key.isdigit() for key in bias):
            raise ValueError("logit_bias keys must be token ids")
        return bias

    @field_validator("functions", "function_call", "prediction", "audio")
    @classmethod
    def _not_honoured(cls, value, info):
        if value:
            hint = "; use tools and tool_choice" if info.field_name in ("functions", "function_call") else ""
            raise ValueError(f"{info.field_name} is not supported by K25{hint}")
        return value

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, modalities):
        if modalities and modalities != ["text"]:
            raise ValueError("K25 answers in text only: modalities must be [\"text\"]")
        return modalities

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, stop):
        stops = [stop] if isinstance(stop, str) else (stop or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences")
        if any(not s for s in stops):
            raise ValueError("stop sequences must not be empty")
        return stops

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def reserved_tokens(self, default_max_tokens: int) -> int:
        """What a tenant's token rate is charged when the request is admitted, before it is
        tokenised: its estimated prompt plus its max_tokens."""
        return self.estimated_prompt_tokens() + (self.requested_max_tokens() or default_max_tokens)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def requested_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def estimated_prompt_tokens(self) -> int:
        tools = sum(estimated_tokens(t.model_dump_json()) for t in self.tools or ())
        return tools + sum(estimated_tokens(m.text()) for m in self.messages)


NonEmptyText = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[int], Field(min_length=1)]


class CompletionRequest(SamplingFields):
    prompt: (NonEmptyText | TokenIds | Annotated[list[NonEmptyText], Field(min_length=1, max_length=1)]
             | Annotated[list[TokenIds], Field(min_length=1, max_length=1)])
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, prompt):
        """Plain messages for what the types would refuse obscurely (a batch, an empty prompt)."""
        batch = isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list))
        if batch and len(prompt) != 1:
            raise ValueError("one prompt per request: batches of prompts are not supported")
        if isinstance(prompt, (str, list)) and not (prompt[0] if batch else prompt):
            raise ValueError("prompt must not be empty")
        return prompt

    @field_validator("prompt")
    @classmethod
    def _unbatched(cls, prompt):
        return prompt[0] if isinstance(prompt, list) and isinstance(prompt[0], (str, list)) else prompt

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, echo: bool) -> bool:
        if echo:
            raise ValueError("echo is not supported")
        return echo

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, suffix):
        if suffix:
            raise ValueError("suffix is not supported")
        return suffix

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def requested_logprobs(self) -> int | None:
        return self.logprobs

    def estimated_prompt_tokens(self) -> int:
        return estimated_tokens(self.prompt) if isinstance(self.prompt, str) else len(self.prompt)


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(0, description="prompt tokens whose KV the engine's prefix cache already held")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str
    logprobs: dict | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str
    logprobs: dict | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "k25"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
