"""A trained model rebuilt from its model folder (or a checkpoint file alone) for use from Python:
``cfg, task, model = load_model("runs/sst2_phm", "best")``.

The checkpoint's header (or the folder's ``config.yaml``) holds the config, so nothing else is needed: the
task registered for ``data.task`` (:mod:`hyperplex.config.registry`) reads the saved vocabularies, builds the
model the config names and the weights are loaded into it. ``hyperplex evaluate``, ``translate``, ``export``,
``score-encoder`` and the experiment plans all load models this way.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

from hyperplex.config import ConfigError, load_yaml
from hyperplex.config.experiment import (
    ExperimentConfig,
    build_experiment,
    default_data_root,
    experiment_dict,
    flatten,
    upgrade_saved_config,
)
from hyperplex.fileio import inside
from hyperplex.train.checkpoint import BEST, LAST, checkpoint_info, load_into, load_model_weights

__all__ = ["checkpoint_path", "inference_form", "load_model", "resolve_model"]


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

    The folder's ``config.yaml`` when there is one: its decoding and data settings may be edited, and a
    model section that does not fit the weights is an error (:func:`load_model`). Otherwise the config the
    checkpoint stored when it was written (every training checkpoint has it), so a copied checkpoint file,
    or a folder without its ``config.yaml``, loads too."""
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
            data["split_seed"] = raw["seed"]  # a config without data.split_seed carved with seed (carve_seed)
    raw["model_dir"] = str(folder)
    upgrade_saved_config(raw)
    try:
        return build_experiment(raw), source
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def _check_model_section(cfg: ExperimentConfig, source: str, path: Path, stored: dict) -> None:
    """A ``config.yaml`` whose model section differs from the one the checkpoint was trained with is an
    error even when the tensor shapes happen to fit (an activation, a linear kind with equal shapes):
    the checkpoint's own config is the truth for its weights."""
    stored = copy.deepcopy(stored)
    upgrade_saved_config(stored)
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
    checkpoint records, read from the model folder (the standard names for a checkpoint without that record)."""
    import torch

    from hyperplex.config.registry import get_task

    model_dir, path = resolve_model(model_dir, checkpoint)
    info = checkpoint_info(path)  # header only: "not a hyperplex checkpoint" before anything else is read
    cfg, source = _model_config(model_dir, path, info)
    log = logger or logging.getLogger("hyperplex.inference")
    record = info["extra"].get("task")
    _check_recorded_files(record, model_dir, path)
    task = get_task(cfg.data.task).load()(cfg, model_dir, data_root or default_data_root(), log)
    task.checkpoint_record = record if isinstance(record, dict) else None
    if read_data:
        task.prepare(fresh=False)
    else:
        task.load_vocabularies()  # the tokenisers alone, or the data for a task that needs it (Task's default)
    task.weights_from_checkpoint = True
    model = task.build_model()
    load_into(model, load_model_weights(path), path, expected_from=source)
    stored = info["extra"].get("config")
    if source == str(model_dir / "config.yaml") and isinstance(stored, dict):
        _check_model_section(cfg, source, path, stored)
    from hyperplex.train.process import resolve_device

    # the GPU training.device names (cuda:N), else the trainer's choice; the CPU where there is none
    wanted = cfg.training.device
    device = resolve_device(wanted) if torch.cuda.is_available() and wanted != "cpu" else torch.device("cpu")
    model.to(device).eval()
    return cfg, task, inference_form(cfg, model)


def inference_form(cfg: ExperimentConfig, model):
    """``model`` in the form ``testing.quantize`` names: unchanged for ``none``; for ``int8``, moved to the CPU
    (PyTorch's int8 kernels run there only: a model loaded on a GPU is scored on the CPU) and its dense,
    low-rank and PHM layers quantised in place by :func:`hyperplex.int8` (a model already
    quantised is returned as it is)."""
    if cfg.testing.quantize == "none":
        return model
    from hyperplex.int8 import is_quantized, quantize

    return model if is_quantized(model) else quantize(model.cpu())


def _check_recorded_files(record, model_dir: Path, path: Path) -> None:
    """The vocabulary file names a checkpoint header records (``extra.task.files``) must be plain names inside
    the model folder: a header is untrusted input, and ``../`` or an absolute path would read elsewhere."""
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
