"""What an engine pod asks of its node beyond its GPUs: CPU and memory (spec.resources; absent:
DEFAULT_RESOURCES, so that no engine pod is BestEffort, the first to be evicted when a node runs
short of memory), a priority class, and a spread of the pool's pods over nodes (one node's
failure takes as few of a pool's engines as the scheduler can manage)."""

import math
import re

RESOURCE_NAMES = ("cpu", "memory", "ephemeral-storage")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
# enough for the engine process and a small model's weights in host memory while they load; a
# pool serving a larger model sets its own. K25's engine adds its KV host tier on top (default_resources).
DEFAULT_RESOURCES = {"requests": {"cpu": "1", "memory": "4Gi"}}
DEFAULT_MEMORY_GIB = 4
GPU = "nvidia.com/gpu"
HOSTNAME_KEY = "kubernetes.io/hostname"


def default_resources(host_tier_gib: float) -> dict[str, dict[str, str]]:
    """What a pool that sets no resources asks for: DEFAULT_RESOURCES, plus the host memory its KV
    host tier may fill (the tier's pages are touched as blocks arrive, so a request without them
    lets a node overcommit and evict the pod mid-request)."""
    memory = DEFAULT_MEMORY_GIB + math.ceil(host_tier_gib)
    return {"requests": {**DEFAULT_RESOURCES["requests"], "memory": f"{memory}Gi"}}


def parse_resources(value, host_tier_gib: float = 0) -> dict[str, dict[str, str]]:
    """spec.resources as the container takes it; ValueError says what is wrong (the caller names
    the field). GPUs are not among them: gpusPerReplica says those. Absent: default_resources."""
    if value is None:
        return default_resources(host_tier_gib)
    if not isinstance(value, dict) or set(value) - {"requests", "limits"}:
        raise ValueError("takes requests and limits only")
    parsed = {}
    for part, amounts in value.items():
        if not isinstance(amounts, dict):
            raise ValueError(f"{part} must map resource names to quantities")
        for name, quantity in amounts.items():
            if name not in RESOURCE_NAMES:
                raise ValueError(f"{part}.{name}: takes {', '.join(RESOURCE_NAMES)} (GPUs come from gpusPerReplica)")
            if isinstance(quantity, bool) or not QUANTITY.match(str(quantity)):
                raise ValueError(f"{part}.{name}: {quantity!r} is not a quantity such as 2, 500m or 8Gi")
        parsed[part] = {name: str(quantity) for name, quantity in amounts.items()}
    return parsed


def container_resources(resources: dict[str, dict[str, str]], gpus: int) -> dict:
    """The container's resources: the pool's, with its GPUs as a limit (Kubernetes takes a GPU
    request equal to its limit)."""
    merged = {part: dict(amounts) for part, amounts in resources.items()}
    if gpus:
        merged.setdefault("limits", {})[GPU] = str(gpus)
    return merged


def spread_over_nodes(selector: dict[str, str]) -> list[dict]:
    """Prefer putting the pool's pods on different nodes; never leave one pending for it."""
    return [{"maxSkew": 1, "topologyKey": HOSTNAME_KEY, "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": dict(selector)}}]
