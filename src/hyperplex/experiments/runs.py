"""The models of a plan (row × seed) and the checks made before anything trains.

:func:`validate` loads every row × seed config with its overrides, builds each row's model, checks the
metrics against the task, the ``quality:`` files and ``match_params``, and compares every existing model
folder (or record) with what the plan would train now. All problems are reported together and nothing is
created: a typo fails before hours of training, not after.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from hyperplex.config import ConfigError, dump_yaml, load_yaml
from hyperplex.experiments.matching import check_param_matches
from hyperplex.experiments.plan import TASK_METRICS, Plan, PlanError, Row
from hyperplex.experiments.state import PLAN_MARK, RECORD_FILE, folder_status, read_record, trained
from hyperplex.scoring import plan_metrics as quality_metrics

__all__ = ["Run", "run_overrides", "validate", "saved_config", "config_diff", "load_yaml_text"]


@dataclass
class Run:
    """One model (row × seed) and where it lives; ``row`` is the training row (not a models_from row)."""

    row: Row
    seed: int
    model_dir: Path
    overrides: list[str]  # budget + row overrides + extra + --seed=K
    status: str = "new"  # new | partial (folder without last.safetensors) | unfinished | finished | diverged
    record: Path | None = None  # a --records folder standing in for a model folder that has no checkpoint here

    @property
    def files(self) -> Path:
        """Where the model's config, logs and evaluations are read: its folder, or its record."""
        return self.record or self.model_dir


def run_overrides(plan: Plan, row: Row, seed: int, extra: list[str]) -> list[str]:
    """Overrides of one model, in order of precedence (later wins): budget (not for a ``train: false`` row,
    which is not trained), row, command line, seed."""
    return [*(plan.budget if row.train else []), *row.overrides, *extra, f"--seed={seed}"]


#: Keys that say how a run is executed, never what it computes: a folder trained with other values still holds the
#: plan's run (a lane resumed with more threads, a model trained on a GPU through torch.compile and reported on a
#: CPU, a GPU call's run that wrote its resumable checkpoint only when stopped).
HOW_IT_RUNS_KEYS = frozenset({"training.num_threads", "training.device", "training.progress_bar", "training.plots",
                              "training.compile", "training.last_at_validation"})


def config_diff(saved: dict, wanted: dict, prefix: str = "") -> list[str]:
    """``key: A in the folder, B in the plan`` for every dotted key whose values differ (``model_dir`` and
    :data:`HOW_IT_RUNS_KEYS` ignored)."""
    keys = []
    for key in sorted(set(saved) | set(wanted)):
        a, b = saved.get(key), wanted.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += config_diff(a, b, f"{prefix}{key}.")
        elif a != b and key != "model_dir" and f"{prefix}{key}" not in HOW_IT_RUNS_KEYS:
            keys.append(f"{prefix}{key}: {a!r} in the folder, {b!r} in the plan")
    return keys


def saved_config(model_dir: Path) -> dict:
    """A model folder's ``config.yaml`` resolved through today's config classes, so keys added since it
    was written compare as their defaults. A config without ``data.split_seed`` carved (and generated)
    its data with ``seed``, which is what it is set to here."""
    from hyperplex.config.experiment import build_experiment, experiment_dict, upgrade_saved_config

    raw = load_yaml(model_dir / "config.yaml")
    upgrade_saved_config(raw)  # keys renamed since it was written (model.include → model.targets)
    if isinstance(raw.get("data"), dict):
        raw["data"].setdefault("split_seed", raw.get("seed", 1))
    try:
        return load_yaml_text(dump_yaml(experiment_dict(build_experiment(raw))))
    except (ConfigError, ValueError):  # a key renamed since: compare the raw file and let the diff name it
        return raw


def load_yaml_text(text: str):
    """YAML text → data (the round trip that ``config.yaml`` in a model folder went through)."""
    import yaml

    return yaml.safe_load(text)


