"""Training runs into a model folder, as Python calls: ``train("configs/x.yaml")`` is ``hyperplex train``,
``compress(...)`` is ``hyperplex compress``. Each validates the config, holds the model folder's lock while it
writes (:func:`own_model_dir`) and returns the final validation metrics."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

from hyperplex.config.experiment import ExperimentConfig, default_data_root, load_experiment, resume_experiment
from hyperplex.inference.load import load_model

__all__ = ["compress", "own_model_dir", "train"]


def own_model_dir(model_dir: str | Path, verb: str):
    """The lock every verb that writes a model folder holds (:func:`hyperplex.fileio.folder_lock`): a second
    run into the same folder stops at once with an error naming the first one's pid and command. Under
    torchrun only rank 0 takes it (the ranks of one run share the folder)."""
    from hyperplex.fileio import LOCK_NAME, folder_lock
    from hyperplex.guards import check_output_folder

    if int(os.environ.get("RANK", "0") or 0) != 0:
        return contextlib.nullcontext()
    check_output_folder(model_dir, "model folder", ("checkpoints.json", "config.yaml", LOCK_NAME))  # not another model
    argv = " ".join(sys.argv[1:]) if sys.argv and os.path.basename(sys.argv[0]) in ("hyperplex", "__main__.py") else ""
    command = f"hyperplex {argv}" if argv else f"hyperplex {verb} (pid {os.getpid()})"
    return folder_lock(model_dir, command[:300], transient=("train.log",))  # the log of a refused start


def train(config: str, overrides: list[str] | None = None, model_dir: str | None = None,
          data_root: str | None = None, resume: bool = False) -> dict:
    """Validate the config, then train (or resume) into the model folder, which the run owns while it
    writes (:func:`own_model_dir`). ``overrides``: dotted ``--section.key=value`` strings; returns the
    final validation metrics."""
    cfg = load_experiment(config, overrides, model_dir)
    with own_model_dir(cfg.model_dir, "train"):
        return _train_owned(cfg, config, overrides, data_root, resume)


def _train_owned(cfg: ExperimentConfig, config: str, overrides: list[str] | None, data_root: str | None,
                 resume: bool) -> dict:
    from hyperplex.config.registry import get_task
    from hyperplex.train.trainer import Trainer

    changes: list[str] = []
    if resume and (Path(cfg.model_dir) / "config.yaml").is_file():
        # The saved config is the run's; only budget keys may change (anything else is refused, by name).
        cfg, changes = resume_experiment(cfg.model_dir, config, overrides)
    try:
        trainer = Trainer(cfg, get_task(cfg.data.task).load(), cfg.model_dir, data_root or default_data_root(),
                          resume=resume, resume_changes=changes)
        return trainer.train()
    finally:  # later calls in this process (evaluate, another train) must not log into this model's train.log
        log = logging.getLogger("hyperplex")
        for handler in list(log.handlers):
            log.removeHandler(handler)
            handler.close()


def compress(config: str, overrides: list[str] | None = None, model_dir: str | None = None,
             data_root: str | None = None, resume: bool = False) -> dict:
    """:func:`train` for a ``data.task: distillation`` config, then the best checkpoint's student written
    with :func:`hyperplex.convert.save_converted` into ``MODEL_DIR/student`` (reloaded by
    :func:`hyperplex.convert.load_converted`), or, with ``testing.quantize: int8``, quantised and written with
    ``save_quantized`` (reloaded by ``load_quantized``). Other tasks are refused before anything is written."""
    cfg = load_experiment(config, overrides, model_dir)
    _check_compress_config(cfg, config)
    with own_model_dir(cfg.model_dir, "compress"):  # held from training to the student's last file
        metrics = train(config, overrides, model_dir, data_root, resume)
        _, _, model = load_model(cfg.model_dir, "best", data_root, read_data=False)
        _save_student(cfg, model.encoder, Path(cfg.model_dir) / "student")
    return metrics


def _check_compress_config(cfg: ExperimentConfig, config: str) -> None:
    """What :func:`compress` refuses before the model folder is created: another task, a teacher folder
    that does not exist, ``keep_layers`` / ``layer_map`` beyond the teacher's depth."""
    if cfg.data.task != "distillation":
        raise ValueError(f"{config}: compress needs a config with data.task: distillation (this one has "
                         f"{cfg.data.task!r}); use `hyperplex train` for it")
    path = getattr(cfg.model, "path", None)
    if isinstance(path, str):  # the teacher folder
        from hyperplex.pretrained import resolve_model_path

        resolve_model_path(path, "model.path")
    from hyperplex.models.pretrained_student import PretrainedStudentConfig, check_layer_indices

    if isinstance(cfg.model, PretrainedStudentConfig):  # keep_layers / layer_map against the teacher's depth
        check_layer_indices(cfg.model)


def _save_student(cfg: ExperimentConfig, encoder, folder: Path) -> None:
    """The trained student as ``testing.quantize`` names: int8 (``save_quantized``) or as trained
    (``save_converted``)."""
    if cfg.testing.quantize == "int8":
        from hyperplex.int8 import save_quantized

        save_quantized(encoder, folder)
    else:
        from hyperplex.convert import save_converted

        save_converted(encoder, folder)
