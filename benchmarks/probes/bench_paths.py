"""Every inference path of ``PHMLinear`` on one shape, forced, against ``nn.Linear``: which one ``auto`` should take.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/probes/bench_paths.py --threads 1 --ns 2 4 8 \\
        --rows 16 48 96 128 192          # MiniLM's shapes (the default --shapes)

For each shape ``D×K`` (in × out features), ``n`` and row count: a stack of ``--layers`` distinct layers (eval
mode, no ``cache_dense``) run under ``torch.inference_mode()`` with ``forward_mode`` set to ``premixed``,
``structured`` and ``materialized`` in turn (``materialized`` forms ``H`` for the call: whole, or one block column
at a time where :func:`hyperplex.layers.dispatch.takes_blocked` says so), and a stack of ``nn.Linear`` layers.
Rounds are interleaved with the order rotating; a ratio is the median over rounds of the path's time / the dense
stack's in the same round. The table marks the fastest path and the one ``auto`` takes (``choose_mode``). oneDNN
and the compiled kernel are not timed here (``benchmarks/bench_phm.py`` does, on larger layers).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from hyperplex.layers import PHMLinear

# the sibling probe and the harness, run as a script or loaded by path
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import harness  # noqa: E402
from bench_formation import parse_grid, ratios_to_dense, run_grid  # noqa: E402

PATHS = ("premixed", "structured", "materialized")


def measure(d: int, k: int, n: int, rows: int, layers: int, rounds: int) -> dict:
    """Each path's ratio to dense, the fastest path and ``auto``'s choice, for one shape, ``n`` and row count."""
    torch.manual_seed(0)
    dense = [torch.nn.Linear(d, k) for _ in range(layers)]
    phm = [PHMLinear(d, k, n=n).eval() for _ in range(layers)]
    x = torch.randn(rows, d)
    stacks = {"dense": dense, **{path: phm for path in PATHS}}

    def prepare(name):
        for layer in phm:
            layer.forward_mode = "auto" if name == "dense" else name

    with torch.inference_mode():
        auto = phm[0].choose_mode(rows)
        try:
            result = ratios_to_dense({name: (lambda stack=stack: [layer(x) for layer in stack])
                                      for name, stack in stacks.items()}, rounds, layers, prepare)
        finally:
            prepare("dense")
    result.update(fastest=min(PATHS, key=lambda path: result[path]), auto=auto)
    return result


def main(argv: list[str] | None = None) -> dict:
    args = parse_grid(argv, __doc__, ns=[4], rows=[16, 48, 96, 128, 192],
                      rows_help="input rows (default 16 48 96 128 192)")
    print(f"# bench_paths — {args.layers} layers, {args.rounds} rounds; ratios = time / dense, inference, no cache")
    print(f"# {harness.header(harness.machine())}")
    print("| D×K | n | rows | dense ms/layer | premixed × | structured × | materialized × | fastest | auto |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    return run_grid(args, measure, lambda d, k, n, rows, r: (
        f"| {d}×{k} | {n} | {rows} | {r['dense_ms']:.2f} | " + " | ".join(f"{r[p]:.2f}" for p in PATHS)
        + f" | {r['fastest']} | {r['auto']} |"))


if __name__ == "__main__":
    main()
