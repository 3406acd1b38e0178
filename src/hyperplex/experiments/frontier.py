"""The size–quality frontier of a compression plan, from its ``results.json``:

    hyperplex report frontier experiments/records/minilm_frontier/results.json \\
        --figure docs/figures/frontier.png

For every row with evaluated seeds: the bytes its weights hold in memory (``size.held_bytes``, the mean over
seeds) and, per quality metric, its **retention** — the row's mean divided by the teacher row's (the row whose
models are the unconverted teacher: ``--teacher``, default ``teacher``). A row is **on the frontier** of a
metric when no other row holds at most as many bytes with at least its retention (and is strictly better in
one of the two); the table marks those rows, and the figure draws bytes (log scale) against retention with the
frontier as a step line. Mean ± std over seeds is printed where a row has several.

Serving cost comes from ``benchmarks/bench_compress.py --json FILE`` (one run, every model against the teacher
in the same run): ``--serving FILE --serving-row ROW=VARIANT …`` adds, for each named row, the speed ratios to
the teacher at each batch size and the peak-memory difference of the bench variant that serves it (a healed
model serves at the speed of its architecture, so ``phm4=phm4`` and ``phm4_int8=phm4+int8``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from hyperplex.experiments.intervals import summarize
from hyperplex.fileio import atomic_write, atomic_write_text

__all__ = ["FrontierPoint", "mean_std", "frontier_points", "pareto_front", "attach_serving", "frontier_table",
           "frontier_figure", "main"]

#: The quality metrics a frontier is drawn for, in table order.
METRICS = ("agreement", "wikiqa_map", "sst2_probe")

#: The command that runs this report.
PROG = "hyperplex report frontier"


class FrontierError(ValueError):
    """A results.json that cannot give a frontier (the message says what is missing)."""


class FrontierPoint(dict):
    """One row: ``name``, ``label``, ``n`` (seeds evaluated), ``held_bytes``, ``file_bytes``, ``mean``/``std``
    per metric and ``retention`` per metric (row mean / teacher mean)."""


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample std (``None`` for one value) of per-seed values, as
    :func:`~hyperplex.experiments.intervals.summarize` gives them."""
    stats = summarize(values)
    return stats["mean"], stats["std"]


def frontier_points(results: dict, teacher: str = "teacher", metrics=METRICS) -> list[FrontierPoint]:
    """The rows of ``results`` that have evaluated seeds with sizes, as :class:`FrontierPoint`, in plan order."""
    rows = {row["name"]: row for row in results["rows"]}
    if teacher not in rows:
        raise FrontierError(f"no row named {teacher!r} (the teacher, whose quality is 100%); rows: {', '.join(rows)}")
    points = []
    for row in results["rows"]:
        runs = [r for r in row["runs"] if r.get("metrics") and r.get("size", {}).get("held_bytes")]
        if not runs:
            continue
        point = FrontierPoint(name=row["name"], label=row["label"], n=len(runs),
                              held_bytes=statistics.fmean(r["size"]["held_bytes"] for r in runs),
                              file_bytes=statistics.fmean(r["size"]["file_bytes"] for r in runs), mean={}, std={})
        for metric in metrics:
            values = [r["metrics"][metric] for r in runs if metric in r["metrics"]]
            if values:
                point["mean"][metric], point["std"][metric] = mean_std(values)
        points.append(point)
    base = next((p for p in points if p["name"] == teacher), None)
    if base is None:
        raise FrontierError(f"row {teacher!r} has no evaluated model with sizes (size.held_bytes)")
    for point in points:
        point["retention"] = {m: v / base["mean"][m] for m, v in point["mean"].items()
                              if base["mean"].get(m) not in (None, 0)}
    return points


