"""What the trainer needs from a task: data in batches, a loss, and validation metrics.

The trainer (:mod:`hyperplex.train.trainer`) is one loop for every kind of data; each kind is a
:class:`Task` subclass in :mod:`hyperplex.tasks` (translation, classification, sentence pairs,
ranking). The protocol lives here, below the tasks, so that ``train`` never imports ``tasks``:
dependencies run one way (tasks → train). The hooks only some tasks or models have (scoring any file,
translating, a model's own tokenizer or checkpoint state, …) are declared in :mod:`hyperplex.train.protocols`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

#: Metrics where smaller is better; every other metric is maximised.
MINIMISED_METRICS = ("loss", "ppl")


def metric_mode(name: str) -> str:
    """``"min"`` for loss-like metrics, ``"max"`` otherwise."""
    return "min" if name in MINIMISED_METRICS else "max"


class Task:
    """Base class. Subclasses set :attr:`metrics` (the validation metrics they report, the first being
    the default early-stopping metric) and implement every method below."""

    name = "task"
    metrics: tuple[str, ...] = ("loss",)
    #: What ``batch.num_tokens`` counts (the loss normaliser), named in the trainer's throughput log:
    #: target tokens for sequence tasks, whole examples for classification.
    loss_unit = "tokens"
    #: The task metadata of the checkpoint being loaded (``extra.task`` of its header, what :meth:`metadata`
    #: returned when it was saved), set by :func:`hyperplex.inference.load.load_model` before ``prepare(fresh=False)``
    #: or :meth:`load_vocabularies`; ``None`` while training. Its ``"files"`` name the saved vocabulary files.
    checkpoint_record: dict | None = None
    #: Whether the model :meth:`build_model` builds gets its weights from a checkpoint at once (a resumed run, a
    #: loaded model), set before it is called: a task whose build fits weights to data (a distilled student's
    #: calibrated initialisation) may then skip the fit, whose result the checkpoint replaces.
    weights_from_checkpoint: bool = False

    def __init__(self, cfg, model_dir: Path, data_root: str | None, logger: logging.Logger | None = None) -> None:
        self.cfg = cfg
        self.model_dir = Path(model_dir)
        self.data_root = data_root
        self.log = logger or logging.getLogger("hyperplex")

    # -- data -----------------------------------------------------------------
    def prepare(self, fresh: bool) -> None:
        """Read and validate the data; build tokenisers/vocabularies from the training split and save them
        in the model folder (``fresh``), or load them from it (resume, evaluate, translate)."""
        raise NotImplementedError

    def load_vocabularies(self) -> None:
        """Load only what a saved model needs to read new input (tokenisers, vocabularies, labels), by the files
        :attr:`checkpoint_record` names, without the training data: enough to translate new text or score a
        file. Called by :func:`hyperplex.inference.load.load_model` with ``read_data=False``. This default reads
        the data (``prepare(fresh=False)``); tasks that can do without override it."""
        self.prepare(fresh=False)

    def train_batches(self, epoch: int) -> Sequence:
        """All training batches of 1-based ``epoch``, in order; deterministic in (seed, epoch). Any sequence the
        trainer can take ``len`` of and slice (a list, or a lazy one that builds batches when indexed)."""
        raise NotImplementedError

    # -- model ----------------------------------------------------------------
    def build_model(self) -> nn.Module:
        raise NotImplementedError

    def loss(self, model: nn.Module, batch) -> Tensor:
        """Summed (not averaged) training loss of ``batch``; the trainer divides by ``batch.num_tokens``."""
        raise NotImplementedError

    @torch.no_grad()
    def validate(self, model: nn.Module) -> dict[str, float]:
        """Metrics on the validation split (the model is already in eval mode)."""
        raise NotImplementedError

    def describe_validation(self) -> str:
        """One line for ``train.log`` saying how validation scores the model (e.g. which decoding), or ""."""
        return ""

    def metadata(self) -> dict:
        """JSON-serialisable facts stored in every checkpoint (e.g. vocabulary sizes, label names)."""
        return {}
