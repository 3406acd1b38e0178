"""The checkpoints of one model folder: ``last``, the best ``k``, their index, recovery after a crash."""
from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
from typing import Any

from torch import Tensor

from hyperplex import fileio
from hyperplex.train.checkpoint.format import (
    CheckpointError,
    _save,
    atomic_write,
    checkpoint_info,
    save_checkpoint,
)

log = logging.getLogger(__name__)

#: File names in a model folder, named once here.
LAST = "last.safetensors"
BEST = "best.safetensors"

# ---------------------------------------------------------------------------- manager
_BEST_PATTERN = re.compile(r"^best-(\d+)\.safetensors$")


class CheckpointManager:
    """Keeps ``last.safetensors`` and the best ``keep_best`` checkpoints of a model folder.

    Files in ``model_dir``: ``last.safetensors``; ``best-<step>.safetensors`` for the ``keep_best``
    best validation scores; ``best.safetensors``, a hard link (a copy where links are unsupported)
    to the single best; ``checkpoints.json``, the index (best first). Ties keep the earlier step.

    Every file is written atomically, and a file that drops out of the top ``k`` is deleted only
    after the new one and the index are safely on disk. Each best file also records its step and
    metric in its own header, so on start-up the manager rebuilds a missing or stale index from the
    files (after a crash between steps) and removes leftover temporary files.

    A run resumes from ``last``, and the best checkpoints must agree with it: the best file that was
    on top when ``last`` was last written is kept until the next ``last`` (even after a better one
    pushed it out of the top ``k``), and a manager opened with ``resume_step`` deletes the best files
    of later steps (written by a run that died before it saved ``last`` again, so the resumed run
    trains those steps anew). Write a validation's best file before ``last``.

    Args:
        model_dir: the model folder (created if missing).
        keep_best: how many best checkpoints to keep, ≥ 1.
        metric_mode: ``"max"`` (BLEU, accuracy) or ``"min"`` (loss, perplexity).
        metric_name: optional; recorded in the index, and a restart with a different name or mode
            raises :class:`CheckpointError` instead of mixing rankings.
        resume_step: the step of the ``last`` a run resumes from; best files of later steps are deleted
            (their steps in :attr:`dropped_steps`).
    """

    INDEX = "checkpoints.json"
    LAST = LAST
    BEST = BEST

    def __init__(self, model_dir, keep_best: int = 1, metric_mode: str = "max", metric_name: str | None = None,
                 resume_step: int | None = None) -> None:
        if not isinstance(keep_best, int) or keep_best < 1:
            raise ValueError(f"keep_best must be an integer >= 1, got {keep_best!r}")
        if metric_mode not in ("max", "min"):
            raise ValueError(f"metric_mode must be 'max' or 'min', got {metric_mode!r}")
        self.model_dir, self.keep_best = os.fspath(model_dir), keep_best
        self.metric_mode, self.metric_name = metric_mode, metric_name
        try:
            os.makedirs(self.model_dir, exist_ok=True)
        except OSError as e:
            raise CheckpointError(f"{self.model_dir}: cannot create the model folder ({e.strerror or e})") from e
        self.entries: list[dict] = []  # [{"step", "metric", "file"}], best first
        self.dropped_steps: list[int] = []  # best files deleted for being later than resume_step
        self._anchor: str | None = None  # the top best file when last was written: kept until the next last
        self._recover(resume_step)
        self._anchor = self.entries[0]["file"] if self.entries else None

    # ------------------------------------------------------------------ paths and ranking
    def path(self, name: str) -> str:
        """Absolute path of a file in the model folder."""
        return os.path.join(self.model_dir, name)

    @property
    def last_path(self) -> str:
        return self.path(self.LAST)

    @property
    def best_path(self) -> str:
        return self.path(self.BEST)

    @property
    def best_metric(self) -> float | None:
        """The best metric value kept so far, or ``None``."""
        return self.entries[0]["metric"] if self.entries else None

    def _key(self, entry: dict) -> tuple:
        return (-entry["metric"] if self.metric_mode == "max" else entry["metric"], entry["step"])

    def is_better(self, value: float, than: float | None) -> bool:
        """Whether ``value`` is strictly better than ``than`` (``None`` = nothing yet) under ``metric_mode``."""
        if than is None:
            return True
        return value > than if self.metric_mode == "max" else value < than

    # ------------------------------------------------------------------ saving
    def save_last(self, model_state: dict[str, Tensor], optimizer_state: dict | None = None,
                  extra: dict | None = None, rng: bool = True) -> str:
        """Atomically (over)write ``last.safetensors``; arguments as :func:`save_checkpoint`. Returns its path."""
        path = save_checkpoint(self.last_path, model_state, optimizer_state, extra, rng)
        previous, self._anchor = self._anchor, (self.entries[0]["file"] if self.entries else None)
        if previous is not None and previous not in {e["file"] for e in self.entries}:
            self._unlink(previous)  # no resumable state refers to it any more
        return path

    def save_if_best(self, metric_value: float, step: int, model_state: dict[str, Tensor],
                     optimizer_state: dict | None = None, extra: dict | None = None, rng: bool = True) -> str | None:
        """Save ``best-<step>.safetensors`` if ``metric_value`` ranks in the top ``keep_best``.

        Returns the new file's path, or ``None`` when it does not rank (nothing is written).
        Raises ``ValueError`` for a NaN or infinite metric.
        """
        metric_value = float(metric_value)
        if not math.isfinite(metric_value):
            raise ValueError(f"save_if_best: the validation metric is {metric_value}; refusing to rank it")
        entry: dict[str, Any] = {"step": int(step), "metric": metric_value, "file": f"best-{int(step)}.safetensors"}
        ranked = sorted([e for e in self.entries if e["step"] != entry["step"]] + [entry], key=self._key)
        kept = ranked[: self.keep_best]
        if entry not in kept:
            return None
        info = {"step": entry["step"], "metric": metric_value, "metric_mode": self.metric_mode,
                "metric_name": self.metric_name}
        _save(self.path(entry["file"]), "checkpoint", model_state, optimizer_state, extra, rng, manager=info)
        self._commit(kept)
        return self.path(entry["file"])

    def _commit(self, kept: list[dict]) -> None:
        """Point best.safetensors at the top entry, write the index, then delete what dropped out."""
        dropped = [e for e in self.entries if e["file"] not in {k["file"] for k in kept}]
        if kept and not self._is_linked(kept[0]):
            self._link_best(kept[0])
        self.entries = kept
        self._write_index()
        for e in dropped:  # only now: the new file and the index are on disk
            if e["file"] != self._anchor:  # a resume from last needs the best it was written with
                self._unlink(e["file"])

    def _unlink(self, name: str) -> None:
        try:
            os.unlink(self.path(name))
        except FileNotFoundError:
            pass

    def _is_linked(self, entry: dict) -> bool:
        try:
            return os.path.samefile(self.best_path, self.path(entry["file"]))
        except OSError:
            return False

    def _link_best(self, entry: dict) -> None:
        source = self.path(entry["file"])

        def write(tmp: str) -> None:
            try:
                os.link(source, tmp)
            except OSError:  # no hard links on this file system: copy
                shutil.copyfile(source, tmp)

        atomic_write(self.best_path, write)

    def _write_index(self) -> None:
        index = {"format": "hyperplex-checkpoint-index", "version": 1, "metric_mode": self.metric_mode,
                 "metric_name": self.metric_name, "keep_best": self.keep_best, "best": self.entries}

        def write(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(index, f, indent=1)

        atomic_write(self.path(self.INDEX), write)

    # ------------------------------------------------------------------ start-up recovery
    def _recover(self, resume_step: int | None) -> None:
        """Rebuild the ranking from the index and the best-*.safetensors files actually present (less those
        of steps after ``resume_step``)."""
        names = os.listdir(self.model_dir)
        for name in names:  # temporary files of writes killed mid-way
            if fileio.TMP_PATTERN.match(name):
                leftover = self.path(name)
                try:
                    shutil.rmtree(leftover) if os.path.isdir(leftover) else os.unlink(leftover)
                except OSError:
                    pass
        index_path, index = self.path(self.INDEX), {}
        if os.path.exists(index_path):
            try:
                with open(index_path, encoding="utf-8") as f:
                    index = json.load(f)
            except (OSError, ValueError) as e:
                log.warning("%s: unreadable checkpoint index (%s); rebuilding it from the best-*.safetensors files",
                            index_path, e)
        old_mode, old_name = index.get("metric_mode", self.metric_mode), index.get("metric_name", self.metric_name)
        if (old_mode, old_name) != (self.metric_mode, self.metric_name) and index.get("best"):
            raise CheckpointError(
                f"{index_path}: the best checkpoints here are ranked by {old_name!r} ({old_mode}), this run ranks by "
                f"{self.metric_name!r} ({self.metric_mode}); "
                "use another model_dir or delete the best-* files and the index")
        by_file = {e["file"]: e for e in index.get("best", []) if os.path.exists(self.path(e["file"]))}
        for name in names:
            if _BEST_PATTERN.match(name) and name not in by_file:  # written or dropped around a crash
                try:
                    info = checkpoint_info(self.path(name))["manager"] or {}
                except CheckpointError as e:
                    log.warning("ignoring %s: %s", name, e)
                    continue
                if "metric" in info and info.get("metric_mode") == self.metric_mode:
                    by_file[name] = {"step": info["step"], "metric": info["metric"], "file": name}
        if resume_step is not None:
            later = [name for name, e in by_file.items() if e["step"] > resume_step]
            self.dropped_steps = sorted(by_file[name]["step"] for name in later)
            for name in later:
                del by_file[name]
                self._unlink(name)
            if later and not by_file:  # best.safetensors is a link to (or copy of) one of them
                self._unlink(self.BEST)
        self.entries = sorted(by_file.values(), key=self._key)
        if by_file or index:
            self._commit(self.entries[: self.keep_best])
