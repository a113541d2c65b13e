"""OpenAI response bodies and stream chunks for chat and text completions, built from what
the engine sent (text deltas, logprobs, the Final's finish reason and usage)."""

import json

from common.tokenizer import Tokenizer
from proto import k25_pb2

# the normal ends of an answer (an ABORT is not one: dispatch.OpenedStream raises an error for it)
FINISH_REASONS = {k25_pb2.STOP: "stop", k25_pb2.LENGTH: "length"}


def usage_body(usage: k25_pb2.Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"


class LogprobsBuilder:
    """OpenAI's logprobs objects from the engine's per-token logprobs; chat and text
    completions spell them differently."""

    def __init__(self, tokenizer: Tokenizer, chat: bool):
        self.tokenizer = tokenizer
        self.chat = chat
        self.text_offset = 0

    def _token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def build(self, logprobs) -> dict | None:
        if not logprobs:
            return None
        if self.chat:
            return {"content": [
                {
                    "token": self._token(lp.token_id), "logprob": lp.logprob,
                    "bytes": list(self._token(lp.token_id).encode()),
                    "top_logprobs": [
                        {"token": self._token(t.token_id), "logprob": t.logprob, "bytes": list(self._token(t.token_id).encode())}
                        for t in lp.top
                    ],
                }
                for lp in logprobs
            ]}
        tokens = [self._token(lp.token_id) for lp in logprobs]
        offsets = []
        for token in tokens:
            offsets.append(self.text_offset)
            self.text_offset += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{self._token(t.token_id): t.logprob for t in lp.top} for lp in logprobs],
            "text_offset": offsets,
        }


def merge_logprobs(parts: list[dict]) -> dict | None:
    """One logprobs object from the per-delta ones (for a non-streamed answer)."""
    if not parts:
        return None
    merged: dict = {key: [] for key in parts[0]}
    for part in parts:
        for key, values in part.items():
            merged[key].extend(values)
    return merged


def chat_chunk(request_id: str, created: int, model: str, delta: dict, finish_reason: str | None = None,
               logprobs: dict | None = None) -> dict:
    return {
        "id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
    }


def text_chunk(request_id: str, created: int, model: str, text: str, finish_reason: str | None = None,
               logprobs: dict | None = None) -> dict:
    return {
        "id": request_id, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
    }


def usage_chunk(request_id: str, created: int, model: str, chat: bool, usage: k25_pb2.Usage) -> dict:
    return {
        "id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created, "model": model, "choices": [], "usage": usage_body(usage),
    }
