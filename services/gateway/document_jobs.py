"""The engine jobs of a document request (a passage's note or field, the warming of a passage's
KV, an answer from notes) and the usage of all of them together."""

import time

from services.gateway.api_keys import Caller
from services.gateway.errors import OpenAIError
from services.gateway.openai_schema import ChatCompletionRequest


async def document_job(gateway, model: str, user: str | None, messages: list[dict], max_tokens: int, caller: Caller,
                      ticket, deadline: float):
    """The engine job of one prompt of a document request, charged to the tenant's ticket."""
    if time.time() >= deadline:  # nothing more is sent to an engine for a request that has run out of time
        raise OpenAIError(504, "the request's deadline passed before every passage was read", "server_error", "timeout")
    request = ChatCompletionRequest(model=model, messages=messages, max_tokens=max_tokens, temperature=0, user=user)
    job = gateway.make_job(request, await gateway.encoder.encode_chat(messages), caller, "doc", deadline)
    ticket.use(len(job.prompt_token_ids) + job.sampling.max_tokens)
    return job


class Usage:
    """The tokens of every engine job of one request, answered as one OpenAI usage object."""

    def __init__(self):
        self.prompt_tokens = self.completion_tokens = self.cached_tokens = 0

    def add(self, usage) -> None:
        self.prompt_tokens += usage.prompt_tokens
        self.completion_tokens += usage.completion_tokens
        self.cached_tokens += usage.cached_tokens

    def body(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}
