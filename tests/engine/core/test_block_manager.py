"""The block manager's prefix cache by hand: what is found, what is evicted first, what counts
as used, and the events the engine publishes."""

from common.prefix_hash import cache_seed, chain_block_hashes
from engine.core.block_manager import BlockManager


def cached_table(bm: BlockManager, tokens: list[int], seed: int = cache_seed()) -> tuple[list[int], list[int]]:
    """Blocks holding `tokens` (computed and offered to the cache), and their hashes."""
    table: list[int] = []
    hashes = chain_block_hashes(tokens, bm.block_size, seed)
    reuse = bm.cached_prefix(hashes)
    bm.grow(table, len(tokens), reuse=reuse)
    bm.cache_full_blocks(table, hashes, len(reuse))
    return table, hashes


def test_a_released_prefix_is_found_again_and_counts_as_free():
    bm = BlockManager(8, 4)
    table, hashes = cached_table(bm, list(range(10)))  # 2 full blocks and a partial one
    assert len(table) == 3 and bm.num_cached_blocks == 2
    blocks = list(table)
    bm.release(table)
    assert bm.usage == 0.0 and bm.num_free_blocks == 8
    assert bm.cached_prefix(hashes) == blocks[:2]
    assert bm.cached_prefix(chain_block_hashes(list(range(10)), 4, cache_seed("lora@v1"))) == []
    assert bm.cached_prefix(chain_block_hashes([99] + list(range(1, 10)), 4, cache_seed())) == []


def test_shared_blocks_are_held_until_every_holder_releases_them():
    bm = BlockManager(8, 4)
    first, hashes = cached_table(bm, list(range(8)))
    second, _ = cached_table(bm, list(range(8)) + [50, 51])
    assert second[:2] == first and bm.ref_count(first[0]) == 2
    assert bm.usage == 3 / 8  # two shared blocks and second's own third block
    bm.release(first)
    assert bm.ref_count(second[0]) == 1 and bm.usage == 3 / 8
    bm.release(second)
    assert bm.usage == 0.0 and bm.cached_prefix(hashes) != []


def test_uncached_free_blocks_go_first_then_the_least_recently_released():
    bm = BlockManager(4, 4)
    old, old_hashes = cached_table(bm, [1, 2, 3, 4])
    new, new_hashes = cached_table(bm, [5, 6, 7, 8])
    bm.release(old)
    bm.release(new)
    taken: list[int] = []
    bm.grow(taken, 8)  # the two never-cached blocks
    assert bm.stats.evicted_blocks == 0 and bm.num_cached_blocks == 2
    bm.grow(taken, 12)  # one more: the least recently released cached block goes
    assert bm.stats.evicted_blocks == 1
    assert bm.cached_prefix(old_hashes) == [] and bm.cached_prefix(new_hashes) != []


def test_reusing_free_cached_blocks_counts_against_what_is_left():
    bm = BlockManager(3, 4)
    table, hashes = cached_table(bm, list(range(8)))
    bm.release(table)
    reuse = bm.cached_prefix(hashes)
    # 3 free blocks, 2 of them the cached ones to reuse: room for one new block, not two
    assert bm.can_grow([], 12, reuse=reuse) and not bm.can_grow([], 16, reuse=reuse)
    assert not bm.can_grow([], 12, keep_free=1, reuse=reuse)


def test_a_hash_already_cached_keeps_its_first_block():
    bm = BlockManager(4, 4)
    hashes = chain_block_hashes([1, 2, 3, 4], 4, cache_seed())
    a: list[int] = []
    b: list[int] = []
    bm.grow(a, 4)
    bm.grow(b, 4)  # computed twice at once, before either was cached
    bm.cache_full_blocks(a, hashes, 0)
    bm.cache_full_blocks(b, hashes, 0)
    assert bm.cached_prefix(hashes) == a and bm.cached_hash(b[0]) is None


def test_events_list_what_was_cached_and_evicted_once_enabled():
    bm = BlockManager(2, 4)
    cached_table(bm, [1, 2, 3, 4])  # held to the end: its block is never free
    assert bm.take_events() == ([], [])  # nobody takes them yet: none kept
    bm.events_enabled = True
    table, hashes = cached_table(bm, [5, 6, 7, 8])
    assert bm.take_events() == (hashes, [])
    bm.release(table)
    new, new_hashes = cached_table(bm, [9, 9, 9, 9])  # the one free block: the cached [5, 6, 7, 8] goes
    assert bm.take_events() == (new_hashes, hashes)


def test_caching_off_finds_and_keeps_nothing():
    bm = BlockManager(4, 4, prefix_caching=False)
    table, hashes = cached_table(bm, list(range(8)))
    bm.release(table)
    assert bm.num_cached_blocks == 0 and bm.cached_prefix(hashes) == []
