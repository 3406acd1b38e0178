"""Run an experiment plan: train every row × seed, evaluate, and write the results table.

    python experiments/run.py PLAN.yaml [--rows a,b] [--seeds 1,2] [--out runs/PLAN] [--dry-run]
                              [--resume] [--report-only] [--append-to docs/results.md]
                              [--data-root DIR] [--override=--training.device=cuda ...]

A plan (``experiments/*.yaml``, see ``experiments/README.md``) lists rows
``{name, config, overrides, seeds}`` plus a plan-level ``budget`` (overrides applied to every
row), a ``title`` and the ``metrics`` to report. Every row × seed is validated first (config,
overrides, model construction, the state of its folder) so a typo fails before any training.
Each model trains through :func:`hyperplex.cli.runner.train` into ``OUT/<row>/seed<k>``; a folder
whose ``last.safetensors`` says ``trainer.finished`` is skipped, an unfinished one continues
with ``--resume``. Each finished model is evaluated on the validation split the way
:func:`hyperplex.cli.runner.evaluate` does (beam from the config), its parameters are counted with
:func:`hyperplex.models.params.parameter_breakdown`, and ``OUT/results.{md,json}`` are written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import json
import math
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:  # a source checkout without `pip install -e .`
    import hyperplex  # noqa: F401
except ImportError:
    sys.path.insert(0, str(HERE.parent / "src"))

import compress_quality  # experiments/compress_quality.py (its sibling, like report.py)
import report  # noqa: E402  (experiments/report.py)
from hyperplex.config import ConfigError, dump_yaml, from_dict, load_yaml, merge, parse_overrides, to_dict  # noqa: E402
from hyperplex.fileio import atomic_write_bytes, atomic_write_text  # noqa: E402

PLAN_KEYS = ("name", "title", "description", "seeds", "budget", "metrics", "checkpoint", "digits", "rows",
             "quality")
ROW_KEYS = ("name", "label", "config", "overrides", "seeds", "model_of", "eval_overrides", "eval_split", "sweep",
            "match_params", "heal")
#: Largest relative difference of parameters (total, and without embeddings) that ``match_params`` accepts.
PARAM_MATCH_TOLERANCE = 0.02
#: What each task's validation returns (``Task.validate``); plans may only ask for these.
TASK_METRICS = {"translation": ("bleu", "chrf", "accuracy", "loss", "ppl"),
                "classification": ("accuracy", "loss"), "pair_classification": ("accuracy", "loss"),
                "ranking": ("map", "mrr", "loss"), "distillation": ("cosine", "loss")}
#: ``stop_reason`` in the trainer state of a ``heal: false`` model's checkpoint (written without training).
NOT_HEALED = "not healed"
RUN_FILE = "experiment.json"  # per model folder: training segments (time, command, machine)
DIVERGED_FILE = "diverged.json"  # per model folder of a sweep row whose training stopped at a NaN/inf
RECORD_FILE = "record.json"  # per record folder (--records): what the model folder's checkpoint said
#: The small files of a model folder that a record keeps (with every ``evaluation-<row>.json``): enough to
#: report the model on a machine without its checkpoint, not to load it.
RECORD_FILES = ("config.yaml", RUN_FILE, "train.log", "metrics.csv", DIVERGED_FILE)
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) ")


class PlanError(ValueError):
    """A plan that cannot run; the message names the plan file, the row and what is expected."""


@dataclass
class Row:
    """One plan row: a config with overrides, trained once per seed (or evaluating another row's models)."""

    name: str
    label: str
    config: str = ""  # resolved path ("" for model_of rows until resolved)
    overrides: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    model_of: str = ""
    eval_overrides: list[str] = field(default_factory=list)
    eval_split: str = ""  # a file in the task's format scored instead of the validation split
    params_table: str = ""  # `hyperplex params` of the row's config (vocabulary = data.vocab_size), set by validate
    sweep_of: str = ""  # a row expanded from a `sweep:` row: that row's name
    sweep_key: str = ""  # the swept config key (e.g. training.lr) ...
    sweep_value: float | int | str | None = None  # ... and this row's value of it
    match_params: str = ""  # a row whose parameter count this row's must match within PARAM_MATCH_TOLERANCE
    heal: bool = True  # False: the model as built (step 0, no training, no budget) is saved and evaluated


@dataclass
class Plan:
    """A parsed plan file."""

    path: Path
    name: str
    title: str
    rows: list[Row]
    budget: list[str] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    checkpoint: str = "last"
    digits: int = 2
    description: str = ""
    quality: dict = field(default_factory=dict)  # compress_quality.parse_quality of the `quality:` key


# ---------------------------------------------------------------------------- plan file
def _unknown(keys, valid, where: str) -> None:
    for key in keys:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(valid)}"
            raise PlanError(f"{where}: unknown key {key!r}{hint}")


