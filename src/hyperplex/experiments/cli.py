"""The command line of ``hyperplex experiment PLAN``: validate a plan, train its models, report.

    hyperplex experiment PLAN.yaml [--rows a,b] [--seeds 1,2] [--out runs/PLAN] [--dry-run]
                                   [--resume] [--report-only] [--no-report] [--evaluate-each]
                                   [--records DIR] [--append-to docs/results.md] [--data-root DIR]
                                   [--override=--training.device=cuda ...]

Every row × seed is validated first (:func:`hyperplex.experiments.runs.validate`), so a typo fails before
any training. Each model trains into ``OUT/<row>/seed<k>``; a finished folder is skipped, an unfinished
one continues with ``--resume``. Then every finished model is evaluated and ``OUT/results.{md,json}`` are
written (:mod:`hyperplex.experiments.results`). The command line is recorded in the report.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from hyperplex.config import ConfigError
from hyperplex.experiments.evaluation import evaluate_each
from hyperplex.experiments.execution import save_untrained_run, train_run
from hyperplex.experiments.plan import Plan, PlanError, load_plan
from hyperplex.experiments.results import collect, write_results
from hyperplex.experiments.runs import Run, validate
from hyperplex.experiments.state import DIVERGED_FILE, folder_status
from hyperplex.guards import OutputError, check_output_folder, check_outputs

__all__ = ["PROG", "add_arguments", "build_parser", "main"]

#: The command as the report records it when run as ``hyperplex experiment``.
PROG = "hyperplex experiment"


def _csv(kind):
    return lambda text: [kind(x) for x in text.split(",") if x.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``hyperplex experiment`` ."""
    p.add_argument("plan", help="plan YAML file (experiments/*.yaml)")
    p.add_argument("--rows", type=_csv(str), help="train only these rows (comma-separated); the report covers all")
    p.add_argument("--seeds", type=_csv(int), help="train only these of the planned seeds (comma-separated)")
    p.add_argument("--out", help="output folder (default runs/PLAN_NAME)")
    p.add_argument("--dry-run", action="store_true", help="validate and list the runs; train and write nothing")
    p.add_argument("--resume", action="store_true", help="continue unfinished runs from last.safetensors")
    only = p.add_mutually_exclusive_group()  # together they would do nothing
    only.add_argument("--report-only", action="store_true", help="train nothing; evaluate finished models and report")
    only.add_argument("--no-report", action="store_true",
                   help="train only; evaluate and report later with --report-only (for parallel lanes over one plan)")
    p.add_argument("--evaluate-each", action="store_true",
                   help="evaluate each model as soon as it is trained (cached in its folder; every row that scores "
                        "it), so --no-report lanes share the evaluation and --report-only reads the caches")
    p.add_argument("--records", metavar="DIR",
                   help="keep each finished, evaluated model's small files (config, logs, evaluations; no checkpoint; "
                        "written when it is evaluated: with --evaluate-each or by the report) in "
                        "DIR/ROW/seedK, and report models recorded there whose folders are not on this machine "
                        "(e.g. experiments/records/PLAN, committed, so a plan can span sessions and machines)")
    p.add_argument("--append-to", help="also replace this plan's <!-- plan:NAME --> section of a markdown file")
    p.add_argument("--data-root", help="data root for relative data paths (default $HYPERPLEX_DATA, ../shared/data)")
    p.add_argument("--override", action="append", default=[], metavar="--SECTION.KEY=VALUE",
                   help="extra override for every model after the budget (repeatable); write it with =, e.g. "
                        "--override=--training.device=cuda")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """A parser with :func:`add_arguments` (``prog``: the name shown in usage lines)."""
    p = argparse.ArgumentParser(prog=prog, description="Run an experiment plan: train every row × seed, evaluate, "
                                "and write the results table.")
    add_arguments(p)
    return p


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Run the command line ``argv``; ``prog`` (``hyperplex experiment`` or ``hyperplex experiment``) is
    how the report records the command. Returns the exit status: 1 on a plan error or a failed model, 128 + the
    signal number when a signal stopped training."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return run(build_parser(prog).parse_args(argv), shlex.join([*shlex.split(prog), *argv]))


