"""What a run writes as it goes: ``train.log`` and ``metrics.csv`` plus TensorBoard scalars."""

from __future__ import annotations

import csv
import logging
import sys
from pathlib import Path

from hyperplex.fileio import atomic_write

__all__ = ["RUN_START", "setup_logger", "MetricsWriter"]

#: The message that opens the first line each trainer process writes to ``train.log``: a resumed run appends to the
#: log of the runs before it, and this line is where its own part begins (``hyperplex.experiments.timing`` counts
#: each part within its own training segment).
RUN_START = "training process start"


def setup_logger(model_dir: Path, rank: int) -> logging.Logger:
    """Logger writing to ``model_dir/train.log`` and stderr (rank 0 only)."""
    log = logging.getLogger("hyperplex")
    log.setLevel(logging.INFO)
    for handler in list(log.handlers):
        log.removeHandler(handler)
        handler.close()
    log.propagate = False
    if rank != 0:
        log.addHandler(logging.NullHandler())
        return log
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S")
    file_handler = logging.FileHandler(model_dir / "train.log", encoding="utf-8")
    file_handler.setFormatter(fmt)
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(logging.Formatter("%(message)s"))
    # the start line marks the file's parts for the tools that read it; on a terminal it says nothing new
    stream.addFilter(lambda record: not record.getMessage().startswith(RUN_START))
    log.addHandler(file_handler)
    log.addHandler(stream)
    return log


class MetricsWriter:
    """``metrics.csv`` in long format (``step,epoch,split,name,value``) plus TensorBoard scalars."""

    FIELDS = ("step", "epoch", "split", "name", "value")

    def __init__(self, model_dir: Path, resume_step: int | None, tensorboard: bool = True) -> None:
        self.path = model_dir / "metrics.csv"
        if resume_step is not None and self.path.exists():
            # Rows written after the checkpoint we resume from belong to a run that was killed.
            with open(self.path, newline="", encoding="utf-8") as f:
                rows = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]

            def write(tmp: str) -> None:
                with open(tmp, "w", newline="", encoding="utf-8") as f:
                    writer = csv.DictWriter(f, self.FIELDS)
                    writer.writeheader()
                    writer.writerows(rows)

            atomic_write(self.path, write)
        elif not self.path.exists() or resume_step is None:
            with open(self.path, "w", newline="", encoding="utf-8") as f:
                csv.writer(f).writerow(self.FIELDS)
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                # events after the resumed step are the killed run's; those of that step came before its last
                self.tb = SummaryWriter(str(model_dir / "tensorboard"),
                                        purge_step=None if resume_step is None else resume_step + 1)
            except ImportError:  # tensorboard is a dependency, but do not die over logging
                logging.getLogger("hyperplex").warning("tensorboard not installed: no TensorBoard logs")

    def write(self, step: int, epoch: int, split: str, values: dict[str, float]) -> None:
        with open(self.path, "a", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            for name, value in values.items():
                writer.writerow((step, epoch, split, name, f"{value:.6g}"))
                if self.tb is not None:
                    self.tb.add_scalar(f"{split}/{name}", value, step)
        if self.tb is not None:
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
