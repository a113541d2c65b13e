"""Whether the engine takes a request: pure checks over the request and the engine's state.

`validate` refuses what can never run here (INVALID_ARGUMENT, CHUNK_SIZE_MISMATCH,
DEADLINE_EXCEEDED); `check_room` refuses what cannot be queued now (RESOURCE_EXHAUSTED)."""

from collections.abc import Container

from engine.base.errors import EngineError, ErrorCode
from engine.core.request import EngineRequest


def validate(
    request: EngineRequest, active_ids: Container[str], chunk_size: int, vocab_size: int, max_model_len: int, now: float
) -> list[int]:
    """The request's prompt without its pads; raises EngineError if the request can never run."""
    invalid = ErrorCode.INVALID_ARGUMENT
    if not request.request_id:
        raise EngineError(invalid, "request_id must not be empty")
    if request.request_id in active_ids:
        raise EngineError(invalid, f"request_id {request.request_id!r} is already running")
    if request.chunk_size != chunk_size:
        raise EngineError(
            ErrorCode.CHUNK_SIZE_MISMATCH,
            f"request was padded for chunk_size {request.chunk_size}; this engine's chunk_size is {chunk_size}",
        )
    padded = len(request.prompt_token_ids)
    if padded % chunk_size:
        raise EngineError(
            ErrorCode.CHUNK_SIZE_MISMATCH, f"padded prompt length {padded} is not a multiple of chunk_size {chunk_size}"
        )
    if not 0 <= request.pad_length < padded:
        raise EngineError(invalid, f"pad_length {request.pad_length} leaves no prompt in {padded} tokens")
    prompt = list(request.prompt_token_ids[: padded - request.pad_length])
    if any(not 0 <= t < vocab_size for t in prompt):
        raise EngineError(invalid, f"prompt has token ids outside the vocabulary [0, {vocab_size})")
    request.sampling.validate(vocab_size)
    needed = len(prompt) + request.sampling.max_tokens
    if needed > max_model_len:
        raise EngineError(
            invalid,
            f"prompt ({len(prompt)} tokens) + max_tokens ({request.sampling.max_tokens}) = {needed} "
            f"exceeds this engine's context of {max_model_len} tokens",
        )
    if request.deadline is not None and request.deadline <= now:
        raise EngineError(ErrorCode.DEADLINE_EXCEEDED, "the request's deadline has already passed")
    return prompt


def check_room(num_waiting: int, max_waiting: int, kv_usage: float, kv_admission_limit: float) -> None:
    """Raises EngineError(RESOURCE_EXHAUSTED) while the queue is full or the KV cache is above its admission limit."""
    if num_waiting >= max_waiting:
        raise EngineError(ErrorCode.RESOURCE_EXHAUSTED, f"queue full ({num_waiting} waiting)")
    if kv_usage > kv_admission_limit:
        raise EngineError(
            ErrorCode.RESOURCE_EXHAUSTED, f"KV cache {kv_usage:.0%} full (limit {kv_admission_limit:.0%})"
        )
