"""Block manager and scheduler properties, driven without a model: a step 'computes' the
scheduled tokens and appends one fake output token to every sequence that reached its end."""

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.block_manager import BlockManager
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceStatus
from engine.lora.adapter import AdapterRef, LoadedAdapter


def make_seq(prompt_len: int, max_tokens: int, name: str, adapter: LoadedAdapter | None = None) -> Sequence:
    return Sequence(name, list(range(prompt_len)), SamplingParams(max_tokens=max_tokens), adapter=adapter)


def make_adapter(name: str) -> LoadedAdapter:
    return LoadedAdapter(AdapterRef(name, "v1"), name, "0" * 64, rank=8, modules=("q_proj",))


def check_block_invariants(scheduler: Scheduler) -> None:
    """Every block is free or held, held blocks are counted once per table that holds them,
    and a block two tables hold is a full, computed, cached block of the same prefix (same
    tokens, same adapter, same salt) in both."""
    bm = scheduler.block_manager
    holders: dict[int, list[tuple[Sequence, int]]] = {}
    for seq in scheduler.running + scheduler.waiting:
        for i, block in enumerate(seq.block_table):
            holders.setdefault(block, []).append((seq, i))
    for block in range(bm.num_blocks):
        assert bm.ref_count(block) == len(holders.get(block, [])), f"block {block} freed while held, or leaked"
    assert len(holders) + bm.num_free_blocks == bm.num_blocks, "a block leaked"
    for block, held in holders.items():
        if len(held) > 1:
            assert bm.cached_hash(block) is not None, f"block {block} shared but not cached"
            for seq, i in held:
                assert seq.num_computed_tokens >= (i + 1) * bm.block_size, "a shared block is still being written"
                assert seq.block_hashes[i] == bm.cached_hash(block)
            assert len({(seq.cache_seed, tuple(seq.tokens(0, (i + 1) * bm.block_size))) for seq, i in held}) == 1, \
                "a block shared across adapters, salts or different tokens"
    for seq in scheduler.waiting:
        assert seq.block_table == [] or seq.num_computed_tokens > 0


def run_step(scheduler: Scheduler) -> list[Sequence]:
    """One fake engine step; returns sequences that finished."""
    batch = scheduler.schedule()
    assert batch.num_tokens <= scheduler.max_num_batched_tokens
    assert len(scheduler.running) <= scheduler.max_num_seqs
    seen = [s for s, _ in batch.items]
    assert len(seen) == len(set(map(id, seen))), "a sequence scheduled twice in one step"
    finished = []
    for seq, n in batch.items:
        assert n >= 1
        scheduler.mark_computed(seq, n)
        assert scheduler.block_manager.blocks_for(seq.num_computed_tokens) <= len(seq.block_table)
        if seq.num_computed_tokens == seq.num_tokens:
            seq.output_token_ids.append(7)
            if len(seq.output_token_ids) >= seq.sampling.max_tokens:
                scheduler.finish(seq)
                finished.append(seq)
    check_block_invariants(scheduler)
    return finished


requests = st.lists(
    st.tuples(st.integers(1, 120), st.integers(1, 40), st.integers(0, 6)),  # prompt, max_tokens, arrival step
    min_size=1,
    max_size=14,
)


@settings(max_examples=150, deadline=None)
@given(
    reqs=requests,
    num_blocks=st.integers(10, 40),
    block_size=st.sampled_from([4, 8, 16]),
    budget=st.integers(1, 96),
    max_seqs=st.integers(1, 8),
    aborts=st.lists(st.tuples(st.integers(0, 13), st.integers(0, 60)), max_size=4),
    overtake_limit_s=st.sampled_from([0.0, 1e9]),  # first come first served; fewest tokens left first, never overdue
)
def test_every_request_finishes_and_every_block_comes_back(reqs, num_blocks, block_size, budget, max_seqs, aborts, overtake_limit_s):
    capacity = num_blocks * block_size
    bm = BlockManager(num_blocks, block_size)
    scheduler = Scheduler(bm, budget, max_seqs, overtake_limit_s=overtake_limit_s)
    # every request fits the cache on its own (the engine refuses the others at admission)
    fitting = [(f"r{i}", p, m, a) for i, (p, m, a) in enumerate(reqs) if p + m <= capacity]
    seqs = [make_seq(p, m, name) for name, p, m, _ in fitting]
    arrivals = {name: a for name, _, _, a in fitting}
    abort_at = {f"r{i}": step for i, step in aborts}
    done = set()
    for step in range(5000):
        for s in seqs:
            if arrivals[s.request_id] == step:
                scheduler.add(s)
        for s in seqs:
            if abort_at.get(s.request_id) == step and s.status is not SequenceStatus.FINISHED and arrivals[s.request_id] <= step:
                scheduler.finish(s)
                done.add(s.request_id)
        done |= {s.request_id for s in run_step(scheduler)}
        if len(done) == len(seqs) and step > 6:
            break
    assert done == {s.request_id for s in seqs}, "some request never finished (starvation or deadlock)"
    assert bm.num_free_blocks == num_blocks
    for s in seqs:
        if s.request_id not in abort_at:
            assert len(s.output_token_ids) == s.sampling.max_tokens


def test_decodes_are_scheduled_before_prefill_slices():
    scheduler = Scheduler(BlockManager(64, 16), max_num_batched_tokens=40, max_num_seqs=8)
    first = make_seq(10, 5, "first")
    scheduler.add(first)
    run_step(scheduler)  # first prefills whole and samples
    scheduler.add(make_seq(200, 5, "long"))
    batch = scheduler.schedule()
    assert [(s.request_id, n) for s, n in batch.items] == [("first", 1), ("long", 39)]


