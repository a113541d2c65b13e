"""The CPU kernels are built ahead, one variant per instruction set, and a process loads the one
its CPU runs without compiling anything."""

import os
import pathlib
import subprocess
import sys

import pytest

from engine.kernels.cpu_build import ON_X86, VARIANTS, best_variant, cpu_flags, runnable_variants

AVX2 = {"avx2", "fma", "f16c"}
AVX512_BF16 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}


@pytest.mark.skipif(not ON_X86, reason="the instruction-set variants are x86's; elsewhere one build for the machine")
@pytest.mark.parametrize("flags, variant", [
    (set(), "generic"),
    ({"sse4_2", "avx"}, "generic"),
    (AVX2, "avx2"),
    (AVX2 | {"avx512f", "avx512bw"}, "avx2"),  # AVX-512 without BF16: the AVX2 paths
    (AVX512_BF16, "avx512bf16"),
    (AVX512_BF16 | {"amx_tile"}, "avx512bf16"),  # tiles without bf16 tiles
    (AVX512_BF16 | {"amx_tile", "amx_bf16"}, "amx"),
])
def test_the_variant_is_the_most_capable_one_the_cpu_runs(flags, variant):
    assert best_variant(flags) == variant
    assert runnable_variants(flags)[-1] == variant and runnable_variants(flags)[0] == "generic"


def test_an_engine_starts_with_no_compiler_on_its_path():
    """As in the engine image: PATH holds the virtualenv's Python and k25, no C++ compiler; the kernels load."""
    bin_dir = pathlib.Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CC")} | {"PATH": str(bin_dir)}
    script = ("import logging, shutil; logging.basicConfig(level=logging.INFO); "
              "assert shutil.which('c++') is None and shutil.which('g++') is None; "
              "from engine.kernels.cpu_build import cpu_kernel; assert cpu_kernel() is not None")
    started = subprocess.run([sys.executable, "-c", script], env=env, cwd=pathlib.Path(__file__).parents[3],
                             capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stderr
    assert "not built ahead" not in started.stderr and "torch paths" not in started.stderr
    assert best_variant(cpu_flags()) in VARIANTS
