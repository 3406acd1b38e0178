#!/usr/bin/env python
"""The compiled streamed kernel against what ``auto`` does without it, on layers of any shape. Cold-stack times × dense.

``bench_phm.py`` times square layers (``d = k``); this script times ``PHMLinear`` layers of the shapes given with
``--shapes D:K`` (narrowing ones included, where the rule's mixing, ``n²·d`` multiply-adds a row, is a larger
share of the product's ``k·d``), each as a stack of distinct layers holding twice the last-level cache
(``--llc-mib``), so that no weights are served from it. For each shape, ``n`` and row count it prints, × the time
of a stack of ``nn.Linear(D, K)`` run in the same round:

- ``auto``: ``forward_mode="auto"`` with the kernel off — what a user gets without it (its path is printed);
- ``streamed``: ``forward_mode="streamed"`` — the kernel of :mod:`hyperplex.layers.native`;
- ``qualifies``: whether ``auto`` with the kernel on takes it at that point (:data:`STREAMED_ROW_LIMIT`,
  :data:`STREAMED_MIN_FACTORS`).

Each figure is the median over ``--rounds`` interleaved rounds (``benchmarks/harness.py``, the order rotating) of the
time per pass over ``--repeats`` passes through the stack.
Usage (from the repository root; builds the kernel first, about a minute the first time)::

    PYTHONPATH=src python benchmarks/probes/bench_streamed_shapes.py
    PYTHONPATH=src python benchmarks/probes/bench_streamed_shapes.py --shapes 4096:1024 3072:768 --ns 8 16 --rows 1 4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from hyperplex.layers import PHMLinear, native

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the harness, run as a script or loaded by path
import harness  # noqa: E402


def _pass(layers, x):
    """One pass of ``x (rows, D)`` through the stack."""
    return lambda: [layer(x) for layer in layers]


def _shape(text: str) -> tuple[int, int]:
    try:
        d, k = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected D:K, e.g. 4096:1024") from None
    if d <= 0 or k <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: both sizes must be positive")
    return d, k


def main(argv=None) -> list[dict]:
    """Run the grid, print its table and return its rows (one dict per shape, n and row count)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", type=_shape, nargs="+", default=[(4096, 1024), (3072, 768), (1024, 4096)],
                   help="layer shapes D:K (in:out) (default: 4096:1024 3072:768 1024:4096)")
    p.add_argument("--ns", type=int, nargs="+", default=[4, 8, 16], help="numbers of Kronecker terms")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4], help="rows of the input")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per point (median)")
    p.add_argument("--repeats", type=int, default=9, help="passes through the stack per round (median)")
    p.add_argument("--llc-mib", type=float, default=32.0, help="last-level cache to overflow, MiB (default 32)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    args = p.parse_args(argv)
    for name in ("rounds", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.llc_mib <= 0:
        p.error("--llc-mib must be positive")
    for d, k in args.shapes:
        for n in args.ns:
            if d % n or k % n:
                p.error(f"--shapes {d}:{k} with --ns {n}: both sizes must be multiples of n")
    if args.threads:
        torch.set_num_threads(args.threads)
    native.enable_native_kernels()  # built once here, so that the timings below do not include the build
    torch.manual_seed(0)
    llc = args.llc_mib * 2 ** 20
    results = []
    print(f"threads {torch.get_num_threads()}; × the nn.Linear stack's time in the same round")
    print("| D→K | n | rows | layers | dense ms | auto (path) | streamed | qualifies |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for d, k in args.shapes:
        dense = [torch.nn.Linear(d, k).eval() for _ in range(max(2, int(2 * llc / (4 * d * k)) + 1))]
        for n in args.ns:
            count = max(2, int(2 * llc * n / (4 * d * k)) + 1)
            layers = [PHMLinear(d, k, n).eval() for _ in range(count)]
            for rows in args.rows:
                x = torch.randn(rows, d)
                with torch.inference_mode():
                    native.enable_native_kernels()
                    qualifies = layers[0].choose_mode(rows) == "streamed"
                    native.enable_native_kernels(False)
                    path = layers[0].choose_mode(rows)

                    def mode(name, layers=layers):  # the PHM stack's path for the next sample (auto for dense)
                        for layer in layers:
                            layer.forward_mode = "streamed" if name == "streamed" else "auto"

                    timings = harness.interleave({"dense": _pass(dense, x), "auto": _pass(layers, x),
                                                  "streamed": _pass(layers, x)}, args.rounds, number=args.repeats,
                                                 before=mode)
                    mode("auto")
                row = {"d": d, "k": k, "n": n, "rows": rows, "layers": count, "path": path, "qualifies": qualifies,
                       "dense_ms": timings.median("dense") * 1e3 / count, "auto": timings.ratio("auto", "dense"),
                       "streamed": timings.ratio("streamed", "dense")}
                results.append(row)
                print(f"| {d}→{k} | {n} | {rows} | {count} | {row['dense_ms']:.3f} | {row['auto']:.2f} ({path}) "
                      f"| {row['streamed']:.2f} | {'yes' if qualifies else 'no'} |", flush=True)
    return results


if __name__ == "__main__":
    main()
