"""Speed check behind :class:`hyperplex.int8.QuantizedPHMLinear`'s default path (not a benchmark
the docs quote): the int8 GEMM path against the dequantised-blocks path at MiniLM's shapes, with the float
structured product, the float dense layer and PyTorch's int8 dense layer as references.

Each variant runs a stack of ``--layers`` distinct layers per shape (weights beyond one layer's cache
footprint, as in a model), ``--repeats`` interleaved rounds; the median time per stack call is printed as
a ratio to the float dense stack measured in the same round.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/check_quantize.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from hyperplex.int8 import QuantizedLinear, QuantizedPHMLinear
from hyperplex.layers import PHMLinear
from hyperplex.layers.functional import phm_linear_structured


def _time(fn, x, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - start) / calls


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
    print(f"torch {torch.__version__}, engine {torch.backends.quantized.engine}, threads {args.threads}, n={args.n}")
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
        variants = {
            "dense": lambda x: [F.linear(x, m.weight, m.bias) for m in dense],
            "phm": lambda x: [phm_linear_structured(x, m.phm_rule, m.phm_weight, m.bias) for m in phm],
            "q_dense": lambda x: [m(x) for m in q_dense],
            "q_int8": lambda x: [m(x) for m in q_int8],
            "q_deq": lambda x: [m(x) for m in q_deq],
            "q_pre": lambda x: [m(x) for m in q_pre],
        }
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, d)
            calls = max(2, 2000 // rows)
            times = {name: [] for name in variants}
            with torch.inference_mode():
                for fn in variants.values():
                    fn(x)
                for _ in range(args.repeats):
                    for name, fn in variants.items():
                        times[name].append(_time(fn, x, calls))
            med = {name: statistics.median(t) for name, t in times.items()}
            ratio = {name: med[name] / med["dense"] for name in med}
            print(f"| {k}x{d} | {rows} | {med['dense'] * 1e3:.3f} | {ratio['phm']:.2f} | {ratio['q_dense']:.2f} | "
                  f"{ratio['q_int8']:.2f} | {ratio['q_deq']:.2f} | {ratio['q_pre']:.2f} |")


if __name__ == "__main__":
    main()
