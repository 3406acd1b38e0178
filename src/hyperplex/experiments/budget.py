"""The budget curve of a healing plan: quality against sentences seen, from its ``results.json`` and records:

    hyperplex report budget experiments/records/minilm_frontier/results.json \\
        --curve "PHM n=4=phm4,phm4_40k,phm4_400k" --curve "Low-rank=lowrank4,lowrank4_40k,lowrank4_400k" \\
        --figure docs/figures/budget.png

A curve is a list of rows that heal the same recipe on more and more sentences. For every row with evaluated
seeds: the sentences each seed saw (its last logged step × ``training.batch_size`` of its recorded config), its
training time (``train_seconds``, in hours: what the point costs a one-thread lane), the last validation value of
``--dev-metric`` and the mean ± std over seeds of each quality metric. The figure draws, per curve, every seed's
validation trajectory (``metrics.csv``: the dev metric at each validation, so one long run gives the whole
curve) and the rows' final quality metrics, sentences on a log axis. Rows of a curve that have no evaluated seed
yet are listed under the table as not yet recorded.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from pathlib import Path

from hyperplex.experiments.frontier import METRICS, mean_std
from hyperplex.fileio import atomic_write, atomic_write_text

__all__ = ["BudgetError", "parse_curve", "budget_points", "budget_table", "budget_figure", "main"]

class BudgetError(ValueError):
    """A results.json, record or ``--curve`` that cannot give a budget curve (the message names what)."""

#: The command that runs this report.
PROG = "hyperplex report budget"


def parse_curve(text: str) -> tuple[str, list[str]]:
    """``"LABEL=ROW,ROW,…"`` → ``(label, rows)``; the label is everything before the last ``=``."""
    label, sep, rows = text.rpartition("=")
    names = [r.strip() for r in rows.split(",") if r.strip()]
    if not sep or not label.strip() or not names:
        raise BudgetError(f"--curve {text!r}: expected LABEL=ROW,ROW,…, e.g. 'PHM n=4=phm4,phm4_40k'")
    if len(set(names)) != len(names):
        raise BudgetError(f"--curve {text!r}: a row is named twice")
    return label.strip(), names


def _record_dir(results_path: Path, row: str, run: dict) -> Path:
    given = Path(run.get("record") or "")
    if run.get("record") and given.is_dir():
        return given
    beside = results_path.parent / row / f"seed{run['seed']}"
    if beside.is_dir():
        return beside
    raise BudgetError(f"row {row!r} seed {run['seed']}: no record folder at {str(given)!r} or {str(beside)!r}")


def _batch_size(record: Path) -> int:
    import yaml

    path = record / "config.yaml"
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
        size = config["training"]["batch_size"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as error:
        raise BudgetError(f"{path}: no training.batch_size ({error})") from None
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise BudgetError(f"{path}: training.batch_size is {size!r}, expected a positive integer")
    return size


def _trajectory(record: Path, metric: str) -> tuple[int, list[tuple[int, float]]]:
    """The last logged step and ``[(step, value)]`` of the dev ``metric`` from ``record/metrics.csv``."""
    path = record / "metrics.csv"
    last, points = 0, []
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            for line, entry in enumerate(csv.DictReader(handle), start=2):
                try:
                    step = int(entry["step"])
                    last = max(last, step)
                    if entry["split"] == "dev" and entry["name"] == metric:
                        points.append((step, float(entry["value"])))
                except (KeyError, TypeError, ValueError):
                    raise BudgetError(f"{path}, line {line}: expected step,epoch,split,name,value with a numeric "
                                      f"step and value, got {entry}") from None
    except OSError as error:
        raise BudgetError(f"{path}: {error}") from None
    return last, points


def budget_points(results: dict, curves: list[tuple[str, list[str]]], results_path: str | Path,
                  dev_metric: str = "cosine", metrics=METRICS) -> tuple[list[dict], list[str]]:
    """Per curve and recorded row: ``{"curve", "row", "label", "seeds", "sentences", "hours", "dev", "mean",
    "std", "trajectories"}`` (``trajectories``: per seed ``[(sentences, value)]``), and the rows not yet recorded."""
    results_path = Path(results_path)
    rows = {row["name"]: row for row in results.get("rows", [])}
    points, missing = [], []
    for curve, names in curves:
        unknown = [name for name in names if name not in rows]
        if unknown:
            raise BudgetError(f"curve {curve!r}: no row {unknown[0]!r} in the plan; rows: {', '.join(rows)}")
        for name in names:
            runs = [run for run in rows[name]["runs"] if run.get("metrics")]
            if not runs:
                missing.append(name)
                continue
            sentences, hours, dev, trajectories = [], [], [], []
            for run in runs:
                record = _record_dir(results_path, name, run)
                batch = _batch_size(record)
                last, trajectory = _trajectory(record, dev_metric)
                sentences.append(last * batch)
                trajectories.append([(step * batch, value) for step, value in trajectory])
                if trajectory:
                    dev.append(trajectory[-1][1])
                if run.get("train_seconds") is not None:
                    hours.append(run["train_seconds"] / 3600)
            if len(set(sentences)) > 1:
                raise BudgetError(f"row {name!r}: its seeds saw different numbers of sentences {sentences}; a budget "
                                  "point needs one")
            stats = {m: mean_std([r["metrics"][m] for r in runs]) for m in metrics
                     if all(m in r["metrics"] for r in runs)}
            points.append({"curve": curve, "row": name, "label": rows[name].get("label", name), "seeds": len(runs),
                           "sentences": sentences[0], "hours": statistics.fmean(hours) if hours else None,
                           "dev": mean_std(dev) if dev else None, "mean": {m: s[0] for m, s in stats.items()},
                           "std": {m: s[1] for m, s in stats.items()}, "trajectories": trajectories})
    return points, missing


def _cell(mean: float, std: float | None) -> str:
    return f"{mean:.3f}" if std is None else f"{mean:.3f} ± {std:.3f}"


def budget_table(points: list[dict], missing: list[str], dev_metric: str = "cosine", metrics=METRICS) -> str:
    header = ["curve", "row", "sentences seen", "seeds", "training time (h, one thread)", f"dev {dev_metric}",
              *metrics]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]
    for p in points:
        cells = [_cell(p["mean"][m], p["std"][m]) if m in p["mean"] else "–" for m in metrics]
        lines.append(f"| {p['curve']} | {p['row']} | {p['sentences']:,} | {p['seeds']} | "
                     f"{'–' if p['hours'] is None else format(p['hours'], '.2f')} | "
                     f"{'–' if p['dev'] is None else _cell(*p['dev'])} | " + " | ".join(cells) + " |")
    if missing:
        lines += ["", "Not yet recorded: " + ", ".join(f"`{name}`" for name in missing) + "."]
    return "\n".join(lines)


def budget_figure(points: list[dict], dev_metric: str = "cosine", metrics=METRICS):
    """A matplotlib ``Figure``: the dev metric's trajectories, then one panel per quality metric (mean ± std of
    each row against its sentences), one colour per curve, sentences on a log axis."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    panels = [dev_metric, *metrics]
    fig = Figure(figsize=(4.0 * len(panels), 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    colours = {curve: f"C{i}" for i, curve in enumerate(dict.fromkeys(p["curve"] for p in points))}
    for curve, colour in colours.items():
        mine = [p for p in points if p["curve"] == curve]
        for p in mine:
            for trajectory in p["trajectories"]:
                if trajectory:
                    axes[0].plot(*zip(*trajectory), color=colour, alpha=0.6, linewidth=1, marker=".")
        axes[0].plot([], [], color=colour, label=curve)
        for ax, metric in zip(axes[1:], metrics):
            scored = sorted((p for p in mine if metric in p["mean"]), key=lambda p: p["sentences"])
            if scored:
                ax.errorbar([p["sentences"] for p in scored], [p["mean"][metric] for p in scored],
                            yerr=[p["std"][metric] or 0 for p in scored], color=colour, marker="o", capsize=3,
                            label=curve)
    thousands = FuncFormatter(lambda value, _: f"{value / 1000:g}k")
    # minor ticks labelled at 2× and 5× each power of ten only: every one of them overlapped its neighbours
    twos_and_fives = FuncFormatter(lambda value, pos: thousands(value, pos) if value > 0 and round(
        value / 10 ** math.floor(math.log10(value))) in (2, 5) else "")
    for ax, name in zip(axes, panels):
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(thousands)
        ax.xaxis.set_minor_formatter(twos_and_fives)
        ax.tick_params(axis="x", which="minor", labelsize=6)
        ax.set_xlabel("sentences seen (log scale)")
        ax.set_title(f"dev {name} during training" if ax is axes[0] else name)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``hyperplex report budget``."""
    parser.add_argument("results", help="a plan's results.json (its rows' records beside it)")
    parser.add_argument("--curve", action="append", required=True, metavar="LABEL=ROW,ROW,…",
                        help="rows healing one recipe on growing budgets, e.g. 'PHM n=4=phm4,phm4_40k' (repeatable)")
    parser.add_argument("--dev-metric", default="cosine", help="the validation metric of metrics.csv (default cosine)")
    parser.add_argument("--metrics", nargs="+", default=list(METRICS),
                        help="the quality metrics of the rows' runs to tabulate and plot "
                        f"(default: {' '.join(METRICS)})")
    parser.add_argument("--figure", help="write the figure to this PNG")
    parser.add_argument("--table", help="write the markdown table to this file (default: print it)")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return parser


def run(args: argparse.Namespace, prog: str = PROG) -> int:
    from hyperplex.guards import OutputError, check_outputs

    try:
        check_outputs({"--table": args.table, "--figure": args.figure}, [args.results])
    except OutputError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 1
    try:
        curves = [parse_curve(text) for text in args.curve]
        with open(args.results, encoding="utf-8") as handle:
            results = json.load(handle)
        points, missing = budget_points(results, curves, args.results, args.dev_metric, args.metrics)
    except (OSError, json.JSONDecodeError, KeyError, BudgetError) as error:
        print(f"{prog}: {args.results}: {error}", file=sys.stderr)
        return 1
    table = budget_table(points, missing, args.dev_metric, args.metrics)
    if args.table:
        atomic_write_text(args.table, table + "\n")
    else:
        print(table)
    if args.figure:
        fig = budget_figure(points, args.dev_metric, args.metrics)
        atomic_write(args.figure, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    return 0


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """:func:`run` on the command line ``argv`` (``hyperplex report budget ...`` from the shell)."""
    return run(build_parser(prog).parse_args(argv), prog)
