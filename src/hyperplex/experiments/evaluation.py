"""Evaluating a plan's models: the steps of ``hyperplex evaluate`` plus parameter counts, cached per
model folder and row in ``evaluation-<row>.json`` until the checkpoint (or the plan's settings) change.

The cache file is written atomically (:func:`hyperplex.fileio.atomic_write_text`), so a lane killed while
writing it leaves the old cache or none, never a half-written one that a later report would trip on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hyperplex.config import from_dict, merge, parse_overrides, to_dict
from hyperplex.experiments.plan import Plan, Row
from hyperplex.experiments.records import recorded_evaluation, write_record
from hyperplex.experiments.runs import Run
from hyperplex.experiments.state import folder_status
from hyperplex.fileio import atomic_write_text
from hyperplex.scoring import plan_metrics as quality_metrics

__all__ = ["evaluate_model", "evaluation_key", "cached_evaluation", "evaluate_each"]


def evaluate_model(model_dir: Path, checkpoint: str, data_root: str | None, eval_overrides: list[str],
                   eval_split: str = "", quality: dict | None = None) -> dict:
    """``{"metrics", "params", "signatures", "beam_size"}`` (and, for translation, ``"hypotheses"``: the scored
    text, one line per sentence of the split) of one model folder: the steps of
    :func:`hyperplex.inference.verbs.evaluate` (load, validation split or the file ``eval_split``, the configured
    beam) with ``eval_overrides`` (``testing.*``) applied to the saved config first, and
    :func:`~hyperplex.models.params.parameter_breakdown` of the loaded model. With a plan's ``quality``
    (distillation models): its metrics join ``metrics``, and ``size`` / ``quality_details`` are added
    (:mod:`hyperplex.scoring.plan_metrics`)."""
    from hyperplex.config.experiment import TestingConfig
    from hyperplex.inference.load import inference_form, load_model
    from hyperplex.inference.verbs import score
    from hyperplex.models.params import parameter_breakdown
    from hyperplex.train.protocols import SignsMetrics

    cfg, task, model = load_model(str(model_dir), checkpoint, data_root)
    if eval_overrides:
        testing = parse_overrides(eval_overrides)["testing"]
        cfg.testing = from_dict(TestingConfig, merge(to_dict(cfg.testing), testing), "testing")
        model = inference_form(cfg, model)  # e.g. --testing.quantize=int8 scores the int8 form
    if eval_split:  # relative paths are read from the data root, as `hyperplex evaluate --split FILE`
        task.use_evaluation_file(eval_split)
    metrics = score(cfg, task, model)
    hypotheses = getattr(task, "hypotheses", None)  # translation: the text the metrics scored
    breakdown = parameter_breakdown(model)
    signatures = dict(task.signatures) if isinstance(task, SignsMetrics) else {}  # sacreBLEU's, translation only
    result: dict[str, Any] = {"metrics": {k: float(v) for k, v in metrics.items()}, "params": breakdown,
                              "signatures": signatures,
                              "beam_size": cfg.testing.beam_size if cfg.data.task == "translation" else None}
    if hypotheses is not None:
        result["hypotheses"] = list(hypotheses)
    if quality:
        scores = quality_metrics.evaluate_quality(task, model, quality, data_root)
        result["quality_details"] = scores.pop("quality_details")
        result["metrics"].update(scores)
        result["size"] = quality_metrics.model_size(model)
    return result


def evaluation_key(run: Run, row: Row, checkpoint: str, quality: dict | None = None) -> dict:
    """What an evaluation depends on: the checkpoint chosen and its file (name, size, modification time; none
    for a record), the row's eval overrides and split, and the plan's ``quality`` settings when it has any."""
    from hyperplex.inference.load import checkpoint_path

    if run.record is not None:
        stat, name = None, None
    else:
        ckpt = checkpoint_path(run.model_dir, checkpoint)
        stat, name = ckpt.stat(), ckpt.name
    key: dict[str, Any] = {"checkpoint": checkpoint, "file": name, "size": stat and stat.st_size,
                           "mtime_ns": stat and stat.st_mtime_ns, "eval_overrides": row.eval_overrides,
                           "eval_split": row.eval_split}
    if quality:  # only then: the caches of plans without quality keep their keys
        key["quality"] = quality
    return key


def cached_evaluation(run: Run, row: Row, checkpoint: str, data_root: str | None, quality: dict | None = None) -> dict:
    """:func:`evaluate_model`, cached in ``MODEL_DIR/evaluation-<row>.json`` (a translation's scored text in
    ``hypotheses-<row>.txt`` beside it) until the checkpoint file (or the
    plan's ``quality`` settings) change; a recorded model's evaluation is read from its record. A
    ``train: false`` model has only ``last``."""
    if not run.row.train:
        checkpoint = "last"
    key = evaluation_key(run, row, checkpoint, quality)
    if run.record is not None:
        return recorded_evaluation(run, row.name, key)
    cache = run.model_dir / f"evaluation-{row.name}.json"
    if cache.is_file():
        saved = json.loads(cache.read_text(encoding="utf-8"))
        if saved.get("key") == key:
            return saved["result"]
    result = evaluate_model(run.model_dir, checkpoint, data_root, row.eval_overrides, row.eval_split, quality)
    hypotheses = result.pop("hypotheses", None)
    if hypotheses is not None:  # beside the scores, so that a record can be re-scored without its checkpoint
        atomic_write_text(run.model_dir / f"hypotheses-{row.name}.txt", "".join(f"{h}\n" for h in hypotheses))
    atomic_write_text(cache, json.dumps({"key": key, "result": result}, indent=1))
    return result


def evaluate_each(plan: Plan, run: Run, data_root: str | None, failures: dict[Path, str],
                  records: Path | None = None) -> None:
    """Evaluate a just-trained model for every plan row that scores it (its own row and the ``models_from``
    rows naming it) into the ``evaluation-<row>.json`` caches that the report reads, so lanes of
    ``--no-report --evaluate-each`` share the evaluation cost and ``--report-only`` only reads caches. With
    ``records``, the model's record is written after its evaluations. A failure is noted in ``failures``."""
    if run.record is not None or folder_status(run.model_dir) != "finished":
        return
    for row in plan.rows:
        if (row.models_from or row.name) == run.row.name and run.seed in row.seeds:
            try:
                cached_evaluation(run, row, plan.checkpoint, data_root, plan.quality)
                print(f"  evaluated for row {row.name!r}", file=sys.stderr)
            except Exception as err:  # the report retries it; the lane goes on
                failures[run.model_dir] = f"evaluation failed: {type(err).__name__}: {err}"
                print(f"  {failures[run.model_dir]}", file=sys.stderr)
    if records and run.model_dir not in failures:
        print(f"  recorded in {write_record(run, records, plan.name)}", file=sys.stderr)
