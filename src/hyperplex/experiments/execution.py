"""Training one model of a plan, with its provenance recorded in ``experiment.json``.

A row with a config trains through :func:`hyperplex.train.run.train` (the ``hyperplex train`` path); a
``train: false`` row saves the model as training would start it through
:meth:`hyperplex.train.trainer.Trainer.save_untrained` (the trainer's own seeding, data preparation and
checkpoint contents). A NaN/inf loss (the trainer's :class:`~hyperplex.train.trainer.DivergedError`) is an
outcome of the row's settings: it is recorded in ``diverged.json``, the plan goes on with its other models, the
model is not trained again, and the reports count it as diverged instead of leaving it out of a row unsaid.
"""

from __future__ import annotations

import json
import logging
import re

from hyperplex.experiments.provenance import Segment, device_name, machine_info
from hyperplex.experiments.runs import Run
from hyperplex.experiments.state import DIVERGED_FILE, NOT_HEALED
from hyperplex.fileio import atomic_write_text

__all__ = ["train_run", "save_untrained_run"]


def train_run(run: Run, resume: bool, data_root: str | None, command: str) -> None:
    """Train (or resume) one model, recording the wall-clock segment, command and machine in
    ``MODEL_DIR/experiment.json`` (written before training starts, so a killed run leaves its start)."""
    from hyperplex.config.experiment import load_experiment
    from hyperplex.train.run import train
    from hyperplex.train.trainer import DivergedError

    cfg = load_experiment(run.row.config, run.overrides, str(run.model_dir))
    with Segment(run.model_dir, command, machine_info(device_name(cfg)), resume=resume) as segment:
        try:
            train(run.row.config, run.overrides, str(run.model_dir), data_root, resume=resume)
            segment["status"] = "finished"
        except DivergedError as err:
            # a result of the row's settings, as a finished score is: recorded, not retried
            step = re.search(r"at step (\d+)", str(err))
            segment["status"] = "diverged"
            atomic_write_text(run.model_dir / DIVERGED_FILE, json.dumps(
                {"step": int(step.group(1)) if step else None, "message": str(err)}, indent=1))


def save_untrained_run(run: Run, data_root: str | None, command: str) -> None:
    """A ``train: false`` model: what training would start from (for a ``pretrained_student``, the
    conversion), saved by :meth:`~hyperplex.train.trainer.Trainer.save_untrained` as a finished checkpoint
    at step 0 with ``stop_reason`` :data:`~hyperplex.experiments.state.NOT_HEALED`, so it is the trained rows'
    starting point and evaluates like any trained model. The segment goes to ``experiment.json``."""
    from hyperplex.config.experiment import default_data_root, load_experiment
    from hyperplex.tasks import task_class
    from hyperplex.train.trainer import Trainer

    cfg = load_experiment(run.row.config, run.overrides, str(run.model_dir))
    with Segment(run.model_dir, command, machine_info(), train=False) as segment:
        try:
            trainer = Trainer(cfg, task_class(cfg.data.task), run.model_dir, data_root or default_data_root())
            trainer.save_untrained(NOT_HEALED)
            segment["status"] = "converted"
        finally:  # later models in this process must not log into this model's train.log
            log = logging.getLogger("hyperplex")
            for handler in list(log.handlers):
                log.removeHandler(handler)
                handler.close()