def run(args: argparse.Namespace, command: str) -> int:
    """Run parsed arguments (:func:`add_arguments`); ``command`` is recorded in the report."""
    try:
        plan = load_plan(args.plan)
        out = Path(args.out or Path("runs") / plan.name)
        records = Path(args.records) if args.records else None
        to_train, all_runs, resolved = validate(plan, args.rows, args.seeds, out, args.override, args.resume,
                                                args.data_root, records, will_train=not args.report_only)
    except (PlanError, ConfigError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1

    try:  # the outputs: never an input of the plan, never one model's folder
        check_outputs({"--append-to": args.append_to}, [plan.path, *(r.config for r in plan.rows if r.config)])
        for option, folder in (("--out", out), ("--records", records)):
            if folder is not None:
                check_output_folder(folder, option, ())
    except OutputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.dry_run:
        _print_dry_run(plan, to_train, out)
        return 0
    failures: dict[Path, str] = {}
    if not args.report_only:
        stopped = _train_all(plan, to_train, args, command, failures, records)
        if stopped is not None:
            return stopped
    if args.no_report:
        return 1 if failures else 0
    results = collect(plan, all_runs, resolved, args.data_root, command, failures, records)
    print(write_results(results, out, args.append_to, records))
    return 1 if failures else 0


def _print_dry_run(plan: Plan, to_train: list[Run], out: Path) -> None:
    print(f"{plan.title}\n{len(to_train)} model(s) selected, output {out}:")
    for run in to_train:
        verb = "hyperplex train" if run.row.train else "train: false, built and saved untrained:"
        print(f"  [{run.status}] {run.model_dir}: {verb} {run.row.config} --model-dir {run.model_dir} "
              + " ".join(run.overrides))
    for row in plan.rows:
        if row.params_table:
            print(f"\nrow {row.name!r}: " + row.params_table)


def _train_all(plan: Plan, to_train: list[Run], args: argparse.Namespace, command: str, failures: dict[Path, str],
               records: Path | None) -> int | None:
    """Train every selected model that is not finished (evaluating each with ``--evaluate-each``). A failed
    model is noted in ``failures`` and the others go on; a signal stops the plan: returns its exit status."""
    from hyperplex.train.interrupts import TrainingInterrupted

    for i, run in enumerate(to_train, 1):
        if run.record is not None:
            print(f"[{i}/{len(to_train)}] {run.model_dir}: {run.status}, recorded in {run.record}; skipped",
                  file=sys.stderr)
            continue
        status = folder_status(run.model_dir)
        if status in ("finished", "diverged"):
            print(f"[{i}/{len(to_train)}] {run.model_dir}: {status} already, skipped", file=sys.stderr)
            if args.evaluate_each:  # a lane killed between training and evaluating: the cache is filled now
                evaluate_each(plan, run, args.data_root, failures, records)
            continue
        print(f"[{i}/{len(to_train)}] {run.model_dir}: {'training' if run.row.train else 'converting'} ({status})",
              file=sys.stderr)
        try:
            if run.row.train:
                train_run(run, args.resume and status == "unfinished", args.data_root, command)
            else:
                save_untrained_run(run, args.data_root, command)
        except TrainingInterrupted as err:  # Ctrl-C / SIGTERM stops the plan, not just this model
            print(f"  {err}\nplan stopped; continue it with the same command and --resume", file=sys.stderr)
            return 128 + err.signal_number
        except Exception as err:  # noqa: BLE001 - noted, the other models go on, exit 1 at the end
            failures[run.model_dir] = f"training failed: {type(err).__name__}: {err}"
            print(f"  {failures[run.model_dir]}", file=sys.stderr)
            continue
        if folder_status(run.model_dir) == "diverged":
            print(f"  diverged (a non-finite loss or validation metric): recorded in {run.model_dir / DIVERGED_FILE} "
                  "and counted in the report; not trained again", file=sys.stderr)
            continue
        if args.evaluate_each:
            evaluate_each(plan, run, args.data_root, failures, records)
    return None