def validate(plan: Plan, rows: list[str] | None, seeds: list[int] | None, out: Path, extra: list[str],
             resume: bool, data_root: str | None = None, records: Path | None = None,
             will_train: bool = True) -> tuple[list[Run], list[Run], dict[str, object]]:
    """Check everything before any training: every row × seed config loads with its overrides, each
    row's model can be built, eval overrides are valid, requested metrics fit the task, the ``quality:``
    files exist, and existing folders hold the same config and are trained as the row says (unfinished
    ones need ``--resume``). A model with no folder here but a record under ``records``
    (:mod:`hyperplex.experiments.records`) counts as that record says (finished or diverged) and is checked
    the same way. A ``records`` folder must belong to this plan, and with ``will_train`` a model that would
    train must ask for a device this machine has. All problems are reported together (:class:`PlanError`).
    Returns (runs to train, all runs of the plan, resolved config of each row)."""
    rows = _selected_rows(plan, rows)
    _check_selected_seeds(plan, seeds)
    errors: list[str] = _writable("--out", out) + check_records_plan(plan, records)
    resolved: dict[str, object] = {}
    all_runs: dict[Path, Run] = {}
    for row in plan.rows:
        errors += _check_row(plan, row, out, extra, resume, records, resolved, all_runs)
    wanted = set(rows or [r.name for r in plan.rows])
    if will_train:
        errors += _check_devices(plan, [r for r in all_runs.values() if r.row.name in wanted
                                        and r.status in ("new", "unfinished") and (not seeds or r.seed in seeds)],
                                 resolved)
    errors += check_param_matches(plan)
    errors += [f"{plan.path}: {problem}" for problem in quality_metrics.check_files(plan.quality, data_root)]
    if errors:
        raise PlanError(f"{len(errors)} problem(s) in {plan.path}, nothing was trained:\n  " + "\n  ".join(errors))
    wanted_rows = set(rows or [r.name for r in plan.rows])
    train_names = {r.models_from or r.name for r in plan.rows if r.name in wanted_rows}
    to_train = [r for r in all_runs.values() if r.row.name in train_names and (not seeds or r.seed in seeds)]
    return to_train, list(all_runs.values()), resolved


def _selected_rows(plan: Plan, rows: list[str] | None) -> list[str] | None:
    """``--rows`` with each sweep's name replaced by its expanded rows; an unknown name is a PlanError."""
    names = [r.name for r in plan.rows]
    sweeps = {r.sweep_of: [s.name for s in plan.rows if s.sweep_of == r.sweep_of] for r in plan.rows if r.sweep_of}
    for name in rows or []:
        if name not in names and name not in sweeps:
            raise PlanError(f"--rows: no row {name!r} in {plan.path} (rows: {', '.join(names)}"
                            + (f"; sweeps: {', '.join(sweeps)}" if sweeps else "") + ")")
    return [n for name in rows for n in sweeps.get(name, [name])] if rows else rows


def _check_selected_seeds(plan: Plan, seeds: list[int] | None) -> None:
    planned = {s for r in plan.rows for s in r.seeds}
    for seed in seeds or []:
        if seed not in planned:
            raise PlanError(f"--seeds: seed {seed} is not in {plan.path} (planned: {sorted(planned)}); "
                            "add it to the plan so the results record it")


class _Progress:
    """A line on stderr every few seconds while a long check runs (a plan of thousands of seeds)."""

    def __init__(self, total: int, what: str, every: float = 2.0) -> None:
        import time

        self.total, self.what, self.every, self.done = total, what, every, 0
        self.last = time.monotonic()

    def step(self) -> None:
        import time

        self.done += 1
        if time.monotonic() - self.last >= self.every:
            self.last = time.monotonic()
            import sys

            print(f"{self.what}: {self.done:,} of {self.total:,} runs", file=sys.stderr, flush=True)


def _check_row(plan: Plan, row: Row, out: Path, extra: list[str], resume: bool, records: Path | None,
               resolved: dict, all_runs: dict[Path, Run]) -> list[str]:
    """The problems of one row: each seed's config and folder, and (for a row with a config) building its
    model, whose parameter table and counts are kept in ``row.params_table`` / ``row.params``. Fills
    ``resolved`` (row name → config) and ``all_runs`` (model folder → Run)."""
    from hyperplex.config.experiment import load_experiment
    from hyperplex.inference.parameters import params_report

    errors: list[str] = []
    where = f"{plan.path}: row {row.name!r} ({row.config})"
    import dataclasses

    train_row = next(r for r in plan.rows if r.name == (row.models_from or row.name))
    first = None
    progress = _Progress(len(row.seeds), f"checking {plan.path}: row {row.name!r}")
    for seed in row.seeds:
        progress.step()
        model_dir = out / train_row.name / f"seed{seed}"
        overrides = run_overrides(plan, train_row, seed, extra)
        if first is not None:  # the seeds differ only in `--seed=N`, the last override, and the folder
            cfg = dataclasses.replace(first, seed=seed, model_dir=str(model_dir))
        else:
            try:
                cfg = first = load_experiment(row.config, overrides + row.eval_overrides, str(model_dir))
            except (ConfigError, ValueError, OSError) as err:
                errors.append(f"{where}, seed {seed}: {err}")
                break  # every seed of the row has the same config: one error, not one per seed
        resolved.setdefault(row.name, cfg)
        if seed == row.seeds[0]:
            errors += _check_task(plan, cfg, where)
        if model_dir in all_runs:
            continue
        run = Run(train_row, seed, model_dir, overrides, folder_status(model_dir))
        record = records / train_row.name / f"seed{seed}" if records else None
        if run.status == "new" and record and (record / RECORD_FILE).is_file():
            run.record, run.status = record, read_record(record)["status"]
        all_runs[model_dir] = run
        errors += _check_folder(run, row.config, resume)
    if row.name in resolved and not row.models_from:
        try:  # builds the model from the config: a bad n / size fails here, not hours later
            row.params_table, row.params = params_report(row.config, run_overrides(plan, row, row.seeds[0], extra))
        except (ConfigError, ValueError) as err:
            errors.append(f"{where}: the model cannot be built: {err}")
    return errors


