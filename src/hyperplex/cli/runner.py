"""What the CLI verbs do: train, compress, evaluate, translate, average. Each takes plain arguments
so it can be called from Python as well (``hyperplex.cli.runner.train("configs/x.yaml")``). A trained model
is rebuilt by :func:`hyperplex.train.load.load_model`; the ``params`` table is
:func:`hyperplex.train.params.params`."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from pathlib import Path

from hyperplex.config.experiment import ExperimentConfig, default_data_root, load_experiment, resume_experiment
from hyperplex.train.load import load_model




def own_model_dir(model_dir: str | Path, verb: str):
    """The lock every verb that writes a model folder holds (:func:`hyperplex.fileio.folder_lock`): a second
    run into the same folder stops at once with an error naming the first one's pid and command. Under
    torchrun only rank 0 takes it (the ranks of one run share the folder)."""
    from hyperplex.fileio import folder_lock

    if int(os.environ.get("RANK", "0") or 0) != 0:
        return contextlib.nullcontext()
    argv = " ".join(sys.argv[1:]) if sys.argv and os.path.basename(sys.argv[0]) in ("hyperplex", "__main__.py") else ""
    command = f"hyperplex {argv}" if argv else f"hyperplex {verb} (pid {os.getpid()})"
    return folder_lock(model_dir, command[:300], transient=("train.log",))  # the log of a refused start


def train(config: str, overrides: list[str] | None = None, model_dir: str | None = None,
          data_root: str | None = None, resume: bool = False) -> dict:
    """``hyperplex train``: validate the config, then train (or resume) into the model folder, which the
    run owns while it writes (:func:`own_model_dir`)."""
    cfg = load_experiment(config, overrides, model_dir)
    with own_model_dir(cfg.model_dir, "train"):
        return _train_owned(cfg, config, overrides, data_root, resume)


def _train_owned(cfg: ExperimentConfig, config: str, overrides: list[str] | None, data_root: str | None,
                 resume: bool) -> dict:
    from hyperplex.tasks import task_class
    from hyperplex.train.trainer import Trainer

    changes: list[str] = []
    if resume and (Path(cfg.model_dir) / "config.yaml").is_file():
        # The saved config is the run's; only budget keys may change (anything else is refused, by name).
        cfg, changes = resume_experiment(cfg.model_dir, config, overrides)
    try:
        trainer = Trainer(cfg, task_class(cfg.data.task), cfg.model_dir, data_root or default_data_root(),
                          resume=resume, resume_changes=changes)
        return trainer.train()
    finally:  # later calls in this process (evaluate, another train) must not log into this model's train.log
        log = logging.getLogger("hyperplex")
        for handler in list(log.handlers):
            log.removeHandler(handler)
            handler.close()


def compress(config: str, overrides: list[str] | None = None, model_dir: str | None = None,
             data_root: str | None = None, resume: bool = False) -> dict:
    """``hyperplex compress``: :func:`train` for a ``data.task: distillation`` config, then the best
    checkpoint's student written with :func:`hyperplex.convert.save_converted` into ``MODEL_DIR/student``
    (reloaded by :func:`hyperplex.convert.load_converted`), or, with ``testing.quantize: int8``, quantised and
    written with ``save_quantized`` (reloaded by ``load_quantized``). Other tasks are refused before anything
    is written."""
    from hyperplex.convert import save_converted

    cfg = load_experiment(config, overrides, model_dir)
    if cfg.data.task != "distillation":
        raise ValueError(f"{config}: compress needs a config with data.task: distillation (this one has "
                         f"{cfg.data.task!r}); use `hyperplex train` for it")
    path = getattr(cfg.model, "path", None)
    if isinstance(path, str):  # the teacher folder, checked before the model folder is created
        from hyperplex.pretrained import resolve_model_path

        resolve_model_path(path, "model.path")
    from hyperplex.models.pretrained_student import PretrainedStudentConfig, check_layer_indices

    if isinstance(cfg.model, PretrainedStudentConfig):  # keep_layers / layer_map against the teacher's depth
        check_layer_indices(cfg.model)
    with own_model_dir(cfg.model_dir, "compress"):  # held from training to the student's last file
        metrics = train(config, overrides, model_dir, data_root, resume)
        _, _, model = load_model(cfg.model_dir, "best", data_root, read_data=False)
        if cfg.testing.quantize == "int8":
            from hyperplex.convert.quantize import save_quantized

            save_quantized(model.encoder, Path(cfg.model_dir) / "student")
        else:
            save_converted(model.encoder, Path(cfg.model_dir) / "student")
    return metrics


@contextlib.contextmanager
def _warnings_to_stderr(verb: str):
    """A logger for loading and decoding whose warnings (e.g. over-long lines cut) reach stderr as
    ``hyperplex VERB: warning: …`` lines; its info messages are dropped (there is no log file)."""
    log = logging.getLogger(f"hyperplex.inference.{verb}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter(f"hyperplex {verb}: warning: %(message)s"))
    log.addHandler(handler)
    log.propagate = False
    try:
        yield log
    finally:
        log.removeHandler(handler)


def _set_inference_threads(threads: int | None, cfg: ExperimentConfig, model) -> int:
    """``--threads`` or, for 0/None, :func:`hyperplex.threads.choose_threads` for decoding
    ``testing.batch_size`` sentences × beam rows (a sentence of typical length for classifiers)."""
    from hyperplex.threads import TOKENS_PER_SENTENCE, model_width, set_threads

    if cfg.data.task == "translation":
        rows = cfg.testing.batch_size * cfg.testing.beam_size
    else:
        rows = cfg.testing.batch_size * TOKENS_PER_SENTENCE
    return set_threads(threads, rows, model_width(model))


def evaluate(model_dir: str, checkpoint: str = "best", split: str = "dev", data_root: str | None = None,
             beam_size: int | None = None, threads: int | None = None, progress: bool = True) -> dict:
    """``hyperplex evaluate``: metrics of a saved model on the validation split (``dev``), the training
    split (``train``, classification tasks), or any file in the task's format (a path, or a parallel
    prefix; relative paths are read from the data root). ``threads``: torch CPU threads (0/None: the
    :mod:`hyperplex.threads` rule); ``progress``: a bar on stderr while decoding (a terminal only)."""
    from hyperplex.threads import parse_threads

    threads = None if threads is None else parse_threads(threads)
    with _warnings_to_stderr("evaluate") as log:
        # a file to score needs no training data: the saved vocabularies (and labels) are enough
        cfg, task, model = load_model(model_dir, checkpoint, data_root, read_data=split in ("dev", "train"),
                                      logger=log)
        cfg.testing = cfg.testing.with_beam_size(beam_size)  # --beam-size: the one override of the decoding
        _set_inference_threads(threads, cfg, model)
        return _evaluate_split(cfg, task, model, split, progress)


def _evaluate_split(cfg: ExperimentConfig, task, model, split: str, progress: bool) -> dict:
    from hyperplex.train.protocols import EvaluatesFiles, SignsMetrics

    if split == "train":
        if cfg.data.task == "translation":
            raise ValueError("--split train is not supported for translation (references are not kept)")
        task.dev_set = task.train_set
    elif split != "dev":  # a file (or parallel prefix) in the task's format, e.g. a held-out test split
        if not isinstance(task, EvaluatesFiles):
            raise ValueError(f"--split {split}: a {cfg.data.task} model is scored on its validation data only "
                             f"(--split dev)")
        task.use_evaluation_file(split)
    metrics = score(cfg, task, model, progress)
    signatures = task.signatures if isinstance(task, SignsMetrics) else {}
    return metrics | {f"{name}_signature": sig for name, sig in signatures.items()}


def score(cfg: ExperimentConfig, task, model, progress: bool = False) -> dict[str, float]:
    """Validation metrics of a loaded model (:func:`~hyperplex.train.load.load_model`) on ``task``'s current evaluation split;
    translation decodes with ``cfg.testing.beam_size`` (the evaluation beam, not the validation one), with
    a progress bar on a terminal's stderr if ``progress``. sacreBLEU signatures of the last call are in
    ``task.signatures``."""
    from hyperplex.train.protocols import Translates

    if isinstance(task, Translates):
        return task.validate(model, beam_size=cfg.testing.beam_size, progress=progress)
    return task.validate(model)


def _read_stdin_lines() -> list[str]:
    """stdin's lines, decoded exactly as :func:`~hyperplex.data.readers.read_lines` decodes a file
    (strict UTF-8 with errors naming ``<stdin>`` and the line, BOM and CR removed, stripped)."""
    from hyperplex.data.readers import decode_lines

    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # an already-decoded text stream (io.StringIO in tests, some embedded shells)
        return [line.strip() for line in decode_lines(sys.stdin.read().encode("utf-8"), "<stdin>")]
    return [line.strip() for line in decode_lines(buffer.read(), "<stdin>")]


def translate(model_dir: str, input_path: str | None = None, output_path: str | None = None,
              checkpoint: str = "best", beam_size: int | None = None, plot_attention: str | None = None,
              threads: int | None = None, progress: bool = True) -> int:
    """``hyperplex translate``: read sentences (a file or stdin), write translations (a file or stdout),
    exactly one output line per input line (a blank line gives a blank line). Lines longer than the
    model's positions are cut, with a warning on stderr naming them. ``threads``: torch CPU threads
    (0/None: the :mod:`hyperplex.threads` rule); ``progress``: a bar on stderr (a terminal only)."""
    from hyperplex.threads import parse_threads
    from hyperplex.train.protocols import Translates

    threads = None if threads is None else parse_threads(threads)
    with _warnings_to_stderr("translate") as log:
        cfg, task, model = load_model(model_dir, checkpoint, read_data=False, logger=log)
        cfg.testing = cfg.testing.with_beam_size(beam_size)
        if not isinstance(task, Translates):
            raise ValueError(f"{model_dir} holds a {cfg.data.task} model; translate needs a translation model")
        if input_path:
            from hyperplex.data.readers import read_lines

            lines = read_lines(input_path, allow_empty=True)
        else:
            lines = _read_stdin_lines()
        _set_inference_threads(threads, cfg, model)
        outputs, details = task.translate(model, lines, return_attention=True,
                                          progress=progress and len(lines) > 1)
    plotted = next((i for i, found in enumerate(details) if found is not None), None)  # first line with tokens
    if plot_attention:  # checked before anything is written
        if plotted is None:
            raise ValueError("--plot-attention: no input line has tokens to plot")
        if details[plotted][1] is None:
            raise ValueError("this model produces no attention weights to plot")
    text = "".join(o + "\n" for o in outputs)
    if output_path:
        from hyperplex.fileio import atomic_write_text

        atomic_write_text(output_path, text)  # an existing output is replaced whole or not at all
    else:
        sys.stdout.write(text)
    if plot_attention:
        from hyperplex.train.plots import plot_attention as draw

        tokens, attention = details[plotted]
        src_tokens = task.source_tokens([lines[plotted]], warn=False)[0] + ["</s>"]
        draw(attention, src_tokens, tokens + ["</s>"] if attention.shape[0] > len(tokens) else tokens, plot_attention)
    return len(outputs)


def _check_average_output(out: Path, paths: list[Path]) -> None:
    """The averaged file may not replace one of its inputs, nor a checkpoint a training run's index names
    (``best``/``last``/``best-N``, listed in ``checkpoints.json``): the index would describe another file."""
    from hyperplex.train.checkpoint import BEST, LAST, CheckpointManager

    target = os.path.realpath(out)
    if any(os.path.realpath(p) == target for p in paths):
        raise ValueError(f"-o {out}: is one of the checkpoints being averaged; write the average to another file")
    index = out.parent / CheckpointManager.INDEX
    if index.is_file() and (out.name in (BEST, LAST) or (out.name.startswith("best-") and out.suffix == ".safetensors")):
        raise ValueError(f"-o {out}: a checkpoint the training run in {out.parent} manages ({index.name}); write the "
                         f"average to another file, e.g. {out.parent / 'averaged.safetensors'}")


def average(inputs: list[str], output: str) -> Path:
    """``hyperplex average``: average the weights of checkpoints (files, or every best-*.safetensors of a folder)."""
    from hyperplex.train.checkpoint import average_checkpoints, save_model_weights

    paths: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(p.glob("best-*.safetensors"))
            if not found:
                raise FileNotFoundError(f"{p}: no best-*.safetensors checkpoints to average")
            paths += found
        elif p.is_file():
            paths.append(p)
        else:
            raise FileNotFoundError(f"checkpoint not found: {p}")
    out = Path(output)
    if out.is_dir():
        out = out / "averaged.safetensors"
    _check_average_output(out, paths)
    state = average_checkpoints(paths)
    save_model_weights(out, state, {"averaged_from": json.dumps([str(p) for p in paths])})
    return out
