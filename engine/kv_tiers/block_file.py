"""One KV block on disk: a fixed header, then the block's bytes.

The header holds a magic, the tier namespace and the block's key (engine/core/tier_key.py), the
payload's length and a blake2b digest of it. A reader checks all of them: a file from another
model, a truncated or flipped file, reads as BlockFileError and is dropped, never served.
A writer writes a temporary file and renames it, so a crash leaves no half-written block."""

import hashlib
import os
import struct

MAGIC = b"K25KVBLK"
_HEADER = struct.Struct("<8sQQQ16s")  # magic, namespace, key, payload bytes, digest
SUFFIX = ".kv"


class BlockFileError(Exception):
    """The file cannot be read back as the block asked for."""


def block_file_name(key: int) -> str:
    return f"{key:016x}{SUFFIX}"


def _digest(payload: bytes | memoryview) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


def write_block_file(path: str, namespace: int, key: int, payload: bytes | memoryview) -> None:
    """Write atomically (temporary file, then rename); raises OSError (disk full, read-only path)."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(_HEADER.pack(MAGIC, namespace, key, len(payload), _digest(payload)))
            f.write(payload)
        os.replace(tmp, path)
    except OSError:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_block_file(path: str, namespace: int, key: int, nbytes: int) -> bytes:
    """The payload, checked against the header; BlockFileError on any mismatch or I/O error."""
    try:
        with open(path, "rb") as f:
            data = f.read(_HEADER.size + nbytes + 1)
    except OSError as exc:
        raise BlockFileError(f"{path}: {exc}") from None
    if len(data) != _HEADER.size + nbytes:
        raise BlockFileError(f"{path}: {len(data)} bytes, expected {_HEADER.size + nbytes}")
    magic, file_namespace, file_key, length, digest = _HEADER.unpack_from(data)
    if (magic, file_namespace, file_key, length) != (MAGIC, namespace, key, nbytes):
        raise BlockFileError(f"{path}: header names another block")
    payload = data[_HEADER.size :]
    if _digest(payload) != digest:
        raise BlockFileError(f"{path}: checksum mismatch")
    return payload
