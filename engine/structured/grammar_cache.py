"""Constraints compiled once, off the step loop: a compile runs on a worker thread
(llguidance drops the GIL while it builds a grammar) and its result, a matcher in its start
state, is kept in a bounded LRU cache keyed by the constraint; each request gets a copy.
Identical constraints that arrive together share one compile."""

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance

from common.constraint_grammar import grammar_of, ll_tokenizer_of
from common.tokenizer import Tokenizer
from engine.base.errors import EngineError, ErrorCode
from engine.core.sampling_params import Constraint

# compiled constraints kept (a matcher in its start state each)
CACHE_SIZE = 256


class GrammarCache:
    def __init__(self, tokenizer: Tokenizer, size: int = CACHE_SIZE):
        self.ll_tokenizer = ll_tokenizer_of(tokenizer)
        self.size = size
        self._compiled: OrderedDict[Constraint, Future] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="k25-grammar")
        self.compiles = 0  # how many constraints were compiled (cache misses)

    def start(self, constraint: Constraint) -> Future:
        """A future of the constraint's start-state matcher, compiled now or found in the cache."""
        with self._lock:
            future = self._compiled.get(constraint)
            if future is not None:
                self._compiled.move_to_end(constraint)
                return future
            future = self._pool.submit(self._compile, constraint)
            self.compiles += 1
            self._compiled[constraint] = future
            while len(self._compiled) > self.size:
                self._compiled.popitem(last=False)
            return future

    def _compile(self, constraint: Constraint) -> llguidance.LLMatcher:
        try:
            grammar = grammar_of(constraint.kind, constraint.text)
        except ValueError as exc:
            raise EngineError(ErrorCode.INVALID_ARGUMENT, f"the constraint does not compile: {exc}") from None
        matcher = llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise EngineError(ErrorCode.INVALID_ARGUMENT, f"the constraint does not compile: {matcher.get_error()}")
        return matcher

    def forget_failed(self, constraint: Constraint) -> None:
        """A compile that failed is not kept: the next request with it is refused afresh."""
        with self._lock:
            future = self._compiled.get(constraint)
            if future is not None and future.done() and future.exception() is not None:
                del self._compiled[constraint]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
