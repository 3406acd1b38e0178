"""A plan's results: every model evaluated (or read from its record) into one ``results.json`` dict,
then ``OUT/results.{json,md}``, the sweep plots, and the plan's section of a markdown page.

``results.json`` holds, per row, each seed's status, metrics, parameters, training time and stability,
and the row's :func:`~hyperplex.experiments.intervals.summarize` per metric; at the top, the plan, the
report's command, date and machine, and the training commands, machines and dates read from the models'
``experiment.json``. :mod:`hyperplex.experiments.markdown` renders it as markdown.

A report that repeats the one saved before it (same command, same models, same numbers) leaves that
report as it is — its date, machine, and whether each model was read from its folder or from its record
(:data:`REPORT_PROVENANCE`) — so regenerating a page from committed records changes no byte of it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hyperplex.experiments import markdown as report
from hyperplex.experiments.evaluation import cached_evaluation
from hyperplex.experiments.intervals import summarize
from hyperplex.experiments.plan import Plan, Row
from hyperplex.experiments.provenance import machine_info, read_run_file
from hyperplex.experiments.records import write_record
from hyperplex.experiments.runs import Run
from hyperplex.experiments.stability import stability
from hyperplex.experiments.state import folder_status
from hyperplex.experiments.timing import training_time
from hyperplex.guards import write_set

__all__ = ["REPORT_PROVENANCE", "collect", "write_results", "keep_report_provenance"]

#: Keys of ``results.json`` (and of each run in it) that describe the writing of the report, not what it reports.
REPORT_PROVENANCE = ("date", "machine", "recorded")
RUN_PROVENANCE = ("record",)


class _Provenance:
    """The training commands, machines and times of the models a report covers, in first-seen order."""

    def __init__(self) -> None:
        self.machines: list[str] = []
        self.commands: list[str] = []
        self.starts: list[str] = []
        self.ends: list[str] = []
        self.signatures: list[str] = []

    def add(self, item: dict, files: Path) -> None:
        self.signatures += [f"{k}: {v}" for k, v in item.get("signatures", {}).items()]
        for seg in read_run_file(files)["segments"]:
            self.machines.append(seg["machine"])
            self.commands.append(seg["command"])
            self.starts.append(seg["started"])
            if seg.get("seconds") is not None:
                self.ends.append(dt.datetime.fromtimestamp(seg["start"] + seg["seconds"]).isoformat(timespec="seconds"))


def _unique(items: list) -> list:
    return [x for i, x in enumerate(items) if x not in items[:i]]  # order kept; items may be dicts


def collect(plan: Plan, all_runs: list[Run], resolved: dict, data_root: str | None, command: str,
            failures: dict[Path, str], records: Path | None = None) -> dict:
    """Evaluate every finished model of the plan and build the ``results.json`` dict; with ``records``, each
    evaluated model folder's record is written (or refreshed) there, and recorded models are read from it."""
    by_key = {(r.row.name, r.seed): r for r in all_runs}
    seen = _Provenance()
    rows = []
    for row in plan.rows:
        entry = _row_entry(row, resolved.get(row.name))
        for seed in row.seeds:
            run = by_key[(row.models_from or row.name, seed)]
            item = _run_item(plan, row, run, data_root, failures, seen)
            if records and run.record is None and item["status"] in ("finished", "diverged") and "error" not in item:
                write_record(run, records, plan.name)
            entry["runs"].append(item)
        entry["summary"] = {m: summarize([r["metrics"][m] for r in entry["runs"] if m in r.get("metrics", {})])
                            for m in plan.metrics}
        rows.append(entry)
    plan_entry = {"name": plan.name, "title": plan.title, "description": plan.description, "path": str(plan.path),
                  "budget": plan.budget, "metrics": plan.metrics, "checkpoint": plan.checkpoint, "digits": plan.digits}
    if plan.quality:
        plan_entry["quality"] = plan.quality
    return {"plan": plan_entry,
            "command": command, "date": dt.datetime.now().isoformat(timespec="seconds"),
            "machine": machine_info(), "training_machines": _unique(seen.machines),
            "training_commands": _unique(seen.commands), "signatures": _unique(seen.signatures),
            "trained_between": [min(seen.starts), max(seen.ends or seen.starts)] if seen.starts else None,
            "rows": rows,
            "recorded": sorted({r["record"] for row in rows for r in row["runs"] if r.get("record")})}


def _text_writer(content: str) -> Callable[[str], object]:
    return lambda tmp: Path(tmp).write_text(content, encoding="utf-8")


