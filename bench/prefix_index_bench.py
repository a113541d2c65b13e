"""`k25 bench prefix-index`: the gateway's cache-aware routing index filled with distinct
block hashes as engines announce them, its memory (tracemalloc, the index alone) and the
time of a lookup, of an engine's announcement and of forgetting an engine."""

import random
import statistics
import time
import tracemalloc
from dataclasses import asdict, dataclass

from proto import k25_pb2
from services.gateway.prefix_index import PrefixIndex

EVENT_HASHES = 1000  # hashes per announcement: what an engine gathers in its 50 ms
PROMPT_BLOCKS = 256  # a 4,096-token prompt in blocks of 16


@dataclass
class PrefixIndexResult:
    announced_blocks: int  # distinct hashes the engines announced
    max_blocks: int  # the index's bound
    engines: int
    held_blocks: int  # entries in the index at the end
    evicted_blocks: int
    memory_bytes: int  # allocated by the index, as tracemalloc counts it
    bytes_per_block: float
    apply_us_per_hash: float  # announcing, per hash
    lookup_us: float  # median over lookups of a PROMPT_BLOCKS-block prompt that is held
    forget_ms: float  # an engine leaves: the lookup-visible part (the sweep runs after it)
    sweep_ms: float  # the sweep that then clears its bit, all slices together

    def as_dict(self) -> dict:
        return asdict(self)


def bench_prefix_index(blocks: int, max_blocks: int, engines: int, seed: int = 0) -> PrefixIndexResult:
    rng = random.Random(seed)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = PrefixIndex(max_blocks)
    held: list[int] = []
    apply_s = 0.0
    for start in range(0, blocks, EVENT_HASHES):
        hashes = [rng.getrandbits(64) for _ in range(min(EVENT_HASHES, blocks - start))]
        event = k25_pb2.KVEvents(engine_id=f"engine-{start // EVENT_HASHES % engines}", incarnation="1", stored=hashes)
        t = time.perf_counter()
        index.apply(event)
        apply_s += time.perf_counter() - t
        held = hashes
    memory = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    prompt = held[-PROMPT_BLOCKS:]
    lookups = []
    for _ in range(50):
        t = time.perf_counter()
        index.matched_blocks(prompt)
        lookups.append(time.perf_counter() - t)
    t = time.perf_counter()
    index.retain({f"engine-{e}": "1" for e in range(1, engines)})
    forget_s = time.perf_counter() - t
    t = time.perf_counter()
    while not index.sweep():
        pass
    sweep_s = time.perf_counter() - t
    held_blocks = min(blocks, max_blocks)
    return PrefixIndexResult(
        announced_blocks=blocks, max_blocks=max_blocks, engines=engines, held_blocks=held_blocks,
        evicted_blocks=index.evicted, memory_bytes=memory, bytes_per_block=memory / held_blocks,
        apply_us_per_hash=apply_s / blocks * 1e6, lookup_us=statistics.median(lookups) * 1e6,
        forget_ms=forget_s * 1e3, sweep_ms=sweep_s * 1e3,
    )