def _str_list(value, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PlanError(f"{where}: expected a list of strings like ['--training.max_steps=3000'], got {value!r}")
    return list(value)


def _seed_list(value, where: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(v, int) and not isinstance(v, bool)
                                                          for v in value):
        raise PlanError(f"{where}: expected a non-empty list of integer seeds like [1, 2, 3], got {value!r}")
    if len(set(value)) != len(value):
        raise PlanError(f"{where}: repeated seed in {value}")
    return list(value)


def _value_text(value) -> str:
    """A swept value as it appears in row names and labels: ``0.0005`` → ``0.0005``, ``1e-05`` → ``1e-05``."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def expand_sweep(row: Row, sweep, where: str) -> list[Row]:
    """The rows of a ``sweep: {key: training.lr, values: [...]}`` row: one per value, named
    ``NAME_<last key part><value>`` (``transformer_lr0.0005``), labelled ``LABEL, lr 0.0005``, with
    ``--KEY=VALUE`` appended to the row's overrides (so it wins over them and over the budget)."""
    if not isinstance(sweep, dict) or set(sweep) != {"key", "values"}:
        raise PlanError(f"{where}: sweep must be a mapping {{key: training.lr, values: [2.5e-4, 5e-4, ...]}}, "
                        f"got {sweep!r}")
    key, values = sweep["key"], sweep["values"]
    if not isinstance(key, str) or not re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", key):
        raise PlanError(f"{where}: sweep key must be a dotted config key like training.lr, got {key!r}")
    if not isinstance(values, list) or len(values) < 2 or len(set(map(str, values))) != len(values) or \
            not all(isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in values):
        raise PlanError(f"{where}: sweep values must be a list of ≥ 2 distinct numbers or strings, got {values!r}")
    short = key.rsplit(".", 1)[1]
    out = []
    for value in values:
        text = _value_text(value)
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", text):
            raise PlanError(f"{where}: sweep value {value!r} cannot be part of a folder name")
        out.append(Row(name=f"{row.name}_{short}{text}", label=f"{row.label}, {short} {text}", config=row.config,
                       overrides=[*row.overrides, f"--{key}={text}"], seeds=list(row.seeds),
                       eval_overrides=list(row.eval_overrides), eval_split=row.eval_split, sweep_of=row.name,
                       sweep_key=key, sweep_value=value))
    return out


def resolve_config(config: str, plan_path: Path) -> Path:
    """A row's config path: as given (absolute, or relative to the working directory), else relative
    to the plan's folder, else to its parent (the repository root for ``experiments/*.yaml``)."""
    candidates = [Path(config), plan_path.parent / config, plan_path.parent.parent / config]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise PlanError(f"config file {config!r} not found (looked at {', '.join(str(c) for c in candidates)})")


def load_plan(path: str | Path) -> Plan:
    """Read and check a plan file (structure only; configs are checked by :func:`validate`)."""
    path = Path(path)
    try:
        raw = load_yaml(path)
    except ConfigError as err:
        raise PlanError(str(err)) from None
    _unknown(raw, PLAN_KEYS, str(path))
    for key in ("title", "rows"):
        if not raw.get(key):
            raise PlanError(f"{path}: missing `{key}:` (a plan needs a title and a non-empty list of rows)")
    if not isinstance(raw["rows"], list):
        raise PlanError(f"{path}: `rows:` must be a list of mappings, got {type(raw['rows']).__name__}")
    default_seeds = _seed_list(raw["seeds"], f"{path}: seeds") if "seeds" in raw else [1]
    checkpoint = raw.get("checkpoint", "last")
    if checkpoint not in ("best", "last"):
        raise PlanError(f"{path}: checkpoint must be best or last, got {checkpoint!r}")
    metrics = _str_list(raw.get("metrics"), f"{path}: metrics")
    known = sorted({m for ms in TASK_METRICS.values() for m in ms} | set(compress_quality.QUALITY_METRICS))
    if not metrics or any(m not in known for m in metrics):
        raise PlanError(f"{path}: metrics must be a non-empty list from {known}, got {metrics!r}")
    try:
        quality = compress_quality.parse_quality(raw.get("quality"), str(path))
        compress_quality.check_metrics(metrics, quality, str(path))
    except compress_quality.QualityError as err:
        raise PlanError(str(err)) from None
    rows: list[Row] = []
    for i, item in enumerate(raw["rows"]):
        where = f"{path}: rows[{i}]"
        if not isinstance(item, dict):
            raise PlanError(f"{where}: expected a mapping with name, config, overrides, seeds")
        _unknown(item, ROW_KEYS, where)
        name = item.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.+-]+", name):
            raise PlanError(f"{where}: `name` must be a folder-safe string (letters, digits, _ . + -), got {name!r}")
        if any(r.name == name for r in rows):
            raise PlanError(f"{where}: duplicate row name {name!r}")
        where = f"{path}: row {name!r}"
        if bool(item.get("config")) == bool(item.get("model_of")):
            raise PlanError(f"{where}: give exactly one of `config:` (train models) or `model_of:` (evaluate the "
                            "models of another row)")
        row = Row(name=name, label=str(item.get("label") or name),
                  overrides=_str_list(item.get("overrides"), f"{where}: overrides"),
                  eval_overrides=_str_list(item.get("eval_overrides"), f"{where}: eval_overrides"),
                  model_of=item.get("model_of") or "", eval_split=str(item.get("eval_split") or ""))
        for o in row.eval_overrides:
            if not o.lstrip("-").startswith("testing."):
                raise PlanError(f"{where}: eval_overrides may only set testing.* keys (the model is fixed), got {o!r}")
        if row.model_of:
            if row.overrides or "seeds" in item:
                raise PlanError(f"{where}: a `model_of` row takes its config, overrides and seeds from that row")
        else:
            row.config = str(resolve_config(str(item["config"]), path))
            row.seeds = _seed_list(item["seeds"], f"{where}: seeds") if "seeds" in item else list(default_seeds)
        row.match_params = str(item.get("match_params") or "")
        if "heal" in item:
            if not isinstance(item["heal"], bool):
                raise PlanError(f"{where}: heal must be true or false, got {item['heal']!r}")
            if row.model_of or "sweep" in item:
                raise PlanError(f"{where}: heal: false applies to a row with a config and no sweep")
            row.heal = item["heal"]
        if "sweep" in item:
            if row.model_of:
                raise PlanError(f"{where}: a `model_of` row cannot sweep (it trains nothing)")
            expanded = expand_sweep(row, item["sweep"], where)
            if any(r.name == e.name for r in rows for e in expanded):
                raise PlanError(f"{where}: the sweep's row names {[e.name for e in expanded]} clash with another row")
            rows += expanded
        else:
            rows.append(row)
    by_name = {r.name: r for r in rows}
    for row in rows:
        if row.match_params and (row.match_params not in by_name or by_name[row.match_params].model_of):
            raise PlanError(f"{path}: row {row.name!r}: match_params {row.match_params!r} must name a row with a "
                            f"config (rows: {', '.join(r.name for r in rows if not r.model_of)})")
    for row in rows:
        if row.model_of:
            source = by_name.get(row.model_of)
            if source is None or source.model_of:
                raise PlanError(f"{path}: row {row.name!r}: model_of {row.model_of!r} must name a row with a config "
                                f"(rows: {', '.join(r.name for r in rows if not r.model_of)})")
            row.config, row.overrides, row.seeds = source.config, source.overrides, source.seeds
    digits = raw.get("digits", 2)
    if not isinstance(digits, int) or not 0 <= digits <= 6:
        raise PlanError(f"{path}: digits must be an integer 0…6, got {digits!r}")
    return Plan(path=path, name=str(raw.get("name") or path.stem), title=str(raw["title"]), rows=rows,
                budget=_str_list(raw.get("budget"), f"{path}: budget"), metrics=metrics, checkpoint=checkpoint,
                digits=digits, description=str(raw.get("description") or ""), quality=quality)


