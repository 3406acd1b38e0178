"""The plan file: which models to train (rows × seeds), with what budget, and what to report.

A plan (``experiments/*.yaml``) is validated by the same machinery as every hyperplex YAML
(:func:`hyperplex.config.from_dict`): :class:`PlanFile` and :class:`RowSpec` are dataclasses whose
fields carry their help, an unknown key is an error naming it (and the closest valid key), a wrong type
names the key and the expected type. :func:`load_plan` then checks what spans several keys (row names,
``models_from`` and ``match_params`` references, metrics) and expands ``sweep:`` rows, giving a :class:`Plan`.
Configs are checked later, by :func:`hyperplex.experiments.runs.validate`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from hyperplex.config import ConfigError, from_dict, load_yaml, located
from hyperplex.scoring import plan_metrics as quality_metrics

__all__ = ["PlanError", "TASK_METRICS", "SweepSpec", "RowSpec", "PlanFile", "Row", "Plan", "load_plan",
           "expand_sweep", "resolve_config", "value_text"]

#: What each task's validation returns (``Task.validate``); plans may only ask for these.
TASK_METRICS = {"translation": ("bleu", "chrf", "accuracy", "loss", "ppl"),
                "classification": ("accuracy", "loss"), "pair_classification": ("accuracy", "loss"),
                "ranking": ("map", "mrr", "loss"), "distillation": ("cosine", "loss")}
#: Row and folder names: letters, digits and ``_ . + -``.
FOLDER_NAME = re.compile(r"[A-Za-z0-9_.+-]+")


def folder_safe(name: str) -> bool:
    """Whether ``name`` may be one folder name (``OUT/NAME``): :data:`FOLDER_NAME` and one plain path component
    (:func:`hyperplex.guards.check_name`: ``.`` and ``..`` match the letters but lead out of ``OUT``)."""
    from hyperplex.guards import check_name

    try:
        check_name(name, "name")
    except ValueError:
        return False
    return bool(FOLDER_NAME.fullmatch(name))


class PlanError(ValueError):
    """A plan that cannot run; the message names the plan file, the row and what is expected."""


def _check_override_form(items: list[str], where: str) -> None:
    """A plan's overrides are written into the command lines of its report, so each must be what ``hyperplex
    train`` takes: ``--section.key=value``."""
    for item in items:
        if not isinstance(item, str) or not item.startswith("--") or "=" not in item:
            raise ValueError(f"{where}: {item!r} is not of the form --section.key=value (as `hyperplex train` "
                             "takes it)")


def _check_seeds(seeds: list[int], key: str) -> None:
    if not seeds:
        raise ValueError(f"{key}: expected a non-empty list of integer seeds like [1, 2, 3]")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{key}: repeated seed in {seeds}")


# ---------------------------------------------------------------------------- schema
@dataclass
class SweepSpec:
    """``sweep:`` of a row: one row per value of one config key."""

    key: str = field(default="", metadata={"help": "dotted config key, e.g. training.lr"})
    values: list[int | str | float] = field(default_factory=list, metadata={
        "help": "≥ 2 distinct numbers or strings; each becomes a row NAME_<last key part><value> whose overrides "
                "end with --KEY=VALUE"})

    def __post_init__(self) -> None:
        if not self.key or not self.values:
            raise ValueError("sweep must be a mapping {key: training.lr, values: [2.5e-4, 5e-4, ...]} with both keys")
        if not re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", self.key):
            raise ValueError(f"sweep key must be a dotted config key like training.lr, got {self.key!r}")
        if len(self.values) < 2 or len(set(map(str, self.values))) != len(self.values):
            raise ValueError(f"sweep values must be a list of ≥ 2 distinct numbers or strings, got {self.values!r}")
        for value in self.values:
            if not folder_safe(value_text(value)):
                raise ValueError(f"sweep value {value!r} cannot be part of a folder name")


@dataclass
class RowSpec:
    """One entry of ``rows:``: a config trained once per seed, or another row's models scored again."""

    name: str = field(default="", metadata={"help": "folder name and row id (letters, digits, _ . + -)"})
    label: str = field(default="", metadata={"help": "label in the table (default: name)"})
    config: str = field(default="", metadata={
        "help": "experiment config: as given, else relative to the plan's folder, else to its parent"})
    overrides: list[str] = field(default_factory=list, metadata={
        "help": "config overrides of this row, e.g. [--model.linear.n=4]; applied after the plan's budget"})
    seeds: list[int] | None = field(default=None, metadata={"help": "this row's seeds (default: the plan's)"})
    models_from: str = field(default="", metadata={
        "help": "score the models of this other row instead of training (with eval_overrides or eval_split)"})
    eval_overrides: list[str] = field(default_factory=list, metadata={
        "help": "testing.* overrides applied when evaluating, e.g. [--testing.beam_size=1]"})
    eval_split: str = field(default="", metadata={
        "help": "a file in the task's format scored instead of the validation split (relative: the data root)"})
    sweep: SweepSpec | None = field(default=None, metadata={"help": "{key, values}: one row per value"})
    match_params: str = field(default="", metadata={
        "help": "a row whose parameter count (total and without embeddings) this row's must match within 2%"})
    train: bool | None = field(default=None, metadata={
        "help": "false: save and evaluate the model as built (step 0, no training, no budget); default true"})

    #: Keys whose old names are refused with the new name (:func:`hyperplex.config.from_dict`).
    renamed_keys: ClassVar[dict[str, str]] = {"heal": "train", "model_of": "models_from"}

    def __post_init__(self) -> None:
        if not folder_safe(self.name):
            raise ValueError(f"`name` must be a folder-safe string (letters, digits, _ . + -; not '.' or '..'), "
                             f"got {self.name!r}")
        if bool(self.config) == bool(self.models_from):
            raise ValueError(f"row {self.name!r}: give exactly one of `config:` (train models) or `models_from:` "
                             "(evaluate the models of another row)")
        _check_override_form(self.overrides, f"row {self.name!r}: overrides")
        _check_override_form(self.eval_overrides, f"row {self.name!r}: eval_overrides")
        for item in self.eval_overrides:
            if not item.lstrip("-").startswith("testing."):
                raise ValueError(f"row {self.name!r}: eval_overrides may only set testing.* keys (the model is "
                                 f"fixed), got {item!r}")
        if self.seeds is not None:
            _check_seeds(self.seeds, f"row {self.name!r}: seeds")
        if self.models_from and (self.overrides or self.seeds is not None):
            raise ValueError(f"row {self.name!r}: a `models_from` row takes its config, overrides and seeds from "
                             "that row")
        if self.models_from and self.sweep is not None:
            raise ValueError(f"row {self.name!r}: a `models_from` row cannot sweep (it trains nothing)")
        if self.train is not None and (self.models_from or self.sweep is not None):
            raise ValueError(f"row {self.name!r}: train: false applies to a row with a config and no sweep")


