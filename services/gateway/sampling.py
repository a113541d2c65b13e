"""What a request asks the engine for: the engine's SamplingParams from the request's OpenAI
fields, with max_tokens resolved against the engines' context and the gateway's limits, and
logit_bias checked against the model's vocabulary."""

from collections.abc import Iterable

from proto import k25_pb2
from services.gateway.errors import invalid_request
from services.gateway.openai_schema import SamplingFields
from services.gateway.routing import PoolInfo, largest_context
from services.gateway.settings import GatewaySettings


def sampling_params(body: SamplingFields, prompt_tokens: int, vocab_size: int, pools: Iterable[PoolInfo],
                    s: GatewaySettings) -> k25_pb2.SamplingParams:
    """For a prompt of `prompt_tokens` tokens; a max_tokens above the limit, or a logit_bias
    token outside the vocabulary, is a 400."""
    max_tokens = body.requested_max_tokens()
    if max_tokens is None:
        context = largest_context(pools)  # None: no engine seen yet
        room = s.default_max_tokens if context is None else context - prompt_tokens
        max_tokens = max(1, min(s.default_max_tokens, s.max_tokens_limit, room))
    if max_tokens > s.max_tokens_limit:
        raise invalid_request(f"max_tokens must be at most {s.max_tokens_limit}, got {max_tokens}", "max_tokens")
    logprobs = body.requested_logprobs()
    sampling = k25_pb2.SamplingParams(
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, max_tokens=max_tokens,
        stop=body.stop, logprobs=0 if logprobs is None else max(1, logprobs),
    )
    if body.seed is not None:
        sampling.seed = body.seed
    bias = {int(token): value for token, value in (body.logit_bias or {}).items()}
    if any(token >= vocab_size for token in bias):
        raise invalid_request(f"logit_bias token ids must be in [0, {vocab_size})", "logit_bias")
    sampling.logit_bias.update(bias)
    sampling.presence_penalty, sampling.frequency_penalty = body.presence_penalty, body.frequency_penalty
    sampling.repetition_penalty = body.repetition_penalty
    return sampling
