"""The gateway's prefix index: what it answers after engines announce, evict, restart and
leave; its bound; and, for random histories, the same answers as a plain dict of sets."""

from hypothesis import given, settings
from hypothesis import strategies as st

from proto import k25_pb2
from services.gateway.prefix_index import PrefixIndex


def event(engine: str, stored=(), removed=(), cleared=False, incarnation="i1") -> k25_pb2.KVEvents:
    return k25_pb2.KVEvents(engine_id=engine, incarnation=incarnation, stored=stored, removed=removed, cleared=cleared)


def sweep_all(index: PrefixIndex) -> None:
    while not index.sweep():
        pass


def test_matched_blocks_counts_each_engines_run_from_the_start():
    index = PrefixIndex(100)
    index.apply(event("a", stored=[1, 2, 3]))
    index.apply(event("b", stored=[1, 2]))
    index.apply(event("c", stored=[2, 3]))  # not the first block: holds no prefix of it
    assert index.matched_blocks([1, 2, 3, 4]) == {"a": 3, "b": 2}
    assert index.matched_blocks([9, 1]) == {}
    index.apply(event("a", removed=[2]))
    assert index.matched_blocks([1, 2, 3]) == {"a": 1, "b": 2}


def test_a_restart_or_cleared_forgets_the_engine_at_once():
    index = PrefixIndex(100)
    index.apply(event("a", stored=[1, 2]))
    index.apply(event("b", stored=[1]))
    index.apply(event("a", stored=[7], incarnation="i2"))  # restarted: its old blocks are gone
    assert index.matched_blocks([1, 2]) == {"b": 1} and index.matched_blocks([7]) == {"a": 1}
    index.apply(event("b", cleared=True))
    assert index.matched_blocks([1, 2]) == {}


def test_retain_drops_engines_that_left_or_restarted_and_the_sweep_frees_their_bits():
    index = PrefixIndex(100, sweep_slice=2)
    index.apply(event("a", stored=[1, 2, 3, 4, 5]))
    index.record("b", "i1", [1, 2])
    index.retain({"b": "i1"})  # a left
    assert index.matched_blocks([1, 2, 3]) == {"b": 2}  # before any sweep
    assert index.engines == {"b"}
    sweep_all(index)
    assert len(index) == 2  # a's blocks that only it held are gone
    index.apply(event("c", stored=[3]))  # takes a's old bit, which must not bring a's blocks back
    assert index.matched_blocks([1, 2, 3]) == {"b": 2} and index.matched_blocks([3]) == {"c": 1}
    index.retain({"b": "i2", "c": "i1"})  # b restarted: the registry shows a new incarnation
    assert index.matched_blocks([1]) == {}


def test_the_least_recently_used_blocks_go_first_and_the_bound_holds():
    index = PrefixIndex(3)
    index.apply(event("a", stored=[1, 2, 3]))
    index.matched_blocks([1])  # 1 is used again: 2 is now the oldest
    index.apply(event("a", stored=[4]))
    assert len(index) == 3 and index.evicted == 1
    assert index.matched_blocks([1]) == {"a": 1} and index.matched_blocks([2]) == {}


def test_a_bound_below_one_block_is_refused():
    try:
        PrefixIndex(0)
    except ValueError as exc:
        assert "at least one block" in str(exc)
    else:
        raise AssertionError("PrefixIndex(0) must be refused")


operations = st.lists(st.one_of(
    st.tuples(st.just("store"), st.sampled_from("abc"), st.lists(st.integers(0, 6), max_size=4)),
    st.tuples(st.just("remove"), st.sampled_from("abc"), st.lists(st.integers(0, 6), max_size=4)),
    st.tuples(st.just("clear"), st.sampled_from("abc"), st.just([])),
    st.tuples(st.just("leave"), st.sampled_from("abc"), st.just([])),
    st.tuples(st.just("sweep"), st.just(""), st.just([])),
), max_size=30)


@settings(max_examples=200, deadline=None)
@given(ops=operations, probe=st.lists(st.integers(0, 6), min_size=1, max_size=5))
def test_answers_match_a_plain_dict_of_sets(ops, probe):
    """With room for every block, the index answers as {engine: set of hashes} would."""
    index = PrefixIndex(1000, sweep_slice=3)
    held: dict[str, set[int]] = {}
    for op, engine, hashes in ops:
        if op == "store":
            index.apply(event(engine, stored=hashes))
            held.setdefault(engine, set()).update(hashes)
        elif op == "remove":
            index.apply(event(engine, removed=hashes))
            held.setdefault(engine, set()).difference_update(hashes)
        elif op == "clear":
            index.apply(event(engine, cleared=True))
            held[engine] = set()
        elif op == "leave":
            index.retain({e: "i1" for e in held if e != engine})
            held.pop(engine, None)
        else:
            index.sweep()
    expected = {}
    for engine, blocks in held.items():
        run = 0
        while run < len(probe) and probe[run] in blocks:
            run += 1
        if run:
            expected[engine] = run
    assert index.matched_blocks(probe) == expected