@dataclass
class PlanFile:
    """The keys of a plan file."""

    title: str = field(default="", metadata={"help": "heading of the results section (required)"})
    rows: list[RowSpec] = field(default_factory=list, metadata={"help": "the rows (required, non-empty)"})
    metrics: list[str] = field(default_factory=list, metadata={
        "help": "metrics to report, the first one leads (required): " + ", ".join(
            f"{task}: {' '.join(m)}" for task, m in TASK_METRICS.items()) + "; with quality: also "
        + " ".join(quality_metrics.QUALITY_METRICS)})
    name: str = field(default="", metadata={"help": "section marker and default output folder (default: file stem)"})
    description: str = field(default="", metadata={"help": "paragraph under the title"})
    seeds: list[int] = field(default_factory=lambda: [1], metadata={"help": "default seeds of every row"})
    budget: list[str] = field(default_factory=list, metadata={
        "help": "overrides applied to every trained row first, e.g. [--training.max_steps=3000]"})
    checkpoint: Literal["last", "best"] = field(default="last", metadata={"help": "the checkpoint evaluated"})
    digits: int = field(default=2, metadata={"help": "decimals in the table (0…6)"})
    quality: dict | None = field(default=None, metadata={
        "help": "sentence-encoder quality metrics of distillation models (hyperplex.scoring.plan_metrics)"})

    def __post_init__(self) -> None:
        if not self.title or not self.rows:
            raise ValueError("missing `title:` or `rows:` (a plan needs a title and a non-empty list of rows)")
        _check_seeds(self.seeds, "seeds")
        _check_override_form(self.budget, "budget")
        if not 0 <= self.digits <= 6:
            raise ValueError(f"digits must be an integer 0…6, got {self.digits!r}")
        known = sorted({m for ms in TASK_METRICS.values() for m in ms} | set(quality_metrics.QUALITY_METRICS))
        if not self.metrics or any(m not in known for m in self.metrics):
            raise ValueError(f"metrics must be a non-empty list from {known}, got {self.metrics!r}")


# ---------------------------------------------------------------------------- parsed plan
@dataclass
class Row:
    """One plan row after expansion: a config with overrides, trained once per seed (or evaluating
    another row's models)."""

    name: str
    label: str
    config: str = ""  # resolved path (a models_from row: its source row's, set by load_plan)
    overrides: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    models_from: str = ""
    eval_overrides: list[str] = field(default_factory=list)
    eval_split: str = ""  # a file in the task's format scored instead of the validation split
    params_table: str = ""  # `hyperplex params` of the row's config (vocabulary = data.vocab_size), set by validate
    params: dict | None = None  # the parameter_breakdown that table shows, set by validate
    sweep_of: str = ""  # a row expanded from a `sweep:` row: that row's name
    sweep_key: str = ""  # the swept config key (e.g. training.lr) ...
    sweep_value: float | int | str | None = None  # ... and this row's value of it
    match_params: str = ""  # a row whose parameter count this row's must match (hyperplex.experiments.matching)
    train: bool = True  # False: the model as built (step 0, no training, no budget) is saved and evaluated


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
    quality: dict = field(default_factory=dict)  # hyperplex.scoring.plan_metrics.parse_quality of `quality:`