# ---------------------------------------------------------------------------- runs and validation
@dataclass
class Run:
    """One model (row × seed) and where it lives; ``row`` is the training row (not a model_of row)."""

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
    """Overrides of one model, in order of precedence (later wins): budget (not for a ``heal: false`` row,
    which is not trained), row, command line, seed."""
    return [*(plan.budget if row.heal else []), *row.overrides, *extra, f"--seed={seed}"]


def folder_status(model_dir: Path) -> str:
    """``new`` / ``partial`` / ``unfinished`` / ``finished`` from ``last.safetensors``'s trainer state;
    ``diverged`` when a sweep run stopped at a non-finite loss (``diverged.json``, an outcome, not retried)."""
    from hyperplex.train.checkpoint import checkpoint_info

    if (model_dir / DIVERGED_FILE).is_file():
        return "diverged"
    last = model_dir / "last.safetensors"
    if not last.is_file():
        return "partial" if model_dir.is_dir() and any(model_dir.iterdir()) else "new"
    return "finished" if checkpoint_info(last)["extra"]["trainer"].get("finished") else "unfinished"


def _config_diff(saved: dict, wanted: dict, prefix: str = "") -> list[str]:
    keys = []
    for key in sorted(set(saved) | set(wanted)):
        a, b = saved.get(key), wanted.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += _config_diff(a, b, f"{prefix}{key}.")
        elif a != b and key != "model_dir":
            keys.append(f"{prefix}{key}: {a!r} in the folder, {b!r} in the plan")
    return keys


def validate(plan: Plan, rows: list[str] | None, seeds: list[int] | None, out: Path, extra: list[str],
             resume: bool, data_root: str | None = None,
             records: Path | None = None) -> tuple[list[Run], list[Run], dict[str, object]]:
    """Check everything before any training: every row × seed config loads with its overrides, each
    row's model can be built, eval overrides are valid, requested metrics fit the task, the ``quality:``
    files exist, and existing folders hold the same config and are healed as the row says (unfinished
    ones need ``--resume``). A model with no folder here but a record under ``records`` (:func:`write_record`)
    counts as that record says (finished or diverged) and is checked the same way. All problems are reported
    together. Returns (runs to train, all runs of the plan, resolved config of each row)."""
    from hyperplex.cli import runner
    from hyperplex.config.experiment import experiment_dict, load_experiment

    names = [r.name for r in plan.rows]
    sweeps = {r.sweep_of: [s.name for s in plan.rows if s.sweep_of == r.sweep_of] for r in plan.rows if r.sweep_of}
    for name in rows or []:
        if name not in names and name not in sweeps:
            raise PlanError(f"--rows: no row {name!r} in {plan.path} (rows: {', '.join(names)}"
                            + (f"; sweeps: {', '.join(sweeps)}" if sweeps else "") + ")")
    rows = [n for name in rows for n in sweeps.get(name, [name])] if rows else rows
    planned_seeds = {s for r in plan.rows for s in r.seeds}
    for seed in seeds or []:
        if seed not in planned_seeds:
            raise PlanError(f"--seeds: seed {seed} is not in {plan.path} (planned: {sorted(planned_seeds)}); "
                            "add it to the plan so the results record it")
    errors: list[str] = []
    resolved: dict[str, object] = {}
    all_runs: dict[Path, Run] = {}
    for row in plan.rows:
        where = f"{plan.path}: row {row.name!r} ({row.config})"
        train_row = next(r for r in plan.rows if r.name == (row.model_of or row.name))
        for seed in row.seeds:
            model_dir = out / train_row.name / f"seed{seed}"
            overrides = run_overrides(plan, train_row, seed, extra)
            try:
                cfg = load_experiment(row.config, overrides + row.eval_overrides, str(model_dir))
            except (ConfigError, ValueError, OSError) as err:
                errors.append(f"{where}, seed {seed}: {err}")
                continue
            resolved.setdefault(row.name, cfg)
            bad = [m for m in plan.metrics if m not in TASK_METRICS[cfg.data.task]
                   and m not in compress_quality.QUALITY_METRICS]
            if bad and seed == row.seeds[0]:
                errors.append(f"{where}: metrics {bad} do not exist for task {cfg.data.task!r} "
                              f"(it reports {', '.join(TASK_METRICS[cfg.data.task])})")
            if plan.quality and cfg.data.task != compress_quality.TASK and seed == row.seeds[0]:
                errors.append(f"{where}: quality: applies to data.task {compress_quality.TASK} models, this row's "
                              f"task is {cfg.data.task!r}")
            if model_dir in all_runs:
                continue
            run = Run(train_row, seed, model_dir, overrides, folder_status(model_dir))
            record = records / train_row.name / f"seed{seed}" if records else None
            if run.status == "new" and record and (record / RECORD_FILE).is_file():
                run.record, run.status = record, read_record(record)["status"]
            all_runs[model_dir] = run
            if run.status in ("finished", "unfinished", "diverged") and (run.files / "config.yaml").is_file():
                wanted = load_yaml_text(dump_yaml(experiment_dict(load_experiment(row.config, overrides,
                                                                                  str(model_dir)))))
                diff = _config_diff(saved_config(run.files), wanted)
                if diff:
                    errors.append(f"{run.files} holds a run with a different config ({'; '.join(diff[:4])}); delete "
                                  "the folder or use another --out")
            if run.status == "finished" and healed(run.files) != train_row.heal:
                errors.append(f"{run.files} holds a {'healed' if healed(run.files) else 'not healed (heal: false)'} "
                              f"model but row {train_row.name!r} says heal: {str(train_row.heal).lower()}; delete the "
                              "folder or use another --out")
            if run.status == "unfinished" and not resume:
                errors.append(f"{model_dir} holds an unfinished run: pass --resume to continue it (or delete it)")
        if row.name in resolved and not row.model_of:
            try:  # builds the model from the config: a bad n / size fails here, not hours later
                row.params_table = runner.params(row.config, run_overrides(plan, row, row.seeds[0], extra))
            except (ConfigError, ValueError) as err:
                errors.append(f"{where}: the model cannot be built: {err}")
    errors += check_param_matches(plan)
    errors += [f"{plan.path}: {problem}" for problem in compress_quality.check_files(plan.quality, data_root)]
    if errors:
        raise PlanError(f"{len(errors)} problem(s) in {plan.path}, nothing was trained:\n  " + "\n  ".join(errors))
    wanted_rows = set(rows or names)
    train_names = {r.model_of or r.name for r in plan.rows if r.name in wanted_rows}
    to_train = [r for r in all_runs.values() if r.row.name in train_names and (not seeds or r.seed in seeds)]
    return to_train, list(all_runs.values()), resolved


