"""At convergence: how far each model of an early-stopped plan trained, and the gaps between rows.

A plan whose rows train until the validation metric stops improving (``training.patience``) is read
from its ``results.json`` and its records (``metrics.csv``, ``train.log`` of each model): the best
validation value and the step and epoch that reached it, why training stopped (early stopping, a step
or epoch cap, divergence), and the differences between rows' means with a 95% Welch interval and, over the
seeds both rows finished, a 95% interval of the per-seed differences (seed k of every row trains on the same
batches in the same order, so the rows' seeds are paired by design and not independent). The
paper's own gaps (its Table 2 for translation, its Table 4 for style transfer) are quoted beside them, marked
as the paper's, on its data. ``--figure`` draws the
rows' validation curves: each row's mean over seeds of the best value reached by each step (what a checkpoint
kept at that step would score), every seed's own validations faint, and each model's best checkpoint marked.
"""

from __future__ import annotations

import csv
import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from hyperplex.experiments.intervals import summarize, t_quantile_975
from hyperplex.experiments.state import DIVERGED_FILE
from hyperplex.fileio import atomic_write

__all__ = ["PAPER_TABLE2", "PAPER_TABLE4", "PAPER_TABLES", "best_by", "training_course", "welch_gap", "paired_gap",
           "row_courses",
           "convergence_section", "mean_best_curve", "convergence_figure"]

#: Zhang et al. (ICLR 2021), Table 2, BLEU on seven corpora — quoted from the paper, never measured here.
PAPER_TABLE2 = {
    "corpora": ["En-Vi", "En-Id", "De-En", "Ro-En", "En-Et", "En-Mk", "En-Ro"],
    "Transformer": [28.43, 47.40, 36.68, 34.60, 14.17, 13.96, 22.79],
    "Quaternion Tm": [28.00, 42.22, 32.83, 30.53, 13.10, 13.67, 18.50],
    "PHM-Tm n=2": [29.25, 46.32, 35.52, 33.40, 14.98, 13.60, 21.73],
    "PHM-Tm n=4": [29.13, 44.13, 35.53, 32.74, 14.11, 13.01, 21.19],
    "PHM-Tm n=8": [29.34, 40.81, 34.16, 31.88, 13.08, 12.95, 21.66],
    "PHM-Tm n=16": [29.04, 33.48, 33.89, 31.53, 12.15, 11.97, 19.63],
    "PHM-Tm† n=4": [29.17, 46.24, 34.86, 33.80, 14.43, 13.78, 21.91],
}

#: Zhang et al. (ICLR 2021), Table 4, BLEU of Modern→Shakespeare style transfer — quoted, never measured here.
PAPER_TABLE4 = {
    "corpora": ["Modern→Shakespeare"],
    "Transformer": [11.65],
    "PHM-Tm n=2": [12.20],
    "PHM-Tm n=4": [12.42],
    "PHM-Tm n=8": [11.66],
    "PHM-Tm n=16": [10.76],
}

#: The paper's row a quoted gap is measured from unless a comparison names another.
PAPER_BASELINE = "Transformer"

#: The paper tables that ``--paper-table`` can quote, by number.
PAPER_TABLES = {2: PAPER_TABLE2, 4: PAPER_TABLE4}


def _paper_rows(table: dict) -> list[str]:
    """The model rows of a quoted paper table (its ``corpora`` entry names the columns, not a model)."""
    return [k for k in table if k != "corpora"]


_FINISHED = re.compile(r"finished at step (\d+) \(epoch (\d+)\): (.*)$")
_STEPS_PER_EPOCH = re.compile(r"\((\d+) steps per epoch")


def _stop_kind(reason: str) -> str:
    """``early stopping`` | ``step cap`` | ``epoch cap`` | ``other`` from the trainer's final log line."""
    if reason.startswith("early stopping"):
        return "early stopping"
    if "max_steps" in reason:
        return "step cap"
    if "max_epochs" in reason:
        return "epoch cap"
    return "other"


