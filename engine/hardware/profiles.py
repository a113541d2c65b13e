"""Node-type profiles and the check that weights plus the KV cache fit the memory budget."""

from engine.base.errors import EngineConfigError

GIB = 1 << 30


# max_chunk_per_gpu of each GPU node type; None: the largest that fits the device's memory budget
DEFAULT_MAX_CHUNK_PER_GPU: dict[str, int | None] = {
    "a100-40g": 2,
    "a100-80g": 4,
    "h100-80g": 8,
    "h200": None,
    "cpu": None,
}


def default_max_chunk_per_gpu(node_type: str) -> int | None:
    try:
        return DEFAULT_MAX_CHUNK_PER_GPU[node_type.lower()]
    except KeyError:
        known = ", ".join(DEFAULT_MAX_CHUNK_PER_GPU)
        raise EngineConfigError(f"unknown node type {node_type!r}; known: {known}") from None


def largest_max_chunk_per_gpu(budget_bytes: int, weight_bytes: int, reserve_bytes: int, chunk_kv_bytes: int) -> int:
    return max(0, (budget_bytes - weight_bytes - reserve_bytes) // chunk_kv_bytes)


def resolve_max_chunk_per_gpu(
    requested: int | None, node_type: str, budget_bytes: int, weight_bytes: int, reserve_bytes: int, chunk_kv_bytes: int
) -> int:
    """The `max_chunk_per_gpu` to run with; raises if weights plus that much KV do not fit."""
    largest = largest_max_chunk_per_gpu(budget_bytes, weight_bytes, reserve_bytes, chunk_kv_bytes)
    wanted = requested if requested is not None else default_max_chunk_per_gpu(node_type)
    if wanted is None:
        wanted = largest
    if wanted < 1 or wanted > largest:
        need = weight_bytes + reserve_bytes + max(wanted, 1) * chunk_kv_bytes
        raise EngineConfigError(
            f"max_chunk_per_gpu={wanted} does not fit: weights {weight_bytes / GIB:.2f} GiB + activations "
            f"{reserve_bytes / GIB:.2f} GiB + KV {max(wanted, 1) * chunk_kv_bytes / GIB:.2f} GiB = {need / GIB:.2f} GiB "
            f"> budget {budget_bytes / GIB:.2f} GiB; the largest max_chunk_per_gpu that fits is {largest}"
        )
    return wanted
