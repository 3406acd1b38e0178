#!/usr/bin/env python
"""Speed of ``PHMLSTM`` (n = 1, 2, 4, 8) against ``torch.nn.LSTM`` of the same size, same run.

Usage (from the repository root)::

    PYTHONPATH=src python benchmarks/bench_lstm.py --quick          # tiny grid, well under a minute
    PYTHONPATH=src python benchmarks/bench_lstm.py --hidden 512 --batch 64 --steps 50 --ns 1 2 4 8 16

Layers timed (``benchmarks/harness.py``) on the same input ``x (batch, steps, hidden)`` with random lengths in
``[steps/2, steps]`` (variable-length batch: ``nn.LSTM`` gets a ``pack_padded_sequence``,
``PHMLSTM`` the ``lengths`` tensor):

- ``nn.LSTM``: the baseline every ratio divides by (fused ATen / cuDNN kernel);
- ``dense``: ``PHMLSTM`` with ``LinearSpec("dense")`` — the cost of the Python time loop alone;
- ``phm n=k``: ``PHMLSTM`` with ``LinearSpec("phm", n=k)`` (learned rule), ``n = 1`` included.

Phases: ``fwd`` = one forward under ``torch.inference_mode()``; ``f+b`` = forward and backward
of ``output.sum() + h_n.sum()`` with parameter gradients reset to ``None`` first. Each layer
gets a warm-up call, then ``--rounds`` interleaved rounds (layer order rotating every round);
in a round each layer runs ``--calls`` back-to-back calls. A time is the median over rounds of
the per-call time; a ratio is the median over rounds of (layer time / ``nn.LSTM`` time in the
same round), so drift on a shared machine cancels. Absolute times depend on the machine named in
the header; compare ratios.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from hyperplex.nn.linear import LinearSpec
from hyperplex.nn.rnn import PHMLSTM

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the harness, run as a script or loaded by path
import harness  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="hidden 64, batch 8, 10 steps, 5 rounds of 3 calls")
    parser.add_argument("--hidden", type=int, default=256, help="input and hidden size (default 256)")
    parser.add_argument("--layers", type=int, default=1, help="LSTM layers (default 1)")
    parser.add_argument("--bidirectional", action="store_true", help="time bidirectional LSTMs")
    parser.add_argument("--batch", type=int, default=32, help="batch size (default 32)")
    parser.add_argument("--steps", type=int, default=30, help="time steps (default 30)")
    parser.add_argument("--ns", type=int, nargs="+", default=[1, 2, 4, 8], help="PHM n values (default 1 2 4 8)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--calls", type=int, default=3, help="calls per layer per round (default 3)")
    harness.add_arguments(parser)  # --device, --threads, --out
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.hidden, args.batch, args.steps, args.rounds, args.calls = 64, 8, 10, 5, 3
    bad = [n for n in args.ns if args.hidden % n]
    if bad:
        parser.error(f"--ns {bad} do not divide --hidden {args.hidden}")
    return args


def build(args, device) -> dict[str, nn.Module]:
    kwargs = dict(num_layers=args.layers, bidirectional=args.bidirectional, batch_first=True)
    layers: dict[str, nn.Module] = {"nn.LSTM": nn.LSTM(args.hidden, args.hidden, **kwargs)}
    layers["dense"] = PHMLSTM(args.hidden, args.hidden, linear=LinearSpec("dense"), **kwargs)
    for n in args.ns:
        layers[f"phm n={n}"] = PHMLSTM(args.hidden, args.hidden, linear=LinearSpec("phm", n=n), **kwargs)
    return {name: layer.to(device) for name, layer in layers.items()}


def make_call(name: str, layer: nn.Module, x: torch.Tensor, lengths: torch.Tensor, phase: str):
    def run():
        if name == "nn.LSTM":
            packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            out, (h, _) = layer(packed)
            out = out.data
        else:
            out, (h, _) = layer(x, lengths)
        return out, h

    if phase == "fwd":
        def call():
            with torch.inference_mode():
                run()
    else:
        def call():
            for p in layer.parameters():
                p.grad = None
            out, h = run()
            (out.sum() + h.sum()).backward()
    return call


def measure(args, layers, phase: str, x, lengths, device) -> dict[str, dict]:
    """name → {ms: median per call, ratio: median to nn.LSTM in the same round, spread}."""
    calls = {name: make_call(name, layer, x, lengths, phase) for name, layer in layers.items()}
    timings = harness.interleave(calls, args.rounds, device=device, number=args.calls)
    return {name: {"ms": timings.median(name) * 1e3, "ratio": timings.ratio(name, "nn.LSTM"),
                   "spread": timings.spread(name)} for name in calls}


def main(argv=None) -> dict:
    """Run the benchmark; returns ``{"args", "rows": [{name, params, fwd: {ms, ratio, spread}, "f+b": {...}}]}``
    (also written to ``--out``)."""
    args = parse_args(argv)
    device = harness.setup(args)
    torch.manual_seed(args.seed)
    layers = build(args, device)
    x = torch.randn(args.batch, args.steps, args.hidden, device=device)
    lengths = torch.randint(max(1, args.steps // 2), args.steps + 1, (args.batch,))
    lengths[0] = args.steps
    print(f"# bench_lstm: device {device}, hidden {args.hidden}, layers {args.layers}, "
          f"bidirectional {args.bidirectional}, batch {args.batch}, steps {args.steps}, "
          f"rounds {args.rounds} x {args.calls} calls, median")
    print(f"# {harness.header(harness.machine(device))}")
    results = {phase: measure(args, layers, phase, x, lengths, device) for phase in ("fwd", "f+b")}
    print()
    print("| layer | params | fwd ms | fwd ×LSTM | f+b ms | f+b ×LSTM |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = []
    for name, layer in layers.items():
        rows.append({"name": name, "params": sum(p.numel() for p in layer.parameters()),
                     "fwd": results["fwd"][name], "f+b": results["f+b"][name]})
        fwd, fb = results["fwd"][name], results["f+b"][name]
        print(f"| {name} | {rows[-1]['params']} | {fwd['ms']:.2f} | {fwd['ratio']:.2f} | {fb['ms']:.2f} | "
              f"{fb['ratio']:.2f} |")
    result = {"args": vars(args), "rows": rows}
    if args.out:
        harness.write_json(args.out, result, device, command=harness.command_line(argv, "benchmarks/bench_lstm.py"))
    return result


if __name__ == "__main__":
    main()
