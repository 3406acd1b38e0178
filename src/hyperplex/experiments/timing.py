"""Training time of one model: the measured segments of ``experiment.json``, with ``train.log`` time
stamps standing in for a segment that was killed before it could record its length."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from hyperplex.experiments.provenance import read_run_file

__all__ = ["LOG_TIME", "log_times", "training_time"]

#: The time stamp that starts each ``train.log`` line.
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) ")


def log_times(model_dir: Path) -> list[dt.datetime]:
    """Every time stamp of ``MODEL_DIR/train.log``, in file order (none without the file)."""
    path = model_dir / "train.log"
    if not path.is_file():
        return []
    stamps = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        m = LOG_TIME.match(line)
        if m:
            stamps.append(dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
    return stamps


def training_time(model_dir: Path) -> tuple[float | None, str]:
    """(seconds, source): the sum of the measured training segments in ``experiment.json``; a segment
    killed before it could record its length is estimated from its start to its last ``train.log`` time
    stamp (source ``train.log``). Without ``experiment.json``: first to last ``train.log`` time stamp."""
    segments = read_run_file(model_dir)["segments"]
    stamps = log_times(model_dir)
    if not segments:
        return ((stamps[-1] - stamps[0]).total_seconds(), "train.log") if stamps else (None, "unknown")
    total, source = 0.0, "measured"
    for i, seg in enumerate(segments):
        if seg.get("seconds") is not None:
            total += seg["seconds"]
            continue
        begin = dt.datetime.fromtimestamp(seg["start"]).replace(microsecond=0)
        end = dt.datetime.fromtimestamp(segments[i + 1]["start"]) if i + 1 < len(segments) else dt.datetime.max
        inside = [s for s in stamps if begin <= s < end]
        total += (inside[-1] - begin).total_seconds() if inside else 0.0
        source = "train.log"
    return total, source
