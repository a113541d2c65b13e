"""Building the tiers an engine's settings ask for, at start: the host pool sized to the
setting, capped at half the host memory available now (within the container's memory limit,
since the pool's pages are touched only as blocks arrive: a pool past the limit would be an
OOM kill mid-request); the disk tier if a path is given.

A disk path that cannot be used is a start error (EngineConfigError), never a failure
mid-request; a host tier that cannot get its memory is logged and the engine runs without it."""

import logging
import os
import time

from engine.attention.kv_cache import KVCache
from engine.base.config import EngineConfig
from engine.base.errors import EngineConfigError
from engine.core.tier_key import tier_namespace
from engine.core.tier_policy import ScoreWeights
from engine.kv_tiers.block_copy import block_shape
from engine.kv_tiers.disk_tier import DiskTier, DiskTierError
from engine.kv_tiers.store import TierStore
from engine.model.fingerprint import model_fingerprint

log = logging.getLogger(__name__)
GIB = 1 << 30
HOST_SHARE_CAP = 0.5  # of the host memory available at start


CGROUP_ROOT = "/sys/fs/cgroup"
# (limit, usage) files of cgroup v2, then v1, under CGROUP_ROOT
CGROUP_MEMORY_FILES = (("memory.max", "memory.current"), ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"))
UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a number near 2**63


def cgroup_headroom_bytes(root: str = CGROUP_ROOT) -> int | None:
    """What this process's memory cgroup (a container's limit) still allows, or None without a limit.
    A pod's limit is not in /proc/meminfo, which shows the node's memory."""
    for limit_file, usage_file in CGROUP_MEMORY_FILES:
        try:
            with open(os.path.join(root, limit_file)) as f:
                limit = f.read().strip()
            with open(os.path.join(root, usage_file)) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= UNLIMITED:
            return None
        return max(0, int(limit) - usage)
    return None


def available_host_bytes(cgroup_root: str = CGROUP_ROOT) -> int:
    """Host memory this engine may still take: the node's available memory, within its container's limit."""
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    if available is None:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    headroom = cgroup_headroom_bytes(cgroup_root)
    return available if headroom is None else min(available, headroom)


def build_tier_store(config: EngineConfig, model_source: str, model_config_text: str, kv: KVCache,
                     max_model_len: int) -> TierStore | None:
    """The store the settings ask for, or None (tiers off: no host tier and no disk path)."""
    if not config.prefix_caching or (config.kv_host_tier_gib <= 0 and not config.kv_disk_tier_path):
        return None
    weights = ScoreWeights(config.kv_tier_recency_weight, config.kv_tier_decay_per_s)
    shape = block_shape(kv, config.block_size)
    block_bytes = kv.k[0].dtype.itemsize
    for n in shape:
        block_bytes *= n
    host_bytes = min(int(config.kv_host_tier_gib * GIB), int(available_host_bytes() * HOST_SHARE_CAP))
    host_blocks = host_bytes // block_bytes
    disk = None
    if config.kv_disk_tier_path:
        # disk reads land in host memory: room for at least one longest prompt
        host_blocks = max(host_blocks, -(-max_model_len // config.block_size))
        namespace = tier_namespace(model_fingerprint(model_source) + model_config_text, config.dtype, config.quant,
                                   config.block_size, shape)
        try:
            disk = DiskTier(config.kv_disk_tier_path, namespace, block_bytes,
                            int(config.kv_disk_tier_gib * GIB) // block_bytes, weights, time.time())
        except DiskTierError as exc:
            raise EngineConfigError(f"--kv-disk-tier-path: {exc}") from None
        log.info("KV disk tier %s: %d blocks of %d bytes, %d found from before", disk.dir, disk.index.capacity,
                 block_bytes, disk.stats.found_at_start)
    try:
        store = TierStore(kv, config.block_size, host_blocks, weights, disk)
    except RuntimeError as exc:  # pinned or plain host memory not to be had
        log.warning("KV host tier of %d blocks not created (%s); running with the device tier only", host_blocks, exc)
        if disk is not None:
            disk.close()
        return None
    log.info("KV host tier: %d blocks (%.2f GiB)", host_blocks, host_blocks * block_bytes / GIB)
    return store
