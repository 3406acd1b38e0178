"""Compressed sentence encoders scored next to their teacher (``hyperplex score-encoder``, from Python
:func:`score_encoders`).

Each STUDENT is a folder :func:`hyperplex.convert.save_converted` wrote (``hyperplex_convert.json``) or a
``hyperplex compress`` model folder (``config.yaml`` with ``data.task: distillation``), which is scored
through its ``student/`` when there is one, else its best checkpoint, else its last one (an experiment
plan's ``train: false`` rows have only that). The teacher is ``--teacher``, or the ``model.path`` the
students' ``config.yaml`` records (a ``student/`` folder: its parent's); it is always the first row.

The scoring is :mod:`hyperplex.scoring.quality`'s, the same as an experiment plan's ``quality:`` key
(:mod:`hyperplex.scoring.plan_metrics`): ``agreement`` (mean cosine to the teacher on held-out sentences,
the teacher embedded once, :func:`~hyperplex.scoring.quality.teacher_agreement`), ``wikiqa_map`` /
``wikiqa_mrr`` (zero-shot ranking by cosine), ``sst2_probe`` (a logistic-regression probe on frozen
embeddings, whole sentences only); and the sizes (:func:`~hyperplex.scoring.quality.encoder_size`):
``params`` (whole model), ``converted_layers``, ``selected_params`` (the parameters of the layers the
students converted; for the teacher the same layers dense) and ``file_bytes`` (``model.safetensors`` as
``save_converted`` writes it). Everything that can be checked without embedding is checked first, so
bad input fails in seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_FILES", "METRICS", "PROBE_C", "find_student", "resolve_teacher", "score_encoders"]

#: ``--metrics`` name → the file it is measured on, relative to the data root (the files
#: ``experiments/minilm_compress.yaml`` uses); its flag is ``--NAME``.
DEFAULT_FILES = {"agreement": "tatoeba_en_fr/dev.en.gz", "wikiqa": "wikiqa/dev.jsonl.gz",
                 "sst2": "sst2/train.tsv.gz"}
METRICS = tuple(DEFAULT_FILES)
#: The SST-2 probe's logistic-regression strength and carve (whole sentences: no test text is seen in training).
PROBE_C, PROBE_CARVE = 1.0, "sentences"


@dataclass
class Student:
    """Where one STUDENT argument's model comes from."""

    argument: str               # as given on the command line (the row's name)
    folder: Path                # a save_converted folder, or the compress model folder (with ``checkpoint``)
    checkpoint: str | None      # the checkpoint file name in ``folder`` when there is no student/ folder
    teacher: str | None         # the teacher it records (``model.path``), None when it records none
    recorded_in: str | None     # the file that records it

    @property
    def source(self) -> str:
        return os.fspath(self.folder / self.checkpoint) if self.checkpoint else os.fspath(self.folder)


def _distillation_config(path: Path) -> dict:
    """The ``config.yaml`` at ``path`` as a mapping; ValueError unless it is a distillation config."""
    from hyperplex.config import load_yaml

    raw = load_yaml(path)
    task = raw.get("data", {}).get("task") if isinstance(raw.get("data"), dict) else None
    if task != "distillation":
        raise ValueError(f"{path} has data.task {task!r}; a `hyperplex compress` model folder has data.task: "
                         f"distillation")
    return raw


def _recorded_teacher(raw: dict) -> str:
    from hyperplex.pretrained import MINILM

    model = raw.get("model")
    return str((model.get("path") if isinstance(model, dict) else None) or MINILM)


