"""Every running sequence's block table as one row of an array kept across steps.

Rebuilding the tables each step would cost host work in proportion to the total context of
the batch (a 32k-token sequence owns 2,048 blocks). Here a sequence keeps its row while it
runs, and a step writes only the blocks it gained since the last one (vLLM v1's persistent
batch, for the part that grows with context)."""

import numpy as np


class BlockTables:
    def __init__(self, max_rows: int, max_blocks_per_seq: int):
        self.table = np.zeros((max_rows, max_blocks_per_seq), dtype=np.int32)
        self._free_rows = list(range(max_rows - 1, -1, -1))
        self._rows: dict[str, tuple[int, int]] = {}  # request id -> (row, blocks written)

    def row_of(self, request_id: str, block_table: list[int]) -> int:
        """The sequence's row, with every block of `block_table` written into it."""
        row, written = self._rows.get(request_id, (None, 0))
        if row is None:
            row = self._free_rows.pop()
        if len(block_table) > written:
            self.table[row, written : len(block_table)] = block_table[written:]
        self._rows[request_id] = (row, len(block_table))
        return row

    def remove(self, request_id: str) -> None:
        """Give back the row of a sequence that finished or was preempted (its blocks were freed)."""
        entry = self._rows.pop(request_id, None)
        if entry is not None:
            self._free_rows.append(entry[0])
