#!/usr/bin/env python
"""The fused few-row PHM kernel (hyperplex.layers.triton_phm) against cuBLAS dense and the structured PHM path.

Usage (from the repository root)::

    PYTHONPATH=src python benchmarks/gpu/bench_kernel.py                          # on a GPU: d = k = 4096, bf16
    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/gpu/bench_kernel.py --device cpu --quick   # dry run

Measured first, on the card as found: the copy ceiling (a device-to-device copy of ``--copy-mib`` MiB, bytes read
plus written over the median time) and the dense ceiling (a ``--matmul``-cubed bf16 product, TFLOP/s). Then for
every ``n`` in ``--ns`` and ``rows`` in ``--rows``, three ways of computing ``x Hᵀ`` on a COLD stack of distinct
layers (each stack's weights at least ``--cold-factor`` × the card's L2, so every layer is read from device memory,
as in a model): ``dense`` (``F.linear`` on a ``k × d`` weight: cuBLAS), ``structured``
(:func:`~hyperplex.layers.functional.phm_linear_structured`: PyTorch's products), ``fused`` (the Triton kernel) and
``fused-1k`` (the same kernel finishing a shared-out reduction itself, ``reduction="one-kernel"``: one launch, the
layer's default). Beside them, for the next version's choices: ``fused-1k/p1`` and ``fused-1k/p2`` (the one-kernel
reduction aiming at one and two programs per multiprocessor instead of four: fewer shares of the reduction, more
bytes per program), ``fused-1k/unrolled`` (its last program's loop over the partials unrolled at compile time,
so their loads are issued together rather than one L2 round trip after another), ``fused-atomic`` (each share adds
its partial into one float32 sum with atomic adds, ``reduction="atomic"``: the last program reads one tile instead
of one per share; the same function, its low bits in arrival order), ``fused-atomic/p8`` (the atomic reduction
aiming at eight programs per multiprocessor: more shares, more bytes in flight, a tail that does not grow with
them) and ``copy`` (a device-to-device
copy of each layer's factors: one kernel moving the bytes the fused kernel must read, the floor a one-launch
kernel can reach at that size).
Each layer gets its own input (the inputs rotate with the layers). A time is the median over ``--reps`` runs of the
whole stack after ``--warmup`` runs, divided by the stack's depth; with ``--graph`` (default on CUDA) the stack is
captured once as a CUDA graph and its replays are timed with CUDA events, so that Python's launch cost, which
exceeds a one-row layer's GPU time, stays out. Before timing, every variant's output on the first layer is checked
against a float64 reference (``err``: ‖y − ref‖ / ‖ref‖).

Columns: ``ms/layer``; ``× dense`` (below 1 is faster); ``GB/s`` = the fewest bytes the layer must move (its
weights, input and output, each once) over its time, and ``% copy`` that against the measured copy ceiling; the
issue's targets for the fused kernel at one row, ``≤ 0.55 / 0.30 / 0.18 / 0.12 × dense`` for ``n = 2 / 4 / 8 /
16``, beside its ratio.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from hyperplex.layers import triton_phm
from hyperplex.layers.functional import phm_linear_reference, phm_linear_structured

TARGETS = {2: 0.55, 4: 0.30, 8: 0.18, 16: 0.12}  # fused / dense at one row, d = k = 4096 (the issue)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_ms(fn, device: str, warmup: int, reps: int) -> float:
    """Median wall time of ``fn()`` in ms: CUDA events around each call on a GPU, ``perf_counter`` on the CPU."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def ceilings(device: str, copy_mib: int, matmul: int, warmup: int, reps: int) -> dict:
    """The copy ceiling (GB/s, bytes read + written) and the dense bf16 ceiling (TFLOP/s), measured here."""
    src = torch.randn(copy_mib * 2 ** 20 // 4, device=device)
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src), device, warmup, reps)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a, b = (torch.randn(matmul, matmul, device=device, dtype=dtype),
            torch.randn(matmul, matmul, device=device, dtype=dtype))
    mm_ms = median_ms(lambda: a @ b, device, warmup, reps)
    return {"copy_GBps": 2 * src.numel() * 4 / copy_ms / 1e6, "copy_MiB": copy_mib,
            "dense_TFLOPs": 2 * matmul ** 3 / mm_ms / 1e9, "matmul": matmul, "matmul_dtype": str(dtype)}


