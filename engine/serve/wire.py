"""Pure conversions between the wire's protobuf messages and the engine's own types.

No I/O here: the server decodes a frame with `decode_client_message`, turns a
GenerateRequest into an EngineRequest, every RequestOutput into the EngineMessages it
sends back (a TokenDelta when there is something new, then one Final or Error), and the
messages for one peer into one frame with `engine_frame` (an EngineBatch)."""

from google.protobuf.message import DecodeError

from engine.base.errors import EngineError, ErrorCode
from engine.core.request import EngineRequest, RequestOutput, Timings, Usage
from engine.core.sampling_params import Constraint, SampledToken, SamplingParams
from engine.core.sequence import FinishReason
from engine.lora.adapter import AdapterRef
from proto import k25_pb2

_FINISH_REASONS = {
    FinishReason.STOP: k25_pb2.STOP,
    FinishReason.LENGTH: k25_pb2.LENGTH,
    FinishReason.ABORT: k25_pb2.ABORT,
    FinishReason.ERROR: k25_pb2.ERROR,
}


def decode_client_message(payload: bytes) -> k25_pb2.ClientMessage:
    """The ClientMessage in one frame; EngineError(INVALID_ARGUMENT) if there is none."""
    message = k25_pb2.ClientMessage()
    try:
        message.ParseFromString(payload)
    except (DecodeError, ValueError) as exc:
        raise EngineError(ErrorCode.INVALID_ARGUMENT, f"frame is not a k25.v1.ClientMessage: {exc}") from None
    if message.WhichOneof("kind") is None:
        raise EngineError(ErrorCode.INVALID_ARGUMENT, "ClientMessage carries neither generate nor cancel")
    return message


def request_id_of(message: k25_pb2.ClientMessage) -> str:
    kind = message.WhichOneof("kind")
    return getattr(message, kind).request_id if kind else ""


def sampling_from_proto(sampling: k25_pb2.SamplingParams) -> SamplingParams:
    return SamplingParams(
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p if sampling.top_p != 0.0 else 1.0,  # proto3's default 0 means "off"
        seed=sampling.seed if sampling.HasField("seed") else None,
        stop_token_ids=tuple(sampling.stop_token_ids),
        stop=tuple(sampling.stop),
        ignore_eos=sampling.ignore_eos,
        logprobs=sampling.logprobs or None,
        constraint=_constraint(sampling.constraint) if sampling.HasField("constraint") else None,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        repetition_penalty=sampling.repetition_penalty or 1.0,  # proto3's default 0 means "off"
        logit_bias=tuple(sorted(sampling.logit_bias.items())),
    )


def _constraint(constraint: k25_pb2.Constraint) -> Constraint:
    kind = constraint.WhichOneof("kind")
    if kind is None:
        raise EngineError(ErrorCode.INVALID_ARGUMENT, "the constraint is set but empty")
    return Constraint(kind, getattr(constraint, kind))


def request_from_proto(request: k25_pb2.GenerateRequest) -> EngineRequest:
    """The engine's view of a request; the engine itself validates the values."""
    return EngineRequest(
        request_id=request.request_id,
        prompt_token_ids=list(request.prompt_token_ids),
        sampling=sampling_from_proto(request.sampling),
        chunk_size=request.chunk_size,
        pad_length=request.pad_length,
        deadline=request.deadline_unix_s or None,
        adapter=AdapterRef(request.adapter.name, request.adapter.version) if request.adapter.name else None,
        cache_salt=request.cache_salt,
    )


def error_message(request_id: str, error: EngineError) -> k25_pb2.EngineMessage:
    return k25_pb2.EngineMessage(
        error=k25_pb2.Error(request_id=request_id, code=k25_pb2.ErrorCode.Value(error.code.name), message=error.message)
    )


def engine_frame(messages: list[k25_pb2.EngineMessage]) -> bytes:
    """One frame to a peer: every message in it, in order, as one EngineBatch."""
    return k25_pb2.EngineBatch(messages=messages).SerializeToString()


def messages_from_output(output: RequestOutput) -> list[k25_pb2.EngineMessage]:
    """What one step's output for one request puts on the wire, in order."""
    messages = []
    if output.token_ids or output.text:
        messages.append(k25_pb2.EngineMessage(delta=_delta(output)))
    if not output.finished:
        return messages
    if output.finish_reason is FinishReason.ERROR:
        error = output.error or EngineError(ErrorCode.INTERNAL, "the engine failed the request")
        messages.append(error_message(output.request_id, error))
    else:
        messages.append(k25_pb2.EngineMessage(final=_final(output)))
    return messages


def _delta(output: RequestOutput) -> k25_pb2.TokenDelta:
    return k25_pb2.TokenDelta(
        request_id=output.request_id,
        token_ids=output.token_ids,
        text=output.text,
        logprobs=[_logprob(t) for t in output.logprobs],
    )


def _logprob(token: SampledToken) -> k25_pb2.TokenLogprob:
    return k25_pb2.TokenLogprob(
        token_id=token.token_id,
        logprob=token.logprob if token.logprob is not None else 0.0,
        top=[k25_pb2.TopLogprob(token_id=t, logprob=lp) for t, lp in token.top],
    )


def _final(output: RequestOutput) -> k25_pb2.Final:
    usage = output.usage or Usage(0, 0, 0)
    timings = output.timings or Timings(0.0, 0.0, 0.0, 0, 0)
    return k25_pb2.Final(
        request_id=output.request_id,
        finish_reason=_FINISH_REASONS[output.finish_reason],
        usage=k25_pb2.Usage(
            prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens, pad_tokens=usage.pad_tokens,
            cached_tokens=usage.cached_tokens, host_cached_tokens=usage.host_cached_tokens,
            disk_cached_tokens=usage.disk_cached_tokens,
        ),
        timings=k25_pb2.Timings(
            queued_s=timings.queued_s,
            time_to_first_token_s=timings.time_to_first_token_s,
            total_s=timings.total_s,
            prefill_chunks=timings.prefill_slices,  # the proto field keeps its first name
            preemptions=timings.preemptions,
        ),
    )
