"""The gateway's prefix index: what it answers after engines announce, evict, move blocks between
tiers, restart and leave; its bound; and, for random histories, the same answers as a plain dict
of each engine's blocks and their tiers."""

from hypothesis import given, settings
from hypothesis import strategies as st

from proto import k25_pb2
from services.gateway.held_prefix import HeldRun
from services.gateway.prefix_index import PrefixIndex


def event(engine: str, stored=(), removed=(), cleared=False, incarnation="i1", host=(), disk=()) -> k25_pb2.KVEvents:
    return k25_pb2.KVEvents(engine_id=engine, incarnation=incarnation, stored=stored, removed=removed, cleared=cleared,
                            host=host, disk=disk)


def runs(index: PrefixIndex, hashes: list[int]) -> dict[str, int]:
    """Each engine's run from the start, whatever the tiers."""
    return {engine: run.blocks for engine, run in index.matched_blocks(hashes).items()}


def sweep_all(index: PrefixIndex) -> None:
    while not index.sweep():
        pass


def test_matched_blocks_counts_each_engines_run_from_the_start():
    index = PrefixIndex(100)
    index.apply(event("a", stored=[1, 2, 3]))
    index.apply(event("b", stored=[1, 2]))
    index.apply(event("c", stored=[2, 3]))  # not the first block: holds no prefix of it
    assert runs(index, [1, 2, 3, 4]) == {"a": 3, "b": 2}
    assert runs(index, [9, 1]) == {}
    index.apply(event("a", removed=[2]))
    assert runs(index, [1, 2, 3]) == {"a": 1, "b": 2}


def test_blocks_moved_below_the_device_are_counted_by_tier_and_dropped_when_gone():
    index = PrefixIndex(100)
    index.apply(event("a", stored=[1, 2, 3, 4]))
    index.apply(event("a", removed=[3, 4], host=[3], disk=[4]))  # evicted from the device, kept below
    index.apply(event("b", stored=[1, 2]))
    assert index.matched_blocks([1, 2, 3, 4, 5]) == {"a": HeldRun(2, 1, 1), "b": HeldRun(2, 0, 0)}
    index.apply(event("a", stored=[3]))  # brought back to the device
    assert index.matched_blocks([1, 2, 3, 4]) == {"a": HeldRun(3, 0, 1), "b": HeldRun(2, 0, 0)}
    index.apply(event("a", removed=[1], disk=[1]))  # from the device to disk only
    index.apply(event("a", removed=[4]))  # dropped from every tier
    assert index.matched_blocks([1, 2, 3, 4]) == {"a": HeldRun(2, 0, 1), "b": HeldRun(2, 0, 0)}
    index.apply(event("b", removed=[1, 2]))
    assert len(index) == 3 and index.matched_blocks([1]) == {"a": HeldRun(0, 0, 1)}


def test_an_engine_that_names_no_tiers_reads_as_before():
    """An engine announcing stored and removed only (the vLLM backend, an older engine): what it
    removes is gone; and a reader that knows no tiers sees tiered events' stored and removed."""
    index = PrefixIndex(100)
    index.apply(event("a", stored=[1, 2]))
    index.apply(event("a", removed=[2]))
    assert index.matched_blocks([1, 2]) == {"a": HeldRun(1, 0, 0)}
    tiered = event("a", removed=[1], host=[1]).SerializeToString()
    assert list(k25_pb2.KVEvents.FromString(tiered).removed) == [1]


def test_a_restart_or_cleared_forgets_the_engine_at_once():
    index = PrefixIndex(100)
    index.apply(event("a", stored=[1, 2]))
    index.apply(event("b", stored=[1]))
    index.apply(event("a", stored=[7], incarnation="i2"))  # restarted: its old blocks are gone
    assert runs(index, [1, 2]) == {"b": 1} and runs(index, [7]) == {"a": 1}
    index.apply(event("b", cleared=True))
    assert runs(index, [1, 2]) == {}


def test_retain_drops_engines_that_left_or_restarted_and_the_sweep_frees_their_bits():
    index = PrefixIndex(100, sweep_slice=2)
    index.apply(event("a", stored=[1, 2, 3]))
    index.apply(event("a", host=[4], disk=[5]))
    index.record("b", "i1", [1, 2])
    index.retain({"b": "i1"})  # a left
    assert runs(index, [1, 2, 3]) == {"b": 2}  # before any sweep
    assert index.engines == {"b"}
    sweep_all(index)
    assert len(index) == 2  # a's blocks that only it held are gone
    index.apply(event("c", stored=[3]))  # takes a's old bits, which must not bring a's blocks back
    assert runs(index, [1, 2, 3]) == {"b": 2} and runs(index, [3]) == {"c": 1} and runs(index, [4]) == runs(index, [5]) == {}
    index.retain({"b": "i2", "c": "i1"})  # b restarted: the registry shows a new incarnation
    assert runs(index, [1]) == {}


def test_the_least_recently_used_blocks_go_first_and_the_bound_holds():
    index = PrefixIndex(3)
    index.apply(event("a", stored=[1, 2, 3]))
    index.matched_blocks([1])  # 1 is used again: 2 is now the oldest
    index.apply(event("a", stored=[4]))
    assert len(index) == 3 and index.evicted == 1
    assert runs(index, [1]) == {"a": 1} and runs(index, [2]) == {}


def test_a_bound_below_one_block_is_refused():
    try:
        PrefixIndex(0)
    except ValueError as exc:
        assert "at least one block" in str(exc)
    else:
        raise AssertionError("PrefixIndex(0) must be refused")


TIERS = {"store": "device", "host": "host", "disk": "disk"}
operations = st.lists(st.one_of(
    st.tuples(st.sampled_from(["store", "host", "disk", "remove"]), st.sampled_from("abc"),
              st.lists(st.integers(0, 6), max_size=4)),
    st.tuples(st.just("clear"), st.sampled_from("abc"), st.just([])),
    st.tuples(st.just("leave"), st.sampled_from("abc"), st.just([])),
    st.tuples(st.just("sweep"), st.just(""), st.just([])),
), max_size=30)


@settings(max_examples=300, deadline=None)
@given(ops=operations, probe=st.lists(st.integers(0, 6), min_size=1, max_size=5))
def test_answers_match_a_plain_dict_of_tiers(ops, probe):
    """With room for every block, the index answers as {engine: {hash: tier}} would. Hashes are
    announced as an engine does: a block moved below its device is in removed and in host or disk."""
    index = PrefixIndex(1000, sweep_slice=3)
    held: dict[str, dict[int, str]] = {}
    for op, engine, hashes in ops:
        if op == "store":
            index.apply(event(engine, stored=hashes))
        elif op in ("host", "disk"):
            index.apply(event(engine, removed=hashes, **{op: hashes}))
        elif op == "remove":
            index.apply(event(engine, removed=hashes))
        elif op == "clear":
            index.apply(event(engine, cleared=True))
            held[engine] = {}
        elif op == "leave":
            index.retain({e: "i1" for e in held if e != engine})
            held.pop(engine, None)
        else:
            index.sweep()
        if op in TIERS:
            held.setdefault(engine, {}).update(dict.fromkeys(hashes, TIERS[op]))
        elif op == "remove":
            for h in hashes:
                held.setdefault(engine, {}).pop(h, None)
    expected = {}
    for engine, tiers in held.items():
        run = []
        while len(run) < len(probe) and probe[len(run)] in tiers:
            run.append(tiers[probe[len(run)]])
        if run:
            expected[engine] = HeldRun(run.count("device"), run.count("host"), run.count("disk"))
    assert index.matched_blocks(probe) == expected
