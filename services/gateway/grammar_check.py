"""Whether a constraint compiles, checked in the gateway with the engine's own compiler
(llguidance, which needs no torch), so that a request the engine would fail on is refused
with a 400 before it is routed. Checks run off the event loop, bounded in time; a constraint
checked once is remembered (bounded)."""

import asyncio
import functools
import threading
from collections import OrderedDict

import llguidance

from common.constraint_grammar import compile_error, grammar_of, ll_tokenizer_of
from common.tokenizer import Tokenizer
from proto import k25_pb2

# how long a constraint may take to compile before the request is refused
COMPILE_TIMEOUT_S = 1.0
# constraints remembered as compiling (their texts are the keys)
CHECKED_CACHE_SIZE = 512


class GrammarChecker:
    def __init__(self, tokenizer: Tokenizer, timeout_s: float = COMPILE_TIMEOUT_S):
        self.tokenizer = tokenizer
        self.timeout_s = timeout_s
        self._checked: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    @functools.cached_property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        return ll_tokenizer_of(self.tokenizer)

    async def check(self, constraint: k25_pb2.Constraint) -> str | None:
        """Why the constraint cannot be used (its compile error, or the time bound passed), or None."""
        key = constraint.SerializeToString(deterministic=True)
        with self._lock:
            if key in self._checked:
                self._checked.move_to_end(key)
                return None
        # the tokenizer's table is built once, outside the bound: it is not the constraint's cost
        await asyncio.to_thread(getattr, self, "ll_tokenizer")
        try:
            error = await asyncio.wait_for(asyncio.to_thread(self._compile, constraint), self.timeout_s)
        except TimeoutError:
            return f"it did not compile within {self.timeout_s:g} s; simplify it"
        if error is None:
            with self._lock:
                self._checked[key] = None
                while len(self._checked) > CHECKED_CACHE_SIZE:
                    self._checked.popitem(last=False)
        return error

    def _compile(self, constraint: k25_pb2.Constraint) -> str | None:
        kind = constraint.WhichOneof("kind")
        if kind is None:
            return "the constraint is empty"
        try:
            grammar = grammar_of(kind, getattr(constraint, kind))
        except ValueError as exc:
            return str(exc)
        return compile_error(grammar, self.ll_tokenizer)

