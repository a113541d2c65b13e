"""The per-row token masks of one step: every constrained row's matcher says which tokens
keep its answer inside its grammar (the end-of-answer token only where the grammar accepts);
free rows allow everything. The masks are filled in parallel by llguidance into one int32
bitmask on the host, moved to the device once, and applied to the whole batch's logits in
one vectorised masked fill, outside any captured graph. After sampling, each matcher
consumes its row's token."""

from concurrent.futures import Future

import llguidance
import llguidance.numpy
import torch

from engine.base.errors import EngineError, ErrorCode
from engine.core.sampling_params import Constraint
from engine.structured.grammar_cache import GrammarCache

_BIT_SHIFTS = torch.arange(32, dtype=torch.int32)


class ConstrainedRequests:
    """Each constrained request's matcher, from its compile to its end."""

    def __init__(self, cache: GrammarCache, vocab_size: int, threads: int = 2):
        self.cache = cache
        self.vocab_size = vocab_size  # the logits' width
        self._pending: dict[str, tuple[Constraint, Future]] = {}
        self._matchers: dict[str, llguidance.LLMatcher] = {}
        self._executor = llguidance.LLExecutor(threads)

    def add(self, request_id: str, constraint: Constraint) -> None:
        self._pending[request_id] = (constraint, self.cache.start(constraint))

    def drop(self, request_id: str) -> None:
        self._pending.pop(request_id, None)
        self._matchers.pop(request_id, None)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._pending or request_id in self._matchers

    def matcher(self, request_id: str) -> llguidance.LLMatcher:
        """The request's matcher; waits for its compile if it has not finished. Raises
        EngineError when the constraint does not compile."""
        if request_id not in self._matchers:
            constraint, future = self._pending.pop(request_id)
            try:
                self._matchers[request_id] = future.result().deep_copy()
            except EngineError:
                self.cache.forget_failed(constraint)
                raise
        return self._matchers[request_id]

    def mask_logits(self, logits: torch.Tensor, rows: list[tuple[int, llguidance.LLMatcher]]) -> None:
        """Mask `logits` [R, vocab] in place: row i keeps only the tokens its matcher allows."""
        bitmask = llguidance.numpy.allocate_token_bitmask(logits.shape[0], self.vocab_size)
        llguidance.numpy.fill_next_token_bitmask_par(self._executor, rows, bitmask)
        words = torch.from_numpy(bitmask).to(logits.device, non_blocking=True)
        allowed = ((words.unsqueeze(-1) >> _BIT_SHIFTS.to(logits.device)) & 1).bool().flatten(1)
        width = min(allowed.shape[1], logits.shape[1])
        logits[:, :width].masked_fill_(~allowed[:, :width], float("-inf"))
        if logits.shape[1] > width:
            logits[[row for row, _ in rows], width:] = float("-inf")

    def consume(self, matcher: llguidance.LLMatcher, token_id: int) -> EngineError | None:
        if matcher.consume_token(token_id):
            return None
        return EngineError(ErrorCode.INTERNAL, f"constrained decoding failed: {matcher.get_error()}")

