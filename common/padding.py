"""Padding prompts to a pool's chunk_size (the gateway does this; engines check it)."""


def pad_to_chunk_size(token_ids: list[int], chunk_size: int, pad_token_id: int) -> tuple[list[int], int]:
    """Right-pad `token_ids` to the next multiple of `chunk_size`; returns (padded ids, pad length)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if not token_ids:
        raise ValueError("cannot pad an empty prompt")
    pad_length = -len(token_ids) % chunk_size
    return list(token_ids) + [pad_token_id] * pad_length, pad_length