def _row_entry(row: Row, cfg) -> dict:
    """A row of ``results.json`` before its runs: what it trains and how it is scored."""
    entry: dict[str, Any] = {"name": row.name, "label": row.label, "config": row.config, "overrides": row.overrides,
             "eval_overrides": row.eval_overrides, "eval_split": row.eval_split, "models_from": row.models_from,
             "seeds": row.seeds, "runs": [], "match_params": row.match_params}
    if not row.train:
        entry["train"] = False
    if row.sweep_of:
        entry.update(sweep_of=row.sweep_of, sweep_key=row.sweep_key, sweep_value=row.sweep_value)
    if cfg is not None and cfg.data.task == "translation":
        entry["beam_size"] = cfg.testing.beam_size
    return entry


def _run_item(plan: Plan, row: Row, run: Run, data_root: str | None, failures: dict[Path, str],
              seen: _Provenance) -> dict:
    """One seed of a row: status, evaluation (metrics, parameters), training time and stability; an
    evaluation that fails is noted in the item (one broken folder must not hide the other rows' results)."""
    item = {"seed": run.seed, "model_dir": str(run.model_dir),
            "status": run.status if run.record else folder_status(run.model_dir)}
    if run.record:
        item["record"] = str(run.record)
    if run.model_dir in failures:
        item["error"] = failures[run.model_dir]
    if (row.sweep_of and item["status"] == "finished") or item["status"] == "diverged":
        item["stability"] = stability(run.files)
    if item["status"] != "finished":
        return item
    try:
        item.update(cached_evaluation(run, row, plan.checkpoint, data_root, plan.quality))
    except Exception as err:  # noqa: BLE001 - reported in the table's notes, and the plan exits 1
        item["error"] = failures[run.model_dir] = f"evaluation failed: {type(err).__name__}: {err}"
        print(f"{row.name} seed {run.seed}: {item['error']}", file=sys.stderr)
    item["train_seconds"], item["train_time_source"] = training_time(run.files) if run.row.train \
        else (None, "not trained")
    seen.add(item, run.files)
    return item


def _measured(results: dict) -> dict:
    """``results`` as JSON data without the keys that describe the writing of the report."""
    data = {k: v for k, v in json.loads(json.dumps(results)).items() if k not in REPORT_PROVENANCE}
    for row in data.get("rows") or []:
        row["runs"] = [{k: v for k, v in run.items() if k not in RUN_PROVENANCE} for run in row.get("runs") or []]
    return data


def keep_report_provenance(results: dict, previous_path: Path) -> dict:
    """The report saved at ``previous_path`` when it says what ``results`` says apart from
    :data:`REPORT_PROVENANCE` (same command, models and numbers), else ``results``."""
    try:
        previous = json.loads(previous_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return results
    if not isinstance(previous, dict) or not isinstance(previous.get("rows"), list):
        return results
    return previous if _measured(previous) == _measured(results) else results


def write_results(results: dict, out: Path, append_to: str | None, records: Path | None = None) -> str:
    """``OUT/results.json``, ``OUT/results.md``, a sweep plot per swept key, and optionally the plan's
    section of ``append_to``; with ``records``, ``results.json`` and the full ``results.md`` are also written
    there (what the summary reads from a checkout), and the section of ``append_to`` links to that
    ``results.md`` for the commands, machines and dates instead of printing them. Returns the markdown."""
    previous = records / "results.json" if records else out / "results.json"
    results = keep_report_provenance(results, previous)
    body = report.render_markdown(results)
    out.mkdir(parents=True, exist_ok=True)
    for key in dict.fromkeys(r["sweep_key"] for r in results["rows"] if r.get("sweep_key")):
        for folder in (out, records) if records else (out,):  # the sweep table points to the plot beside it
            folder.mkdir(parents=True, exist_ok=True)
            report.plot_sweep(results, key, folder / report.sweep_plot_name(key))
    text = json.dumps(results, indent=1, ensure_ascii=False) + "\n"
    name = results["plan"]["name"]
    files: dict[Path, str] = {out / "results.json": text,
                              out / "results.md": _with_section(out / "results.md", name, body)}
    if records:
        records.mkdir(parents=True, exist_ok=True)
        files[records / "results.json"] = text
        files[records / "results.md"] = _with_section(records / "results.md", name, body)
    if append_to:
        link = _relative_link(records / "results.md", Path(append_to)) if records else None
        page_body = report.render_markdown(results, link) if link else body
        files[Path(append_to)] = _with_section(Path(append_to), name, page_body)
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
    # one set: a disk that fills half-way leaves every report as it was, never a new json beside an old page
    write_set([(path, _text_writer(content)) for path, content in files.items()])
    return body


def _with_section(path: Path, name: str, body: str) -> str:
    """The text of the markdown file ``path`` (empty if absent) with plan ``name``'s section replaced by ``body``."""
    return report.replace_section(path.read_text(encoding="utf-8") if path.is_file() else "", name, body)


def _relative_link(target: Path, page: Path) -> str:
    """``target`` as a markdown link from the page ``page`` (a relative posix path)."""
    return Path(os.path.relpath(target.resolve(), page.resolve().parent)).as_posix()
