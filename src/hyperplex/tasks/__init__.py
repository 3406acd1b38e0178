"""Tasks: how each kind of data is read, batched, scored and turned into model inputs."""

from __future__ import annotations

from hyperplex.train.task import Task, metric_mode


def task_class(task: str) -> type[Task]:
    """The :class:`Task` subclass for ``data.task``."""
    if task == "translation":
        from hyperplex.tasks.translation import TranslationTask

        return TranslationTask
    from hyperplex.tasks.classification import ClassificationTask

    return ClassificationTask


def build_task(cfg, model_dir, data_root, logger=None) -> Task:
    """Instantiate the task of ``cfg.data.task`` (its data is read by ``prepare``)."""
    return task_class(cfg.data.task)(cfg, model_dir, data_root, logger)


__all__ = ["Task", "metric_mode", "task_class", "build_task"]
