"""Training stability of one model (of a sweep row, or one that diverged), from its ``metrics.csv`` and
``diverged.json``."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from hyperplex.experiments.state import DIVERGED_FILE

__all__ = ["SPIKE_FACTOR", "stability"]

#: A logged window whose largest gradient norm exceeds this multiple of the run's median window-mean
#: norm (or is not finite) counts as a gradient-norm spike.
SPIKE_FACTOR = 10.0


def stability(model_dir: Path) -> dict:
    """Training stability of one model from ``metrics.csv`` (train ``loss``, ``grad_norm``, ``grad_norm_max``
    per ``log_every`` window) and ``diverged.json``: ``nan_step`` (the step whose loss was not finite, or
    None), ``loss_first`` / ``loss_last`` (first and last logged window), ``loss_above_start``,
    ``diverged`` (either), ``grad_norm_median`` (of the window means), ``grad_norm_max`` (of the finite windows'
    maxima) and ``spikes``
    (windows whose max norm is > :data:`SPIKE_FACTOR` × that median, or not finite)."""
    from hyperplex.train.plots import read_metrics_csv

    marker = model_dir / DIVERGED_FILE
    nan_step = json.loads(marker.read_text(encoding="utf-8"))["step"] if marker.is_file() else None
    series = read_metrics_csv(model_dir / "metrics.csv") if (model_dir / "metrics.csv").is_file() else {}
    loss = series.get(("loss", "train"), ([], []))[1]
    means = [v for v in series.get(("grad_norm", "train"), ([], []))[1] if math.isfinite(v)]
    peaks = series.get(("grad_norm_max", "train"), ([], []))[1]
    median = statistics.median(means) if means else None
    above = len(loss) >= 2 and not loss[-1] <= loss[0]  # a NaN last window counts as above
    return {"nan_step": nan_step, "loss_first": loss[0] if loss else None, "loss_last": loss[-1] if loss else None,
            "loss_above_start": above, "diverged": nan_step is not None or marker.is_file() or above,
            "grad_norm_median": median,
            # of the finite windows (max() keeps or drops a NaN by where it falls); "spikes" counts the others
            "grad_norm_max": max((v for v in peaks if math.isfinite(v)), default=None),
            "spikes": sum(1 for v in peaks if not math.isfinite(v) or (median and v > SPIKE_FACTOR * median))}