def check_records_plan(plan: Plan, records: Path | None) -> list[str]:
    """A ``--records`` folder holds one plan's records: refuse one whose ``results.json`` or ``plan.json`` names
    another plan, so that records of two plans are never mixed (rows of the same name would otherwise pass)."""
    if records is None:
        return []
    errors = _writable("--records", records)
    rows = {row.name for row in plan.rows}
    foreign = sorted({record.parent.parent.name for record in records.glob(f"*/seed*/{RECORD_FILE}")} - rows)
    if foreign:  # a folder written before results.json and plan.json named their plan
        errors.append(f"--records {records} holds records of rows that {plan.path} does not have "
                      f"({', '.join(foreign[:5])}{', …' if len(foreign) > 5 else ''}): another plan's records? Use a "
                      f"folder of this plan's own, e.g. experiments/records/{plan.name}")
    for name, key in (("results.json", lambda d: d["plan"]["name"]), (PLAN_MARK, lambda d: d["plan"])):
        path = records / name
        if not path.is_file():
            continue
        try:
            owner = key(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError) as err:
            errors.append(f"--records {records}: {path} is not a readable plan record ({err})")
            continue
        if owner != plan.name:
            errors.append(f"--records {records} holds the records of plan {owner!r} ({path}), not of {plan.name!r}; "
                          f"use a folder of this plan's own, e.g. experiments/records/{plan.name}")
    return errors


def _writable(flag: str, folder: Path) -> list[str]:
    """A folder the run will write into (or the nearest existing folder above it, where it would be made) must be
    writable now, not after hours of training."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return [f"{flag} {folder}: {existing} is not a folder"]
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == folder else f" ({existing}, where it would be made)"
        return [f"{flag} {folder}: cannot write there{where}: read-only or no permission"]
    return []


def _check_devices(plan: Plan, runs: list[Run], resolved: dict) -> list[str]:
    """A model that would train on CUDA needs a GPU here, and a device must be one the trainer knows; said before
    anything trains, not hours later."""
    import torch

    from hyperplex.train.process import resolve_device

    devices = {run.row.name: str(resolved[run.row.name].training.device) for run in runs if run.row.name in resolved}
    errors = []
    for row, device in sorted(devices.items()):
        if device != "auto" and not device.startswith("cuda"):
            try:
                resolve_device(device)
            except ValueError as err:
                errors.append(f"{plan.path}: row {row!r}: {err}")
    wants = sorted(row for row, device in devices.items() if device.startswith("cuda"))
    if wants and not torch.cuda.is_available():
        errors.append(f"{plan.path}: rows {wants} ask for training.device=cuda but this machine has no CUDA device "
                      "(torch.cuda.is_available() is false): run them on a GPU, or drop the override to train on "
                      "the CPU")
    return errors


def _check_task(plan: Plan, cfg, where: str) -> list[str]:
    """The plan's metrics (and ``quality:``) must fit the row's task."""
    errors = []
    bad = [m for m in plan.metrics if m not in TASK_METRICS[cfg.data.task] and m not in quality_metrics.QUALITY_METRICS]
    if bad:
        errors.append(f"{where}: metrics {bad} do not exist for task {cfg.data.task!r} "
                      f"(it reports {', '.join(TASK_METRICS[cfg.data.task])})")
    if plan.quality and cfg.data.task != quality_metrics.TASK:
        errors.append(f"{where}: quality: applies to data.task {quality_metrics.TASK} models, this row's "
                      f"task is {cfg.data.task!r}")
    return errors


def _check_folder(run: Run, config: str, resume: bool) -> list[str]:
    """An existing folder (or record) must hold the config the plan would train now, trained or not as its row says;
    an unfinished one needs ``--resume``."""
    from hyperplex.config.experiment import experiment_dict, load_experiment

    errors = []
    remedy = ("delete the record or use another --records" if run.record
              else "delete the folder or use another --out")
    if run.status in ("finished", "unfinished", "diverged") and (run.files / "config.yaml").is_file():
        wanted = load_yaml_text(dump_yaml(experiment_dict(load_experiment(config, run.overrides,
                                                                          str(run.model_dir)))))
        diff = config_diff(saved_config(run.files), wanted)
        if diff:
            errors.append(f"{run.files} holds a run with a different config ({'; '.join(diff[:4])}); {remedy}")
    if run.status == "finished" and trained(run.files) != run.row.train:
        errors.append(f"{run.files} holds a {'trained' if trained(run.files) else 'not trained (train: false)'} "
                      f"model but row {run.row.name!r} says train: {str(run.row.train).lower()}; {remedy}")
    if run.status == "unfinished" and not resume:
        errors.append(f"{run.model_dir} holds an unfinished run: pass --resume to continue it (or delete it)")
    return errors
