"""The request an engine unhealthy from failed steps runs on its own: gateways send such an
engine nothing, and it would refuse it, so with nothing left to run it steps a one-token
request whose output goes nowhere, at most every `interval_s`; one successful step makes it
healthy again (health.py)."""

from engine.core.contract import EngineBackend
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams

PROBE_REQUEST_PREFIX = "k25-health-probe-"


class HealthProbe:
    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._next_at = 0.0  # monotonic
        self._count = 0

    def next_request(self, engine: EngineBackend, now: float) -> EngineRequest | None:
        """A probe for `engine`, or None while `interval_s` has not passed since the last one
        (`now`: monotonic seconds)."""
        if now < self._next_at:
            return None
        self._next_at = now + self.interval_s
        self._count += 1
        chunk = engine.config.chunk_size
        return EngineRequest(f"{PROBE_REQUEST_PREFIX}{self._count}", [engine.tokenizer.pad_token_id] * chunk,
                             SamplingParams(max_tokens=1), chunk, pad_length=chunk - 1)