def find_student(argument: str) -> Student:
    """What ``argument`` names (no model is loaded): a ``save_converted`` folder of a SentenceTransformer, or
    a ``hyperplex compress`` model folder. ValueError naming the argument and what was expected otherwise."""
    from hyperplex.convert.serialize import SPEC_NAME
    from hyperplex.train.checkpoint import BEST, LAST

    path = Path(argument)
    expected = (f"expected a folder written by hyperplex.convert.save_converted (with {SPEC_NAME}) or a "
                f"`hyperplex compress` model folder (with config.yaml)")
    if not path.exists():
        raise FileNotFoundError(f"STUDENT {argument}: no such folder; {expected}")
    if not path.is_dir():
        raise ValueError(f"STUDENT {argument}: is a file; {expected}")
    spec_path = path / SPEC_NAME
    if spec_path.is_file():
        from hyperplex.convert.serialize import MAX_SPEC_BYTES
        from hyperplex.fileio import UnsafePathError, check_folder_files, read_bounded

        try:  # a FIFO or a link out of the folder would hang or read elsewhere: refused before anything is read
            check_folder_files(path)
            library = (json.loads(read_bounded(spec_path, MAX_SPEC_BYTES).decode("utf-8"))
                       .get("model", {}).get("library"))
        except UnsafePathError as err:
            raise ValueError(f"STUDENT {argument}: {err}") from None
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, AttributeError):
            raise ValueError(f"STUDENT {argument}: {spec_path} is not a save_converted spec (invalid JSON)") from None
        if library != "sentence-transformers":
            raise ValueError(f"STUDENT {argument}: {spec_path} holds a {library} model, not a SentenceTransformer; "
                             f"score-encoder needs sentence embeddings")
        parent = path.parent / "config.yaml"  # MODEL_DIR/student of `hyperplex compress`: its config names the teacher
        if path.name == "student" and parent.is_file():
            return Student(argument, path, None, _recorded_teacher(_distillation_config(parent)), os.fspath(parent))
        return Student(argument, path, None, None, None)
    config = path / "config.yaml"
    if config.is_file():
        try:
            raw = _distillation_config(config)
        except ValueError as err:
            raise ValueError(f"STUDENT {argument}: {err}") from None
        teacher = _recorded_teacher(raw)
        if (path / "student" / SPEC_NAME).is_file():
            return Student(argument, path / "student", None, teacher, os.fspath(config))
        for name in (BEST, LAST):
            if (path / name).is_file():
                return Student(argument, path, name, teacher, os.fspath(config))
        raise ValueError(f"STUDENT {argument}: a `hyperplex compress` model folder without student/, {BEST} or "
                         f"{LAST} (has its training written a checkpoint yet?)")
    raise ValueError(f"STUDENT {argument}: neither a save_converted folder (no {SPEC_NAME}) nor a `hyperplex "
                     f"compress` model folder (no config.yaml); {expected}")


def _same_teacher(a: str, b: str) -> bool:
    return a == b or os.path.realpath(a) == os.path.realpath(b)


def resolve_teacher(students: list[Student], teacher: str | None) -> tuple[str, str]:
    """(teacher, where it came from): ``--teacher`` when given, else the one every student records."""
    if teacher:
        return teacher, "--teacher"
    bare = [s for s in students if s.teacher is None]
    if bare:
        raise ValueError(f"STUDENT {bare[0].argument} records no teacher (a save_converted folder outside a "
                         f"`hyperplex compress` model folder): pass --teacher minilm|PATH")
    first = students[0]
    assert first.teacher is not None  # students without a teacher were refused above
    for other in students[1:]:
        if other.teacher is None or not _same_teacher(first.teacher, other.teacher):
            raise ValueError(f"the students record different teachers: {first.teacher!r} ({first.recorded_in}) and "
                             f"{other.teacher!r} ({other.recorded_in}); score them separately or pass --teacher")
    return first.teacher, f"model.path in {first.recorded_in}"


def _data_files(metrics: list[str], files: dict[str, str | None], data_root: str | None) -> dict[str, str]:
    """Each metric's file (given, or the default under the data root); a DataError naming its flag if absent."""
    from hyperplex.tasks.common import data_file

    return {m: os.fspath(data_file(files.get(m) or DEFAULT_FILES[m], data_root, key=f"--{m}")) for m in metrics}


def _load_student(student: Student, data_root: str | None):
    if student.checkpoint is None:  # a converted folder, or an int8 one (testing.quantize: int8)
        from hyperplex.int8 import load_model_folder

        return load_model_folder(student.folder)
    from hyperplex.inference.load import load_model

    _, _, model = load_model(student.folder, student.checkpoint, data_root, read_data=False)
    return model.encoder.cpu().eval()


