"""Records (``--records DIR``): a finished model's small files kept without its checkpoint.

``DIR/ROW/seedK/`` holds the model folder's ``config.yaml``, ``experiment.json``, ``train.log``,
``metrics.csv``, ``diverged.json``, every ``evaluation-<row>.json`` and ``hypotheses-<row>.txt`` (a translation's
scored text, so that a record can be re-scored without its checkpoint), plus ``record.json`` (status,
``healed``: trained or not, the SHA-256 of ``last.safetensors``): enough to report the model on a machine without
its checkpoint (a later session, another machine), not to load it. Committed under ``experiments/records/``,
they let a plan span sessions.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path

from hyperplex.experiments.provenance import RUN_FILE
from hyperplex.experiments.runs import Run
from hyperplex.experiments.state import DIVERGED_FILE, PLAN_MARK, RECORD_FILE, folder_status, read_record, trained
from hyperplex.fileio import atomic_write_bytes, atomic_write_text

__all__ = ["RECORD_FILES", "FILE_KEYS", "write_record", "recorded_evaluation"]

#: The small files of a model folder that a record keeps (with every ``evaluation-<row>.json``).
RECORD_FILES = ("config.yaml", RUN_FILE, "train.log", "metrics.csv", DIVERGED_FILE)
#: Parts of an evaluation cache key that name the checkpoint file; a record's evaluation is matched on the rest.
FILE_KEYS = ("file", "size", "mtime_ns")


def write_record(run: Run, records: Path, plan_name: str | None = None) -> Path | None:
    """Copy a finished (or diverged) model folder's small files (:data:`RECORD_FILES`, its evaluations) to
    ``records/ROW/seedK`` with ``record.json``, replacing an older record, so the model can be reported where
    its checkpoint is not (another machine, a later session). Checkpoints are not copied. A record that already
    holds exactly these files and this checkpoint is left as it is (its ``written`` date too), so re-reporting a
    plan does not churn committed records. With ``plan_name``, a new records folder is marked as that plan's
    (``plan.json``), so that another plan's run is refused there. Returns the folder (None for a model that is
    not finished)."""
    status = folder_status(run.model_dir)
    if status not in ("finished", "diverged"):
        return None
    target = records / run.row.name / f"seed{run.seed}"
    names = [n for n in RECORD_FILES if (run.model_dir / n).is_file()]
    names += sorted(p.name for p in run.model_dir.glob("evaluation-*.json"))
    names += sorted(p.name for p in run.model_dir.glob("hypotheses-*.txt"))  # the evaluated text, re-scorable
    last = run.model_dir / "last.safetensors"
    digest = hashlib.sha256(last.read_bytes()).hexdigest() if last.is_file() else None
    info = {"status": status, "healed": trained(run.model_dir) if last.is_file() else True,
            "checkpoint_sha256": digest, "files": names}
    if _record_holds(target, info, run.model_dir, names):
        return target
    target.mkdir(parents=True, exist_ok=True)
    if plan_name and not (records / PLAN_MARK).is_file():
        atomic_write_text(records / PLAN_MARK, json.dumps({"plan": plan_name}) + "\n")
    for name in names:
        atomic_write_bytes(target / name, (run.model_dir / name).read_bytes())
    info["written"] = dt.datetime.now().isoformat(timespec="seconds")
    atomic_write_text(target / RECORD_FILE, json.dumps(info, indent=1) + "\n")
    return target


def _record_holds(target: Path, info: dict, model_dir: Path, names: list[str]) -> bool:
    """Whether the record at ``target`` already says ``info`` and holds the folder's files byte for byte
    (the files are compared only when the info matches)."""
    try:
        old = read_record(target)
    except (OSError, ValueError):  # no record yet, or a broken one: (re)write it
        return False
    if not isinstance(old, dict) or {k: v for k, v in old.items() if k != "written"} != info:
        return False
    return all((target / n).is_file() and (target / n).read_bytes() == (model_dir / n).read_bytes() for n in names)


def recorded_evaluation(run: Run, row_name: str, key: dict) -> dict:
    """The evaluation a record holds for row ``row_name``, if it was made with the same settings (checkpoint
    choice, eval overrides and split, quality) — the checkpoint itself is not here to re-evaluate."""
    assert run.record is not None  # only a recorded run is read back
    cache = run.record / f"evaluation-{row_name}.json"
    saved = json.loads(cache.read_text(encoding="utf-8")) if cache.is_file() else None
    strip = lambda k: {a: b for a, b in k.items() if a not in FILE_KEYS}  # noqa: E731
    if saved is None or strip(saved.get("key", {})) != strip(key):
        raise RuntimeError(f"{run.record} records this model without its checkpoint and holds no evaluation for row "
                           f"{row_name!r} with the plan's settings; evaluate it where its checkpoint is, or retrain it")
    return saved["result"]
