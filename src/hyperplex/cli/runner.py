"""What the CLI verbs do: train, evaluate, translate, params, average. Each takes plain arguments
so it can be called from Python as well (``hyperplex.cli.runner.train("configs/x.yaml")``)."""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import logging
import os
import sys
from pathlib import Path

from hyperplex.config import ConfigError, load_yaml
from hyperplex.config.experiment import (
    ExperimentConfig, build_experiment, default_data_root, experiment_dict, flatten, load_experiment,
    resume_experiment,
)




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


def resolve_model(model: str | Path, checkpoint: str = "best") -> tuple[Path, Path]:
    """(model folder, checkpoint file) named by the MODEL argument of ``evaluate``/``translate``: a model
    folder, whose ``checkpoint`` is ``best`` / ``last`` / a file name in it / a path; or a checkpoint file,
    whose own folder is then the model folder (its vocabulary files are read from beside it)."""
    model = Path(model)
    if model.is_dir():
        return model, checkpoint_path(model, checkpoint)
    if model.is_file():
        if checkpoint != "best":
            raise ValueError(f"{model} is a checkpoint file; --checkpoint {checkpoint} cannot choose another")
        return model.parent, model
    what = "checkpoint file" if model.suffix == ".safetensors" else "model folder"
    raise FileNotFoundError(f"{what} not found: {model}")


def _model_config(folder: Path, path: Path, info: dict) -> tuple[ExperimentConfig, str]:
    """The config a saved model is built with, and where it came from (named in errors).

    The folder's ``config.yaml`` when there is one, as it always was: its decoding and data settings
    may be edited, and a model section that no longer fits the weights is an error (:func:`load_model`).
    Otherwise the config the checkpoint stored when it was written (every training checkpoint has it),
    so a copied checkpoint file, or a folder that lost its ``config.yaml``, still loads."""
    yaml_path = folder / "config.yaml"
    if yaml_path.is_file():
        raw, source = load_yaml(yaml_path), str(yaml_path)
    else:
        stored = info["extra"].get("config")
        if not isinstance(stored, dict):
            raise ConfigError(f"{path} stores no config (a {info['kind']} file, e.g. written by `hyperplex average`) "
                              f"and {yaml_path} does not exist: put the training run's config.yaml beside it")
        raw, source = copy.deepcopy(stored), f"the config stored in {path}"
        data = raw.get("data")
        if isinstance(data, dict) and "split_seed" not in data and "seed" in raw:
            data["split_seed"] = raw["seed"]  # saved before data.split_seed existed: it carved with seed (carve_seed)
    raw["model_dir"] = str(folder)
    try:
        return build_experiment(raw), source
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def _check_model_section(cfg: ExperimentConfig, source: str, path: Path, stored: dict) -> None:
    """A ``config.yaml`` whose model section differs from the one the checkpoint was trained with is an
    error even when the tensor shapes happen to fit (an activation, a linear kind with equal shapes):
    the checkpoint's own config is the truth for its weights."""
    try:
        saved = flatten(experiment_dict(build_experiment({**stored, "model_dir": cfg.model_dir}))["model"])
    except (ConfigError, TypeError):
        return  # a stored config this version cannot read: the weights fit, there is nothing to compare
    current = flatten(experiment_dict(cfg)["model"])
    differ = [k for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]
    if differ:
        shown = "; ".join(f"model.{k} is {current.get(k)!r} there but {saved.get(k)!r} in the checkpoint"
                          for k in differ[:3])
        raise ConfigError(f"{source} does not match the config {path} was trained with: {shown}"
                          f"{' …' if len(differ) > 3 else ''}; restore those keys, or remove config.yaml to use "
                          f"the checkpoint's own config")


def checkpoint_path(model_dir: Path, checkpoint: str) -> Path:
    """``best`` / ``last`` / a file name in the folder / a path."""
    from hyperplex.train.checkpoint import BEST, LAST

    name = {"best": BEST, "last": LAST}.get(checkpoint, checkpoint)
    for candidate in (model_dir / name, Path(name)):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"checkpoint {checkpoint!r} not found in {model_dir} (expected {model_dir / name})")


def load_model(model_dir: str | Path, checkpoint: str = "best", data_root: str | None = None,
               read_data: bool = True, logger: logging.Logger | None = None):
    """(config, task, model) from a model folder or a checkpoint file alone (:func:`resolve_model`;
    the config: :func:`_model_config`). ``read_data=False`` loads only the tokenisers, vocabularies
    (and labels), enough to translate new text or score a file; the vocabulary files are those the
    checkpoint records, read from the model folder (the standard names for older checkpoints)."""
    import torch

    from hyperplex.tasks import build_task
    from hyperplex.train.checkpoint import checkpoint_info, load_into, load_model_weights

    model_dir, path = resolve_model(model_dir, checkpoint)
    info = checkpoint_info(path)  # header only: "not a hyperplex checkpoint" before anything else is read
    cfg, source = _model_config(model_dir, path, info)
    log = logger or logging.getLogger("hyperplex.inference")
    record = info["extra"].get("task")
    _check_recorded_files(record, model_dir, path)
    task = build_task(cfg, model_dir, data_root or default_data_root(), log)
    task.checkpoint_record = record if isinstance(record, dict) else None
    if read_data or not hasattr(task, "load_vocabularies"):
        task.prepare(fresh=False)
    else:
        task.load_vocabularies()
    model = task.build_model()
    load_into(model, load_model_weights(path), path, expected_from=source)
    stored = info["extra"].get("config")
    if source == str(model_dir / "config.yaml") and isinstance(stored, dict):
        _check_model_section(cfg, source, path, stored)
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.training.device != "cpu" else "cpu")
    model.to(device).eval()
    return cfg, task, inference_form(cfg, model)