def training_course(files: Path, metric: str = "bleu") -> dict:
    """The course of one model from its folder or record ``files``: ``{"best", "best_step", "best_epoch",
    "last_step", "stop"}``. ``best`` is the highest validation ``metric`` in ``metrics.csv`` (the first
    validation (split ``dev``) reaching it gives the step, as the trainer keeps the first best checkpoint);
    ``best_epoch`` is the epochs of training data before it, ``best_step`` over the steps per epoch that the
    trainer's budget line logged (the first epoch's; bucketed batches vary by a step or so between epochs), or,
    in a log without that line, the epoch that ``metrics.csv`` names. ``stop`` is ``early stopping``, ``step
    cap``, ``epoch cap``, ``diverged``, ``unfinished`` or ``other``."""
    best: float | None = None
    best_step: int | None = None
    best_epoch: float | None = None
    last_step = 0
    curve = []
    metrics = files / "metrics.csv"
    if metrics.is_file():
        with metrics.open(newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                step = int(row["step"])
                last_step = max(last_step, step)
                if row["split"] == "dev" and row["name"] == metric:
                    value = float(row["value"])
                    curve.append((step, value))
                    if math.isfinite(value) and (best is None or value > best):
                        best, best_step, best_epoch = value, step, int(row["epoch"])
    stop = "unfinished"
    steps_per_epoch = None
    log = files / "train.log"
    if log.is_file():
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            found = _FINISHED.search(line)
            if found:
                stop, last_step = _stop_kind(found.group(3)), max(last_step, int(found.group(1)))
            per_epoch = _STEPS_PER_EPOCH.search(line)
            if per_epoch and steps_per_epoch is None and int(per_epoch.group(1)) > 0:
                steps_per_epoch = int(per_epoch.group(1))
    if best_step is not None and steps_per_epoch:
        best_epoch = best_step / steps_per_epoch
    if (files / DIVERGED_FILE).is_file():
        stop = "diverged"
    return {"best": best, "best_step": best_step, "best_epoch": best_epoch, "last_step": last_step, "stop": stop,
            "trained_on": _trained_on(files), "curve": sorted(curve)}


def best_by(course: dict, step: int) -> float | None:
    """The best validation value a model had reached by ``step`` (its validations at steps ≤ ``step``): the score
    of the checkpoint ``checkpoint: best`` would hold had training ended there. A model that stopped earlier keeps
    its final best; ``None`` before its first validation."""
    values = [v for s, v in course.get("curve", []) if s <= step and math.isfinite(v)]
    return max(values) if values else None


def _trained_on(files: Path) -> list[str]:
    """``DEVICE, torch VERSION`` of every training segment of the model (``experiment.json``), in order, once each."""
    import json

    try:
        segments = json.loads((files / "experiment.json").read_text(encoding="utf-8")).get("segments", [])
    except (OSError, ValueError, AttributeError):
        return []
    seen = []
    for segment in segments:
        machine = segment.get("machine") or {} if isinstance(segment, dict) else {}
        where = f"{machine.get('device', '?')}, torch {machine.get('torch', '?')}"
        if where not in seen:
            seen.append(where)
    return seen


def welch_gap(a: list[float], b: list[float]) -> dict:
    """mean(a) − mean(b) with a two-sided 95% Welch interval: ``{"diff", "ci95", "n_a", "n_b"}`` (``ci95`` is
    None with fewer than two values on a side, ``[diff, diff]`` when neither side varies; seeds of two rows are
    independent models, so not paired)."""
    if len(a) < 2 or len(b) < 2:
        diff = math.fsum(a) / len(a) - math.fsum(b) / len(b) if a and b else None
        return {"diff": diff, "ci95": None, "n_a": len(a), "n_b": len(b)}
    diff = math.fsum(a) / len(a) - math.fsum(b) / len(b)
    va, vb = (summarize(v)["std"] ** 2 / len(v) for v in (a, b))
    se = math.sqrt(va + vb)
    if se == 0:
        return {"diff": diff, "ci95": [diff, diff], "n_a": len(a), "n_b": len(b)}
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile_975(df) * se
    return {"diff": diff, "ci95": [diff - half, diff + half], "n_a": len(a), "n_b": len(b)}


def paired_gap(a: dict[int, float], b: dict[int, float]) -> dict:
    """The mean over the seeds in both ``a`` and ``b`` (seed → value) of ``a[seed] − b[seed]``, with a two-sided
    95% t interval on n − 1 degrees of freedom: ``{"diff", "ci95", "n"}`` (``ci95`` None under two common seeds).
    Seed k of every row of a plan draws the same batches in the same order (the batch order is the seed's), so
    the two rows' values are not independent samples; their per-seed differences are."""
    common = sorted(set(a) & set(b))
    diffs = [a[seed] - b[seed] for seed in common]
    if not diffs:
        return {"diff": None, "ci95": None, "n": 0}
    diff = math.fsum(diffs) / len(diffs)
    if len(diffs) < 2:
        return {"diff": diff, "ci95": None, "n": 1}
    half = t_quantile_975(len(diffs) - 1) * summarize(diffs)["std"] / math.sqrt(len(diffs))
    return {"diff": diff, "ci95": [diff - half, diff + half], "n": len(diffs)}


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _files(run: dict, records: Path | None, row: str) -> Path:
    recorded = records / row / f"seed{run['seed']}" if records else None
    if recorded is not None and recorded.is_dir():
        return recorded
    return Path(run.get("record") or run["model_dir"])


def row_courses(results: dict, records: Path | None, metric: str = "bleu") -> list[dict]:
    """One entry per trained row of ``results.json``: label, the reported metric's summary over seeds, the
    per-seed courses (:func:`training_course`), parameters and mean training seconds."""
    rows = []
    for row in results["rows"]:
        if row.get("models_from"):
            continue
        runs: list[dict] = []
        diverged: list[dict] = []  # no score, but a stop to report
        for r in row["runs"]:
            if r.get("status") == "diverged":
                diverged.append(r)
            elif r.get("status") == "finished" and metric in r.get("metrics", {}):
                # a finished run whose score is not a finite number would make the mean and both gaps NaN
                (runs if _finite(r["metrics"][metric]) else diverged).append(r)
        courses = [training_course(_files(r, records, row["name"]), metric) for r in runs]
        stops = Counter(c["stop"] for c in courses) + Counter("diverged" for _ in diverged)
        seconds = [r["train_seconds"] for r in runs if r.get("train_seconds")]
        params = runs[0]["params"]["total"] if runs and runs[0].get("params") else None
        rows.append({"name": row["name"], "label": row["label"], "values": [r["metrics"][metric] for r in runs],
                     "by_seed": {r["seed"]: r["metrics"][metric] for r in runs if "seed" in r},
                     "summary": summarize([r["metrics"][metric] for r in runs]), "courses": courses,
                     "stops": stops, "diverged": len(diverged),
                     "diverged_at": [(r["seed"], (r.get("stability") or {}).get("nan_step")) for r in diverged],
                     "params": params, "seconds": math.fsum(seconds) / len(seconds) if seconds else None,
                     "seconds_by_device": _seconds_by_device(runs, courses),
                     "planned": len(row.get("seeds") or row["runs"])})
    return rows


def _seconds_by_device(runs: list[dict], courses: list[dict]) -> dict[str, list[float]]:
    """Each seed's training seconds under the device kind it trained on (``cpu``, ``cuda``; ``cuda+cpu`` for a
    model resumed on another kind), so that a row whose seeds trained on a GPU and in a CPU lane does not report
    one mean of minutes and hours."""
    found: dict[str, list[float]] = {}
    for run, course in zip(runs, courses):
        if not run.get("train_seconds"):
            continue
        kinds = []
        for where in course.get("trained_on", []):
            kind = where.split(",")[0].split(" (")[0].strip() or "?"
            if kind not in kinds:
                kinds.append(kind)
        found.setdefault("+".join(kinds) or "?", []).append(run["train_seconds"])
    return found


def _training_time(row: dict) -> str:
    """The mean training time over the seeds; per device kind, with the seeds' count, when they differ."""
    by = row.get("seconds_by_device") or {}
    if len(by) > 1:
        return "; ".join(f"{math.fsum(v) / len(v) / 60:.0f} min on {kind} ({len(v)})" for kind, v in by.items())
    return "–" if row["seconds"] is None else f"{row['seconds'] / 60:.0f} min"


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return math.fsum(values) / len(values) if values else None


def _devices(courses: list[dict]) -> list[str]:
    found = []
    for course in courses:
        found += [d for d in course.get("trained_on", []) if d not in found]
    return found


def _interval(summary: dict, digits: int = 2) -> str:
    if summary["mean"] is None:
        return "–"
    text = f"{summary['mean']:.{digits}f}"
    if summary.get("ci95"):
        low, high = summary["ci95"]
        text += f" [{low:.{digits}f}, {high:.{digits}f}]"
    return text


def _gap_text(gap: dict) -> str:
    if gap["diff"] is None:
        return "–"
    text = f"{gap['diff']:+.2f}"
    if gap["ci95"]:
        text += f" [{gap['ci95'][0]:+.2f}, {gap['ci95'][1]:+.2f}]"
    return text


def _paper_gap(table: dict, label: str, base: str) -> str:
    if label not in table or base not in table:
        return "–"
    diffs = [x - y for x, y in zip(table[label], table[base])]
    if len(diffs) == 1:
        return f"{diffs[0]:+.2f}"
    return f"{min(diffs):+.2f} … {max(diffs):+.2f} (mean {math.fsum(diffs) / len(diffs):+.2f})"


#: What the paper's column says of each table's gap, in the gap table's header.
_PAPER_HEADS = {2: "the paper's Table 2, same gap over its seven corpora (quoted, its data)",
                4: "the paper's Table 4, same gap (quoted, its models and training)"}


def _course_table(rows: dict, comparisons: list[tuple[str, ...]], steps: list[int], metric: str) -> list[str]:
    """Validation ``metric`` by each of ``steps`` (best so far, mean over seeds) and the gaps there."""
    head = " | ".join(f"by step {s:,}" for s in steps)
    lines = ["", f"Validation {metric} during training (the best so far at each step, mean over seeds; the "
                 "validation decoding the trainer used):", "", f"| model | {head} |",
             "|---|" + "---:|" * len(steps)]

    def at(row: dict, step: int) -> list[float]:
        return [v for v in (best_by(c, step) for c in row["courses"]) if v is not None]

    for r in rows.values():
        cells = [_mean(at(r, s)) for s in steps]
        lines.append(f"| {r['label']} | " + " | ".join("–" if c is None else f"{c:.2f}" for c in cells) + " |")
    for name, base, *_ in comparisons:
        if name in rows and base in rows:
            gaps = [_gap_text(welch_gap(at(rows[name], s), at(rows[base], s))) for s in steps]
            lines.append(f"| {rows[name]['label']} − {rows[base]['label']} | " + " | ".join(gaps) + " |")
    return lines


def convergence_section(results: dict, records: Path | None, comparisons: Sequence[tuple[str, ...]],
                        metric: str = "bleu", at_steps: list[int] | None = None, paper_table: int = 2) -> str:
    """Markdown: a table of every trained row at convergence and a table of gaps. ``comparisons`` lists
    ``(row, baseline row, paper label[, paper baseline])``: the paper label names the row of the paper's table
    ``paper_table`` (:data:`PAPER_TABLES`: 2 for translation, 4 for style transfer) whose gap to the paper's
    baseline row (default its Transformer) is quoted beside ours (empty for none). ``at_steps``: also a table of
    each row's best validation value by those steps and the same gaps there (how a gap at a fixed budget changed
    with training)."""
    if paper_table not in PAPER_TABLES:
        raise ValueError(f"paper_table: the paper tables quoted are {sorted(PAPER_TABLES)}, got {paper_table!r}")
    every = row_courses(results, records, metric)
    rows = {r["name"]: r for r in every if r["values"]}
    shown = [r for r in every if r["values"] or r["diverged"]]
    lines = [f"| model | seeds | {metric} of the best checkpoint [95% interval] | steps to best | epochs to best | "
             "stopped by | parameters | training time | trained on |", "|---|---:|---:|---:|---:|---|---:|---:|---|"]
    for r in shown:
        stopped = ", ".join(f"{k} {v}" for k, v in sorted(r["stops"].items())) or "–"
        step, epoch = _mean([c["best_step"] for c in r["courses"]]), _mean([c["best_epoch"] for c in r["courses"]])
        params = "–" if r["params"] is None else f"{r['params'] / 1e6:.2f}M"
        lines.append(f"| {r['label']} | {len(r['values'])}/{r['planned']} | {_interval(r['summary'])} | "
                     f"{'–' if step is None else f'{step:,.0f}'} | {'–' if epoch is None else f'{epoch:.1f}'} | "
                     f"{stopped} | {params} | {_training_time(r)} | {'; '.join(_devices(r['courses'])) or '–'} |")
    gone = [f"{r['label']} seed {seed}" + (f" (step {step})" if step is not None else "")
            for r in shown for seed, step in r["diverged_at"]]
    if gone:
        lines += ["", f"Diverged (a non-finite loss or validation metric; no score, so not in the mean or the gaps, "
                      f"and not retrained): {'; '.join(gone)}."]
    waiting = [r["label"] for r in every if not r["values"] and not r["diverged"]]
    if waiting:
        lines += ["", f"No finished model yet: {'; '.join(waiting)}."]
    # The paper's column only where a gap quotes it (the LSTM translator's rows have no row in the paper's tables).
    comparisons = [(*c, PAPER_BASELINE)[:4] for c in comparisons]
    quoted = any(paper for _, _, paper, _ in comparisons)
    paper_head = f" {_PAPER_HEADS[paper_table]} |" if quoted else ""
    lines += ["", f"| gap | ours: difference of mean {metric} [95% Welch interval] | ours: mean of the per-seed "
                  f"differences [95% interval] (seeds) |{paper_head}",
              "|---|---:|---:|" + ("---|" if quoted else "")]
    table = PAPER_TABLES[paper_table]
    for name, base, paper, paper_base in comparisons:
        if name not in rows or base not in rows:
            continue
        gap = welch_gap(rows[name]["values"], rows[base]["values"])
        paired = paired_gap(rows[name]["by_seed"], rows[base]["by_seed"])
        line = (f"| {rows[name]['label']} − {rows[base]['label']} | {_gap_text(gap)} | {_gap_text(paired)} "
                f"({paired['n']}) |")
        lines.append(line + (f" {_paper_gap(table, paper, paper_base) if paper else '–'} |" if quoted else ""))
    if at_steps:
        lines += _course_table(rows, comparisons, sorted(set(at_steps)), metric)
    return "\n".join(lines) + "\n"


def mean_best_curve(courses: list[dict]) -> list[tuple[int, float]]:
    """``(step, mean over the models of the best value each had reached by that step)`` at every step where one of
    ``courses`` validated, from the first step at which all of them had validated (before it the mean would be
    over fewer models). A model that stopped keeps its final best (:func:`best_by`)."""
    steps = sorted({s for c in courses for s, _ in c.get("curve", [])})
    points = []
    for step in steps:
        values = [best_by(c, step) for c in courses]
        present = [v for v in values if v is not None]
        if values and len(present) == len(values):
            points.append((step, math.fsum(present) / len(present)))
    return points


def convergence_figure(results: dict, records: Path | None, metric: str = "bleu", rows: list[str] | None = None):
    """The figure of the module docstring for the rows named in ``rows`` (all trained rows when None): a
    :class:`matplotlib.figure.Figure` whose artists carry ``gid`` ``mean:ROW``, ``seed:ROW:K`` (K the model's
    position in the row) and ``best:ROW``, so that tests can read the plotted data back."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    trained = {r["name"]: r for r in row_courses(results, records, metric) if r["values"]}
    names = rows or list(trained)
    missing = [name for name in names if name not in trained]
    if missing:
        raise ValueError(f"--figure-rows: no finished model in row(s) {', '.join(missing)} "
                         f"(rows with one: {', '.join(trained) or 'none'})")
    fig = Figure(figsize=(7.5, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    colors = [f"C{i}" for i in range(10)]
    for i, name in enumerate(names):
        row, color = trained[name], colors[i % len(colors)]
        for k, course in enumerate(row["courses"]):
            curve = course.get("curve", [])
            ax.plot([s for s, _ in curve], [v for _, v in curve], color=color, alpha=0.25, linewidth=0.8,
                    gid=f"seed:{name}:{k}")
        mean, seeds = mean_best_curve(row["courses"]), len(row["courses"])
        ax.plot([s for s, _ in mean], [v for _, v in mean], color=color, linewidth=2,
                label=f"{row['label']} ({seeds} seed{'' if seeds == 1 else 's'})", gid=f"mean:{name}")
        bests = [(c["best_step"], c["best"]) for c in row["courses"] if c["best"] is not None]
        ax.scatter([s for s, _ in bests], [v for _, v in bests], color=color, marker="o", s=18, zorder=3,
                   gid=f"best:{name}")
    ax.set_xlabel("training step")
    ax.set_ylabel(f"validation {metric}")
    ax.set_title(f"{results['plan']['name']}: validation {metric} during training\n(thick: mean over seeds of the "
                 f"best so far; faint: each validation; dots: the best checkpoints)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


PROG = "hyperplex report convergence"


def add_arguments(parser) -> None:
    """The options of ``hyperplex report convergence``."""
    parser.add_argument("results", help="a converged plan's results.json (e.g. experiments/records/PLAN/results.json)")
    parser.add_argument("--records", help="its records folder (default: the folder of results.json)")
    parser.add_argument("--metric", default="bleu", help="the validation metric early stopping watched (default bleu)")
    parser.add_argument("--compare", action="append", default=[], metavar="ROW:BASE[:PAPER[:PAPER_BASE]]",
                        help="a gap to report, ROW minus BASE (row names of the plan); PAPER names the row of the "
                             "paper's table (--paper-table) whose gap to PAPER_BASE (default its Transformer) is "
                             "quoted beside it: Table 2 "
                             f"({', '.join(k for k in _paper_rows(PAPER_TABLE2) if k != 'Transformer')}); Table 4 "
                             f"({', '.join(k for k in _paper_rows(PAPER_TABLE4) if k != 'Transformer')})")
    parser.add_argument("--paper-table", type=int, choices=sorted(PAPER_TABLES), default=2,
                        help="the paper's table that --compare's PAPER names: 2, translation on seven corpora "
                             "(default), or 4, Modern→Shakespeare style transfer")
    parser.add_argument("--at-steps", type=int, nargs="+", metavar="STEP",
                        help="also tabulate each row's best validation value by these steps and the gaps there "
                             "(e.g. a fixed budget's last step beside later ones)")
    parser.add_argument("--append-to", metavar="FILE",
                        help="also replace the <!-- plan:PLAN.convergence --> section of this markdown file")
    parser.add_argument("--figure", metavar="PNG",
                        help="also draw the rows' validation curves to this PNG (e.g. docs/figures/PLAN.png)")
    parser.add_argument("--figure-rows", metavar="ROW", nargs="+",
                        help="the rows the figure draws (default: every row with a finished model)")


def _comparisons(specs: list[str], rows: set[str], paper_table: int = 2) -> list[tuple[str, str, str, str]]:
    out = []
    known = _paper_rows(PAPER_TABLES[paper_table])
    for spec in specs:
        parts = spec.split(":")
        if len(parts) not in (2, 3, 4) or not all(parts[:2]) or (len(parts) == 4 and not all(parts[2:])):
            raise ValueError(f"--compare {spec!r}: expected ROW:BASE, ROW:BASE:PAPER or ROW:BASE:PAPER:PAPER_BASE")
        row, base = parts[:2]
        paper = parts[2] if len(parts) > 2 else ""
        paper_base = parts[3] if len(parts) > 3 else PAPER_BASELINE
        for name in (row, base):
            if name not in rows:
                raise ValueError(f"--compare {spec!r}: no row {name!r} in the plan (rows: {', '.join(sorted(rows))})")
        for name in (paper, paper_base) if paper else ():
            if name not in known:
                raise ValueError(f"--compare {spec!r}: the paper's Table {paper_table} has no row {name!r} "
                                 f"(its rows: {', '.join(known)}; --paper-table chooses the table)")
        out.append((row, base, paper, paper_base))
    return out


def run(args, prog: str = PROG) -> int:
    """Print (and with ``--append-to`` write) the convergence section of one plan; 1 with a message on bad input."""
    import json
    import sys

    from hyperplex.experiments.markdown import write_section
    from hyperplex.guards import OutputError, check_outputs

    path = Path(args.results)
    try:
        # never over the results it reads, nor the figure over the section
        check_outputs({"--append-to": args.append_to, "--figure": args.figure}, [args.results])
        results = json.loads(path.read_text(encoding="utf-8"))
        rows = {row["name"] for row in results["rows"]}
        comparisons = _comparisons(args.compare, rows, args.paper_table)
        if args.at_steps and min(args.at_steps) < 1:
            raise ValueError(f"--at-steps: steps are positive, got {min(args.at_steps)}")
    except (OSError, ValueError, KeyError, TypeError, OutputError) as err:
        print(f"{prog}: {path}: {err}", file=sys.stderr)
        return 1
    records = Path(args.records) if args.records else path.parent
    figure = None
    if args.figure:  # drawn before anything is written, so a bad --figure-rows leaves every file as it was
        try:
            figure = convergence_figure(results, records, args.metric, args.figure_rows)
        except ValueError as err:
            print(f"{prog}: {path}: {err}", file=sys.stderr)
            return 1
    body = convergence_section(results, records, comparisons, args.metric, args.at_steps, args.paper_table)
    print(body, end="")
    if args.append_to:
        write_section(args.append_to, f"{results['plan']['name']}.convergence", body)
    if figure is not None:
        Path(args.figure).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(args.figure, lambda tmp: figure.savefig(tmp, format="png", dpi=120))
        print(f"wrote {args.figure}", file=sys.stderr)
    return 0
