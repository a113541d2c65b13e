"""The engine's compiled constraints: one compile per distinct constraint, kept in a bounded
LRU cache; a constraint that does not compile is refused with INVALID_ARGUMENT and not kept."""

import pytest

from common.tokenizer import load_tokenizer
from engine.base.errors import EngineError, ErrorCode
from engine.core.sampling_params import Constraint
from engine.structured.grammar_cache import GrammarCache


@pytest.fixture(scope="module")
def cache_of():
    tokenizer = load_tokenizer("smollm2-135m")
    caches = []

    def make(size):
        caches.append(GrammarCache(tokenizer, size))
        return caches[-1]

    yield make
    for cache in caches:
        cache.close()


def test_one_compile_per_constraint_within_the_bound(cache_of):
    cache = cache_of(2)
    a, b, c = Constraint("regex", "a+"), Constraint("regex", "b+"), Constraint("json_schema", '{"type": "integer"}')
    first = cache.start(a)
    assert cache.start(a) is first and cache.compiles == 1
    matcher = first.result()
    assert matcher.consume_tokens(cache.ll_tokenizer.tokenize_str("aaa")) and matcher.is_accepting()
    cache.start(b), cache.start(c)  # a is the least recently used: evicted
    assert cache.start(c).result() is not None and cache.compiles == 3
    cache.start(a)
    assert cache.compiles == 4


def test_a_constraint_that_does_not_compile(cache_of):
    cache = cache_of(4)
    bad = Constraint("lark", "start: nothing_defined")
    with pytest.raises(EngineError) as refused:
        cache.start(bad).result()
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT and "does not compile" in refused.value.message
    cache.forget_failed(bad)
    cache.start(bad)
    assert cache.compiles == 2
