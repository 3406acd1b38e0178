"""PNG plots for a model folder: training curves, attention heat-maps and learned PHM rules Aᵢ.

Figures are drawn with matplotlib's object-oriented API on the Agg canvas (no ``pyplot``), so
nothing here changes the global backend of a user's session and it works on headless machines.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["METRICS_COLUMNS", "read_metrics_csv", "plot_metrics", "plot_attention", "plot_phm_rules"]

METRICS_COLUMNS = ("step", "epoch", "split", "name", "value")


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, out_png) -> str:
    out_png = os.fspath(out_png)
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    fig.savefig(out_png, format="png", dpi=100)
    return out_png


def read_metrics_csv(path) -> dict[tuple[str, str], tuple[list[int], list[float]]]:
    """Read a long-format ``metrics.csv`` (columns ``step,epoch,split,name,value``).

    Returns ``{(name, split): (steps, values)}`` in file order of first appearance.

    Raises:
        ValueError: missing file, missing columns, or a non-numeric step/value (with the line number).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such metrics file")
    series: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in METRICS_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; expected header "
                             f"{','.join(METRICS_COLUMNS)}")
        for row in reader:
            try:
                step, value = int(float(row["step"])), float(row["value"])
            except (TypeError, ValueError):
                raise ValueError(f"{path}, line {reader.line_num}: step {row['step']!r} and value {row['value']!r} "
                                 f"must be numbers") from None
            steps, values = series.setdefault((row["name"], row["split"]), ([], []))
            steps.append(step)
            values.append(value)
    return series


def plot_metrics(metrics_csv_path, out_png, max_panels: int = 12) -> list[str]:
    """Plot every metric of a ``metrics.csv`` against the step: one panel per metric, one line per split.

    The panel of ``loss`` comes first, the others follow in order of first appearance; at most
    ``max_panels`` panels are drawn. Returns the metric names drawn; an empty file writes nothing
    and returns ``[]``.

    Raises:
        ValueError: as :func:`read_metrics_csv`.
    """
    series = read_metrics_csv(metrics_csv_path)
    names = list(dict.fromkeys(name for name, _ in series))
    names = sorted(names, key=lambda n: n != "loss")[:max_panels]  # stable: loss first
    if not names:
        return []
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig = _new_figure(4.2 * cols, 3.0 * rows)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    splits = list(dict.fromkeys(split for _, split in series))
    for ax, name in zip(axes, names):
        for (metric, split), (steps, values) in series.items():
            if metric == name:  # one colour per split across all panels
                ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=split,
                        color=f"C{splits.index(split) % 10}")
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in axes[len(names):]:
        ax.set_visible(False)
    _save(fig, out_png)
    return names


def _to_numpy(weights) -> np.ndarray:
    if hasattr(weights, "detach"):
        weights = weights.detach().float().cpu().numpy()
    return np.asarray(weights, dtype=np.float64)


def plot_attention(weights, src_tokens: Sequence[str], tgt_tokens: Sequence[str], out_png,
                   title: str | None = None) -> str:
    """Heat-map of attention ``weights`` (T, S): row t = target token t's weights over source tokens.

    Args:
        weights: ``(T, S)`` tensor or array (e.g. the stacked ``attention`` of ``decode_step``).
        src_tokens: ``S`` labels for the columns; tgt_tokens: ``T`` labels for the rows.

    Returns the path written. Raises ``ValueError`` if the shape does not match the token counts.
    """
    array = _to_numpy(weights)
    if array.ndim != 2 or array.shape != (len(tgt_tokens), len(src_tokens)):
        raise ValueError(f"plot_attention: weights have shape {array.shape}, expected (len(tgt_tokens), "
                         f"len(src_tokens)) = ({len(tgt_tokens)}, {len(src_tokens)})")
    fig = _new_figure(max(3.0, 0.35 * len(src_tokens) + 1.5), max(2.5, 0.35 * len(tgt_tokens) + 1.0))
    ax = fig.add_subplot()
    image = ax.imshow(array, cmap="viridis", vmin=0.0, vmax=max(1e-12, float(array.max(initial=0.0))), aspect="auto")
    ax.set_xticks(range(len(src_tokens)), labels=list(src_tokens), rotation=90)
    ax.set_yticks(range(len(tgt_tokens)), labels=list(tgt_tokens))
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    if title:
        ax.set_title(title)
    fig.colorbar(image, ax=ax, fraction=0.05)
    return _save(fig, out_png)


def _page_path(out_png: str, page: int) -> str:
    root, ext = os.path.splitext(out_png)
    return out_png if page == 0 else f"{root}-{page + 1}{ext or '.png'}"


def plot_phm_rules(model, out_png, layers_per_page: int = 8) -> int:
    """Draw the rule matrices ``Aᵢ`` (``phm_rule[i]``, n × n) of every :class:`~hyperplex.layers.PHMLinear` with n > 1.

    One row per layer (titled with its module name, and "fixed" for fixed algebras), n heat-maps
    per row on a symmetric colour scale. More than ``layers_per_page`` layers are split over several
    files: ``out_png``, then ``<stem>-2.png``, ``<stem>-3.png``, …

    Returns the number of layers drawn; 0 means the model has no PHM layer with n > 1 and **no file
    is written**.
    """
    from hyperplex.layers import PHMLinear  # a layer below train/: import where used

    if layers_per_page < 1:
        raise ValueError(f"layers_per_page must be >= 1, got {layers_per_page}")
    layers = [(name or "(model)", m) for name, m in model.named_modules() if isinstance(m, PHMLinear) and m.n > 1]
    out_png = os.fspath(out_png)
    for page in range(math.ceil(len(layers) / layers_per_page)):
        chunk = layers[page * layers_per_page:(page + 1) * layers_per_page]
        n_max = max(m.n for _, m in chunk)
        fig = _new_figure(1.6 * n_max + 1.6, 1.8 * len(chunk) + 0.3)
        # the last, narrow column holds each row's colour bar (keeps the Aᵢ columns aligned)
        axes = fig.subplots(len(chunk), n_max + 1, squeeze=False, width_ratios=[1.0] * n_max + [0.06])
        for row, (name, module) in enumerate(chunk):
            rule = _to_numpy(module.phm_rule)  # (n, n, n); rule[i] = Aᵢ (ICLR eq. 3.2)
            bound = max(1e-12, float(np.abs(rule).max()))
            kind = "learned" if module.rule_is_learned else f"fixed: {module.rule_name}"
            for i in range(n_max):
                ax = axes[row, i]
                if i >= module.n:
                    ax.set_visible(False)
                    continue
                image = ax.imshow(rule[i], cmap="RdBu_r", vmin=-bound, vmax=bound)
                ax.set_xticks([])
                ax.set_yticks([])
                ax.set_title(f"A{i + 1}", fontsize="small")
                if module.n <= 4:  # small matrices: print the entries
                    for (r, c), v in np.ndenumerate(rule[i]):
                        ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=6,
                                color="white" if abs(v) > 0.6 * bound else "black")
            fig.colorbar(image, cax=axes[row, n_max])
            axes[row, 0].set_ylabel(f"{name}\n(n={module.n}, {kind})", fontsize="small", rotation=0,
                                    ha="right", va="center")
        _save(fig, _page_path(out_png, page))
    return len(layers)
