#!/usr/bin/env python
"""Compile the fused PHM kernel for a GPU on a machine without one, and report what the compiler made of it.

    PYTHONPATH=src python benchmarks/gpu/inspect_kernel.py                 # sm_90 (H100 / H200), d = k = 4096
    PYTHONPATH=src python benchmarks/gpu/inspect_kernel.py --arch 80 --ptx /tmp/fused.ptx

For each (dtype, n, rows) the kernel is compiled ahead of time exactly as a launch would specialise it (the same
:func:`~hyperplex.layers.triton_phm.plan`, constexprs and 16-divisibility of pointers and sizes), with the
``ptxas`` that ships in the Triton wheel, and one line is printed: registers per thread, stack (spills), shared
memory, the widest global load (``v4.b32`` = 16 bytes), whether the loads are asynchronous copies (``cp.async``:
software pipelining) and which matrix instructions it uses. No device time is spent: this answers "are the loads
16 bytes wide, are the tensor-core instructions there, did anything spill" before a GPU is lent.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile for real even where the tests use the interpreter

import torch  # noqa: E402

from hyperplex.layers import triton_phm  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def compile_fused(dtype: str, n: int, rows: int, d: int, k: int, arch: int, programs: int, bias: bool = True,
                  reduction: str = "one-kernel", unroll_tail: bool = False):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fused, _ = triton_phm._kernels()
    k_n, d_n = k // n, d // n
    p = triton_phm.plan(rows, n, k_n, d_n, DTYPES[dtype], programs)
    split = p.splits > 1
    ints = {"rows": rows, "k_n": k_n, "d_n": d_n, "stride_x": d, "i_per": p.i_per, "j_chunk": p.j_chunk,
            "j_chunks": p.j_chunks, "splits": p.splits}
    pointers = {"x_ptr": dtype, "w_ptr": dtype, "rule_ptr": dtype, "bias_ptr": dtype, "out_ptr": dtype,
                "ws_ptr": "fp32" if split else dtype, "count_ptr": "i32" if split else dtype}
    constexprs = triton_phm.launch_constexprs(p, n, d_n, DTYPES[dtype], reduction, bias, unroll_tail)
    signature = {**{name: f"*{t}" for name, t in pointers.items()}, **{name: "i32" for name in ints},
                 **dict.fromkeys(constexprs, "constexpr")}
    # what a launch passes: torch's allocations are 16-byte aligned; sizes divisible by 16 are marked so (ints of
    # value 1 are constants at a launch, which this leaves as ordinary ints)
    attrs = {(fused.arg_names.index(name),): [["tt.divisibility", 16]] for name in pointers}
    attrs.update({(fused.arg_names.index(name),): [["tt.divisibility", 16]] for name, v in ints.items() if v % 16 == 0})
    source = ASTSource(fn=fused, signature=signature, constexprs=constexprs, attrs=attrs)
    return p, triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": p.num_warps})


def resource_usage(cubin: bytes) -> str:
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    line = next((line for line in out.splitlines() if "REG:" in line), "")
    found = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line))
    return f"regs {found.get('REG', '?')}, stack {found.get('STACK', '?')}, local {found.get('LOCAL', '?')}"


def summarise_ptx(ptx: str) -> str:
    loads = sorted(set(re.findall(r"ld\.global(?:\.[a-z0-9]+)*", ptx)))
    mma = sorted(set(re.findall(r"(?:wgmma|mma)\.[a-z0-9._]+", ptx)))
    asynchronous = "cp.async" in ptx
    # red: an atomic whose result is unused; the look-behind keeps out e.g. `st.shared.b16`
    atomics = sorted(set(re.findall(r"(?<![\w.])(?:atom|red)\.[a-z0-9._]+", ptx)))
    return (f"loads {', '.join(loads) or 'none'}; cp.async {'yes' if asynchronous else 'no'}; "
            f"{', '.join(mma) or 'no mma'}" + (f"; {', '.join(atomics)}" if atomics else ""))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", type=int, default=90, help="compute capability ×10 (default 90: H100 / H200)")
    p.add_argument("--d", type=int, default=4096)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--ns", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["bf16", "fp32"])
    p.add_argument("--programs", type=int, default=4 * 132, help="programs aimed at (default 4 × 132 SMs)")
    p.add_argument("--reduction", choices=triton_phm.REDUCTIONS, default="one-kernel",
                   help="how shared-out partial sums are finished (default one-kernel)")
    p.add_argument("--unroll-tail", action="store_true",
                   help="the one-kernel reduction's tail unrolled at compile time (bench_kernel's fused-1k/unrolled)")
    p.add_argument("--ptx", help="write the PTX of the first configuration here")
    args = p.parse_args(argv)
    if not triton_phm.triton_available():
        p.error("Triton is not installed (pip install 'hyperplex[triton]')")
    for i, (dtype, n, rows) in enumerate((t, n, r) for t in args.dtypes for n in args.ns for r in args.rows):
        plan, kernel = compile_fused(dtype, n, rows, args.d, args.k, args.arch, args.programs,
                                     reduction=args.reduction, unroll_tail=args.unroll_tail)
        if i == 0 and args.ptx:
            Path(args.ptx).write_text(kernel.asm["ptx"])
        print(f"{dtype} n={n:<2} rows={rows:<2} grid={plan.grid} warps={plan.num_warps} tile={plan.block_m}x"
              f"{plan.block_q}x{plan.block_j}: {resource_usage(kernel.asm['cubin'])}; "
              f"{summarise_ptx(kernel.asm['ptx'])}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
