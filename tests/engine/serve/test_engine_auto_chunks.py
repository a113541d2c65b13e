"""`k25 engine --max-chunk-per-gpu auto` end to end: the engine started by its command line
registers the max_chunk_per_gpu that engine/hardware/chunk_choice.py's rule gives, and logs why."""

import pytest

from tests.helpers.engine_process import start_engine
from tests.helpers.redis_server import redis_server  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow  # starts a real engine process


def test_an_engine_started_with_auto_registers_the_value_the_rule_gives(redis_server, tmp_path):  # noqa: F811
    engine = start_engine(redis_server, str(tmp_path / "engine.log"), "--model", "tiny-random", "--chunk-size", "64",
                          "--max-chunk-per-gpu", "auto", "--expected-chunks-per-request", "3", "--max-num-seqs", "8")
    try:
        entry = engine.registry_entry()
        # 8 sequences of 3 chunks at once, far less than what fits in the CPU budget
        assert (entry["max_chunk_per_gpu"], entry["capacity_tokens"]) == (24, 24 * 64)
        assert "max_chunk_per_gpu 24 (auto: 8 requests of 3 chunks at once" in engine.log()
    finally:
        engine.stop()
