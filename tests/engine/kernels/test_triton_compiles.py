"""Every Triton kernel compiles for the GPUs the chart deploys to (A100: sm_80; H100 and H200:
sm_90) at the shapes its launcher picks, down to a cubin by Triton's own ptxas, with no GPU
here: with its tiles in registers, not spilled to local memory, and within one block's shared
memory. The other Triton tests run the kernels under the interpreter, which checks what they
compute, not whether the GPU compiler takes them or how they fit (the interpreter accepts a
tl.dot under 16 rows, a float32 tile too big for the register file, ...).

Each shape comes from the launcher's own meta function (the same dict the launch passes),
called in the compiling subprocess (tests/helpers/triton_cubin.py says why); strides of 1 are
constants, as Triton specialises them at launch."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

# ptxas may park a few values on the stack at the register cap (8 to 40 bytes a thread, seen in
# the sweep that chose the launch shapes); a tile that does not fit the registers spills hundreds
# to thousands (the float32 LoRA expand at rank 64 with 64 output features a program: 2,368 on sm_80)
SPILL_ALLOWANCE = 64
# the most shared memory one block may use (CUDA C++ Programming Guide, "Features and Technical
# Specifications" per compute capability): 163 KB on sm_80, 227 KB on sm_90
SHARED_LIMIT = {80: 163 * 1024, 90: 227 * 1024}
TYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
LORA_INDICES = {"rows_ptr": "i32", "block_slot_ptr": "i32", "block_start_ptr": "i32", "block_rows_ptr": "i32"}


def attention_jobs(arch):
    jobs = []
    for dtype, head_dim in [(d, h) for d in ("float32", "bfloat16") for h in (64, 128, 256)] + [("float16", 128)]:
        for decodes_only in (True, False):
            for segmented in (True, False):
                data, part = TYPE[dtype], "fp32" if segmented else TYPE[dtype]
                jobs.append({
                    "kernel": "engine.attention.triton_kernel:_paged_attention_kernel", "arch": arch,
                    "meta": "engine.attention.triton_kernel:launch_meta",
                    "meta_args": {"dtype": dtype, "head_dim": head_dim, "group": 3, "block_size": 16, "decodes_only": decodes_only},
                    "constants": {"SEGMENTED": segmented, "stride_qd": 1, "stride_od": 1, "stride_kd": 1, "stride_vd": 1},
                    "pointers": {"out_ptr": data, "q_ptr": data, "k_ptr": data, "v_ptr": data, "part_ptr": part,
                                 "part_max_ptr": part, "part_sum_ptr": part, "block_tables_ptr": "i32",
                                 "query_start_ptr": "i32", "seq_lens_ptr": "i32"},
                    "floats": ["qk_scale"],
                })
    return jobs


def lora_jobs(arch):
    jobs = []
    for dtype in ("float32", "bfloat16"):
        for rank in (8, 64, 128):
            data = TYPE[dtype]
            jobs.append({"kernel": "engine.lora.kernels:_shrink_kernel", "arch": arch, "meta": "engine.lora.kernels:shrink_meta",
                         "meta_args": {"dtype": dtype, "rank": rank}, "constants": {},
                         "pointers": {"x_ptr": data, "a_ptr": data, "s_ptr": "fp32", **LORA_INDICES}})
            jobs.append({"kernel": "engine.lora.kernels:_expand_kernel", "arch": arch, "meta": "engine.lora.kernels:expand_meta",
                         "meta_args": {"rank": rank}, "constants": {},
                         "pointers": {"s_ptr": "fp32", "b_ptr": data, "y_ptr": data, "offsets_ptr": "i32", **LORA_INDICES}})
    return jobs


def dequant_jobs(arch):
    jobs = []
    for dtype in ("float32", "bfloat16"):
        for bits, group, codes in ((8, 576, "i8"), (4, 64, "u8")):
            data = TYPE[dtype]
            jobs.append({"kernel": "engine.quant.triton_matmul:_dequant_matmul_kernel", "arch": arch,
                         "meta": "engine.quant.triton_matmul:dequant_meta",
                         "meta_args": {"dtype": dtype, "bits": bits, "group": group}, "constants": {},
                         "pointers": {"x_ptr": data, "q_ptr": codes, "scale_ptr": data, "zero_ptr": data, "y_ptr": data}})
    return jobs


@pytest.fixture(scope="module")
def compiled():
    """(job, what its cubin uses) for every job on both architectures, compiled in one subprocess."""
    jobs = [job for arch in SHARED_LIMIT for make in (attention_jobs, lora_jobs, dequant_jobs) for job in make(arch)]
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "tests.helpers.triton_cubin"], input=json.dumps(jobs), env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return list(zip(jobs, json.loads(done.stdout)))


def name(job, usage):
    return f"{job['kernel']} sm_{job['arch']} {job['pointers']} {usage['num_warps']} warps {usage['constants']}"


def test_every_kernel_keeps_its_tiles_in_registers(compiled):
    spilled = [f"{name(job, usage)}: {usage['spilled_bytes']} bytes spilled, {usage['registers']} registers"
               for job, usage in compiled if usage["spilled_bytes"] > SPILL_ALLOWANCE]
    assert not spilled, "\n".join(spilled)


def test_every_kernel_fits_one_blocks_shared_memory(compiled):
    over = [f"{name(job, usage)}: {usage['shared_bytes']} bytes" for job, usage in compiled
            if usage["shared_bytes"] > SHARED_LIMIT[job["arch"]]]
    assert not over, "\n".join(over)


def test_the_kernels_compiled_for_both_architectures(compiled):
    """The two checks above saw every kernel on both (and registers, so cuobjdump was read)."""
    seen = {(job["kernel"].split(":")[1], job["arch"]) for job, usage in compiled if usage["registers"] > 0}
    kernels = {"_paged_attention_kernel", "_shrink_kernel", "_expand_kernel", "_dequant_matmul_kernel"}
    assert seen == {(kernel, arch) for kernel in kernels for arch in SHARED_LIMIT}
