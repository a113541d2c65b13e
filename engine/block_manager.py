"""Paged KV-cache bookkeeping: which fixed-size blocks each sequence owns.

Pure Python, no tensors: a block table is a list of block ids, block `i` of a table
holds the KV of token positions [i * block_size, (i + 1) * block_size)."""

from collections import deque


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token, got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._owned: set[int] = set()

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1."""
        return len(self._owned) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_grow(self, block_table: list[int], num_tokens: int, keep_free: int = 0) -> bool:
        """Whether `block_table` can cover `num_tokens` and still leave `keep_free` blocks free."""
        return self.blocks_for(num_tokens) - len(block_table) <= len(self._free) - keep_free

    def grow(self, block_table: list[int], num_tokens: int) -> None:
        """Extend `block_table` in place so that it covers `num_tokens` positions."""
        missing = self.blocks_for(num_tokens) - len(block_table)
        if missing > len(self._free):
            raise RuntimeError(f"asked for {missing} blocks with {len(self._free)} free; call can_grow first")
        for _ in range(missing):
            block = self._free.popleft()
            self._owned.add(block)
            block_table.append(block)

    def release(self, block_table: list[int]) -> None:
        """Return every block of `block_table` to the free list and empty it."""
        for block in block_table:
            self._owned.remove(block)
            self._free.append(block)
        block_table.clear()

    def slot(self, block_table: list[int], position: int) -> int:
        """Row of the flat KV tensor that holds `position` of this sequence."""
        return block_table[position // self.block_size] * self.block_size + position % self.block_size
