"""The benchmark commands run end to end (on a tiny workload) and print what they promise."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # runs the engine and transformers in a subprocess


def test_bench_engine_json_has_the_promised_figures():
    result = subprocess.run(
        [sys.executable, "-m", "k25.cli", "bench", "engine", "--model", "tiny-random", "--requests", "4",
         "--prompt-tokens", "8", "40", "--max-tokens", "4", "12", "--reference-batch-sizes", "1", "4", "--decode-context", "40", "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    for key in ("engine_tokens_per_s", "reference_tokens_per_s", "ratio", "roofline_fraction", "decode_step_seconds",
                "memory_bandwidth_bytes_per_s", "decode_step_over_bandwidth_limit"):
        assert figures[key] > 0
    assert figures["decode_context_tokens"] == 40 and figures["decode_bytes_read"] > 0
    assert set(figures["reference_tokens_per_s_by_mode"]) == {"one-at-a-time", "static-batch-4"}
    assert figures["ratio"] == figures["engine_tokens_per_s"] / figures["reference_tokens_per_s"]
    assert figures["requests"] == 4 and 4 * 4 <= figures["generated_tokens"] <= 4 * 12
