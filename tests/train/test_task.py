"""The task protocol the trainer relies on (hyperplex.train.task): which way each metric is better,
and a base class whose unimplemented methods fail loudly instead of returning nothing."""

import logging
from pathlib import Path

import pytest

from hyperplex.config.experiment import load_experiment
from hyperplex.tasks import build_task
from hyperplex.train.task import MINIMISED_METRICS, Task, metric_mode

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))

#: The direction of every metric a task reports, decided by what the metric means.
EXPECTED_MODE = {"loss": "min", "ppl": "min", "accuracy": "max", "bleu": "max", "chrf": "max", "map": "max",
                 "mrr": "max", "cosine": "max"}


def test_metric_mode_by_meaning():
    assert {name: metric_mode(name) for name in EXPECTED_MODE} == EXPECTED_MODE
    assert set(MINIMISED_METRICS) == {"loss", "ppl"}
    assert metric_mode("f1") == "max"  # anything not loss-like is maximised


def test_every_metric_the_tasks_report_has_its_mode(tmp_path):
    # Every task of every shipped config (translation, the arithmetic task, classification, pairs,
    # ranking): a new metric must be added to EXPECTED_MODE, i.e. someone decides its direction.
    reported: dict[str, set[str]] = {}
    for path in CONFIGS:
        cfg = load_experiment(path)
        task = build_task(cfg, tmp_path, None)  # the constructor reads no data
        reported.setdefault(cfg.data.task + ("/arithmetic" if cfg.data.format == "arithmetic" else ""),
                            set()).update(task.metrics)
        assert len(set(task.metrics)) == len(task.metrics), path.stem
    assert set(reported) == {"translation", "translation/arithmetic", "classification", "pair_classification",
                             "ranking", "distillation"}
    assert reported["translation/arithmetic"] == {"accuracy", "bleu", "chrf", "loss", "ppl"}
    assert reported["ranking"] == {"map", "mrr", "loss"}
    for names in reported.values():
        assert {n: metric_mode(n) for n in names} == {n: EXPECTED_MODE[n] for n in names}


def test_task_base_stores_its_arguments(tmp_path):
    task = Task("CFG", str(tmp_path), "/data")
    assert (task.cfg, task.model_dir, task.data_root) == ("CFG", tmp_path, "/data")
    assert isinstance(task.model_dir, Path)
    assert task.log is logging.getLogger("hyperplex")
    log = logging.getLogger("hyperplex.test_task")
    assert Task(None, tmp_path, None, log).log is log
    assert task.metrics == ("loss",) and task.metadata() == {}


@pytest.mark.parametrize("method,args", [("prepare", (True,)), ("train_batches", (1,)), ("build_model", ()),
                                         ("loss", (None, None)), ("validate", (None,))])
def test_task_base_methods_must_be_implemented(tmp_path, method, args):
    with pytest.raises(NotImplementedError):
        getattr(Task(None, tmp_path, None), method)(*args)