def value_text(value) -> str:
    """A swept value as it appears in row names and labels: ``0.0005`` → ``0.0005``, ``1e-05`` → ``1e-05``."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def expand_sweep(row: Row, sweep: SweepSpec) -> list[Row]:
    """The rows of a ``sweep: {key: training.lr, values: [...]}`` row: one per value, named
    ``NAME_<last key part><value>`` (``transformer_lr0.0005``), labelled ``LABEL, lr 0.0005``, with
    ``--KEY=VALUE`` appended to the row's overrides (so it wins over them and over the budget)."""
    short = sweep.key.rsplit(".", 1)[1]
    return [Row(name=f"{row.name}_{short}{value_text(value)}", label=f"{row.label}, {short} {value_text(value)}",
                config=row.config, overrides=[*row.overrides, f"--{sweep.key}={value_text(value)}"],
                seeds=list(row.seeds), eval_overrides=list(row.eval_overrides), eval_split=row.eval_split,
                sweep_of=row.name, sweep_key=sweep.key, sweep_value=value)
            for value in sweep.values]


def resolve_config(config: str, plan_path: Path) -> Path:
    """A row's config path: as given (absolute, or relative to the working directory), else relative
    to the plan's folder, else to its parent (the repository root for ``experiments/*.yaml``)."""
    candidates = [Path(config), plan_path.parent / config, plan_path.parent.parent / config]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise PlanError(f"config file {config!r} not found (looked at {', '.join(str(c) for c in candidates)})")


def load_plan(path: str | Path) -> Plan:
    """Read and check a plan file (structure only; configs are checked by
    :func:`hyperplex.experiments.runs.validate`). Any problem raises :class:`PlanError` naming the file."""
    path = Path(path)
    spec, quality = _read_plan_file(path)
    if spec.name and not folder_safe(spec.name):  # the default output folder runs/NAME
        raise PlanError(f"{path}: key 'name' {spec.name!r} must be a folder-safe string (letters, digits, "
                        f"_ . + -; not '.' or '..')")
    rows = _expand_rows(spec, path)
    _link_rows(rows, path)
    return Plan(path=path, name=spec.name or path.stem, title=spec.title, rows=rows, budget=spec.budget,
                metrics=spec.metrics, checkpoint=spec.checkpoint, digits=spec.digits, description=spec.description,
                quality=quality)


def _read_plan_file(path: Path) -> tuple[PlanFile, dict]:
    """The plan file's keys checked against the schema, and its parsed ``quality:`` settings checked against its
    metrics; a problem is a :class:`PlanError` that starts with the file's path."""
    try:
        spec = from_dict(PlanFile, load_yaml(path))
        quality = quality_metrics.parse_quality(spec.quality, str(path))
        quality_metrics.check_metrics(spec.metrics, quality, str(path))
    except (ConfigError, quality_metrics.QualityError) as err:
        message = str(err)
        start = located(path, err) if isinstance(err, ConfigError) else str(path)
        raise PlanError(message if message.startswith(str(path)) else f"{start}: {message}") from None
    return spec, quality


def _expand_rows(spec: PlanFile, path: Path) -> list[Row]:
    """Every row of the plan, sweeps expanded, configs resolved; row names must be unique."""
    rows: list[Row] = []
    for item in spec.rows:
        where = f"{path}: row {item.name!r}"
        if any(r.name == item.name for r in rows):
            raise PlanError(f"{where}: duplicate row name {item.name!r}")
        row = Row(name=item.name, label=item.label or item.name, overrides=list(item.overrides),
                  eval_overrides=list(item.eval_overrides), models_from=item.models_from, eval_split=item.eval_split,
                  match_params=item.match_params, train=item.train is not False)
        if not row.models_from:
            row.config = str(resolve_config(item.config, path))
            row.seeds = list(item.seeds if item.seeds is not None else spec.seeds)
        if item.sweep is None:
            rows.append(row)
            continue
        expanded = expand_sweep(row, item.sweep)
        if any(r.name == e.name for r in rows for e in expanded):
            raise PlanError(f"{where}: the sweep's row names {[e.name for e in expanded]} clash with another row")
        rows += expanded
    return rows


def _link_rows(rows: list[Row], path: Path) -> None:
    """Check ``match_params`` and ``models_from`` name rows with a config; a ``models_from`` row takes that row's
    config, overrides and seeds."""
    by_name = {r.name: r for r in rows}
    trained = ", ".join(r.name for r in rows if not r.models_from)
    for row in rows:
        if row.match_params and (row.match_params not in by_name or by_name[row.match_params].models_from):
            raise PlanError(f"{path}: row {row.name!r}: match_params {row.match_params!r} must name a row with a "
                            f"config (rows: {trained})")
    for row in rows:
        if row.models_from:
            source = by_name.get(row.models_from)
            if source is None or source.models_from:
                raise PlanError(f"{path}: row {row.name!r}: models_from {row.models_from!r} must name a row with a "
                                f"config (rows: {trained})")
            row.config, row.overrides, row.seeds = source.config, source.overrides, source.seeds
