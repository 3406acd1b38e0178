"""Where and how each model was trained: the machine, the command, and the training segments of
``MODEL_DIR/experiment.json`` (one per start or resume: wall-clock start, seconds, command, machine).

A segment is written before training starts and completed when it ends, so a killed run still leaves its
start; :mod:`hyperplex.experiments.timing` estimates such a segment's length from ``train.log``.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import time
from pathlib import Path

from hyperplex.fileio import atomic_write_text

__all__ = ["RUN_FILE", "machine_info", "describe_machine", "device_name", "read_run_file", "Segment"]

#: Per model folder (and record): the training segments.
RUN_FILE = "experiment.json"


def machine_info(device: str = "cpu") -> dict:
    """Platform, CPU count, Python and torch versions, and the device runs use (``cpu`` or the GPU name)."""
    import os

    import torch

    return {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "device": device}


def describe_machine(info: dict) -> str:
    """One line: ``Linux-…, 2 CPUs, torch 2.13.0, device cpu``."""
    return f"{info.get('platform')}, {info.get('cpus')} CPUs, torch {info.get('torch')}, device {info.get('device')}"


def device_name(cfg) -> str:
    """``cuda (GPU name)`` when the config asks for a GPU and one is present, else ``cpu``; the GPU is the one
    ``training.device`` resolves to, as the trainer resolves it (:func:`~hyperplex.train.process.resolve_device`)."""
    import torch

    if cfg.training.device != "cpu" and torch.cuda.is_available():
        from hyperplex.train.process import resolve_device

        return f"cuda ({torch.cuda.get_device_name(resolve_device(cfg.training.device))})"
    return "cpu"


def read_run_file(model_dir: Path) -> dict:
    """``{"segments": [...]}`` of a model folder or record (no segments when it has no ``experiment.json``)."""
    path = Path(model_dir) / RUN_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"segments": []}


class Segment:
    """One training segment of a model folder, as a context manager: entering appends it to
    ``experiment.json`` (start time, command, machine, ``seconds: null``); leaving records its length and
    ``status`` (set by the caller, else ``failed: ...`` for an exception) and writes the file again."""

    def __init__(self, model_dir: Path, command: str, machine: dict, **fields) -> None:
        self.model_dir = Path(model_dir)
        self.data = read_run_file(self.model_dir)
        self.entry = {"start": time.time(), "started": dt.datetime.now().isoformat(timespec="seconds"),
                      "resume": False, "command": command, "machine": machine, "seconds": None, **fields}

    def __enter__(self) -> dict:
        self.model_dir.mkdir(parents=True, exist_ok=True)
        self.data["segments"].append(self.entry)
        self._write()
        self._started = time.perf_counter()
        return self.entry

    def __exit__(self, kind, error, traceback) -> None:
        if error is not None and "status" not in self.entry:
            self.entry["status"] = f"failed: {kind.__name__}: {error}"
        self.entry["seconds"] = time.perf_counter() - self._started
        self._write()

    def _write(self) -> None:
        atomic_write_text(self.model_dir / RUN_FILE, json.dumps(self.data, indent=1))
