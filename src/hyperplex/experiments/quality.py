"""Quality of compressed sentence encoders in an experiment plan: the plan key ``quality:``.

A plan whose rows are ``data.task: distillation`` models (``pretrained_student``: the teacher copy,
PHM or low-rank) may ask for these metrics of every model, next to the task's own dev ``cosine``:

    quality:
      agreement: {file: tatoeba_en_fr/dev.en.gz, limit: 0}    # mean cos(student, teacher) on these sentences
      wikiqa: {file: wikiqa/dev.jsonl.gz}                     # zero-shot MAP / MRR by embedding cosine
      sst2_probe: {file: sst2/train.tsv.gz, train_size: 2000, test_size: 1000, split_seed: 0, carve: sentences}

and lists them in ``metrics:`` as ``agreement``, ``wikiqa_map``, ``wikiqa_mrr``, ``sst2_probe``. Relative
files are read from the data root. The functions are :mod:`hyperplex.convert.quality`'s; this module
only parses the plan key, runs them on a loaded model and counts its size:
``selected_params`` (the layers the conversion selects: after conversion, or dense for the teacher),
``converted_layers`` and ``file_bytes`` (``model.safetensors`` written by
:func:`hyperplex.convert.save_converted`).
"""

from __future__ import annotations

import copy
import os

#: quality kind → {key: default}; ``file`` is required.
QUALITY_KEYS = {
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
#: Sentences embedded per call.
BATCH_SIZE = 64


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
            raise QualityError(f"{where}: quality.{kind} is not a quality metric; choose from {', '.join(QUALITY_KEYS)}")
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


_TEACHER_ROWS: dict[tuple, object] = {}  # (teacher path, file, mtime, limit) → (N, D) teacher embeddings


def evaluate_quality(task, model, quality: dict, data_root: str | None) -> dict[str, float]:
    """The quality metrics of a loaded distillation model (:func:`hyperplex.train.load.load_model`): ``model.encoder`` is the
    student SentenceTransformer, ``task.teacher`` the frozen teacher. Returns ``{metric: value}`` plus
    ``{"quality_details": {...}}`` (counts: sentences, questions, probe sizes), by
    :func:`hyperplex.convert.quality.score_embedder`."""
    from hyperplex.convert.quality import (
        embed_batched,
        read_sentences,
        score_embedder,
        sentence_transformer_embedder,
    )

    agreement = wikiqa = sst2 = None
    if "agreement" in quality:
        q = quality["agreement"]
        path = resolve_file(q["file"], data_root)
        sentences = read_sentences(path, q["limit"])
        key = (task.cfg.model.path, path, os.stat(path).st_mtime_ns, q["limit"])
        if key not in _TEACHER_ROWS:  # the teacher is the same for every model of a plan: embed it once
            teacher = sentence_transformer_embedder(task.teacher, batch_size=BATCH_SIZE)
            _TEACHER_ROWS[key] = embed_batched(teacher, sentences, BATCH_SIZE)
        agreement = (sentences, _TEACHER_ROWS[key])
    if "wikiqa" in quality:
        q = quality["wikiqa"]
        wikiqa = {"path": resolve_file(q["file"], data_root), "limit_questions": q["limit_questions"] or None}
    if "sst2_probe" in quality:
        q = quality["sst2_probe"]
        probe = ("train_size", "test_size", "split_seed", "C", "carve")
        sst2 = {"path": resolve_file(q["file"], data_root), **{k: q[k] for k in probe}}
    student = sentence_transformer_embedder(model.encoder, batch_size=BATCH_SIZE)
    metrics, details = score_embedder(student, agreement, wikiqa, sst2, BATCH_SIZE)
    for kind, counts in details.items():  # the plan's file names first, as the cached evaluations had them
        details[kind] = {"file": quality[kind]["file"], **counts}
    return {**metrics, "quality_details": details}


def model_size(model) -> dict:
    """Sizes of a loaded ``pretrained_student``: ``converted_layers`` (layers replaced by PHM / low-rank),
    ``selected_params`` (parameters of the layers its conversion selects, bias included: after conversion,
    or, for ``kind: none``, the dense count of the layers a conversion with the same include/exclude/
    min_features would replace), ``selected_params_dense`` (the same layers dense), ``file_bytes`` (the
    ``model.safetensors`` that :func:`hyperplex.convert.save_converted` writes for ``model.encoder``; for an int8
    model, the weight files of ``save_quantized``) and ``held_bytes`` (parameters, buffers and packed int8
    weights held in memory: :func:`hyperplex.convert.quantize.model_bytes`)."""
    from hyperplex.convert import convert_linears
    from hyperplex.convert.quality import saved_file_bytes
    from hyperplex.convert.quantize import is_quantized, model_bytes

    report = model.report
    if is_quantized(model.encoder):  # testing.quantize: int8 — what save_quantized writes, what it holds
        from hyperplex.convert.quality import saved_quantized_file_bytes

        dense = report.converted_params_before if report is not None else None
        return {"converted_layers": len(report.converted) if report is not None else 0,
                "selected_layers": len(report.converted) if report is not None else 0,
                "selected_params": report.converted_params_after if report is not None else None,
                "selected_params_dense": dense, "file_bytes": saved_quantized_file_bytes(model.encoder),
                "held_bytes": model_bytes(model.encoder), "quantized": "int8"}
    if report is None:  # the dense teacher copy: what a conversion would select (n = 1 divides every size)
        cfg = model.config
        report = convert_linears(copy.deepcopy(model.encoder), "phm", 1, include=cfg.include or None,
                                 exclude=cfg.exclude or None, min_features=cfg.min_features)
        converted, selected = 0, report.converted_params_before
    else:
        converted, selected = len(report.converted), report.converted_params_after
    file_bytes = saved_file_bytes(model.encoder)
    return {"converted_layers": converted, "selected_layers": len(report.converted), "selected_params": selected,
            "selected_params_dense": report.converted_params_before, "file_bytes": file_bytes,
            "held_bytes": model_bytes(model.encoder)}
