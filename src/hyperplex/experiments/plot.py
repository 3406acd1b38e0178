"""The stability figure of a sweep plan, from its ``results.json``:

    hyperplex report sweep runs/stability/results.json docs/figures/stability.png

Top panel: the plan's first metric (or ``--metric``) against the swept value (log axis for positive
numbers), one line per model (the rows expanded from one ``sweep:`` row, ``sweep_of``) at the mean over the
seeds that were evaluated, a band from the lowest to the highest seed, and one cross along the bottom edge
per diverged seed (NaN/inf loss, or last logged training loss above the first: ``stability.diverged``).
Bottom panel (when the runs carry ``stability``): gradient-norm spikes summed over the seeds. Drawn on
matplotlib's Agg canvas (no pyplot, no display). A plan's report draws the same figure as
``OUT/sweep-KEY.png`` next to its tables.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from hyperplex.fileio import atomic_write

__all__ = ["main", "save_sweep_figure", "sweep_figure", "sweep_keys", "sweep_series"]

#: The command that runs this report.
PROG = "hyperplex report sweep"


class SweepPlotError(ValueError):
    """A results.json that has no sweep to plot (the message says what was expected)."""


def sweep_keys(results: dict) -> list[str]:
    """The swept config keys of a results.json, in row order."""
    return list(dict.fromkeys(r["sweep_key"] for r in results["rows"] if r.get("sweep_key")))


def sweep_series(results: dict, key: str, metric: str) -> tuple[list, dict[str, dict]]:
    """(swept values in plan order, ``{model: series}``) of the rows sweeping ``key``. A series holds, per
    value with a row: ``values`` (the metric of every evaluated seed), ``diverged`` (seeds marked diverged)
    and ``spikes`` (gradient-norm spikes summed over seeds; ``None`` without stability records), and
    ``label`` (the row label without its ``, lr …`` suffix)."""
    values: list = []
    series: dict[str, dict] = {}
    for row in results["rows"]:
        if row.get("sweep_key") != key:
            continue
        value = row["sweep_value"]
        if value not in values:
            values.append(value)
        model = series.setdefault(row["sweep_of"], {"label": row["label"].rsplit(", ", 1)[0], "points": {}})
        runs = row["runs"]
        records = [r["stability"] for r in runs if r.get("stability")]
        model["points"][value] = {
            "values": [r["metrics"][metric] for r in runs if metric in (r.get("metrics") or {})],
            "diverged": sum(1 for s in records if s.get("diverged")),
            "spikes": sum(s.get("spikes", 0) for s in records) if records else None}
    return values, series


def sweep_figure(results: dict, key: str | None = None, metric: str | None = None, spikes: bool = True):
    """The :class:`matplotlib.figure.Figure` described in the module docstring (``key``: the only swept key
    when ``None``; ``metric``: the plan's first). Artists carry ``gid`` ``mean:MODEL``, ``spread:MODEL``,
    ``diverged:MODEL`` and ``spikes:MODEL`` so that tests can read the plotted data back."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.transforms import blended_transform_factory

    keys = sweep_keys(results)
    if not keys:
        raise SweepPlotError("no sweep rows (rows with `sweep_key`): expected the results.json of a plan with a "
                             "`sweep:` row, e.g. experiments/stability.yaml")
    if key is None and len(keys) > 1:
        raise SweepPlotError(f"several swept keys ({', '.join(keys)}): choose one with --key")
    key = key or keys[0]
    if key not in keys:
        raise SweepPlotError(f"no rows sweep {key!r}; swept keys: {', '.join(keys)}")
    metric = metric or results["plan"]["metrics"][0]
    if metric not in results["plan"]["metrics"]:
        raise SweepPlotError(f"metric {metric!r} is not one of the plan's metrics {results['plan']['metrics']}")
    values, series = sweep_series(results, key, metric)
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    log_x = numeric and all(v > 0 for v in values)
    position = {v: (v if numeric else i) for i, v in enumerate(values)}
    with_spikes = spikes and any(p["spikes"] is not None for m in series.values() for p in m["points"].values())

    fig = Figure(figsize=(7.2, 6.4 if with_spikes else 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    if with_spikes:
        ax, ax_spikes = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1.2))
    else:
        ax, ax_spikes = fig.add_subplot(), None
    bottom = blended_transform_factory(ax.transData, ax.transAxes)  # x in data, y in axes fraction
    for i, (model, data) in enumerate(series.items()):
        points = [(position[v], data["points"][v]) for v in values if v in data["points"]]
        _draw_model(ax, ax_spikes, bottom, i, model, data["label"], points, log_x)
    ax.plot([], [], linestyle="none", marker="x", color="0.3", markeredgewidth=2, label="diverged seed")
    scores = [v for m in series.values() for p in m["points"].values() for v in p["values"]]
    diverged = any(p["diverged"] for m in series.values() for p in m["points"].values())
    if scores:  # a strip below the lowest score for the crosses: the data start at axes fraction `strip`
        strip, lo, hi = 0.06 + 0.05 * len(series) if diverged else 0.05, min(scores), max(scores)
        top = hi + 0.05 * ((hi - lo) or 1.0)
        ax.set_ylim((lo - strip * top) / (1 - strip), top)
    last = ax_spikes if ax_spikes is not None else ax
    if log_x:
        ax.set_xscale("log")
        ax.set_xlim(min(values) / 1.6, max(values) * 1.6)  # every value visible, also where all seeds diverged
        last.set_xticks(values, [f"{v:g}" for v in values])
        last.minorticks_off()
    else:
        last.set_xticks(list(position.values()), [str(v) for v in values])
    last.set_xlabel(key)
    ax.set_ylabel(f"{metric}\n(mean over seeds; band: min–max)")
    fig.suptitle(textwrap.fill(results["plan"].get("title", ""), 100), fontsize="small")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncols=min(len(series) + 1, 3), fontsize="small")
    if ax_spikes is not None:
        ax_spikes.set_ylabel("gradient-norm spikes\n(sum over seeds)")
        ax_spikes.grid(alpha=0.3)
        ax_spikes.set_ylim(bottom=-0.5)
    return fig


