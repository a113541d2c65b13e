"""The OpenAI request and response bodies the gateway accepts and returns.

Unknown request fields are ignored (clients send many); fields K25 cannot honour are
refused with a clear message rather than silently dropped.
"""

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


# characters per token when a prompt's tokens are estimated before tokenising (as OpenAI's rate limits do)
CHARS_PER_TOKEN = 4


def estimated_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
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
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float) -> float:
        if value != 0.0:
            raise ValueError("presence and frequency penalties are not supported; leave them at 0")
        return value

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

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def requested_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def estimated_prompt_tokens(self) -> int:
        return sum(estimated_tokens(m.text()) for m in self.messages)


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
    content: str


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