def pareto_front(points: list[FrontierPoint], metric: str) -> list[str]:
    """Names of the points no other point dominates in (fewer or equal bytes, higher or equal retention of
    ``metric``, one of them strict), ordered by bytes."""
    scored = [p for p in points if metric in p["retention"]]
    front = []
    for p in scored:
        dominated = any(q is not p and q["held_bytes"] <= p["held_bytes"]
                        and q["retention"][metric] >= p["retention"][metric]
                        and (q["held_bytes"] < p["held_bytes"] or q["retention"][metric] > p["retention"][metric])
                        for q in scored)
        if not dominated:
            front.append(p)
    return [p["name"] for p in sorted(front, key=lambda p: p["held_bytes"])]


def attach_serving(points: list[FrontierPoint], bench: dict, mapping: dict[str, str]) -> list[int]:
    """Set ``point["serving"]`` of each row named in ``mapping`` (row → bench variant) from a
    ``bench_compress.py --json`` result: ``ratio`` (speed / the teacher's, per batch size) and ``peak_delta``
    (peak resident bytes minus the teacher's). Returns the batch sizes. A row or variant that is not there is
    a :class:`FrontierError` naming it."""
    variants = {row["name"]: row for row in bench.get("rows", [])}
    if "dense" not in variants:
        raise FrontierError("the serving file has no 'dense' row (the teacher every ratio is taken against)")
    sizes = bench.get("batch_sizes") or []
    by_name = {p["name"]: p for p in points}
    for row, variant in mapping.items():
        if row not in by_name:
            raise FrontierError(f"--serving-row {row}={variant}: no evaluated row {row!r}; rows: {', '.join(by_name)}")
        if variant not in variants:
            raise FrontierError(f"--serving-row {row}={variant}: the serving file has no variant {variant!r}; "
                                f"variants: {', '.join(variants)}")
        measured = variants[variant]
        by_name[row]["serving"] = {"variant": variant,
                                   "ratio": {b: measured[f"ratio_b{b}"] for b in sizes},
                                   "peak_delta": measured["peak"] - variants["dense"]["peak"]}
    return sizes


def _serving_cells(point: FrontierPoint, sizes: list[int]) -> list[str]:
    serving = point.get("serving")
    if serving is None:
        return ["–"] * (len(sizes) + 1)
    return [f"{serving['ratio'][b]:.2f}×" for b in sizes] + [f"{serving['peak_delta'] / 1e6:+.0f} MB"]


def _cell(point: FrontierPoint, metric: str) -> str:
    if metric not in point["mean"]:
        return "–"
    mean, std = point["mean"][metric], point["std"][metric]
    value = f"{mean:.3f}" if std is None else f"{mean:.3f} ± {std:.3f}"
    return f"{value} ({100 * point['retention'][metric]:.0f}%)"


def frontier_table(points: list[FrontierPoint], metrics=METRICS, serving_sizes: list[int] | None = None) -> str:
    """A markdown table, by bytes held: each metric as ``mean [± std] (retention %)``, and the metrics on whose
    frontier the row lies; with ``serving_sizes`` (from :func:`attach_serving`) also the speed ratio to the
    teacher at each batch size and the peak-memory difference."""
    fronts = {m: set(pareto_front(points, m)) for m in metrics}
    sizes = list(serving_sizes or [])
    serving_head = [f"sent/s batch {b} (× teacher)" for b in sizes] + (["peak memory Δ"] if sizes else [])
    lines = ["| row | n | weights in memory | file | " + " | ".join([*metrics, *serving_head])
             + " | on the frontier of |",
             "|---|---:|---:|---:|" + "---:|" * (len(metrics) + len(serving_head)) + "---|"]
    for p in sorted(points, key=lambda p: p["held_bytes"]):
        on = ", ".join(m for m in metrics if p["name"] in fronts[m]) or "–"
        cells = [_cell(p, m) for m in metrics] + (_serving_cells(p, sizes) if sizes else [])
        lines.append(f"| {p['label']} | {p['n']} | {p['held_bytes'] / 1e6:.1f} MB | {p['file_bytes'] / 1e6:.1f} MB | "
                     + " | ".join(cells) + f" | {on} |")
    return "\n".join(lines)


