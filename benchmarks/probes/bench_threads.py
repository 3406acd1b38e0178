#!/usr/bin/env python
"""Does a second torch thread pay? The measurements behind ``hyperplex.threads.choose_threads``.

Usage (from the repository root)::

    PYTHONPATH=src python benchmarks/probes/bench_threads.py --quick      # about a minute on 2 cores
    PYTHONPATH=src python benchmarks/probes/bench_threads.py --threads 1 4 --widths 64 512 --rows 32 4096

Workloads, each timed at every thread count of ``--threads`` in interleaved rounds (the count
rotating every round, so drift on a shared machine hits all counts alike):

- ``demo``: 100 steps of ``hyperplex demo``'s rotation and octonion-rule fits (the issue-16 case);
- ``mlp W×R``: one training step (forward, backward, Adam) of 4 ``Linear(W, W)`` layers on ``R``
  rows — ``work = R·W²`` multiply-adds per product, the quantity the rule looks at.

Per workload it prints the time per call at the first thread count and, for every other count,
``median`` = median over rounds of (time / time at the first count in the same round) — what a
user sees on this machine as loaded now — and ``best`` = (fastest call at that count) / (fastest at
the first count), which approaches an idle machine because a call that ran undisturbed is the
fastest one. ``rule`` is the count :func:`~hyperplex.threads.choose_threads` picks for the
workload on the cores available. The load average and the CPU idle share during the run are in
the header and the footer: compare ratios, not absolute times, and only within one run.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from torch import nn

from hyperplex.experiments.demo import learn_rotation, learn_rule
from hyperplex.threads import WORK_PER_THREAD, available_cores, choose_threads

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the harness, run as a script or loaded by path
import harness  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="widths 16 256 1024, rows 16 256, 5 rounds")
    parser.add_argument("--threads", type=int, nargs="+", default=None,
                        help="thread counts to compare, the first is the baseline (default: 1 and the cores)")
    parser.add_argument("--widths", type=int, nargs="+", default=[16, 64, 256, 512, 1024])
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 256, 2048])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--seconds", type=float, default=0.15, help="target time per call batch (default 0.15)")
    parser.add_argument("--no-demo", action="store_true", help="skip the demo workload")
    args = parser.parse_args(argv)
    if args.quick:
        args.widths, args.rows, args.rounds = [16, 256, 1024], [16, 256], 5
    if args.threads is None:
        args.threads = [1, max(2, available_cores())]
    return args


def cpu_idle_share() -> tuple[int, int] | None:
    """(idle, total) jiffies from /proc/stat (Linux), to report how busy the machine was."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except OSError:
        return None
    return fields[3] + fields[4], sum(fields)


def mlp_step(width: int, rows: int):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(4)])
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    x = torch.randn(rows, width)

    def call():
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return call


def demo_steps():
    def call():
        learn_rotation(50, seed=0)
        learn_rule("octonion", 50, seed=0)
    return call


def measure(call, counts: list[int], rounds: int, seconds: float) -> tuple[float, dict[int, tuple[float, float]]]:
    """Time ``call`` at each thread count; returns (seconds per call at counts[0], {count: (median, best)})."""
    torch.set_num_threads(counts[0])
    repeat = harness.calls_per_block(call, seconds, limit=200)[0]  # a warm-up, and how many calls fill ``seconds``

    def threads(count):
        torch.set_num_threads(count)
        call()  # one untimed call at the new count

    timings = harness.interleave({count: call for count in counts}, rounds, number=repeat, warmup=0, before=threads)
    base = timings.samples[counts[0]]
    ratios = {c: (timings.ratio(c, counts[0]), min(t) / min(base)) for c, t in timings.samples.items()}
    return timings.median(counts[0]), ratios


def main(argv=None) -> None:
    args = parse_args(argv)
    cores = available_cores()
    before = cpu_idle_share()
    print(f"# bench_threads: {cores} available cores, WORK_PER_THREAD = {WORK_PER_THREAD:,}")
    print(f"# {harness.header(harness.machine())}")
    others = args.threads[1:]
    header = f"{'workload':<16} {'work R·W²':>13} {'rule':>4} {f'ms @{args.threads[0]}':>9}"
    for c in others:
        header += f" {f'@{c} median':>10} {f'@{c} best':>8}"
    print(header)
    # the demo's largest product: the octonion rule fit, 256 rows × 8²
    workloads = [] if args.no_demo else [("demo 100 steps", 256, 8, demo_steps())]
    workloads += [(f"mlp {w}x{r}", r, w, mlp_step(w, r)) for w in args.widths for r in args.rows]
    for name, rows, width, call in workloads:
        base, ratios = measure(call, args.threads, args.rounds, args.seconds)
        rule = choose_threads(rows, width, cores)
        line = f"{name:<16} {rows * width * width:>13,} {rule:>4} {base * 1e3:>9.3f}"
        for c in others:
            line += f" {ratios[c][0]:>10.2f} {ratios[c][1]:>8.2f}"
        print(line, flush=True)
    after = cpu_idle_share()
    if before and after and after[1] > before[1]:
        print(f"# CPU idle during the run: {100 * (after[0] - before[0]) / (after[1] - before[1]):.0f}% of "
              f"{os.cpu_count()} CPUs; load average now {os.getloadavg()[0]:.2f}")
    print("# ratio > 1: the extra threads are slower. median = as loaded now; best ≈ an idle machine.")


if __name__ == "__main__":
    main()