def test_preemption_frees_blocks_and_recomputes_later_arrival():
    # 6 blocks of 4 tokens: two sequences of 6 prompt tokens fit, but not both growing to 14
    scheduler = Scheduler(BlockManager(6, 4), max_num_batched_tokens=64, max_num_seqs=4)
    early = make_seq(6, 8, "early")
    late = Sequence("late", list(range(100, 106)), SamplingParams(max_tokens=8))  # shares no block with early
    scheduler.add(early)
    scheduler.add(late)
    preempted = []
    for _ in range(40):
        batch = scheduler.schedule()
        preempted += [s.request_id for s in batch.preempted]
        for seq, n in batch.items:
            scheduler.mark_computed(seq, n)
            if seq.num_computed_tokens == seq.num_tokens:
                seq.output_token_ids.append(1)
                if len(seq.output_token_ids) == 8:
                    scheduler.finish(seq)
        check_block_invariants(scheduler)
        if not scheduler.num_unfinished:
            break
    assert preempted and set(preempted) == {"late"}
    assert late.preemptions >= 1 and len(late.output_token_ids) == 8
    assert scheduler.block_manager.num_free_blocks == 6


def test_block_manager_refuses_to_overcommit():
    bm = BlockManager(2, 4)
    table: list[int] = []
    assert bm.can_grow(table, 8) and not bm.can_grow(table, 9)
    bm.grow(table, 8)
    assert bm.usage == 1.0
    try:
        bm.grow([], 1)
    except RuntimeError as e:
        assert "can_grow" in str(e)
    else:
        raise AssertionError("grow past capacity must raise")
    assert bm.slot(table, 5) == table[1] * 4 + 1
    bm.release(table)
    assert table == [] and bm.num_free_blocks == 2


ADAPTERS = {name: make_adapter(name) for name in "ABCD"}


def admitted(batch) -> list[str]:
    return [s.request_id for s in batch.admitted]


def test_a_third_adapter_waits_while_later_base_requests_run_and_keeps_its_place():
    scheduler = Scheduler(BlockManager(64, 16), max_num_batched_tokens=256, max_num_seqs=8, max_loras=2)
    a, b, c, d = (ADAPTERS[n] for n in "ABCD")
    seqs = {
        name: make_seq(8, 20, name, adapter)
        for name, adapter in [("a1", a), ("b1", b), ("c1", c), ("base1", None), ("d1", d), ("a2", a), ("base2", None)]
    }
    for seq in seqs.values():
        scheduler.add(seq)
    batch = scheduler.schedule()
    assert admitted(batch) == ["a1", "b1", "base1", "a2", "base2"]  # a1's adapter is in the batch already
    assert [s.request_id for s in scheduler.waiting] == ["c1", "d1"]
    assert scheduler.running_adapter_ids() == {a.id, b.id}
    for seq, n in batch.items:
        seq.num_computed_tokens += n
        seq.output_token_ids.append(7)
    assert admitted(scheduler.schedule()) == []  # both slots still taken
    scheduler.finish(seqs["a1"])
    assert admitted(scheduler.schedule()) == []  # a2 still runs on A
    scheduler.finish(seqs["a2"])
    assert admitted(scheduler.schedule()) == ["c1"]  # first come: c1 before d1
    assert [s.request_id for s in scheduler.waiting] == ["d1"]
    scheduler.finish(seqs["b1"])
    assert admitted(scheduler.schedule()) == ["d1"]
    assert scheduler.running_adapter_ids() == {c.id, d.id}


def test_a_request_passed_over_for_a_slot_never_blocks_the_queue_on_kv():
    # 4 blocks of 16: the waiting long adapter request would not fit beside the running one anyway
    scheduler = Scheduler(BlockManager(4, 16), max_num_batched_tokens=256, max_num_seqs=8, max_loras=1)
    running = make_seq(8, 20, "a1", ADAPTERS["A"])
    scheduler.add(running)
    scheduler.schedule()
    scheduler.add(make_seq(60, 4, "b1", ADAPTERS["B"]))
    scheduler.add(make_seq(8, 4, "base"))
    assert admitted(scheduler.schedule()) == ["base"]
    assert [s.request_id for s in scheduler.waiting] == ["b1"]


@settings(max_examples=100, deadline=None)
@given(
    reqs=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 20), st.sampled_from(["", *ADAPTERS])), min_size=1, max_size=12),
    max_loras=st.integers(1, 3),
    num_blocks=st.integers(8, 24),
    budget=st.integers(1, 64),
    max_seqs=st.integers(1, 6),
    overtake_limit_s=st.sampled_from([0.0, 1e9]),
)
def test_no_step_runs_more_adapters_than_slots_and_every_request_finishes(reqs, max_loras, num_blocks, budget, max_seqs, overtake_limit_s):
    scheduler = Scheduler(BlockManager(num_blocks, 8), budget, max_seqs, max_loras, overtake_limit_s)
    seqs = [
        make_seq(p, m, f"r{i}", ADAPTERS.get(name)) for i, (p, m, name) in enumerate(reqs) if p + m <= num_blocks * 8
    ]
    for seq in seqs:
        scheduler.add(seq)
    done = set()
    for _ in range(5000):
        if not scheduler.num_unfinished:
            break
        done |= {s.request_id for s in run_step(scheduler)}
        assert len(scheduler.running_adapter_ids()) <= max_loras
    assert done == {s.request_id for s in seqs}, "a request waited for an adapter slot forever"
