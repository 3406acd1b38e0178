"""Forming ``H`` for one inference call: all of it, or one block column at a time (``phm_linear_blocked``).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/probes/bench_formation.py --threads 1  # MiniLM's shapes, n 2-8
    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/probes/bench_formation.py --threads 1 --shapes 1024x1024 \\
        --ns 8 16 --rows 2048 --layers 4 --rounds 9

Where ``PHMLinear`` forms ``H`` per call in inference (many rows, no cache), it can form all of ``H`` and run one
GEMM, or form one ``k × d/n`` block column at a time and accumulate ``x_c H_cᵀ``
(:func:`hyperplex.layers.functional.phm_linear_blocked`); it takes the second on small layers with wide block columns
(:func:`~hyperplex.layers.dispatch.takes_blocked`).
For each shape ``D×K`` (in × out features), ``n`` and row count this times, per layer of a stack of ``--layers``
distinct layers on the same input:

- ``dense``: ``nn.Linear``;
- ``whole``: ``H`` formed whole into a reused buffer (``materialize_weight(out=)``), then ``F.linear``;
- ``blocked``: ``phm_linear_blocked`` with a reused buffer of one block column.

Rounds are interleaved with the order rotating; a ratio is the median over rounds of the form's time / the dense
stack's time in the same round (below 1 = faster than dense). Both PHM forms are checked against each other before
timing. The last column is the form ``PHMLinear`` takes for that shape.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from hyperplex.layers import PHMLinear
from hyperplex.layers.dispatch import takes_blocked
from hyperplex.layers.functional import materialize_weight, phm_linear_blocked

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the harness, run as a script or loaded by path
import harness  # noqa: E402

MINILM_SHAPES = ["384x384", "384x1536", "1536x384"]


def parse_shape(text: str) -> tuple[int, int]:
    """``"384x1536"`` → ``(384, 1536)`` (in, out features)."""
    try:
        d, k = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected IN x OUT features such as 384x1536, got {text!r}") from None
    if d < 1 or k < 1:
        raise argparse.ArgumentTypeError(f"features must be positive, got {text!r}")
    return d, k


def forms(layers: list[PHMLinear]) -> dict:
    """The two ways to run a stack of PHM layers with ``H`` formed per call, each with its reused buffer."""
    first = layers[0]
    k, d, n = first.out_features, first.in_features, first.n
    whole = torch.empty(k, d)
    block = torch.empty(k * d // n)

    def run_whole(x):
        return [F.linear(x, materialize_weight(layer.phm_rule, layer.phm_weight, out=whole), layer.bias)
                for layer in layers]

    def run_blocked(x):
        return [phm_linear_blocked(x, layer.phm_rule, layer.phm_weight, layer.bias, buffer=block) for layer in layers]

    return {"whole": run_whole, "blocked": run_blocked}


def ratios_to_dense(runs: dict, rounds: int, layers: int, prepare=None) -> dict:
    """Time the callables of ``runs`` (one of them named ``"dense"``) in ``rounds`` interleaved rounds
    (``harness.interleave``); ``prepare(name)``, if given, runs before each one untimed. Returns ``dense_ms`` (per
    layer of a stack of ``layers``) and, for every other run, the median over rounds of its time / the dense time of
    the same round."""
    timings = harness.interleave(runs, rounds, warmup=0, before=prepare)
    return {"dense_ms": timings.median("dense") * 1e3 / layers,
            **{name: timings.ratio(name, "dense") for name in runs if name != "dense"}}


def measure(d: int, k: int, n: int, rows: int, layers: int, rounds: int) -> dict:
    """Per-layer dense time (ms) and each form's ratio to it for one shape, ``n`` and row count."""
    torch.manual_seed(0)
    dense = [torch.nn.Linear(d, k) for _ in range(layers)]
    phm = [PHMLinear(d, k, n=n).eval() for _ in range(layers)]
    x = torch.randn(rows, d)
    with torch.inference_mode():
        runs = {"dense": lambda t: [layer(t) for layer in dense], **forms(phm)}
        whole, blocked = runs["whole"](x)[-1].clone(), runs["blocked"](x)[-1]
        torch.testing.assert_close(blocked, whole, rtol=1e-4, atol=1e-4)  # the same sums in another order
        result = ratios_to_dense({name: (lambda run=run: run(x)) for name, run in runs.items()}, rounds, layers)
    result["takes"] = "blocked" if takes_blocked(k, d, n, PHMLinear.path_settings) else "whole"
    return result


def parse_grid(argv: list[str] | None, doc: str, ns: list[int], rows: list[int], rows_help: str) -> argparse.Namespace:
    """The shape × n × rows grid of this benchmark and of ``bench_paths.py``: parsed, checked (every ``n`` divides
    both features of every shape) and the thread count set."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--shapes", type=parse_shape, nargs="+", default=[parse_shape(s) for s in MINILM_SHAPES],
                        metavar="DxK", help=f"in x out features (default MiniLM's: {' '.join(MINILM_SHAPES)})")
    parser.add_argument("--ns", type=int, nargs="+", default=ns, help=f"PHM n (default {' '.join(map(str, ns))})")
    parser.add_argument("--rows", type=int, nargs="+", default=rows, help=rows_help)
    parser.add_argument("--layers", type=int, default=6, help="distinct layers per stack (default 6)")
    parser.add_argument("--rounds", type=int, default=21, help="interleaved rounds (default 21)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if min(args.ns + args.rows + [args.layers, args.rounds]) < 1:
        parser.error("--ns, --rows, --layers and --rounds must be positive")
    for d, k in args.shapes:
        for n in args.ns:
            if n < 2 or d % n or k % n:
                parser.error(f"n = {n} must be at least 2 and divide both features of {d}x{k}")
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_grid(argv, __doc__, ns=[2, 4, 8], rows=[160, 640, 1280],
                      rows_help="input rows (default 160 640 1280: MiniLM at batch 8 to 64)")
    settings = PHMLinear.path_settings
    print(f"# bench_formation — blocked_min_columns = {settings.blocked_min_columns}, blocked_max_weight = "
          f"{settings.blocked_max_weight}; {args.layers} layers, {args.rounds} rounds; ratios = time / dense (both "
          "forms with a reused buffer)")
    print(f"# {harness.header(harness.machine())}")
    print("| D×K | n | d/n | rows | dense ms/layer | whole × | blocked × | PHMLinear takes |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    return run_grid(args, measure, lambda d, k, n, rows, r: (
        f"| {d}×{k} | {n} | {d // n} | {rows} | {r['dense_ms']:.2f} | {r['whole']:.3f} | {r['blocked']:.3f} | "
        f"{r['takes']} |"))


def run_grid(args: argparse.Namespace, measure, line) -> dict:
    """``measure(d, k, n, rows, layers, rounds)`` at every point of the grid, each printed as ``line(d, k, n, rows,
    result)`` as soon as it is measured; returns ``{(d, k, n, rows): result}``."""
    results = {}
    for d, k in args.shapes:
        for n in args.ns:
            for rows in args.rows:
                result = results[(d, k, n, rows)] = measure(d, k, n, rows, args.layers, args.rounds)
                print(line(d, k, n, rows, result), flush=True)
    return results


if __name__ == "__main__":
    main()