def healed(model_dir: Path) -> bool:
    """Whether a finished folder's (or record's) model was trained (False: written by :func:`convert_run`)."""
    from hyperplex.train.checkpoint import checkpoint_info

    if (model_dir / RECORD_FILE).is_file() and not (model_dir / "last.safetensors").is_file():
        return read_record(model_dir)["healed"]
    return checkpoint_info(model_dir / "last.safetensors")["extra"]["trainer"].get("stop_reason") != NOT_HEALED


def saved_config(model_dir: Path) -> dict:
    """A model folder's ``config.yaml`` resolved through today's config classes, so keys added since it
    was written compare as their defaults. A config without ``data.split_seed`` predates that key: such
    runs carved (and generated) their data with ``seed``, which is what it is set to here."""
    from hyperplex.config.experiment import build_experiment, experiment_dict

    raw = load_yaml(model_dir / "config.yaml")
    if isinstance(raw.get("data"), dict):
        raw["data"].setdefault("split_seed", raw.get("seed", 1))
    try:
        return load_yaml_text(dump_yaml(experiment_dict(build_experiment(raw))))
    except (ConfigError, ValueError):  # a key renamed since: compare the raw file and let the diff name it
        return raw


def table_counts(params_table: str) -> dict[str, int]:
    """``{"total", "total_without_embeddings"}`` read from a ``hyperplex params`` table."""
    counts = {}
    for line in params_table.splitlines():
        m = re.match(r"^\| (total|total_without_embeddings) \| ([\d,]+) \|", line)
        if m:
            counts[m.group(1)] = int(m.group(2).replace(",", ""))
    if set(counts) != {"total", "total_without_embeddings"}:
        raise ValueError(f"no total / total_without_embeddings lines in the parameter table:\n{params_table}")
    return counts


def param_match(counts: dict[str, int], reference: dict[str, int]) -> dict[str, float]:
    """Relative difference ``counts / reference − 1`` of the total and of the count without embeddings."""
    return {key: counts[key] / reference[key] - 1.0 for key in ("total", "total_without_embeddings")}


def check_param_matches(plan: Plan) -> list[str]:
    """Problems with ``match_params`` rows: parameters (total, and without embeddings) further than
    :data:`PARAM_MATCH_TOLERANCE` from the named row's, counted on the models the configs build."""
    by_name = {r.name: r for r in plan.rows}
    problems = []
    for row in plan.rows:
        ref = by_name.get(row.match_params) if row.match_params else None
        if ref is None or not row.params_table or not ref.params_table:
            continue
        counts, ref_counts = table_counts(row.params_table), table_counts(ref.params_table)
        for key, diff in param_match(counts, ref_counts).items():
            if abs(diff) > PARAM_MATCH_TOLERANCE:
                problems.append(f"{plan.path}: row {row.name!r}: {key} {counts[key]:,} is {diff:+.2%} from row "
                                f"{ref.name!r} ({ref_counts[key]:,}); match_params allows "
                                f"±{PARAM_MATCH_TOLERANCE:.0%}")
    return problems


def load_yaml_text(text: str):
    """YAML text → data (the round trip that ``config.yaml`` in a model folder went through)."""
    import yaml

    return yaml.safe_load(text)


# ---------------------------------------------------------------------------- training
def _device(cfg) -> str:
    import torch

    if cfg.training.device != "cpu" and torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name(0)})"
    return "cpu"


def _read_run_file(model_dir: Path) -> dict:
    path = model_dir / RUN_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"segments": []}