@contextlib.contextmanager
def _quiet_transformers():
    """``transformers``' progress bars ("Loading weights", "Writing model shards") off, then as they were."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _conversion(spec: list[dict]) -> str:
    """``dense``, ``phm n=4``, ``lowrank rank 96``, ``lowrank rank 48–96`` … from a conversion spec."""
    if not spec:
        return "dense"
    parts = []
    for kind, key, label in (("phm", "n", "n="), ("lowrank", "rank", "rank ")):
        values = sorted({entry[key] for entry in spec if entry["kind"] == kind})
        if values:
            shown = str(values[0]) if len(values) == 1 else f"{values[0]}–{values[-1]}"
            parts.append(f"{kind} {label}{shown}")
    return " + ".join(parts)


def score_encoders(students: list[str], teacher: str | None = None, data_root: str | None = None,
                   files: dict[str, str | None] | None = None, metrics: list[str] | None = None,
                   probe_train: int = 2000, probe_test: int = 1000, split_seed: int = 0,
                   json_path: str | None = None, threads: int | str | None = None, progress: bool = True) -> dict:
    """The teacher and each student scored on the same data (``hyperplex score-encoder``).

    Args:
        students: STUDENT folders (:func:`find_student`).
        teacher: ``minilm`` or a SentenceTransformer folder; ``None``: the one the students record.
        data_root: where relative data files are read (default: ``$HYPERPLEX_DATA``, else ``../shared/data``).
        files: ``{"agreement"|"wikiqa"|"sst2": file}`` replacing :data:`DEFAULT_FILES`.
        metrics: the subset of :data:`METRICS` to measure (default: all); the size columns are always there.
        probe_train, probe_test, split_seed: the SST-2 probe's carve (whole sentences only).
        json_path: also write the result there as JSON (its folder must exist).
        threads: torch CPU threads (0/None: :mod:`hyperplex.threads`' rule).
        progress: a bar on stderr (a terminal only).

    Returns:
        ``{"teacher", "teacher_from", "files", "probe", "details", "rows"}``; each row is ``{"name", "role",
        "source", "conversion", metric: value …, "params", "converted_layers", "selected_params",
        "file_bytes"}``, the teacher first.
    """
    from hyperplex.config.experiment import default_data_root
    from hyperplex.threads import parse_threads

    # -- everything that needs no model: arguments, folders, teacher, data files --------------------------
    threads = 0 if threads is None else parse_threads(threads)
    metrics = list(METRICS if metrics is None else metrics)
    found, teacher, teacher_from = _check_arguments(students, teacher, metrics, probe_train, probe_test)
    data_root = data_root or default_data_root()
    paths = _data_files(metrics, files or {}, data_root)
    if "sst2" in metrics:
        from hyperplex.scoring.quality import sst2_pool

        pool = len(sst2_pool(paths["sst2"], PROBE_CARVE))
        if probe_train + probe_test > pool:
            raise ValueError(f"--probe-train + --probe-test = {probe_train + probe_test} exceeds the {pool} whole "
                             f"sentences of {paths['sst2']} (--sst2)")
    if json_path and not Path(json_path).resolve().parent.is_dir():
        raise FileNotFoundError(f"--json: the folder of {json_path} does not exist")
    from hyperplex.guards import check_outputs

    check_outputs({"--json": json_path}, [*students, teacher, *paths.values()])  # not over a model or data file
    probe = {"train": probe_train, "test": probe_test, "split_seed": split_seed, "C": PROBE_C,
             "carve": PROBE_CARVE} if "sst2" in metrics else None

    with _quiet_transformers():  # its own bars for every model loaded or saved; this verb has one bar
        teacher_model, models = _load_models(found, teacher, data_root, threads)
        rows, details = _score_rows(teacher, teacher_model, found, models, paths, probe, progress)
    result = {"teacher": teacher, "teacher_from": teacher_from, "files": paths, "probe": probe,
              "details": details, "rows": rows}
    if json_path:
        from hyperplex.fileio import atomic_write_text

        atomic_write_text(json_path, json.dumps(result, indent=1) + "\n")
    return result


def _check_arguments(students: list[str], teacher: str | None, metrics: list[str], probe_train: int,
                     probe_test: int) -> tuple[list[Student], str, str]:
    """(the students found, the teacher, where it came from), or the error naming the bad argument."""
    from hyperplex.pretrained import resolve_model_path

    unknown = [m for m in metrics if m not in METRICS]
    if unknown or not metrics:
        raise ValueError(f"--metrics: {unknown[0] if unknown else 'nothing'!r} is not a metric; choose from "
                         f"{', '.join(METRICS)}")
    if not students:
        raise ValueError("no STUDENT given")
    if "sst2" in metrics and (probe_train < 2 or probe_test < 1):
        raise ValueError(f"--probe-train must be ≥ 2 and --probe-test ≥ 1, got {probe_train} and {probe_test}")
    found = [find_student(s) for s in students]
    teacher, teacher_from = resolve_teacher(found, teacher)
    try:
        resolve_model_path(teacher)
    except (ValueError, ImportError) as err:
        raise type(err)(f"the teacher ({teacher_from}): {str(err).removeprefix('model.path: ')}") from None
    return found, teacher, teacher_from


def _load_models(found: list[Student], teacher: str, data_root: str | None, threads: int):
    """(teacher, students) loaded on the CPU, each student checked to embed in the teacher's width; the
    torch threads set for their size."""
    from hyperplex.pretrained import load_sentence_transformer
    from hyperplex.scoring.quality import BATCH_SIZE, sentence_transformer_embedder
    from hyperplex.threads import TOKENS_PER_SENTENCE, model_width, set_threads

    teacher_model = load_sentence_transformer(teacher)
    models = [_load_student(s, data_root) for s in found]
    width = sentence_transformer_embedder(teacher_model)(["width"]).shape[1]
    for student, model in zip(found, models):
        own = sentence_transformer_embedder(model)(["width"]).shape[1]
        if own != width:
            raise ValueError(f"STUDENT {student.argument}: its embeddings have {own} dimensions but the teacher's "
                             f"({teacher}) have {width}; is it this teacher's student?")
    set_threads(threads, BATCH_SIZE * TOKENS_PER_SENTENCE, model_width(teacher_model))
    return teacher_model, models


def _score_rows(teacher: str, teacher_model, found: list[Student], models: list, paths: dict[str, str],
                probe: dict | None, progress: bool) -> tuple[list[dict], dict]:
    """One row per model, the teacher first: the metrics of :func:`~hyperplex.scoring.quality.score_embedder`
    and the sizes of :func:`~hyperplex.scoring.quality.encoder_size` (the teacher's selected layers: every
    layer a student converted). Also the details (counts) of the last row."""
    from hyperplex.int8 import is_quantized
    from hyperplex.pretrained import resolve_model_path
    from hyperplex.scoring.quality import (
        BATCH_SIZE,
        encoder_size,
        score_embedder,
        sentence_transformer_embedder,
        teacher_agreement,
        total_parameters,
    )

    specs = [_converted_spec(model) for model in models]
    converted = list(dict.fromkeys(entry["name"] for spec in specs for entry in spec))
    try:
        teacher_size = encoder_size(teacher_model, converted)
    except KeyError as err:
        raise ValueError(f"the teacher ({teacher}) has no layer {err.args[0].split()[-1]} that a student "
                         f"converted; is it their teacher?") from None
    sizes = [encoder_size(model) for model in models]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(models) + 1, unit="model", file=sys.stderr, disable=None, dynamic_ncols=True)
    agreement = None
    if "agreement" in paths:
        bar and bar.set_description("teacher: embedding the agreement sentences")
        agreement = teacher_agreement(teacher_model, teacher, paths["agreement"], 0, BATCH_SIZE)
    wikiqa = {"path": paths["wikiqa"]} if "wikiqa" in paths else None
    sst2 = {"path": paths["sst2"], "train_size": probe["train"], "test_size": probe["test"],
            "split_seed": probe["split_seed"], "C": PROBE_C, "carve": PROBE_CARVE} if probe else None
    rows: list = []
    details: dict[str, dict] = {}
    entries = [("teacher", f"teacher ({teacher})", teacher_model, teacher_size, "dense (teacher)",
                resolve_model_path(teacher))]
    entries += [("student", s.argument, m, size, _conversion(spec) + (", int8" if is_quantized(m) else ""), s.source)
                for s, m, size, spec in zip(found, models, sizes, specs)]
    for role, name, model, size, conversion, source in entries:
        def tick(metric: str, name=name) -> None:
            if bar:
                bar.set_description(f"{name}: {metric}")
        values, details = score_embedder(sentence_transformer_embedder(model, BATCH_SIZE), agreement, wikiqa, sst2,
                                         BATCH_SIZE, progress=tick)
        rows.append({"name": name, "role": role, "source": source, "conversion": conversion, **values,
                     "params": total_parameters(model),  # an int8 layer's packed weights too
                     **{key: size[key] for key in ("converted_layers", "selected_params", "file_bytes")}})
        bar and bar.update(1)
    if bar:
        bar.set_description("scored")
        bar.close()
    return rows, details


def _converted_spec(model) -> list[dict]:
    """The PHM and low-rank layers of a student (int8 ones too), as :func:`hyperplex.convert.conversion_spec`."""
    from hyperplex.convert import conversion_spec
    from hyperplex.int8 import factorised_layers, is_quantized

    return factorised_layers(model) if is_quantized(model) else conversion_spec(model)
