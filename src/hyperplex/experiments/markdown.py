"""The markdown of a plan's results: the table (mean ± std [95% t-interval] per metric over seeds,
parameters, training time), its header (commands, machines, dates, budget), the parameter-match and
sweep tables, and the ``<!-- plan:NAME -->`` section of a page such as ``docs/results.md``.

Pure functions on plain dicts (the ``results.json`` that :mod:`hyperplex.experiments.results` writes),
so a table can be re-rendered from a saved ``results.json`` without touching a model.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path

from hyperplex.experiments.provenance import describe_machine
from hyperplex.fileio import atomic_write_text

__all__ = ["format_duration", "format_count", "format_bytes", "render_markdown", "replace_section", "write_section",
           "param_match_lines", "quality_lines", "sweep_table", "sweep_plot_name", "plot_sweep"]


def format_duration(seconds: float | None) -> str:
    """``42 s`` / ``12.5 min`` / ``2.10 h``; ``–`` when unknown."""
    if seconds is None:
        return "–"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def format_count(count: int | None) -> str:
    """Parameter count as ``9.99M`` / ``400.1K`` / ``950``."""
    if count is None:
        return "–"
    for unit, scale in (("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f}{unit}"
    return str(count)


def format_bytes(count: int | None) -> str:
    """File size in decimal units: ``90.9 MB`` / ``512.0 KB`` / ``950 B``; ``–`` when unknown."""
    if count is None:
        return "–"
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def _metric_cell(summary: dict | None, digits: int) -> str:
    if not summary or not summary["n"]:
        return "–"
    cell = f"{summary['mean']:.{digits}f}"
    if summary["std"] is not None:
        lo, hi = summary["ci95"]
        cell += f" ± {summary['std']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"
    return cell


def _range_cell(values: list[int]) -> str:
    if not values:
        return "–"
    lo, hi = min(values), max(values)
    return format_count(lo) if lo == hi else f"{format_count(lo)}–{format_count(hi)}"


def render_markdown(results: dict, provenance_link: str | None = None) -> str:
    """The plan's results section (without the markers) from a ``results.json`` dict: the header, the
    table, the parameter-match and sweep tables, the list of rows and the models missing from the table.

    With ``provenance_link`` (a relative link to the plan's full report beside its records) the header
    names no command, machine or date but links there: a user's page states today's figures, and the
    record says how, where and when they were measured."""
    lines = [f"### {results['plan']['title']}", ""]
    if results["plan"].get("description"):
        lines += [results["plan"]["description"].strip(), ""]
    provenance = _provenance_lines(results) if provenance_link is None else \
        [f"- Commands, machines and dates: [{provenance_link}]({provenance_link})"]
    lines += provenance + _header_lines(results) + [""]
    table, notes = _table_lines(results)
    lines += table
    matches = param_match_lines(results)
    if matches:
        lines += ["", "Parameter match (counted on the trained models):", ""] + [f"- {m}" for m in matches]
    for key in dict.fromkeys(r["sweep_key"] for r in results["rows"] if r.get("sweep_key")):
        lines += ["", *sweep_table(results, key)]
    lines += ["", "Rows (config and overrides; every row also gets the budget and `--seed=K`):", ""]
    lines += [_row_line(row) for row in results["rows"]]
    if notes:
        lines += ["", "Missing from the table (not counted in n):", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _grouped_commands(commands) -> list[tuple[str, int]]:
    """Training commands that differ only in the values of ``--rows`` and ``--seeds`` as one template (those
    values written ``ROW`` and ``K``) with the number of calls, in first-seen order: a plan trained a model per
    call (as the CPU lanes do) would otherwise list one near-identical line per model. A command alone in its
    group, or one that does not split as a shell line, is kept as it was."""
    groups: dict[str, list[str]] = {}
    for command in commands:
        try:
            words = shlex.split(command)
        except ValueError:
            groups.setdefault(command, []).append(command)
            continue
        template, skipping = [], False
        for word in words:
            if word in ("--rows", "--seeds"):
                template += [word, "ROW" if word == "--rows" else "K"]
                skipping = True
            elif skipping and not word.startswith("-"):
                continue
            else:
                skipping = False
                template.append(word)
        groups.setdefault(shlex.join(template), []).append(command)
    return [(members[0], 1) if len(members) == 1 else (template, len(members)) for template, members in groups.items()]


def _provenance_lines(results: dict) -> list[str]:
    """The first bullets under the title: the commands, machines and dates that produced the report."""
    lines = [f"- Command (from the repository root): `{results['command']}`"]
    for template, count in _grouped_commands(c for c in results.get("training_commands", [])
                                             if c != results["command"]):
        lines.append(f"- Models trained by: `{template}`" if count == 1 else
                     f"- Models trained by ({count} calls that differ only in ROW and K): `{template}`")
    for info in results.get("training_machines") or []:
        lines.append(f"- Training machine: {describe_machine(info)}")
    lines.append(f"- Report written on: {describe_machine(results['machine'])}, {results['date']}")
    if results.get("recorded"):
        lines.append(f"- {len(results['recorded'])} model(s) reported from their records (`run.py --records`: config, "
                     "logs and evaluations kept without the checkpoint, written where the model was trained and "
                     "evaluated), not re-evaluated for this report")
    if results.get("trained_between"):
        lines.append(f"- Models trained between {results['trained_between'][0]} and {results['trained_between'][1]}")
    return lines


def _header_lines(results: dict) -> list[str]:
    """The bullets after the provenance: budget, what the cells mean, the quality metrics, sacreBLEU signatures."""
    plan = results["plan"]
    lines = []
    budget = " ".join(plan.get("budget", [])) or "(none: each config's own)"
    lines.append(f"- Budget and settings applied to every row: `{budget}`")
    lines.append(f"- Metrics on the validation split, checkpoint `{plan['checkpoint']}`, beam from each row's config; "
                 "cells are mean ± sample std over the n seeds [95% t-interval of the mean] (a single value when "
                 "n = 1). Training time is wall-clock per model (data preparation and periodic validation "
                 "included), mean over seeds; ≈ marks times partly read from train.log time stamps.")
    lines += [f"- {line}" for line in quality_lines(results)]
    lines += [f"- sacreBLEU signature, {signature}" for signature in results.get("signatures", [])]
    return lines


def _table_lines(results: dict) -> tuple[list[str], list[str]]:
    """(the results table, one note per seed missing from it). Plans with ``quality:`` add three size columns."""
    metrics, digits = results["plan"]["metrics"], results["plan"].get("digits", 2)
    sized = any(r.get("size") for row in results["rows"] for r in row["runs"])
    held = any("held_bytes" in r.get("size", {}) for row in results["rows"] for r in row["runs"])
    header = ["row", "n"] + metrics + ["params", "params w/o emb."] + \
        (["converted layers", "params of those layers", "file size"] if sized else []) + \
        (["weights in memory"] if held else []) + ["training time"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" + "---:|" * (len(header) - 1)]
    notes: list[str] = []
    for row in results["rows"]:
        done = [r for r in row["runs"] if r.get("metrics")]
        cells = [row["label"], str(len(done))]
        cells += [_metric_cell(row["summary"].get(m), digits) for m in metrics]
        cells.append(_range_cell([r["params"]["total"] for r in done if r.get("params")]))
        cells.append(_range_cell([r["params"]["total_without_embeddings"] for r in done if r.get("params")]))
        if sized:
            cells += _size_cells([r["size"] for r in done if r.get("size")])
        if held:
            cells.append(_bytes_cell([r["size"]["held_bytes"] for r in done if "held_bytes" in r.get("size", {})]))
        cells.append(_time_cell(done))
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        for r in row["runs"]:
            if not r.get("metrics"):
                notes.append(f"`{row['name']}` seed {r['seed']}: {r.get('error') or _missing_status(r)}")
    return lines, notes


def _bytes_cell(values: list[int]) -> str:
    """A byte count, or the range over seeds."""
    if not values:
        return "–"
    return format_bytes(min(values)) if min(values) == max(values) else \
        f"{format_bytes(min(values))}–{format_bytes(max(values))}"


def _size_cells(sizes: list[dict]) -> list[str]:
    """Converted layers, their parameters and the file size of a row's models (ranges over seeds)."""
    return [_range_cell([s["converted_layers"] for s in sizes]), _range_cell([s["selected_params"] for s in sizes]),
            _bytes_cell([s["file_bytes"] for s in sizes])]


def _time_cell(done: list[dict]) -> str:
    """Mean training time over the evaluated seeds; ``≈`` when part of it was read from train.log stamps."""
    times = [r["train_seconds"] for r in done if r.get("train_seconds") is not None]
    cell = format_duration(math.fsum(times) / len(times)) if times else "–"
    return "≈" + cell if any(r.get("train_time_source") == "train.log" for r in done) else cell


def _missing_status(run: dict) -> str:
    """Why a seed has no metrics, from its status."""
    status = {"new": "not trained", "partial": "not trained (empty folder)",
              "diverged": f"diverged (non-finite loss at step {(run.get('stability') or {}).get('nan_step')})"
              }.get(run.get("status") or "", run.get("status"))
    return status or "not trained"


def _row_line(row: dict) -> str:
    """One bullet of the row list: label, name, seeds, beam, config and overrides (or whose models it scores)."""
    source = f"the models of `{row['models_from']}`" if row.get("models_from") else \
        "`" + " ".join([row["config"], *row["overrides"]]) + "`"
    extra = f", evaluated with `{' '.join(row['eval_overrides'])}`" if row.get("eval_overrides") else ""
    extra += f", scored on `{row['eval_split']}`" if row.get("eval_split") else ""
    beam = f", beam {row['beam_size']}" if row.get("beam_size") else ""
    if row.get("train") is False:
        extra += "; **not healed**: the model as built (a conversion: straight after it), evaluated without " \
                 "training (no budget)"
    return f"- **{row['label']}** (`{row['name']}`, seeds {row['seeds']}{beam}): {source}{extra}"


def quality_lines(results: dict) -> list[str]:
    """What each quality metric of a ``quality:`` plan measures (:mod:`hyperplex.scoring.plan_metrics`), with the counts
    the first evaluated model recorded; none for other plans."""
    quality = results["plan"].get("quality")
    if not quality:
        return []
    details: dict = next((r["quality_details"] for row in results["rows"] for r in row["runs"]
                          if r.get("quality_details")), {})
    lines = []
    if "agreement" in quality:
        count = details.get("agreement", {}).get("sentences")
        lines.append(f"`agreement`: mean cosine between the model's and the teacher's sentence embeddings on the "
                     f"distinct lines of `{quality['agreement']['file']}`"
                     + (f" ({count:,} sentences)" if count else "") + "; the teacher scores 1")
    if "wikiqa" in quality:
        w = details.get("wikiqa", {})
        lines.append(f"`wikiqa_map` / `wikiqa_mrr`: zero-shot answer selection on `{quality['wikiqa']['file']}`, each "
                     "question's candidates ranked by the cosine of question and answer embeddings"
                     + (f" ({w['questions']} questions with a correct answer, {w['candidates']:,} candidates)"
                        if w.get("questions") else ""))
    if "sst2_probe" in quality:
        q = quality["sst2_probe"]
        pool = details.get("sst2_probe", {}).get("pool")
        carve = ("whole sentences only (rows inside no other row, token boundaries: no test sentence is a probe "
                 "training text or inside one)" if q["carve"] == "sentences" else "any rows (phrases included)")
        lines.append(f"`sst2_probe`: accuracy of a logistic-regression probe (C = {q['C']:g}) on the frozen "
                     f"embeddings, trained on {q['train_size']:,} and tested on {q['test_size']:,} other rows of "
                     f"`{q['file']}` drawn with split seed {q['split_seed']} from {carve}"
                     + (f"; pool {pool:,} rows" if pool else ""))
    lines.append("Sizes: *converted layers* = layers replaced by PHM / low-rank; *params of those layers* = their "
                 "parameters (bias included) after conversion, for the teacher the same layers dense; *file size* = "
                 "`model.safetensors` written by `hyperplex.convert.save_converted` (float32)")
    return lines


def param_match_lines(results: dict) -> list[str]:
    """One line per row with ``match_params``: its parameters (total and without embeddings) next to the
    named row's, with the relative difference (first counted seed of each; counts do not vary by seed)."""
    by_name = {r["name"]: r for r in results["rows"]}
    lines = []
    for row in results["rows"]:
        ref = by_name.get(row.get("match_params") or "")
        counted = [r["params"] for r in row["runs"] if r.get("params")]
        ref_counted = [r["params"] for r in ref["runs"] if r.get("params")] if ref else []
        if ref is None or not counted or not ref_counted:
            continue
        parts = []
        for key, what in (("total_without_embeddings", "without embeddings"), ("total", "total")):
            a, b = counted[0][key], ref_counted[0][key]
            parts.append(f"{what} {a:,} vs {b:,} ({a / b - 1:+.2%})")
        lines.append(f"**{row['label']}** vs **{ref['label']}**: " + "; ".join(parts))
    return lines


def _sweep_groups(results: dict, key: str) -> tuple[list, dict]:
    """(swept values in plan order, {base row: {value: row}}) of the rows sweeping ``key``."""
    values: list = []
    groups: dict[str, dict] = {}
    for row in results["rows"]:
        if row.get("sweep_key") == key:
            if row["sweep_value"] not in values:
                values.append(row["sweep_value"])
            groups.setdefault(row["sweep_of"], {})[row["sweep_value"]] = row
    return values, groups


def _sweep_cell(row: dict, metric: str, digits: int) -> str:
    runs = [r for r in row["runs"] if r.get("status") in ("finished", "diverged")]
    if not runs:
        return "–"
    summary = row["summary"].get(metric) or {"n": 0}
    cell = f"{summary['mean']:.{digits}f}" if summary["n"] else "–"
    if summary["n"] and summary["std"] is not None:
        cell += f" ± {summary['std']:.{digits}f}"
    cell += f" ({summary['n']})"
    diverged = sum(1 for r in runs if (r.get("stability") or {}).get("diverged"))
    spikes = sum((r.get("stability") or {}).get("spikes", 0) for r in runs)
    if diverged:
        cell += f", {diverged}/{len(runs)} diverged"
    if spikes:
        cell += f", {spikes} spike{'s' if spikes > 1 else ''}"
    return cell


def sweep_table(results: dict, key: str) -> list[str]:
    """Markdown lines of a sweep over ``key``: one table row per swept model, one column per value;
    cells are the first metric's mean ± std (n finished seeds), diverged seeds and gradient-norm spikes."""
    plan = results["plan"]
    metric, digits = plan["metrics"][0], plan.get("digits", 2)
    values, groups = _sweep_groups(results, key)
    short = key.rsplit(".", 1)[-1]
    lines = [f"Sweep over `{key}` ({metric}: mean ± std over the seeds that finished (n); a seed *diverged* when its "
             "loss became NaN/inf, which stops training, or its last logged training loss is above its first; a "
             "*spike* is a logged window whose largest gradient norm exceeds 10 × the run's median; plot "
             f"`{sweep_plot_name(key)}` next to results.md):", "",
             "| model | " + " | ".join(f"{short} {v:g}" if isinstance(v, float) else f"{short} {v}" for v in values)
             + " |", "|---|" + "---:|" * len(values)]
    for _base, by_value in groups.items():
        label = next(iter(by_value.values()))["label"].rsplit(", ", 1)[0]
        cells = [_sweep_cell(by_value[v], metric, digits) if v in by_value else "–" for v in values]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def sweep_plot_name(key: str) -> str:
    """File name of the sweep plot over ``key``: ``sweep-training.lr.png``."""
    return f"sweep-{key}.png"


def plot_sweep(results: dict, key: str, out_png: str | Path) -> Path:
    """The sweep figure of :mod:`hyperplex.experiments.plot` (metric vs swept value, one line per model with the
    seed spread, diverged seeds as crosses, gradient-norm spikes below), written to ``out_png``."""
    from hyperplex.experiments.plot import save_sweep_figure

    return save_sweep_figure(results, out_png, key)


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- plan:{name} -->", f"<!-- /plan:{name} -->"


def replace_section(text: str, name: str, body: str) -> str:
    """``text`` with the section between ``<!-- plan:NAME -->`` and ``<!-- /plan:NAME -->`` (markers
    included) replaced by ``body`` inside fresh markers, or that section appended when absent.
    Idempotent: replacing with the same body twice gives the same text."""
    start, end = _markers(name)
    section = f"{start}\n{body.rstrip()}\n{end}\n"
    i, j = text.find(start), text.find(end)
    if i < 0 and j < 0:
        sep = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
        return text + sep + section
    if i < 0 or j < i:
        raise ValueError(f"the markers of plan {name!r} are broken: expected {start!r} followed by {end!r}")
    if text.find(start, i + 1) >= 0:
        raise ValueError(f"the marker {start!r} appears more than once; remove the duplicate section")
    tail = text[j + len(end):]
    return text[:i] + section + (tail[1:] if tail.startswith("\n") else tail)


def write_section(path: str | Path, name: str, body: str) -> Path:
    """Replace (or append) plan ``name``'s section of the markdown file ``path`` (created if absent)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    new = replace_section(text, name, body)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, new)  # whole file or nothing
    return path
