"""``hyperplex corpus``: build the distillation corpus (:mod:`hyperplex.data.corpus`) and print its counts."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hyperplex.config.experiment import default_data_root
from hyperplex.data.corpus import (
    DEFAULT_EXCLUDES,
    DEFAULT_MIN_SENTENCES,
    FALLBACK_SOURCES,
    SOURCES,
    build_corpus,
    report_path,
    write_corpus,
)

__all__ = ["run_corpus"]


def run_corpus(out: str, data_root: str | None = None, excludes: list[str] | None = None,
               min_sentences: int = DEFAULT_MIN_SENTENCES, seed: int = 0, quiet: bool = False) -> dict:
    """Build the corpus from ``data_root`` (default: ``$HYPERPLEX_DATA``, else ``../shared/data``) into
    ``out`` and its report; print the per-source table (and progress on stderr unless ``quiet``).
    Returns the report as a dict. Nothing is written when any check fails."""
    root = data_root or default_data_root()
    if not root:
        raise FileNotFoundError("no data root: pass --data-root or set HYPERPLEX_DATA")
    if not Path(root).is_dir():
        raise FileNotFoundError(f"--data-root {root} is not a folder")
    if not Path(out).parent.resolve().is_dir():
        raise FileNotFoundError(f"{out}: its folder {Path(out).parent} does not exist (nothing was written)")
    from hyperplex.guards import check_outputs

    inputs = [Path(root) / p for p in (*(s.path for s in (*SOURCES, *FALLBACK_SOURCES)), *DEFAULT_EXCLUDES,
                                       *(excludes or ()))]
    check_outputs({"OUT": out, "its report": report_path(out)}, inputs)  # a source is never replaced
    start = time.perf_counter()
    progress = None if quiet else (lambda message: print(message, file=sys.stderr, flush=True))
    sentences, report = build_corpus(root, excludes or (), min_sentences, seed, progress=progress)
    target = write_corpus(out, sentences, report)
    print(report.table())
    print(f"wrote {report.sentences:,} sentences to {out} and the report to {target} "
          f"in {time.perf_counter() - start:.1f} s")
    return report.to_dict()
