"""bf16 autocast against float32 on this CPU: a linear layer's training step (forward + backward), and whether
this CPU has bf16 instructions (the trainer's ``cpu_has_fast_bf16``, which decides its warning).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/probes/bench_bf16_cpu.py --threads 1

Rounds are interleaved; the ratio is the median over rounds of the bf16 step's time / the float32 step's in the
same round (above 1 = bf16 slower).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

from hyperplex.train.process import cpu_has_fast_bf16

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness  # noqa: E402


def measure(rows: int, d: int, k: int, rounds: int) -> dict:
    """Seconds per training step of one ``d → k`` linear layer on ``rows`` rows, in float32 and under bf16 autocast."""
    torch.manual_seed(0)
    layer, x = torch.nn.Linear(d, k), torch.randn(rows, d)

    def step(autocast: bool):
        context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()

        def call():
            layer.zero_grad(set_to_none=True)
            with context:
                out = layer(x)
            out.float().sum().backward()
        return call

    timings = harness.interleave({"fp32": step(False), "bf16": step(True)}, rounds)
    return {"rows": rows, "d": d, "k": k, **timings.summary("fp32", scale=1e3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4096, help="rows of the input (default 4096, a 4,096-token batch)")
    parser.add_argument("--d", type=int, default=512, help="input features (default 512)")
    parser.add_argument("--k", type=int, default=2048, help="output features (default 2048, a d_ff)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    harness.add_arguments(parser, device=False)
    args = parser.parse_args(argv)
    harness.setup(args)
    result = measure(args.rows, args.d, args.k, args.rounds)
    fast = cpu_has_fast_bf16()
    print(harness.header(harness.machine()))
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}; bf16 instructions: {fast}")
    print(f"{args.rows} × {args.d} → {args.k}, forward + backward: fp32 {result['fp32']['median']:.1f} ms, "
          f"bf16 autocast {result['bf16']['median']:.1f} ms, bf16 / fp32 {result['bf16']['ratio']:.2f}")
    if args.out:
        harness.write_json(args.out, {"result": result, "fast_bf16": fast,
                                      "capability": torch.backends.cpu.get_cpu_capability()},
                           command=harness.command_line(argv, "benchmarks/probes/bench_bf16_cpu.py"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
