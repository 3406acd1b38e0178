#!/usr/bin/env python
"""The short table that ``check.sh`` prints last for its kernel step, from ``bench_kernel.py``'s JSON.

    python benchmarks/gpu/kernel_summary.py kernel.json

One line per (n, rows): every fused variant the step timed (the default and the candidates for the next version)
as × dense, the fastest of them and the issue's target at one row, the structured path and a plain copy of the
factors (what a single launch can reach) as × dense, the fastest variant's GB/s and the largest error of any
variant against the float64 reference. Standard library only: it runs wherever ``check.sh`` does.
"""

from __future__ import annotations

import json
import sys


def summary(data: dict) -> str:
    """The table for one ``bench_kernel.py --json`` result (``{"meta": ..., "rows": [...]}``)."""
    meta = data["meta"]
    lines = [f"kernel on {meta['device']}: copy {meta['copy_GBps']:.0f} GB/s, dense {meta['dense_TFLOPs']:.1f} "
             "TFLOP/s measured" + ("" if meta.get("complete", True)
                                   else "; INCOMPLETE: the step stopped before the last point"),
             "× dense (below 1 is faster); best: the fastest fused variant, against the target at one row"]
    rows = {(r["n"], r["rows"], r["variant"]): r for r in data["rows"]}
    fused = list(dict.fromkeys(v for (_, _, v) in rows if v.startswith("fused")))
    lines.append("| n | rows | " + " | ".join(fused) + " | best | target | structured | copy | best GB/s (% copy) "
                 "| max err |")
    lines.append("| --- | --- | " + "--- | " * len(fused) + "--- | --- | --- | --- | --- | --- |")

    def ratio(n: int, rw: int, variant: str) -> str:
        return f"{rows[(n, rw, variant)]['x_dense']:.3f}" if (n, rw, variant) in rows else "-"

    for n, rw in dict.fromkeys((n, rw) for (n, rw, _) in rows):
        timed = [rows[(n, rw, v)] for v in fused if (n, rw, v) in rows]
        if not timed:
            continue
        best = min(timed, key=lambda r: r["x_dense"])
        target = next((r["target"] for r in timed if r.get("target") is not None), None)
        met = "" if target is None else f"≤ {target:.2f} {'met' if best['x_dense'] <= target else 'MISSED'}"
        cells = " | ".join(ratio(n, rw, v) for v in fused)
        lines.append(f"| {n} | {rw} | {cells} | {best['variant']} | {met} | {ratio(n, rw, 'structured')} | "
                     f"{ratio(n, rw, 'copy')} | {best['GBps']:.0f} ({100 * best['copy_fraction']:.0f}%) | "
                     f"{max(r['error'] for r in timed):.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: kernel_summary.py KERNEL_JSON", file=sys.stderr)
        return 2
    with open(args[0]) as handle:
        print(summary(json.load(handle)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
