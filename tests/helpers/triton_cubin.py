"""Compile Triton kernels ahead of time for a GPU architecture, on a machine without one, and
report what each cubin uses: Triton's front end, its NVIDIA back end and the ptxas it ships
(the steps a launch on the GPU would run), then that ptxas's cuobjdump for registers and spills.

Run as a module (`python -m tests.helpers.triton_cubin`), jobs as JSON on stdin, one result per
job as JSON on stdout, in a process of its own: a kernel decorated while TRITON_INTERPRET=1 is
set (as the other Triton tests do) is the interpreter's, which cannot be compiled; for the same
reason the launch shapes are asked of the launchers' meta functions here, not by the caller. A job:
  {"kernel": "module:name", "arch": 90, "meta": "module:function", "meta_args": {"dtype": "bfloat16", ...},
   "constants": {"SEGMENTED": true, ...}, "pointers": {"x_ptr": "bf16", ...}, "floats": ["scale"]}
the meta function returns constexprs and num_warps (a "dtype" argument is named as in torch);
"constants" adds the rest; other arguments are int32. Every pointer is taken as 16-byte aligned,
as torch allocates. Each result also names the constants and num_warps it compiled with."""

import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor


def compile_job(job: dict) -> dict:
    import torch
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel, meta_function = (getattr(importlib.import_module(module), name)
                             for module, name in (job[key].split(":") for key in ("kernel", "meta")))
    meta_args = {key: getattr(torch, value) if key == "dtype" else value for key, value in job["meta_args"].items()}
    constants = {**meta_function(**meta_args), **job["constants"]}
    num_warps = constants.pop("num_warps")
    signature = {
        arg: "constexpr" if arg in constants else "*" + job["pointers"][arg] if arg in job["pointers"]
        else "fp32" if arg in job.get("floats", ()) else "i32"
        for arg in kernel.arg_names
    }
    aligned = {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(kernel.arg_names) if arg in job["pointers"]}
    compiled = triton.compile(ASTSource(kernel, signature, constants, aligned), target=GPUTarget("cuda", job["arch"], 32),
                              options={"num_warps": num_warps})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", cubin.name],
                               capture_output=True, text=True, check=True).stdout
    counts = {key: int(value) for key, value in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", usage)}
    return {"registers": counts["REG"], "spilled_bytes": counts["STACK"] + counts["LOCAL"],
            "shared_bytes": compiled.metadata.shared, "constants": constants, "num_warps": num_warps}


def main() -> None:
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default, stated so that it does not warn
    jobs = json.load(sys.stdin)
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1) or 1) as pool:
        json.dump(list(pool.map(compile_job, jobs)), sys.stdout)


if __name__ == "__main__":
    main()
