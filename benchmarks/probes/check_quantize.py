"""Speed check behind :class:`hyperplex.int8.QuantizedPHMLinear`'s default path (not a benchmark
the docs quote): the int8 GEMM path against the dequantised-blocks path at MiniLM's shapes, with the float
structured product, the float dense layer and PyTorch's int8 dense layer as references.

Each variant runs a stack of ``--layers`` distinct layers per shape (weights beyond one layer's cache
footprint, as in a model), ``--repeats`` interleaved rounds (``benchmarks/harness.py``); the median time per stack
call is printed, and the median over rounds of its ratio to the float dense stack measured in the same round.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/probes/check_quantize.py --threads 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from hyperplex.int8 import QuantizedLinear, QuantizedPHMLinear
from hyperplex.layers import PHMLinear
from hyperplex.layers.functional import phm_linear_structured

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the harness, run as a script or loaded by path
import harness  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", default="12,128,800")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"engine {torch.backends.quantized.engine}, n={args.n}; {harness.header(harness.machine())}")
    print("| shape (k x d) | rows | float dense ms | float PHM structured | int8 dense | int8 PHM (int8 GEMM) | "
          "int8 PHM (dequantised) | int8 PHM (premixed) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for k, d in ((384, 384), (1536, 384), (384, 1536)):
        dense = [nn.Linear(d, k) for _ in range(args.layers)]
        phm = [PHMLinear(d, k, args.n).eval() for _ in range(args.layers)]
        q_dense = [QuantizedLinear.from_weight(layer.weight, layer.bias) for layer in dense]
        q_int8 = [QuantizedPHMLinear.from_float(layer, "int8").eval() for layer in phm]
        q_deq = [QuantizedPHMLinear.from_float(layer, "dequantized").eval() for layer in phm]
        q_pre = [QuantizedPHMLinear.from_float(layer, "premixed").eval() for layer in phm]
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, d)
            variants = {
                "dense": lambda x=x, dense=dense: [F.linear(x, m.weight, m.bias) for m in dense],
                "phm": lambda x=x, phm=phm: [phm_linear_structured(x, m.phm_rule, m.phm_weight, m.bias) for m in phm],
                **{name: lambda x=x, stack=stack: [m(x) for m in stack]
                   for name, stack in (("q_dense", q_dense), ("q_int8", q_int8), ("q_deq", q_deq), ("q_pre", q_pre))},
            }
            timings = harness.interleave(variants, args.repeats, number=max(2, 2000 // rows),
                                         context=torch.inference_mode)
            med = {name: timings.median(name) for name in variants}
            ratio = {name: timings.ratio(name, "dense") for name in variants}
            print(f"| {k}x{d} | {rows} | {med['dense'] * 1e3:.3f} | {ratio['phm']:.2f} | {ratio['q_dense']:.2f} | "
                  f"{ratio['q_int8']:.2f} | {ratio['q_deq']:.2f} | {ratio['q_pre']:.2f} |")


if __name__ == "__main__":
    main()
