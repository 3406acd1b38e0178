#!/usr/bin/env python
"""Cost of a distillation training step with length-bucketed batches (``training.bucket: true``) against the
shuffled, unsorted order (``false``), on the same student and corpus, as a ratio in the same run.

Usage (from the repository root; needs ``pip install "hyperplex[pretrained]"`` and a corpus built by
``hyperplex corpus``)::

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/probes/bench_distill_batches.py \\
        --corpus runs/corpus/distill.txt.gz --data-root ../shared/data --steps 12

Method: the config's task is prepared twice, once per order (``--training.bucket=true`` / ``false``, every other
setting the config's), and one student is built. The first ``--steps`` batches of epoch 1 of each order are
tokenised up front; then step ``i`` of each order runs back to back (loss + backward, gradients cleared),
alternating which order goes first (``benchmarks/harness.py``), so drift on a shared machine hits both alike.
Printed: padded and real tokens of each order's batches, the total and median step time, and the ratio
unbucketed / bucketed (above 1 = bucketing is faster).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the harness, run as a script or loaded by path
import harness  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/minilm_frontier.yaml", help="a distillation config")
    parser.add_argument("--corpus", required=True, help="the training corpus (data.train)")
    parser.add_argument("--data-root", default=None, help="data root for data.dev / data.exclude")
    parser.add_argument("--steps", type=int, default=12, help="steps timed per order (default 12)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--override", action="append", default=[], help="extra config override, e.g. "
                        "--override=--model.kind=none (repeatable)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be ≥ 1")
    import torch

    from hyperplex.config.experiment import load_experiment
    from hyperplex.tasks import build_task

    torch.set_num_threads(args.threads)
    log = logging.getLogger("bench_distill_batches")
    tasks = {}
    with tempfile.TemporaryDirectory(prefix="bench-distill-") as folder:
        for bucket in (True, False):
            overrides = [f"--data.train={Path(args.corpus).resolve()}", f"--training.bucket={str(bucket).lower()}",
                         *args.override]
            cfg = load_experiment(args.config, overrides, model_dir=folder)
            task = build_task(cfg, cfg.model_dir, args.data_root, log)
            task.prepare(fresh=True)
            tasks[bucket] = task
        model = tasks[True].build_model().train()
        batches = {bucket: task.train_batches(1)[0:args.steps] for bucket, task in tasks.items()}
        def next_step(bucket):  # round i: batch i of that order, loss and backward
            feed = iter(batches[bucket])
            return lambda: tasks[bucket].loss(model, next(feed)).backward()

        timings = harness.interleave({bucket: next_step(bucket) for bucket in tasks}, args.steps, warmup=0,
                                     before=lambda bucket: model.zero_grad(set_to_none=True))
        times = timings.samples
    result: dict[bool | str, Any] = {}
    for bucket, chosen in batches.items():
        padded = sum(b["input_ids"].numel() for b in chosen)
        real = sum(int(b["attention_mask"].sum()) for b in chosen)
        result[bucket] = {"padded": padded, "real": real, "total_s": sum(times[bucket]),
                          "median_s": timings.median(bucket)}
        print(f"bucket={str(bucket).lower():5s}: {padded:7,} padded tokens for {real:,} real "
              f"({1 - real / padded:.0%} padding); {result[bucket]['total_s']:.1f} s for {args.steps} steps, "
              f"median {result[bucket]['median_s']:.2f} s a step")
    result["ratio"] = result[False]["total_s"] / result[True]["total_s"]
    print(f"unbucketed / bucketed time: {result['ratio']:.2f}× (above 1: bucketing is faster)")
    return result


if __name__ == "__main__":
    main()
