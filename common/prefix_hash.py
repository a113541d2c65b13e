"""The chained hash of full KV blocks: the engine caches blocks by it, the gateway routes by it.

Block i's hash covers its own tokens and, through its parent (block i-1's hash), every token
before it, so equal hashes mean equal prefixes. The chain starts from a seed that holds
everything else that changes a block's KV: the adapter (name@version; empty for the base
model) and an optional salt (the tenant, when tenants must not share cached prompts). Only
full blocks are hashed; a partly filled block is never shared.

blake2b over the token ids as little-endian uint32, 8 bytes of digest: stable across
processes and machines (Python's hash() is salted per process), and a collision between
two different prefixes is a 2^-64 event per pair."""

import hashlib
from collections.abc import Sequence

import numpy as np

_DIGEST_BYTES = 8


def cache_seed(adapter: str = "", salt: str = "") -> int:
    """The hash a chain starts from: what besides the tokens makes two blocks' KV differ."""
    return _digest(f"k25-prefix-v1\0{adapter}\0{salt}".encode())


def chain_block_hashes(token_ids: Sequence[int], block_size: int, parent: int) -> list[int]:
    """Hashes of the full blocks of `token_ids`, chained on from `parent` (the seed for a
    prompt's first block, else the hash of the block before the first one here)."""
    tokens = np.asarray(token_ids, dtype="<u4")
    hashes = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = _digest(parent.to_bytes(_DIGEST_BYTES, "little") + tokens[start : start + block_size].tobytes())
        hashes.append(parent)
    return hashes


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=_DIGEST_BYTES).digest(), "little")
