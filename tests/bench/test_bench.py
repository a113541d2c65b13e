"""The benchmark commands run end to end (on a tiny workload) and print what they promise."""

import json
import subprocess
import sys

import pytest

from bench.engine_bench import reference_dtype
from engine.kernels.cpu_build import cpu_flags

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
    # transformers in its own best dtype here, never in an emulated one
    assert figures["reference_dtype"] == reference_dtype(cpu_flags())


@pytest.mark.parametrize("flags, expected", [
    ({"avx2", "avx512f", "avx512_bf16"}, "bfloat16"), ({"avx2", "amx_bf16", "amx_tile"}, "bfloat16"),
    ({"avx2", "fma"}, "float32"),  # torch would emulate bf16: several times slower than its own fp32
    (set(), "float32"),
])
def test_transformers_runs_in_its_best_dtype_for_the_cpu(flags, expected):
    assert reference_dtype(flags) == expected
