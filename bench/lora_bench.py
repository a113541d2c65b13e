"""How long an adapter takes from local disk to ready: read, hash, parse, cache, slot write;
and to the first token of a request that uses it."""

import statistics
import time
from dataclasses import dataclass

from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.lora.adapter import AdapterRef
from engine.offline import make_request


@dataclass
class LoadTimes:
    load_s: list[float]  # load_adapter until it returns: the adapter is in a device slot
    first_token_s: list[float]  # load_adapter, then one request until its first token

    def summary(self) -> str:
        return (
            f"load to ready: median {statistics.median(self.load_s) * 1e3:.1f} ms "
            f"(min {min(self.load_s) * 1e3:.1f}, max {max(self.load_s) * 1e3:.1f}); "
            f"load to first token of a {PROMPT_TOKENS}-token prompt: median {statistics.median(self.first_token_s) * 1e3:.1f} ms"
        )


PROMPT_TOKENS = 16


def adapter_load_times(engine: LLMEngine, path: str, repeats: int = 5) -> LoadTimes:
    """Load `path` (under the engine's adapter root) `repeats` times under fresh versions, unloading
    each before the next; the engine must be idle and have a free slot."""
    times = LoadTimes([], [])
    for i in range(repeats):
        for measure_first_token in (False, True):
            version = f"bench-{i}-{int(measure_first_token)}"
            start = time.perf_counter()
            engine.load_adapter("bench", version, path)
            loaded = time.perf_counter()
            if measure_first_token:
                request = make_request(engine, list(range(1, PROMPT_TOKENS + 1)), SamplingParams(max_tokens=1))
                request.adapter = AdapterRef("bench", version)
                engine.add_request(request)
                while engine.has_unfinished():
                    engine.step()
                times.first_token_s.append(time.perf_counter() - start)
            else:
                times.load_s.append(loaded - start)
            engine.unload_adapter("bench", version)
    return times