def inference_form(cfg: ExperimentConfig, model):
    """``model`` in the form ``testing.quantize`` names: unchanged for ``none``; for ``int8``, its dense,
    low-rank and PHM layers quantised in place by :func:`hyperplex.convert.quantize` (a model already
    quantised is returned as it is)."""
    if cfg.testing.quantize == "none":
        return model
    from hyperplex.convert.quantize import is_quantized, quantize

    return model if is_quantized(model) else quantize(model)


def _check_recorded_files(record, model_dir: Path, path: Path) -> None:
    """The vocabulary file names a checkpoint header records (``extra.task.files``) must be plain names inside
    the model folder: a header is untrusted input, and ``../`` or an absolute path would read elsewhere."""
    from hyperplex.fileio import inside

    files = record.get("files") if isinstance(record, dict) else None
    if files is None:
        return
    if not isinstance(files, dict):
        raise ValueError(f"{path}: header key extra.task.files is not an object of vocabulary files")
    for name, entry in files.items():
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: header key extra.task.files.{name} is not an object of file names")
        for kind, file in entry.items():
            inside(model_dir, file, f"{path}: header key extra.task.files.{name}.{kind}")


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
    if split == "train":
        if cfg.data.task == "translation":
            raise ValueError("--split train is not supported for translation (references are not kept)")
        task.dev_set = task.train_set
    elif split != "dev":  # a file (or parallel prefix) in the task's format, e.g. a held-out test split
        if not hasattr(task, "use_evaluation_file"):
            raise ValueError(f"--split {split}: a {cfg.data.task} model is scored on its validation data only "
                             f"(--split dev)")
        task.use_evaluation_file(split)
    metrics = score(cfg, task, model, progress)
    return metrics | {f"{name}_signature": sig for name, sig in getattr(task, "signatures", {}).items()}


def score(cfg: ExperimentConfig, task, model, progress: bool = False) -> dict[str, float]:
    """Validation metrics of a loaded model (:func:`load_model`) on ``task``'s current evaluation split;
    translation decodes with ``cfg.testing.beam_size`` (the evaluation beam, not the validation one), with
    a progress bar on a terminal's stderr if ``progress``. sacreBLEU signatures of the last call are in
    ``task.signatures``."""
    if cfg.data.task == "translation":
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

    threads = None if threads is None else parse_threads(threads)
    with _warnings_to_stderr("translate") as log:
        cfg, task, model = load_model(model_dir, checkpoint, read_data=False, logger=log)
        cfg.testing = cfg.testing.with_beam_size(beam_size)
        if cfg.data.task != "translation":
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


def params(config: str, overrides: list[str] | None = None, vocab_size: int | None = None,
           tgt_vocab_size: int | None = None, num_classes: int | None = None) -> str:
    """``hyperplex params``: the parameter table of the model a config describes (no data is read)."""
    return params_report(config, overrides, vocab_size, tgt_vocab_size, num_classes)[0]


def params_report(config: str, overrides: list[str] | None = None, vocab_size: int | None = None,
                  tgt_vocab_size: int | None = None, num_classes: int | None = None) -> tuple[str, dict[str, int]]:
    """(the table of :func:`params`, the :func:`~hyperplex.models.params.parameter_breakdown` it shows)."""
    from hyperplex.models.params import format_breakdown, parameter_breakdown
    from hyperplex.config.registry import get_architecture

    for flag, value in (("--vocab-size", vocab_size), ("--tgt-vocab-size", tgt_vocab_size),
                        ("--num-classes", num_classes)):
        if value is not None and value < (2 if flag == "--num-classes" else 1):
            raise ValueError(f"{flag} must be ≥ {2 if flag == '--num-classes' else 1}, got {value}")
    cfg = load_experiment(config, overrides, model_dir="(params)")
    arch = get_architecture(cfg.model.architecture, cfg.data.task)
    _, model_class = arch.load()
    v = cfg.data.vocab_size if vocab_size is None else vocab_size
    own_tokenizer = getattr(model_class, "text_tokenizer", None)  # a pretrained encoder brings its vocabulary
    if vocab_size is None and callable(own_tokenizer):
        v = len(own_tokenizer(cfg.model))
    if arch.family == "seq2seq":  # the second size is the target vocabulary
        outputs = v if tgt_vocab_size is None else tgt_vocab_size
    elif cfg.data.task == "ranking":  # one relevance score
        outputs = 1
    else:
        outputs = num_classes if num_classes is not None else max(2, len(cfg.data.labels))
    # counting needs the structure only: a model whose init fits to data (a student with init: activation)
    # builds its layers without that fit, as it does before loading a checkpoint
    extra = {"structure_only": True} if "structure_only" in inspect.signature(model_class).parameters else {}
    model = model_class(cfg.model, v, outputs, **extra)
    teacher_tokenizer = getattr(getattr(model, "encoder", None), "tokenizer", None)
    if vocab_size is None and not callable(own_tokenizer) and teacher_tokenizer is not None:
        v = len(teacher_tokenizer)  # a pretrained student tokenises as its teacher: data.vocab_size is unused
    header = f"{cfg.name}: {cfg.model.architecture} (vocabulary {v}"
    header += f", target vocabulary {v if tgt_vocab_size is None else tgt_vocab_size})" \
        if arch.family == "seq2seq" else ")"
    breakdown = parameter_breakdown(model)
    table = header + "\n" + format_breakdown(breakdown)
    describe = getattr(model, "describe", None)  # a fine-tuned pretrained encoder: what trains, matched counts
    return table + ("\n\n" + describe() if callable(describe) else ""), breakdown


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
