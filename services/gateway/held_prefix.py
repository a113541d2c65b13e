"""What an engine holding part of a prompt is worth to routing. Pure functions.

An engine may hold a prompt's leading blocks on its device, in host memory or on local disk
(engine/kv_tiers/, announced by its KV events). A block on the device costs nothing to use; one
in a tier below is copied back first, which costs a share of what computing it would. A block's
weight is the share of its prefill that holding it saves: 1 on the device, less below. The
defaults are measured (`python -m bench.kv_tier_copy_cost`, docs/benchmarks/index.md "KV tiers:
what a block brought back costs"): on an AMD EPYC engine (SmolLM2-135M, bf16, 16-token blocks)
a block came back from host memory in 1.2 ms and from disk in 4.8 ms, against 47 ms to compute
it: weights 0.974 and 0.899. Not measured on a GPU, where prefill is far faster against a copy."""

from typing import NamedTuple

# share of a block's prefill saved when the engine holds it in host memory / on local disk
HOST_TIER_WEIGHT = 0.97
DISK_TIER_WEIGHT = 0.9


class HeldRun(NamedTuple):
    """The blocks from a prompt's start one engine holds, by the highest tier holding each."""

    device: int = 0
    host: int = 0
    disk: int = 0

    @property
    def blocks(self) -> int:
        return self.device + self.host + self.disk


class TierWeights(NamedTuple):
    host: float = HOST_TIER_WEIGHT
    disk: float = DISK_TIER_WEIGHT


MEASURED_WEIGHTS = TierWeights()


def held_share(run: HeldRun, block_size: int, prompt_tokens: int) -> float:
    """The share of the prompt the engine holds in any tier: what it should report cached."""
    return min(1.0, run.blocks * block_size / prompt_tokens) if prompt_tokens > 0 else 0.0


def saved_share(run: HeldRun, block_size: int, prompt_tokens: int, weights: TierWeights = MEASURED_WEIGHTS) -> float:
    """The share of the prompt's prefill the engine saves by holding `run`: device blocks count
    whole, those below by their tier's weight (0..1)."""
    if prompt_tokens <= 0:
        return 0.0
    saved_blocks = run.device + weights.host * run.host + weights.disk * run.disk
    return min(1.0, saved_blocks * block_size / prompt_tokens)