def frontier_figure(points: list[FrontierPoint], metrics=METRICS):
    """A matplotlib ``Figure``: one panel per metric, bytes held (log x) against retention, the frontier as a
    step line, each point labelled with its row name."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    fig = Figure(figsize=(4.2 * len(metrics), 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics):
        scored = [p for p in points if metric in p["retention"]]
        front = set(pareto_front(points, metric))
        for p in scored:
            x, y = p["held_bytes"] / 1e6, 100 * p["retention"][metric]
            ax.scatter([x], [y], s=28, color="C3" if p["name"] in front else "C0", zorder=3)
            ax.annotate(p["name"], (x, y), fontsize=6.5, xytext=(3, 3), textcoords="offset points")
        line = sorted((p for p in scored if p["name"] in front), key=lambda p: p["held_bytes"])
        if line:
            ax.step([p["held_bytes"] / 1e6 for p in line], [100 * p["retention"][metric] for p in line],
                    where="post", color="C3", linewidth=1, alpha=0.7)
        ax.set_xscale("log")
        plain = FuncFormatter(lambda value, _: f"{value:g}")
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(plain)
        ax.set_xlabel("weights held in memory (MB, log scale)")
        ax.set_ylabel(f"{metric}, % of the teacher")
        ax.set_title(metric)
        ax.grid(True, which="both", alpha=0.3)
    return fig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``hyperplex report frontier``."""
    parser.add_argument("results", help="a plan's results.json (a plan with quality: metrics)")
    parser.add_argument("--teacher", default="teacher", help="the row whose models are the teacher (default teacher)")
    parser.add_argument("--figure", help="write the figure to this PNG")
    parser.add_argument("--table", help="write the markdown table to this file (default: print it)")
    parser.add_argument("--serving", help="the JSON of `benchmarks/bench_compress.py --json` (speed and peak memory)")
    parser.add_argument("--serving-row", action="append", default=[], metavar="ROW=VARIANT",
                        help="the bench variant that serves a row, e.g. phm4=phm4, phm4_int8=phm4+int8, "
                             "teacher=dense (repeatable; needs --serving)")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return parser


def _serving_map(pairs: list[str]) -> dict[str, str]:
    mapping = {}
    for pair in pairs:
        row, sep, variant = pair.partition("=")
        if not sep or not row or not variant:
            raise FrontierError(f"--serving-row {pair!r}: expected ROW=VARIANT, e.g. phm4_int8=phm4+int8")
        if row in mapping:
            raise FrontierError(f"--serving-row: row {row!r} given twice")
        mapping[row] = variant
    return mapping


def run(args: argparse.Namespace, prog: str = PROG) -> int:
    from hyperplex.guards import OutputError, check_outputs

    try:
        check_outputs({"--table": args.table, "--figure": args.figure}, [args.results, args.serving])
    except OutputError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 1
    try:
        with open(args.results, encoding="utf-8") as handle:
            results = json.load(handle)
        points = frontier_points(results, args.teacher)
    except (OSError, json.JSONDecodeError, KeyError, FrontierError) as error:
        print(f"{prog}: {args.results}: {error}", file=sys.stderr)
        return 1
    sizes = None
    if args.serving_row and not args.serving:
        print(f"{prog}: --serving-row needs --serving FILE", file=sys.stderr)
        return 2
    if args.serving:
        try:
            mapping = _serving_map(args.serving_row)
            with open(args.serving, encoding="utf-8") as handle:
                sizes = attach_serving(points, json.load(handle), mapping)
        except (OSError, json.JSONDecodeError, KeyError, FrontierError) as error:
            print(f"{prog}: {args.serving}: {error}", file=sys.stderr)
            return 1
    table = frontier_table(points, serving_sizes=sizes)
    if args.table:
        atomic_write_text(args.table, table + "\n")
    else:
        print(table)
    if args.figure:
        fig = frontier_figure(points)
        atomic_write(args.figure, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    return 0


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """:func:`run` on the command line ``argv`` (``hyperplex report frontier ...`` from the shell)."""
    return run(build_parser(prog).parse_args(argv), prog)