def _draw_model(ax, ax_spikes, bottom, index: int, model: str, label: str, points: list, log_x: bool) -> None:
    """One model's line of seed means, its min–max band, a cross per diverged seed (at height ``index`` of the
    strip below the data, ``bottom``: x in data, y in axes fraction) and its spike counts on ``ax_spikes``."""
    color = f"C{index}"
    scored = [(x, p["values"]) for x, p in points if p["values"]]
    xs = [x for x, _ in scored]
    ax.plot(xs, [sum(v) / len(v) for _, v in scored], marker="o", color=color, label=label, gid=f"mean:{model}")
    ax.fill_between(xs, [min(v) for _, v in scored], [max(v) for _, v in scored], color=color, alpha=0.18,
                    linewidth=0, gid=f"spread:{model}")
    crosses = []  # one per diverged seed, side by side around the swept value, one height per model
    for x, p in points:
        k = p["diverged"]
        offsets = [(j - (k - 1) / 2) * 0.06 for j in range(k)]
        crosses += [x * 10 ** o if log_x else x + o for o in offsets]
    if crosses:  # (an empty unclipped line would upset the constrained layout)
        ax.plot(crosses, [0.04 + 0.05 * index] * len(crosses), linestyle="none", marker="x", markersize=7,
                markeredgewidth=2, color=color, transform=bottom, clip_on=False, gid=f"diverged:{model}")
    if ax_spikes is not None:
        counted = [(x, p["spikes"]) for x, p in points if p["spikes"] is not None]
        ax_spikes.plot([x for x, _ in counted], [s for _, s in counted], marker="s", color=color,
                       gid=f"spikes:{model}")


def save_sweep_figure(results: dict, out_png: str | Path, key: str | None = None, metric: str | None = None,
                      spikes: bool = True) -> Path:
    """Draw :func:`sweep_figure` and write it to ``out_png`` (whole file or nothing; folders created)."""
    fig = sweep_figure(results, key, metric, spikes)
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out_png, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    return out_png


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``hyperplex report sweep``."""
    p.add_argument("results", help="results.json of a sweep plan (hyperplex experiment)")
    p.add_argument("out", help="PNG file to write, e.g. docs/figures/stability.png")
    p.add_argument("--key", help="swept config key (default: the only one)")
    p.add_argument("--metric", help="metric to plot (default: the plan's first)")
    p.add_argument("--no-spikes", action="store_true", help="leave out the gradient-norm spike panel")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return p


def run(args: argparse.Namespace, prog: str = PROG) -> int:
    """Draw the figure a command line asks for; returns the exit status (2 for an unusable results.json)."""
    import json

    from hyperplex.guards import OutputError, check_outputs

    try:
        check_outputs({"out": args.out}, [args.results])
        results = json.loads(Path(args.results).read_text(encoding="utf-8"))
        if not isinstance(results, dict) or "rows" not in results or "plan" not in results:
            raise SweepPlotError("expected the results.json of a plan (an object with `plan` and `rows`)")
        path = save_sweep_figure(results, args.out, args.key, args.metric, not args.no_spikes)
    except (OSError, json.JSONDecodeError, SweepPlotError, OutputError) as err:
        print(f"error: {args.results}: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """:func:`run` on the command line ``argv`` (``hyperplex report sweep ...`` from the shell)."""
    return run(build_parser(prog).parse_args(argv), prog)