def _write_run_file(model_dir: Path, data: dict) -> None:
    tmp = model_dir / (RUN_FILE + ".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    tmp.replace(model_dir / RUN_FILE)


def train_run(run: Run, resume: bool, data_root: str | None, command: str) -> None:
    """Train (or resume) one model, recording the wall-clock segment, command and machine in
    ``MODEL_DIR/experiment.json`` (written before training starts, so a killed run leaves its start)."""
    from hyperplex.cli import runner
    from hyperplex.config.experiment import load_experiment
    from hyperplex.train.trainer import TrainingError

    cfg = load_experiment(run.row.config, run.overrides, str(run.model_dir))
    run.model_dir.mkdir(parents=True, exist_ok=True)
    data = _read_run_file(run.model_dir)
    segment = {"start": time.time(), "started": dt.datetime.now().isoformat(timespec="seconds"),
               "resume": resume, "command": command, "machine": report.machine_info(_device(cfg)), "seconds": None}
    data["segments"].append(segment)
    _write_run_file(run.model_dir, data)
    start = time.perf_counter()
    try:
        runner.train(run.row.config, run.overrides, str(run.model_dir), data_root, resume=resume)
        segment["status"] = "finished"
    except TrainingError as err:
        if not run.row.sweep_of:
            segment["status"] = f"failed: {type(err).__name__}: {err}"
            raise
        # In a stability sweep a NaN/inf loss is a result: record it and do not train this model again.
        step = re.search(r"at step (\d+)", str(err))
        segment["status"] = "diverged"
        atomic_write_text(run.model_dir / DIVERGED_FILE, json.dumps(
            {"step": int(step.group(1)) if step else None, "message": str(err)}, indent=1))
    except BaseException as err:
        segment["status"] = f"failed: {type(err).__name__}: {err}"
        raise
    finally:
        segment["seconds"] = time.perf_counter() - start
        _write_run_file(run.model_dir, data)


def convert_run(run: Run, data_root: str | None, command: str) -> None:
    """A ``heal: false`` model: what training would start from, saved as a finished checkpoint at step 0.

    The steps of :meth:`hyperplex.train.trainer.Trainer.train` before its first optimiser step (seed
    Python/NumPy/torch with ``seed``, ``task.prepare(fresh=True)``, ``task.build_model()``), so a
    converted model is the healed rows' starting point; then ``config.yaml`` and ``last.safetensors``
    (no optimiser state; trainer state ``finished``, ``stop_reason`` :data:`NOT_HEALED`) as the trainer
    writes them, so evaluation loads it like any trained model. The segment goes to ``experiment.json``."""
    import random
    from dataclasses import asdict

    import numpy as np
    import torch

    from hyperplex.config.experiment import (
        default_data_root,
        experiment_dict,
        load_experiment,
    )
    from hyperplex.tasks import task_class
    from hyperplex.train.checkpoint import LAST, save_checkpoint
    from hyperplex.train.records import setup_logger
    from hyperplex.train.trainer import TrainState

    cfg = load_experiment(run.row.config, run.overrides, str(run.model_dir))
    run.model_dir.mkdir(parents=True, exist_ok=True)
    data = _read_run_file(run.model_dir)
    segment = {"start": time.time(), "started": dt.datetime.now().isoformat(timespec="seconds"), "resume": False,
               "command": command, "machine": report.machine_info(), "seconds": None, "heal": False}
    data["segments"].append(segment)
    _write_run_file(run.model_dir, data)
    start = time.perf_counter()
    log = setup_logger(run.model_dir, 0)
    try:
        if cfg.training.num_threads:
            torch.set_num_threads(cfg.training.num_threads)
        task = task_class(cfg.data.task)(cfg, run.model_dir, data_root or default_data_root(), log)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        task.prepare(fresh=True)
        model = task.build_model()
        atomic_write_text(run.model_dir / "config.yaml", dump_yaml(experiment_dict(cfg)))
        extra = {"trainer": asdict(TrainState(finished=True, stop_reason=NOT_HEALED)),
                 "config": experiment_dict(cfg), "task": task.metadata(), "format": "hyperplex-checkpoint-1"}
        save_checkpoint(run.model_dir / LAST, model.state_dict(), None, extra)
        log.info(f"heal: false: the model as built (seed {cfg.seed}) saved to {run.model_dir / LAST} without training")
        segment["status"] = "converted"
    except BaseException as err:
        segment["status"] = f"failed: {type(err).__name__}: {err}"
        raise
    finally:
        segment["seconds"] = time.perf_counter() - start
        _write_run_file(run.model_dir, data)
        for handler in list(log.handlers):
            log.removeHandler(handler)
            handler.close()


def _log_times(model_dir: Path) -> list[dt.datetime]:
    path = model_dir / "train.log"
    if not path.is_file():
        return []
    stamps = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        m = LOG_TIME.match(line)
        if m:
            stamps.append(dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
    return stamps


def training_time(model_dir: Path) -> tuple[float | None, str]:
    """(seconds, source): the sum of the measured training segments in ``experiment.json``; a segment
    killed before it could record its length is estimated from its start to its last ``train.log`` time
    stamp (source ``train.log``). Without ``experiment.json``: first to last ``train.log`` time stamp."""
    segments = _read_run_file(model_dir)["segments"]
    stamps = _log_times(model_dir)
    if not segments:
        return ((stamps[-1] - stamps[0]).total_seconds(), "train.log") if stamps else (None, "unknown")
    total, source = 0.0, "measured"
    for i, seg in enumerate(segments):
        if seg.get("seconds") is not None:
            total += seg["seconds"]
            continue
        begin = dt.datetime.fromtimestamp(seg["start"]).replace(microsecond=0)
        end = dt.datetime.fromtimestamp(segments[i + 1]["start"]) if i + 1 < len(segments) else dt.datetime.max
        inside = [s for s in stamps if begin <= s < end]
        total += (inside[-1] - begin).total_seconds() if inside else 0.0
        source = "train.log"
    return total, source


# ---------------------------------------------------------------------------- evaluation
def evaluate_model(model_dir: Path, checkpoint: str, data_root: str | None, eval_overrides: list[str],
                   eval_split: str = "", quality: dict | None = None) -> dict:
    """``{"metrics", "params"}`` of one model folder: the steps of :func:`hyperplex.cli.runner.evaluate`
    (load, validation split or the file ``eval_split``, the configured beam) with ``eval_overrides``
    (``testing.*``) applied to the saved config first, and
    :func:`~hyperplex.models.params.parameter_breakdown` of the loaded model. With a plan's ``quality``
    (distillation models): its metrics join ``metrics``, and ``size`` / ``quality_details`` are added
    (:mod:`compress_quality`)."""
    from hyperplex.cli import runner
    from hyperplex.config.experiment import TestingConfig
    from hyperplex.models.params import parameter_breakdown

    cfg, task, model = runner.load_model(str(model_dir), checkpoint, data_root)
    if eval_overrides:
        testing = parse_overrides(eval_overrides)["testing"]
        cfg.testing = from_dict(TestingConfig, merge(to_dict(cfg.testing), testing), "testing.")
    if eval_split:  # relative paths are read from the data root, as `hyperplex evaluate --split FILE`
        task.use_evaluation_file(eval_split)
    metrics = runner.score(cfg, task, model)
    breakdown = parameter_breakdown(model)
    signatures = dict(getattr(task, "signatures", {}))  # sacreBLEU signatures, translation only
    result = {"metrics": {k: float(v) for k, v in metrics.items()}, "params": breakdown, "signatures": signatures,
              "beam_size": cfg.testing.beam_size if cfg.data.task == "translation" else None}
    if quality:
        scores = compress_quality.evaluate_quality(task, model, quality, data_root)
        result["quality_details"] = scores.pop("quality_details")
        result["metrics"].update(scores)
        result["size"] = compress_quality.model_size(model)
    return result


def cached_evaluation(run: Run, row: Row, checkpoint: str, data_root: str | None, quality: dict | None = None) -> dict:
    """:func:`evaluate_model`, cached in ``MODEL_DIR/evaluation-<row>.json`` until the checkpoint file (or the
    plan's ``quality`` settings) change. A ``heal: false`` model has only ``last``."""
    from hyperplex.cli.runner import checkpoint_path

    if not run.row.heal:
        checkpoint = "last"
    if run.record is not None:
        stat, name = None, None
    else:
        ckpt = checkpoint_path(run.model_dir, checkpoint)
        stat, name = ckpt.stat(), ckpt.name
    key = {"checkpoint": checkpoint, "file": name, "size": stat and stat.st_size, "mtime_ns": stat and stat.st_mtime_ns,
           "eval_overrides": row.eval_overrides, "eval_split": row.eval_split}
    if quality:  # only then: the caches of plans without quality keep their keys
        key["quality"] = quality
    if run.record is not None:
        return recorded_evaluation(run, row, key)
    cache = run.model_dir / f"evaluation-{row.name}.json"
    if cache.is_file():
        saved = json.loads(cache.read_text(encoding="utf-8"))
        if saved.get("key") == key:
            return saved["result"]
    result = evaluate_model(run.model_dir, checkpoint, data_root, row.eval_overrides, row.eval_split, quality)
    cache.write_text(json.dumps({"key": key, "result": result}, indent=1), encoding="utf-8")
    return result


def evaluate_each(plan: Plan, run: Run, data_root: str | None, failures: dict[Path, str],
                  records: Path | None = None) -> None:
    """Evaluate a just-trained model for every plan row that scores it (its own row and the ``model_of``
    rows naming it) into the ``evaluation-<row>.json`` caches that :func:`collect` reads, so lanes of
    ``--no-report --evaluate-each`` share the evaluation cost and ``--report-only`` only reads caches. With
    ``records``, the model's record is written after its evaluations."""
    if run.record is not None or folder_status(run.model_dir) != "finished":
        return
    for row in plan.rows:
        if (row.model_of or row.name) == run.row.name and run.seed in row.seeds:
            try:
                cached_evaluation(run, row, plan.checkpoint, data_root, plan.quality)
                print(f"  evaluated for row {row.name!r}", file=sys.stderr)
            except Exception as err:  # the report retries it; the lane goes on
                failures[run.model_dir] = f"evaluation failed: {type(err).__name__}: {err}"
                print(f"  {failures[run.model_dir]}", file=sys.stderr)
    if records and run.model_dir not in failures:
        print(f"  recorded in {write_record(run, records)}", file=sys.stderr)


# ---------------------------------------------------------------------------- records (--records)
#: Parts of an evaluation cache key that name the checkpoint file; a record's evaluation is matched on the rest.
FILE_KEYS = ("file", "size", "mtime_ns")


def read_record(folder: Path) -> dict:
    """``{"status", "healed", "checkpoint_sha256", "written"}`` of a record folder."""
    return json.loads((folder / RECORD_FILE).read_text(encoding="utf-8"))


def write_record(run: Run, records: Path) -> Path | None:
    """Copy a finished (or diverged) model folder's small files (:data:`RECORD_FILES`, its evaluations) to
    ``records/ROW/seedK`` with ``record.json``, replacing an older record, so the model can be reported where
    its checkpoint is not (another machine, a later session). Checkpoints are not copied. A record that already
    holds exactly these files and this checkpoint is left as it is (its ``written`` date too), so re-reporting a
    plan does not churn committed records. Returns the folder."""
    import hashlib

    status = folder_status(run.model_dir)
    if status not in ("finished", "diverged"):
        return None
    target = records / run.row.name / f"seed{run.seed}"
    names = [n for n in RECORD_FILES if (run.model_dir / n).is_file()]
    names += sorted(p.name for p in run.model_dir.glob("evaluation-*.json"))
    last = run.model_dir / "last.safetensors"
    digest = hashlib.sha256(last.read_bytes()).hexdigest() if last.is_file() else None
    info = {"status": status, "healed": healed(run.model_dir) if last.is_file() else True,
            "checkpoint_sha256": digest, "files": names}
    try:
        old = read_record(target)
    except (OSError, ValueError):  # no record yet, or a broken one: (re)write it
        old = None
    same_info = isinstance(old, dict) and {k: v for k, v in old.items() if k != "written"} == info
    if same_info and all((target / n).is_file() and (target / n).read_bytes() == (run.model_dir / n).read_bytes()
                         for n in names):  # files compared only when the record's info already matches
        return target
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        atomic_write_bytes(target / name, (run.model_dir / name).read_bytes())
    info["written"] = dt.datetime.now().isoformat(timespec="seconds")
    atomic_write_text(target / RECORD_FILE, json.dumps(info, indent=1) + "\n")
    return target


def recorded_evaluation(run: Run, row: Row, key: dict) -> dict:
    """The evaluation a record holds for ``row``, if it was made with the same settings (checkpoint choice,
    eval overrides and split, quality) — the checkpoint itself is not here to re-evaluate."""
    cache = run.record / f"evaluation-{row.name}.json"
    saved = json.loads(cache.read_text(encoding="utf-8")) if cache.is_file() else None
    strip = lambda k: {a: b for a, b in k.items() if a not in FILE_KEYS}  # noqa: E731
    if saved is None or strip(saved.get("key", {})) != strip(key):
        raise RuntimeError(f"{run.record} records this model without its checkpoint and holds no evaluation for row "
                           f"{row.name!r} with the plan's settings; evaluate it where its checkpoint is, or retrain it")
    return saved["result"]


# ---------------------------------------------------------------------------- stability (sweep rows)
#: A logged window whose largest gradient norm exceeds this multiple of the run's median window-mean
#: norm (or is not finite) counts as a gradient-norm spike.
SPIKE_FACTOR = 10.0


def stability(model_dir: Path) -> dict:
    """Training stability of one model from ``metrics.csv`` (train ``loss``, ``grad_norm``, ``grad_norm_max``
    per ``log_every`` window) and ``diverged.json``: ``nan_step`` (the step whose loss was not finite, or
    None), ``loss_first`` / ``loss_last`` (first and last logged window), ``loss_above_start``,
    ``diverged`` (either), ``grad_norm_median`` (of the window means), ``grad_norm_max`` and ``spikes``
    (windows whose max norm is > :data:`SPIKE_FACTOR` × that median, or not finite)."""
    import statistics

    from hyperplex.train.plots import read_metrics_csv

    marker = model_dir / DIVERGED_FILE
    nan_step = json.loads(marker.read_text(encoding="utf-8"))["step"] if marker.is_file() else None
    series = read_metrics_csv(model_dir / "metrics.csv") if (model_dir / "metrics.csv").is_file() else {}
    loss = series.get(("loss", "train"), ([], []))[1]
    means = [v for v in series.get(("grad_norm", "train"), ([], []))[1] if math.isfinite(v)]
    peaks = series.get(("grad_norm_max", "train"), ([], []))[1]
    median = statistics.median(means) if means else None
    above = len(loss) >= 2 and not loss[-1] <= loss[0]  # a NaN last window counts as above
    return {"nan_step": nan_step, "loss_first": loss[0] if loss else None, "loss_last": loss[-1] if loss else None,
            "loss_above_start": above, "diverged": nan_step is not None or marker.is_file() or above,
            "grad_norm_median": median, "grad_norm_max": max(peaks, default=None),
            "spikes": sum(1 for v in peaks if not math.isfinite(v) or (median and v > SPIKE_FACTOR * median))}


# ---------------------------------------------------------------------------- results
def collect(plan: Plan, all_runs: list[Run], resolved: dict, data_root: str | None, command: str,
            failures: dict[Path, str], records: Path | None = None) -> dict:
    """Evaluate every finished model of the plan and build the ``results.json`` dict; with ``records``, each
    evaluated model folder's record is written (or refreshed) there, and recorded models are read from it."""
    by_key = {(r.row.name, r.seed): r for r in all_runs}
    machines, commands, starts, ends, rows, signatures = [], [], [], [], [], []
    for row in plan.rows:
        train_row = row.model_of or row.name
        entry = {"name": row.name, "label": row.label, "config": row.config, "overrides": row.overrides,
                 "eval_overrides": row.eval_overrides, "eval_split": row.eval_split, "model_of": row.model_of,
                 "seeds": row.seeds, "runs": [], "match_params": row.match_params}
        if not row.heal:
            entry["heal"] = False
        if row.sweep_of:
            entry.update(sweep_of=row.sweep_of, sweep_key=row.sweep_key, sweep_value=row.sweep_value)
        cfg = resolved.get(row.name)
        if cfg is not None and cfg.data.task == "translation":
            entry["beam_size"] = cfg.testing.beam_size
        for seed in row.seeds:
            run = by_key[(train_row, seed)]
            item = {"seed": seed, "model_dir": str(run.model_dir),
                    "status": run.status if run.record else folder_status(run.model_dir)}
            if run.record:
                item["record"] = str(run.record)
            if run.model_dir in failures:
                item["error"] = failures[run.model_dir]
            if row.sweep_of and item["status"] in ("finished", "diverged"):
                item["stability"] = stability(run.files)
            if item["status"] == "finished":
                try:
                    item.update(cached_evaluation(run, row, plan.checkpoint, data_root, plan.quality))
                except Exception as err:  # one broken folder must not hide the other rows' results
                    item["error"] = f"evaluation failed: {type(err).__name__}: {err}"
                item["train_seconds"], item["train_time_source"] = training_time(run.files) if run.row.heal \
                    else (None, "not trained")
                signatures += [f"{k}: {v}" for k, v in item.get("signatures", {}).items()]
                for seg in _read_run_file(run.files)["segments"]:
                    machines.append(seg["machine"])
                    commands.append(seg["command"])
                    starts.append(seg["started"])
                    if seg.get("seconds") is not None:
                        ends.append(dt.datetime.fromtimestamp(seg["start"] + seg["seconds"])
                                    .isoformat(timespec="seconds"))
            if records and run.record is None and item["status"] in ("finished", "diverged") and "error" not in item:
                write_record(run, records)
            entry["runs"].append(item)
        entry["summary"] = {m: report.summarize([r["metrics"][m] for r in entry["runs"]
                                                 if m in r.get("metrics", {})]) for m in plan.metrics}
        rows.append(entry)
    unique = lambda items: [x for i, x in enumerate(items) if x not in items[:i]]  # noqa: E731 (order kept)
    plan_entry = {"name": plan.name, "title": plan.title, "description": plan.description, "path": str(plan.path),
                  "budget": plan.budget, "metrics": plan.metrics, "checkpoint": plan.checkpoint, "digits": plan.digits}
    if plan.quality:
        plan_entry["quality"] = plan.quality
    return {"plan": plan_entry,
            "command": command, "date": dt.datetime.now().isoformat(timespec="seconds"),
            "machine": report.machine_info(), "training_machines": unique(machines),
            "training_commands": unique(commands), "signatures": unique(signatures),
            "trained_between": [min(starts), max(ends or starts)] if starts else None, "rows": rows,
            "recorded": sorted({r["record"] for row in rows for r in row["runs"] if r.get("record")})}


def write_results(results: dict, out: Path, append_to: str | None, records: Path | None = None) -> str:
    """``OUT/results.json``, ``OUT/results.md`` and optionally the plan's section of ``append_to``; with
    ``records``, ``results.json`` is also written there (what ``summary.py`` reads from a checkout)."""
    body = report.render_markdown(results)
    out.mkdir(parents=True, exist_ok=True)
    for key in dict.fromkeys(r["sweep_key"] for r in results["rows"] if r.get("sweep_key")):
        report.plot_sweep(results, key, out / report.sweep_plot_name(key))
    text = json.dumps(results, indent=1, ensure_ascii=False) + "\n"
    (out / "results.json").write_text(text, encoding="utf-8")
    if records:
        atomic_write_text(records / "results.json", text)
    report.write_section(out / "results.md", results["plan"]["name"], body)
    if append_to:
        report.write_section(append_to, results["plan"]["name"], body)
    return body


# ---------------------------------------------------------------------------- CLI
def _csv(kind):
    return lambda text: [kind(x) for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="experiments/run.py", description=__doc__.split("\n\n")[0])
    p.add_argument("plan", help="plan YAML file (experiments/*.yaml)")
    p.add_argument("--rows", type=_csv(str), help="train only these rows (comma-separated); the report covers all")
    p.add_argument("--seeds", type=_csv(int), help="train only these of the planned seeds (comma-separated)")
    p.add_argument("--out", help="output folder (default runs/PLAN_NAME)")
    p.add_argument("--dry-run", action="store_true", help="validate and list the runs; train and write nothing")
    p.add_argument("--resume", action="store_true", help="continue unfinished runs from last.safetensors")
    p.add_argument("--report-only", action="store_true", help="train nothing; evaluate finished models and report")
    p.add_argument("--no-report", action="store_true",
                   help="train only; evaluate and report later with --report-only (for parallel lanes over one plan)")
    p.add_argument("--evaluate-each", action="store_true",
                   help="evaluate each model as soon as it is trained (cached in its folder; every row that scores "
                        "it), so --no-report lanes share the evaluation and --report-only reads the caches")
    p.add_argument("--records", metavar="DIR",
                   help="keep each finished model's small files (config, logs, evaluations; no checkpoint) in "
                        "DIR/ROW/seedK, and report models recorded there whose folders are not on this machine "
                        "(e.g. experiments/records/PLAN, committed, so a plan can span sessions and machines)")
    p.add_argument("--append-to", help="also replace this plan's <!-- plan:NAME --> section of a markdown file")
    p.add_argument("--data-root", help="data root for relative data paths (default $HYPERPLEX_DATA, ../shared/data)")
    p.add_argument("--override", action="append", default=[], metavar="--SECTION.KEY=VALUE",
                   help="extra override for every model after the budget (repeatable); write it with =, e.g. --override=--training.device=cuda")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (1 on a plan error or a failed model)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        script = Path(__file__).resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        script = Path(__file__).resolve()
    command = shlex.join(["python", str(script), *argv])
    try:
        plan = load_plan(args.plan)
        out = Path(args.out or Path("runs") / plan.name)
        records = Path(args.records) if args.records else None
        to_train, all_runs, resolved = validate(plan, args.rows, args.seeds, out, args.override, args.resume,
                                                args.data_root, records)
    except (PlanError, ConfigError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.dry_run:
        print(f"{plan.title}\n{len(to_train)} model(s) selected, output {out}:")
        for run in to_train:
            verb = "hyperplex train" if run.row.heal else "heal: false, built and saved untrained:"
            print(f"  [{run.status}] {run.model_dir}: {verb} {run.row.config} --model-dir {run.model_dir} "
                  + " ".join(run.overrides))
        for row in plan.rows:
            if row.params_table:
                print(f"\nrow {row.name!r}: " + row.params_table)
        return 0
    failures: dict[Path, str] = {}
    if not args.report_only:
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
            print(f"[{i}/{len(to_train)}] {run.model_dir}: {'training' if run.row.heal else 'converting'} ({status})",
                  file=sys.stderr)
            try:
                if run.row.heal:
                    train_run(run, args.resume and status == "unfinished", args.data_root, command)
                else:
                    convert_run(run, args.data_root, command)
            except TrainingInterrupted as err:  # Ctrl-C / SIGTERM stops the plan, not just this model
                print(f"  {err}\nplan stopped; continue it with the same command and --resume", file=sys.stderr)
                return 128 + err.signal_number
            except Exception as err:  # record it, go on with the other models, exit 1 at the end
                failures[run.model_dir] = f"training failed: {type(err).__name__}: {err}"
                print(f"  {failures[run.model_dir]}", file=sys.stderr)
                continue
            if args.evaluate_each:
                evaluate_each(plan, run, args.data_root, failures, records)
    if args.no_report:
        return 1 if failures else 0
    results = collect(plan, all_runs, resolved, args.data_root, command, failures, records)
    print(write_results(results, out, args.append_to, records))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
