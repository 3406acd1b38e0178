"""The state of one model of a plan, read from its folder or from its record.

A model folder is ``new`` (absent or empty), ``partial`` (files but no ``last.safetensors``),
``unfinished`` (a checkpoint whose trainer state is not finished), ``finished`` or ``diverged`` (a model
whose loss or validation metric became NaN/inf: ``diverged.json``, an outcome that is not retried). A *record*
(:mod:`hyperplex.experiments.records`) keeps a finished model's small files without its checkpoint and
says in ``record.json`` what the folder's checkpoint said.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["DIVERGED_FILE", "RECORD_FILE", "PLAN_MARK", "NOT_HEALED", "folder_status", "read_record", "trained"]

#: Per model folder whose training stopped at a NaN/inf loss or validation metric.
DIVERGED_FILE = "diverged.json"
#: Per record folder: status, trained or not (key ``healed``), and the checkpoint's SHA-256.
RECORD_FILE = "record.json"
#: In a ``--records`` folder: ``{"plan": NAME}``, the plan whose records it holds.
PLAN_MARK = "plan.json"
#: ``stop_reason`` in the trainer state of a ``train: false`` model's checkpoint (written without training).
NOT_HEALED = "not healed"


def folder_status(model_dir: Path) -> str:
    """``new`` / ``partial`` / ``unfinished`` / ``finished`` from ``last.safetensors``'s trainer state;
    ``diverged`` when a run stopped at a non-finite loss (``diverged.json``)."""
    from hyperplex.train.checkpoint import checkpoint_info

    if (model_dir / DIVERGED_FILE).is_file():
        return "diverged"
    last = model_dir / "last.safetensors"
    if not last.is_file():
        return "partial" if model_dir.is_dir() and any(model_dir.iterdir()) else "new"
    return "finished" if checkpoint_info(last)["extra"]["trainer"].get("finished") else "unfinished"


class RecordError(ValueError):
    """A ``record.json`` that cannot be read; the message names the file and the key."""


def read_record(folder: Path) -> dict:
    """``{"status", "healed", "checkpoint_sha256", "files", "written"}`` of a record folder (``healed``: whether
    the model was trained, :func:`trained`). :class:`RecordError` naming the file for a damaged record."""
    from hyperplex.fileio import UnsafePathError, read_bounded

    path = folder / RECORD_FILE
    try:
        record = json.loads(read_bounded(path, 16 << 20).decode("utf-8"))
    except (UnsafePathError, OSError) as err:
        raise RecordError(f"{path}: cannot be read ({err})") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise RecordError(f"{path}: not a record written by hyperplex (invalid JSON: {err})") from None
    if not isinstance(record, dict) or record.get("status") not in ("finished", "diverged"):
        status = record.get("status") if isinstance(record, dict) else record
        raise RecordError(f"{path}: key 'status' is {status!r}, expected 'finished' or 'diverged'")
    if not isinstance(record.get("healed"), bool):
        raise RecordError(f"{path}: key 'healed' is {record.get('healed')!r}, expected true or false")
    return record


def trained(model_dir: Path) -> bool:
    """Whether a finished folder's (or record's) model was trained (False: saved as built by a
    ``train: false`` row, :func:`hyperplex.experiments.execution.save_untrained_run`)."""
    from hyperplex.train.checkpoint import checkpoint_info

    if (model_dir / RECORD_FILE).is_file() and not (model_dir / "last.safetensors").is_file():
        return read_record(model_dir)["healed"]
    return checkpoint_info(model_dir / "last.safetensors")["extra"]["trainer"].get("stop_reason") != NOT_HEALED
