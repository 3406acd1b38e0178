"""Tasks: how each kind of data is read, batched, scored and turned into model inputs.

Which class serves which ``data.task`` is the task table of :mod:`hyperplex.config.registry`.
"""

from __future__ import annotations

from hyperplex.config.registry import get_task
from hyperplex.train.task import Task, metric_mode


def task_class(task: str) -> type[Task]:
    """The :class:`Task` subclass registered for ``data.task``."""
    return get_task(task).load()


def build_task(cfg, model_dir, data_root, logger=None) -> Task:
    """Instantiate the task of ``cfg.data.task`` (its data is read by ``prepare``)."""
    return task_class(cfg.data.task)(cfg, model_dir, data_root, logger)


__all__ = ["Task", "metric_mode", "task_class", "build_task"]
