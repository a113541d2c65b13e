"""The per-row token masks of one step: every constrained row's matcher says which tokens
keep its answer inside its grammar (the end-of-answer token only where the grammar accepts);
free rows allow everything. The masks are filled in parallel by llguidance into one int32
bitmask on the host, moved to the device once, and applied to the whole batch's logits,
outside any captured graph: words of 32 blocked tokens (most of a grammar's mask) as blocks,
and only the words that mix allowed and blocked tokens unpacked; free rows' words allow
everything and are left alone. After sampling, each matcher consumes its row's token."""

from concurrent.futures import Future

import llguidance
import llguidance.numpy
import torch

from engine.base.errors import EngineError, ErrorCode
from engine.core.sampling_params import Constraint
from engine.structured.grammar_cache import GrammarCache

# byte -> which of its 8 tokens it blocks (bit b of a word is token 32 * word + b; the words are
# read as bytes in little-endian order, the order of every CPU and GPU the engine runs on)
_BLOCKED_BY_BYTE = torch.tensor([[not (byte >> bit) & 1 for bit in range(8)] for byte in range(256)])


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

    def mask_logits(self, logits: torch.Tensor, rows: list[tuple[llguidance.LLMatcher, int]]) -> None:
        """Mask `logits` [R, vocab] in place: row i keeps only the tokens its matcher allows."""
        bitmask = llguidance.numpy.allocate_token_bitmask(logits.shape[0], self.vocab_size)
        llguidance.numpy.fill_next_token_bitmask_par(self._executor, rows, bitmask)
        apply_token_bitmask(logits, torch.from_numpy(bitmask).to(logits.device, non_blocking=True))

    def consume(self, matcher: llguidance.LLMatcher, token_id: int) -> EngineError | None:
        if matcher.consume_token(token_id):
            return None
        return EngineError(ErrorCode.INTERNAL, f"constrained decoding failed: {matcher.get_error()}")



def apply_token_bitmask(logits: torch.Tensor, words: torch.Tensor) -> None:
    """Set logits[r, t] to -inf where bit t of row r's bitmask (int32 words, 32 tokens each,
    llguidance's layout) is 0; the words cover at least the logits' width."""
    width = logits.shape[1]
    whole = width // 32
    blocks = logits[:, : whole * 32].unflatten(1, (whole, 32))
    head = words[:, :whole]
    blocks[head == 0] = float("-inf")
    mixed = ((head != 0) & (head != -1)).nonzero(as_tuple=True)
    if mixed[0].numel():
        blocks[mixed] = blocks[mixed].masked_fill(_blocked(head[mixed]), float("-inf"))
    if width > whole * 32:  # a vocabulary that is not a multiple of 32: its last, partial word
        logits[:, whole * 32:].masked_fill_(_blocked(words[:, whole])[:, : width - whole * 32], float("-inf"))


def _blocked(words: torch.Tensor) -> torch.Tensor:
    """[N] int32 words -> [N, 32] bool, True where a token is blocked."""
    table = _BLOCKED_BY_BYTE.to(words.device)
    return table[words.contiguous().view(torch.uint8).long()].view(words.shape[0], 32)
