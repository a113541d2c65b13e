"""What names a stored KV block outside the device: a namespace for everything a tier shares
(the model and a fingerprint of its files, dtype, quantisation, block size, the KV layout) and,
inside it, the block's chained prefix hash (common/prefix_hash.py), which already covers its
tokens, every token before it, the adapter with its version and the tenant's salt.

Two engines with the same namespace compute the same KV for the same key, so a block file
written by one (or by the same engine before a restart) is safe for the other to read."""

import hashlib

FORMAT_VERSION = 1  # bump when the layout of a stored block changes


def tier_namespace(model_fingerprint: str, dtype: str, quant: str | None, block_size: int, kv_shape: tuple[int, ...]) -> int:
    """An 8-byte digest of everything besides the prefix hash that determines a block's KV."""
    text = "\0".join(["k25-kv-tier", str(FORMAT_VERSION), model_fingerprint, dtype, quant or "", str(block_size),
                      "x".join(map(str, kv_shape))])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
