"""Everything after a token id is sampled: detokenising, stop strings, the text deltas
streamed back and the final outcome of each request. The engine core appends the token to
its Sequence; this turns it into a RequestOutput and says whether the request ends there."""

import time
from dataclasses import dataclass

from common.tokenizer import IncrementalDetokenizer, Tokenizer
from engine.base.errors import EngineError
from engine.core.request import RequestOutput, Timings, Usage
from engine.core.sampling_params import SampledToken
from engine.core.sequence import FinishReason, Sequence


@dataclass
class _Stream:
    detokenizer: IncrementalDetokenizer
    text: str = ""  # everything decoded so far, cut at a stop string
    emitted_chars: int = 0  # how much of `text` has been streamed


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._streams: dict[str, _Stream] = {}

    def add(self, request_id: str) -> None:
        self._streams[request_id] = _Stream(IncrementalDetokenizer(self.tokenizer))

    def append(self, seq: Sequence, sampled: SampledToken) -> RequestOutput:
        """The output for `sampled`, the newest of `seq`'s output tokens; a final one (finished)
        when it is an end-of-sequence or stop token, completes a stop string or reaches max_tokens."""
        token = sampled.token_id
        stream = self._streams[seq.request_id]
        params = seq.sampling
        reason, stop_at = None, None
        if (not params.ignore_eos and token in self.tokenizer.eos_token_ids) or token in params.stop_token_ids:
            reason = FinishReason.STOP
        else:
            stream.text += stream.detokenizer.push(token)
            stop_at = _find_stop(stream.text, params.stop, stream.emitted_chars)
            if stop_at is not None:
                stream.text = stream.text[:stop_at]
                reason = FinishReason.STOP
        if reason is None and len(seq.output_token_ids) >= params.max_tokens:
            reason = FinishReason.LENGTH
        if reason is not None and stop_at is None:
            stream.text += stream.detokenizer.finish()  # bytes held back for a character never completed
        logprobs = [sampled] if params.logprobs is not None else []
        if reason is not None:
            final = self.finish(seq, reason)
            final.token_ids, final.logprobs = [token], logprobs
            return final
        # hold back text that could still become the start of a stop string
        holdback = max((len(s) for s in params.stop), default=1) - 1
        safe_end = max(stream.emitted_chars, len(stream.text) - holdback)
        text = stream.text[stream.emitted_chars : safe_end]
        stream.emitted_chars = safe_end
        return RequestOutput(seq.request_id, token_ids=[token], text=text, logprobs=logprobs)

    def finish(self, seq: Sequence, reason: FinishReason, error: EngineError | None = None) -> RequestOutput:
        """The request's last output: the text still held back (when it ended normally), usage and timings."""
        stream = self._streams.pop(seq.request_id)
        now = time.monotonic()
        text = stream.text[stream.emitted_chars :] if reason in (FinishReason.STOP, FinishReason.LENGTH) else ""
        return RequestOutput(
            seq.request_id,
            text=text,
            finish_reason=reason,
            error=error,
            usage=Usage(len(seq.prompt_token_ids), len(seq.output_token_ids), seq.pad_length, seq.num_cached_tokens,
                        seq.host_cached_tokens, seq.disk_cached_tokens),
            timings=Timings(
                queued_s=(seq.first_scheduled_time or now) - seq.arrival_time,
                time_to_first_token_s=(seq.first_token_time or now) - seq.arrival_time,
                total_s=now - seq.arrival_time,
                prefill_slices=seq.prefill_slices,
                preemptions=seq.preemptions,
            ),
        )


def _find_stop(text: str, stops: tuple[str, ...], emitted_chars: int) -> int | None:
    """Index where the earliest stop string starts in the not-yet-emitted tail, if any."""
    hits = [i for s in stops if (i := text.find(s, max(0, emitted_chars - len(s) + 1))) != -1]
    return min(hits) if hits else None
