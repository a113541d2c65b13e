"""A cheap identity of a model's files on disk: what caches derived from a checkpoint are keyed by."""

import hashlib
import os


def model_fingerprint(source: str) -> str:
    """The model's path, size and a digest of its first and last MiB: a changed checkpoint is
    another namespace, at a cost that does not grow with the checkpoint."""
    files = [source] if os.path.isfile(source) else (
        sorted(os.path.join(source, n) for n in os.listdir(source)) if os.path.isdir(source) else [])
    digest = hashlib.blake2b(source.encode(), digest_size=16)
    for path in files:
        if not os.path.isfile(path):
            continue
        size = os.path.getsize(path)
        digest.update(f"{os.path.basename(path)}:{size}".encode())
        with open(path, "rb") as f:
            digest.update(f.read(1 << 20))
            f.seek(max(0, size - (1 << 20)))
            digest.update(f.read(1 << 20))
    return digest.hexdigest()
