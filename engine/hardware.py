"""Node-type profiles and the check that weights plus the KV cache fit the memory budget."""

from dataclasses import dataclass

from engine.errors import EngineConfigError

GIB = 1 << 30


@dataclass(frozen=True)
class NodeProfile:
    memory_bytes: int | None  # per GPU; None for the CPU (its budget is configured)
    default_max_chunk_per_gpu: int | None  # None: the largest that fits

NODE_PROFILES = {
    "a100-40g": NodeProfile(40 * GIB, 2),
    "a100-80g": NodeProfile(80 * GIB, 4),
    "h100-80g": NodeProfile(80 * GIB, 8),
    "h200": NodeProfile(141 * 10**9, None),
    "cpu": NodeProfile(None, None),
}


def node_profile(node_type: str) -> NodeProfile:
    try:
        return NODE_PROFILES[node_type.lower()]
    except KeyError:
        raise EngineConfigError(f"unknown node type {node_type!r}; known: {', '.join(NODE_PROFILES)}") from None


def largest_max_chunk_per_gpu(budget_bytes: int, weight_bytes: int, reserve_bytes: int, chunk_kv_bytes: int) -> int:
    return max(0, (budget_bytes - weight_bytes - reserve_bytes) // chunk_kv_bytes)


def resolve_max_chunk_per_gpu(
    requested: int | None, node_type: str, budget_bytes: int, weight_bytes: int, reserve_bytes: int, chunk_kv_bytes: int
) -> int:
    """The `max_chunk_per_gpu` to run with; raises if weights plus that much KV do not fit."""
    largest = largest_max_chunk_per_gpu(budget_bytes, weight_bytes, reserve_bytes, chunk_kv_bytes)
    wanted = requested if requested is not None else node_profile(node_type).default_max_chunk_per_gpu
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