def l2_bytes(device: str) -> int:
    if device == "cuda":
        return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 * 2 ** 20))
    return 32 * 2 ** 20  # a CPU's last-level cache, roughly: only the dry run uses this


def stack_depth(layer_bytes: int, cache: int, factor: float, cap: int) -> int:
    return max(2, min(cap, math.ceil(factor * cache / layer_bytes)))


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """‖got − want‖ / ‖want‖ against a float64 reference, on the reference's device."""
    return ((got.to(want.device, torch.float64) - want).norm() / want.norm()).item()


def timed(stack_fn, device: str, args) -> float:
    """ms for one run of the stack: a CUDA graph's replays where asked for (falls back to eager if capture fails)."""
    if device == "cuda" and args.graph:
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    stack_fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            # captured on the warm-up stream: the one-kernel reduction's counters, made for that stream while
            # warming up, are then reused by the graph rather than zeroed inside it
            with torch.cuda.graph(graph, stream=stream):
                stack_fn()
            return median_ms(graph.replay, device, args.warmup, args.reps)
        except RuntimeError as err:
            print(f"  (graph capture failed, timing eagerly: {str(err).splitlines()[0]})", file=sys.stderr)
    return median_ms(stack_fn, device, args.warmup, args.reps)


def bench_point(n: int, rows: int, args, ceiling: dict) -> list[dict]:
    device, dtype = args.device, DTYPES[args.dtype]
    d, k = args.d, args.k
    size = torch.empty((), dtype=dtype).element_size()
    gen = torch.Generator(device=device).manual_seed(n * 1000 + rows)
    cache = l2_bytes(device)
    dense_depth = stack_depth(k * d * size, cache, args.cold_factor, args.max_layers)
    phm_depth = stack_depth(k * d // n * size, cache, args.cold_factor, args.max_layers)
    rnd = lambda *shape, scale=1.0: (torch.randn(*shape, device=device, generator=gen) * scale).to(dtype)  # noqa: E731
    dense_w = [rnd(k, d, scale=d ** -0.5) for _ in range(dense_depth)]
    rules = [torch.randn(n, n, n, device=device, generator=gen).to(dtype) for _ in range(phm_depth)]
    factors = [rnd(n, k // n, d // n, scale=d ** -0.5) for _ in range(phm_depth)]
    xs = [rnd(rows, d) for _ in range(max(dense_depth, phm_depth))]
    outs = [torch.empty(rows, k, device=device, dtype=dtype) for _ in range(phm_depth)]

    def dense():
        for w, x in zip(dense_w, xs):
            F.linear(x, w)

    def structured():
        for r, s, x in zip(rules, factors, xs):
            phm_linear_structured(x, r, s)

    def fused(reduction: str):
        def stack():
            for r, s, x, o in zip(rules, factors, xs, outs):
                triton_phm.triton_phm_linear(x, r, s, out=o, reduction=reduction)
        return stack

    reductions = {"fused": "two-kernel", "fused-1k": "one-kernel", "fused-atomic": "atomic"}
    sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 4
    # programs to aim at (the default: 4 per SM) and the reduction: fewer shares for the one-kernel reduction (a
    # shorter tail), more for the atomic one (whose tail does not grow with them: more bytes in flight)
    shares = {"fused-1k/p1": (sms, "one-kernel"), "fused-1k/p2": (2 * sms, "one-kernel"),
              "fused-atomic/p8": (8 * sms, "atomic")}
    copies = [torch.empty_like(f) for f in factors]

    def copy():
        for f, c in zip(factors, copies):
            c.copy_(f)

    def fused_programs(programs: int | None, reduction: str = "one-kernel", unroll: bool = False):
        def stack():
            for r, s, x, o in zip(rules, factors, xs, outs):
                triton_phm.triton_phm_linear(x, r, s, out=o, programs=programs, reduction=reduction,
                                             _unroll_tail=unroll)
        return stack

    results = []
    with torch.inference_mode():
        # float64 references on the device, one per layer shape (the three PHM variants share theirs): on the CPU
        # a 4096² float64 product formed 9 times per n took most of the step's time budget
        x64 = xs[0].double()
        dense_want = F.linear(x64, dense_w[0].double())
        phm_want = phm_linear_reference(x64, rules[0].double(), factors[0].double())
        errors = {"dense": relative_error(F.linear(xs[0], dense_w[0]), dense_want),
                  "structured": relative_error(phm_linear_structured(xs[0], rules[0], factors[0]), phm_want),
                  **{name: relative_error(triton_phm.triton_phm_linear(xs[0], rules[0], factors[0], reduction=how),
                                          phm_want) for name, how in reductions.items()},
                  **{name: relative_error(triton_phm.triton_phm_linear(xs[0], rules[0], factors[0], programs=count,
                                                                       reduction=how), phm_want)
                     for name, (count, how) in shares.items()},
                  "fused-1k/unrolled": relative_error(triton_phm.triton_phm_linear(xs[0], rules[0], factors[0],
                                                                                   _unroll_tail=True), phm_want),
                  "copy": 0.0 if torch.equal(copies[0].copy_(factors[0]), factors[0]) else math.inf}
        del x64, dense_want, phm_want
        variants = (("dense", dense, dense_depth), ("structured", structured, phm_depth),
                    *((name, fused(how), phm_depth) for name, how in reductions.items()),
                    *((name, fused_programs(count, how), phm_depth) for name, (count, how) in shares.items()),
                    ("fused-1k/unrolled", fused_programs(None, unroll=True), phm_depth),
                    ("copy", copy, phm_depth))
        times = {name: timed(fn, device, args) / depth for name, fn, depth in variants}
    for name, _, depth in variants:
        weight_bytes = k * d * size // (1 if name == "dense" else n)
        moved = weight_bytes + (0 if name == "copy" else rows * (d + k) * size)  # a copy reads its factors only
        gbps = moved / times[name] / 1e6
        results.append({"n": n, "rows": rows, "d": d, "k": k, "dtype": args.dtype, "variant": name, "layers": depth,
                        "ms_per_layer": times[name], "x_dense": times[name] / times["dense"], "GBps": gbps,
                        "copy_fraction": gbps / ceiling["copy_GBps"], "error": errors[name],
                        "target": TARGETS.get(n) if name in reductions and rows == 1 and d == k == 4096
                        else None})
    return results


def table(rows: list[dict], ceiling: dict) -> str:
    lines = [f"copy ceiling {ceiling['copy_GBps']:.0f} GB/s (read + written, {ceiling['copy_MiB']} MiB); dense "
             f"ceiling {ceiling['dense_TFLOPs']:.1f} TFLOP/s ({ceiling['matmul']}³ {ceiling['matmul_dtype']})", "",
             "| n | rows | variant | layers | ms/layer | × dense | target | GB/s | % copy | err |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        target = "" if r["target"] is None else (f"≤ {r['target']:.2f} " + ("met" if r["x_dense"] <= r["target"]
                                                                         else "MISSED"))
        lines.append(f"| {r['n']} | {r['rows']} | {r['variant']} | {r['layers']} | {r['ms_per_layer']:.4f} | "
                     f"{r['x_dense']:.3f} | {target} | {r['GBps']:.0f} | {100 * r['copy_fraction']:.0f} | "
                     f"{r['error']:.1e} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cuda (default where present), or cpu for a dry run under TRITON_INTERPRET=1")
    p.add_argument("--quick", action="store_true", help="d = k = 256, rows 1 8, n 2 4, few runs (a dry run)")
    p.add_argument("--d", type=int, default=None, help="in_features (default 4096; quick 256)")
    p.add_argument("--k", type=int, default=None, help="out_features (default 4096; quick 256)")
    p.add_argument("--ns", type=int, nargs="+", default=None, help="default 2 4 8 16 (quick 2 4)")
    p.add_argument("--rows", type=int, nargs="+", default=None, help="default 1 8 64 (quick 1 8)")
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    p.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 10; quick 1)")
    p.add_argument("--reps", type=int, default=None, help="timed runs; the median is reported (default 50; quick 3)")
    p.add_argument("--cold-factor", type=float, default=3.0, help="each stack's weights ≥ this × L2 (default 3)")
    p.add_argument("--max-layers", type=int, default=256, help="deepest stack (default 256)")
    p.add_argument("--graph", action=argparse.BooleanOptionalAction, default=True,
                   help="time CUDA-graph replays of the stack (default on; CUDA only)")
    p.add_argument("--copy-mib", type=int, default=None, help="copy-ceiling buffer, MiB (default 1024; quick 16)")
    p.add_argument("--matmul", type=int, default=None, help="dense-ceiling product size (default 8192; quick 256)")
    p.add_argument("--json", help="also write the ceilings and every row here")
    args = p.parse_args(argv)
    quick = args.quick
    args.d = args.d or (256 if quick else 4096)
    args.k = args.k or (256 if quick else 4096)
    args.ns = args.ns or ([2, 4] if quick else [2, 4, 8, 16])
    args.rows = args.rows or ([1, 8] if quick else [1, 8, 64])
    args.warmup = args.warmup if args.warmup is not None else (1 if quick else 10)
    args.reps = args.reps if args.reps is not None else (3 if quick else 50)
    if quick:
        args.max_layers = min(args.max_layers, 4)
    copy_mib, matmul = args.copy_mib or (16 if quick else 1024), args.matmul or (256 if quick else 8192)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here (use --device cpu with TRITON_INTERPRET=1 for a dry run)")
    if args.device == "cpu" and not triton_phm.interpreting():
        p.error("--device cpu runs the kernel under Triton's interpreter: set TRITON_INTERPRET=1")
    if not triton_phm.triton_available():
        p.error("Triton is not installed (pip install 'hyperplex[triton]')")
    torch.backends.cuda.matmul.allow_tf32 = False
    ceiling = ceilings(args.device, copy_mib, matmul, args.warmup, max(3, args.reps // 5))
    meta = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu (Triton interpreter)",
            "torch": torch.__version__, "triton": __import__("triton").__version__, "L2_bytes": l2_bytes(args.device),
            "args": vars(args), **ceiling}
    print(f"# bench_kernel: {meta['device']}, torch {meta['torch']}, triton {meta['triton']}, "
          f"L2 {meta['L2_bytes'] / 2 ** 20:.0f} MiB, d={args.d} k={args.k} {args.dtype}, "
          f"{'CUDA graphs' if args.graph and args.device == 'cuda' else 'eager'}", flush=True)
    rows: list[dict] = []

    def write_json(complete: bool) -> None:  # after every point: a step stopped by its time budget keeps its rows
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": {**meta, "complete": complete}, "rows": rows}, f, indent=1)

    for n in args.ns:
        for r in args.rows:
            rows.extend(bench_point(n, r, args, ceiling))
            print(f"  n={n} rows={r}: " + ", ".join(f"{x['variant']} {x['ms_per_layer']:.4f} ms"
                                                   for x in rows if (x["n"], x["rows"]) == (n, r)),
                  flush=True)
            write_json(complete=False)
    print(table(rows, ceiling))
    write_json(complete=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
