"""A trained model used, as Python calls: ``evaluate("runs/mt")`` is ``hyperplex evaluate``,
``translate("runs/mt", "in.txt", "out.txt")`` is ``hyperplex translate``. The model is rebuilt by
:func:`hyperplex.inference.load.load_model`; :func:`score` is the metrics of one already loaded."""

from __future__ import annotations

import contextlib
import logging
import sys

from hyperplex.config.experiment import ExperimentConfig
from hyperplex.inference.load import load_model

__all__ = ["evaluate", "evaluate_split", "score", "translate"]


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
    """``threads`` or, for 0/None, :func:`hyperplex.threads.choose_threads` for decoding
    ``testing.batch_size`` sentences × beam rows (a sentence of typical length for classifiers)."""
    from hyperplex.threads import TOKENS_PER_SENTENCE, model_width, set_threads

    if cfg.data.task == "translation":
        rows = cfg.testing.batch_size * cfg.testing.beam_size
    else:
        rows = cfg.testing.batch_size * TOKENS_PER_SENTENCE
    return set_threads(threads, rows, model_width(model))


def evaluate(model_dir: str, checkpoint: str = "best", split: str = "dev", data_root: str | None = None,
             beam_size: int | None = None, threads: int | None = None, progress: bool = True) -> dict:
    """Metrics of a saved model on the validation split (``dev``), the training split (``train``,
    classification tasks), or any file in the task's format (a path, or a parallel prefix; relative paths
    are read from the data root). ``threads``: torch CPU threads (0/None: the :mod:`hyperplex.threads` rule);
    ``progress``: a bar on stderr while decoding (a terminal only)."""
    from hyperplex.threads import parse_threads

    threads = None if threads is None else parse_threads(threads)
    with _warnings_to_stderr("evaluate") as log:
        # a file to score needs no training data: the saved vocabularies (and labels) are enough
        cfg, task, model = load_model(model_dir, checkpoint, data_root, read_data=split in ("dev", "train"),
                                      logger=log)
        cfg.testing = cfg.testing.with_beam_size(beam_size)  # beam_size: the one override of the decoding
        _set_inference_threads(threads, cfg, model)
        return evaluate_split(cfg, task, model, split, progress)


def evaluate_split(cfg: ExperimentConfig, task, model, split: str, progress: bool = False) -> dict:
    """:func:`score` of a loaded model on ``split`` (``dev``, ``train`` or a file, as :func:`evaluate`
    takes it), with the sacreBLEU signatures as ``NAME_signature`` keys."""
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
    """Validation metrics of a loaded model (:func:`~hyperplex.inference.load.load_model`) on ``task``'s current
    evaluation split; translation decodes with ``cfg.testing.beam_size`` (the evaluation beam, not the
    validation one), with a progress bar on a terminal's stderr if ``progress``. sacreBLEU signatures of the
    last call are in ``task.signatures``."""
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
    """Read sentences (a file, else stdin), write translations (a file, replaced whole, else stdout),
    exactly one output line per input line (a blank line gives a blank line); returns the number of lines.
    Lines longer than the model's positions are cut, with a warning on stderr naming them.
    ``plot_attention``: a PNG of the first line's attention. ``threads``: torch CPU threads (0/None: the
    :mod:`hyperplex.threads` rule); ``progress``: a bar on stderr (a terminal only)."""
    from hyperplex.guards import check_outputs
    from hyperplex.threads import parse_threads
    from hyperplex.train.protocols import Translates

    # never over the model it reads, its input or another model's files (the CLI checks the same, naming -o)
    check_outputs({"output_path": output_path, "plot_attention": plot_attention}, [input_path, model_dir])
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
    _write_lines(outputs, output_path)
    if plot_attention:
        from hyperplex.train.plots import plot_attention as draw

        assert plotted is not None  # refused above
        tokens, attention = details[plotted]
        src_tokens = task.source_tokens([lines[plotted]], warn=False)[0] + ["</s>"]
        draw(attention, src_tokens, tokens + ["</s>"] if attention.shape[0] > len(tokens) else tokens, plot_attention)
    return len(outputs)


def _write_lines(lines: list[str], output_path: str | None) -> None:
    """One line per entry into ``output_path`` (an existing file is replaced whole or not at all), else stdout."""
    text = "".join(line + "\n" for line in lines)
    if output_path:
        from hyperplex.fileio import atomic_write_text

        atomic_write_text(output_path, text)
    else:
        sys.stdout.write(text)
