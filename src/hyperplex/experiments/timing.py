"""Training time of one model: the measured segments of ``experiment.json``, with ``train.log`` time
stamps standing in for a segment that was killed before it could record its length."""

from __future__ import annotations

import bisect
import datetime as dt
import re
from pathlib import Path

from hyperplex.experiments.provenance import read_run_file
from hyperplex.train.logs import RUN_START

__all__ = ["LOG_TIME", "log_parts", "log_times", "training_time"]

#: The time stamp that starts each ``train.log`` line.
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) ")
#: A line a trainer process wrote first (:data:`~hyperplex.train.logs.RUN_START`): ``STAMP LEVEL MESSAGE``.
_RUN_START_LINE = re.compile(LOG_TIME.pattern + r"\S+ " + re.escape(RUN_START))


def log_parts(model_dir: Path) -> list[tuple[bool, list[dt.datetime]]]:
    """``MODEL_DIR/train.log`` split where each trainer process started: ``(marked, stamps)`` per part, in file
    order. ``marked``: the part opens with that process's start line; lines before the first start line (a log
    written before the trainer wrote one) form one unmarked part. No parts without the file."""
    path = model_dir / "train.log"
    if not path.is_file():
        return []
    parts: list[tuple[bool, list[dt.datetime]]] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        m = LOG_TIME.match(line)
        if not m:
            continue
        stamp = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
        if _RUN_START_LINE.match(line) or not parts:
            parts.append((bool(_RUN_START_LINE.match(line)), []))
        parts[-1][1].append(stamp)
    return parts


def log_times(model_dir: Path) -> list[dt.datetime]:
    """Every time stamp of ``MODEL_DIR/train.log``, in file order (none without the file)."""
    return [stamp for _, stamps in log_parts(model_dir) for stamp in stamps]


def training_time(model_dir: Path) -> tuple[float | None, str]:
    """(seconds, source): the sum of the measured training segments in ``experiment.json``; a segment
    killed before it could record its length is estimated from its start to its own last ``train.log`` time
    stamp (source ``train.log``). Without ``experiment.json``: the sum over the log's parts (one per trainer
    process) of first to last time stamp.

    A segment's own lines are those of the processes that started within it. Stamps are whole seconds while a
    segment's start is not, so a resumed process's first lines can carry a stamp before its segment's start:
    counted by stamp alone they would extend the killed segment before it over the whole downtime. A part that
    opens with a trainer's start line belongs, with all its lines, to the last segment begun by that line's
    second; the lines of an unmarked part are placed one by one the same way (off by under a second at a
    boundary)."""
    segments = read_run_file(model_dir)["segments"]
    parts = log_parts(model_dir)
    if not segments:
        if not parts:
            return None, "unknown"
        return sum((stamps[-1] - stamps[0]).total_seconds() for _, stamps in parts), "train.log"
    begins = [dt.datetime.fromtimestamp(seg["start"]).replace(microsecond=0) for seg in segments]
    owned: list[list[dt.datetime]] = [[] for _ in segments]

    def owner(stamp: dt.datetime) -> int:  # the last segment begun by ``stamp``'s second; -1 before the first
        return bisect.bisect_right(begins, stamp) - 1

    for marked, stamps in parts:
        for stamp in stamps:
            i = owner(stamps[0] if marked else stamp)
            if i >= 0:
                owned[i].append(stamp)
    total, source = 0.0, "measured"
    for seg, begin, stamps in zip(segments, begins, owned):
        if seg.get("seconds") is not None:
            total += seg["seconds"]
            continue
        total += (max(stamps) - begin).total_seconds() if stamps else 0.0
        source = "train.log"
    return total, source
