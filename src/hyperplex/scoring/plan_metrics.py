"""Quality of compressed sentence encoders in an experiment plan: the plan key ``quality:``.

A plan whose rows are ``data.task: distillation`` models (``pretrained_student``: the teacher copy,
PHM or low-rank) may ask for these metrics of every model, next to the task's own dev ``cosine``:

    quality:
      agreement: {file: tatoeba_en_fr/dev.en.gz, limit: 0}    # mean cos(student, teacher) on these sentences
      wikiqa: {file: wikiqa/dev.jsonl.gz}                     # zero-shot MAP / MRR by embedding cosine
      sst2_probe: {file: sst2/train.tsv.gz, train_size: 2000, test_size: 1000, split_seed: 0, carve: sentences}

and lists them in ``metrics:`` as ``agreement``, ``wikiqa_map``, ``wikiqa_mrr``, ``sst2_probe``. Relative
files are read from the data root. The scoring is :mod:`hyperplex.scoring.quality`'s, the same as
``hyperplex score-encoder``'s (:mod:`hyperplex.scoring`); this module parses the plan key and says which
teacher, files and layers a loaded model is scored with.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from hyperplex.scoring.quality import BATCH_SIZE

#: quality kind → {key: default}; ``file`` is required.
QUALITY_KEYS: dict[str, dict[str, Any]] = {
    "agreement": {"file": None, "limit": 0},
    "wikiqa": {"file": None, "limit_questions": 0},
    "sst2_probe": {"file": None, "train_size": 2000, "test_size": 1000, "split_seed": 0, "carve": "sentences",
                   "C": 1.0},
}
#: metric name (as in the plan's ``metrics:``) → the quality kind that produces it.
QUALITY_METRICS = {"agreement": "agreement", "wikiqa_map": "wikiqa", "wikiqa_mrr": "wikiqa",
                   "sst2_probe": "sst2_probe"}
#: The task whose models these metrics apply to.
TASK = "distillation"


class QualityError(ValueError):
    """A bad ``quality:`` key; the message names the plan file and the key."""


def parse_quality(raw, where: str) -> dict:
    """The ``quality:`` mapping with every default filled in (the filled form is part of each cached
    evaluation's key). ``QualityError`` naming ``where`` and the key for anything unexpected."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not raw:
        raise QualityError(f"{where}: quality must be a mapping of {', '.join(QUALITY_KEYS)} to their settings, "
                           f"got {raw!r}")
    out = {}
    for kind, settings in raw.items():
        if kind not in QUALITY_KEYS:
            raise QualityError(f"{where}: quality.{kind} is not a quality metric; choose from "
                               f"{', '.join(QUALITY_KEYS)}")
        if isinstance(settings, str):
            settings = {"file": settings}
        if not isinstance(settings, dict):
            raise QualityError(f"{where}: quality.{kind} must be a file name or a mapping with keys "
                               f"{', '.join(QUALITY_KEYS[kind])}, got {settings!r}")
        defaults = QUALITY_KEYS[kind]
        unknown = [k for k in settings if k not in defaults]
        if unknown:
            raise QualityError(f"{where}: quality.{kind}.{unknown[0]} is not a key; expected {', '.join(defaults)}")
        merged = {**defaults, **settings}
        if not isinstance(merged["file"], str) or not merged["file"]:
            raise QualityError(f"{where}: quality.{kind}.file must name a file (relative: under the data root)")
        for key, default in defaults.items():
            value = merged[key]
            if key == "file":
                continue
            if isinstance(default, int) and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise QualityError(f"{where}: quality.{kind}.{key} must be an integer ≥ 0, got {value!r}")
            if isinstance(default, float) and (isinstance(value, bool) or not isinstance(value, (int, float))
                                               or value <= 0):
                raise QualityError(f"{where}: quality.{kind}.{key} must be a positive number, got {value!r}")
        if kind == "sst2_probe":
            if merged["carve"] not in ("sentences", "random"):
                raise QualityError(f"{where}: quality.sst2_probe.carve must be sentences or random, "
                                   f"got {merged['carve']!r}")
            if merged["train_size"] < 2 or merged["test_size"] < 1:
                raise QualityError(f"{where}: quality.sst2_probe needs train_size ≥ 2 and test_size ≥ 1")
            merged["C"] = float(merged["C"])
        out[kind] = merged
    return out


def check_metrics(metrics: list[str], quality: dict, where: str) -> None:
    """Each quality metric the plan reports must have its ``quality:`` entry."""
    for metric in metrics:
        kind = QUALITY_METRICS.get(metric)
        if kind and kind not in quality:
            raise QualityError(f"{where}: metric {metric!r} needs quality.{kind} (the file to measure it on)")


def resolve_file(name: str, data_root: str | None) -> str:
    """``name`` as given when absolute, else under the data root (``--data-root``, ``$HYPERPLEX_DATA``,
    ``../shared/data``); ``FileNotFoundError`` naming the key's file otherwise."""
    from hyperplex.config.experiment import default_data_root
    from hyperplex.tasks.common import data_file

    return os.fspath(data_file(name, data_root or default_data_root(), key="quality file"))


def check_files(quality: dict, data_root: str | None) -> list[str]:
    """One problem line per ``quality.*.file`` that does not exist."""
    problems = []
    for kind, settings in quality.items():
        try:
            resolve_file(settings["file"], data_root)
        except (OSError, ValueError) as err:
            problems.append(f"quality.{kind}.file: {err}")
    return problems


def evaluate_quality(task, model, quality: dict, data_root: str | None) -> dict[str, Any]:
    """The quality metrics of a loaded distillation model (:func:`hyperplex.inference.load.load_model`):
    ``model.encoder`` is the student SentenceTransformer, ``task.teacher`` the frozen teacher. Returns
    ``{metric: value}`` plus ``{"quality_details": {...}}`` (counts: sentences, questions, probe sizes), by
    :func:`hyperplex.scoring.quality.score_embedder`."""
    from hyperplex.scoring.quality import score_embedder, sentence_transformer_embedder, teacher_agreement

    agreement = wikiqa = sst2 = None
    if "agreement" in quality:
        q = quality["agreement"]
        agreement = teacher_agreement(task.teacher, task.cfg.model.path, resolve_file(q["file"], data_root),
                                      q["limit"], BATCH_SIZE)
    if "wikiqa" in quality:
        q = quality["wikiqa"]
        wikiqa = {"path": resolve_file(q["file"], data_root), "limit_questions": q["limit_questions"] or None}
    if "sst2_probe" in quality:
        q = quality["sst2_probe"]
        probe = ("train_size", "test_size", "split_seed", "C", "carve")
        sst2 = {"path": resolve_file(q["file"], data_root), **{k: q[k] for k in probe}}
    student = sentence_transformer_embedder(model.encoder, batch_size=BATCH_SIZE)
    metrics, details = score_embedder(student, agreement, wikiqa, sst2, BATCH_SIZE)
    # the plan's file names first, as the cached evaluations had them
    named = {kind: {"file": quality[kind]["file"], **counts} for kind, counts in details.items()}
    return {**metrics, "quality_details": named}


def model_size(model) -> dict:
    """:func:`hyperplex.scoring.quality.encoder_size` of a loaded ``pretrained_student``'s encoder, its
    selected layers those its conversion selected; for ``kind: none`` (the dense teacher copy), those a
    conversion with the same targets/exclude/min_features would replace. An int8 form of the dense copy
    has no float layers left to select from: its ``selected_params`` are ``None``."""
    from hyperplex.convert.compress import PHMConfig, compress
    from hyperplex.int8 import is_quantized
    from hyperplex.scoring.quality import encoder_size

    report = model.report
    if report is None and is_quantized(model.encoder):
        return encoder_size(model.encoder, []) | {"selected_params": None, "selected_params_dense": None}
    if report is None:  # what a conversion would select (n = 1 divides every size)
        cfg = model.config
        report = compress(copy.deepcopy(model.encoder), PHMConfig(n=1, targets=cfg.targets or None,
                                                                   exclude=cfg.exclude, min_features=cfg.min_features))
    return encoder_size(model.encoder, [layer.name for layer in report.converted])
