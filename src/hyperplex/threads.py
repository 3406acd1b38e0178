"""How many CPU threads torch should use: one rule for ``demo``, ``evaluate``, ``translate`` and
``training.num_threads: 0``.

The rule::

    work    = rows × width × width              # multiply-adds of one width×width matrix product
    threads = clamp(work // WORK_PER_THREAD, 1, cores)

``rows`` are the rows one matrix product sees (tokens of a training batch, or sentences × beam when
decoding one token at a time), ``width`` the model's hidden width (``d_model`` / ``hidden_size``)
and ``cores`` the CPUs this process may run on (``os.sched_getaffinity``, which honours
``taskset`` and container CPU sets; ``os.cpu_count()`` counts the whole machine).

Why: torch splits one operation over its threads and waits for all of them at the end. A thread
that is descheduled — another process holds its core — stalls the others for a time slice, and a
small model runs hundreds of such operations per step, so on a shared 2-core machine two threads
made small models 5-100× slower than one (``benchmarks/probes/bench_threads.py``). A second thread only
pays when each thread gets at least ``WORK_PER_THREAD`` multiply-adds per product. The load of
other processes is deliberately *not* an input: the load average lags by a minute, counts the
whole host inside containers, and would make a training run's thread count (and with it its float
rounding, and bitwise-exact resumption) depend on what else was running. Pass ``--threads N`` (or
``training.num_threads``) to override.
"""

from __future__ import annotations

import os

import torch

__all__ = ["WORK_PER_THREAD", "TOKENS_PER_SENTENCE", "available_cores", "choose_threads", "model_width",
           "parse_threads", "set_threads"]

#: Multiply-adds of one matrix product below which a further thread costs more than it saves
#: (2²⁴ ≈ 16.8 M, e.g. 256 rows × 256²; measured by ``benchmarks/probes/bench_threads.py``).
WORK_PER_THREAD = 1 << 24

#: Rows one sentence contributes when only sentence counts are known (sentence-sized batches of an
#: encoder or a classifier): a typical sentence length in tokens (Multi30k averages 12-14).
TOKENS_PER_SENTENCE = 20


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where that is unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS / Windows have no sched_getaffinity
        return max(1, os.cpu_count() or 1)


def choose_threads(rows: int, width: int, cores: int | None = None) -> int:
    """The module's rule: ``clamp(rows · width² // WORK_PER_THREAD, 1, cores)``.

    Args:
        rows: rows of one matrix product (tokens per training batch; sentences × beam when decoding).
        width: the model's hidden width.
        cores: CPUs available (default :func:`available_cores`).
    """
    for name, value in (("rows", rows), ("width", width)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"choose_threads: {name} must be a positive integer, got {value!r}")
    cores = available_cores() if cores is None else cores
    if not isinstance(cores, int) or cores < 1:
        raise ValueError(f"choose_threads: cores must be a positive integer, got {cores!r}")
    return max(1, min(cores, rows * width * width // WORK_PER_THREAD))


def model_width(model) -> int:
    """Hidden width of a model or of its config: ``d_model``, ``hidden_size`` or ``embedding_dim``, the
    first one set; else (a module without such a config) the largest smaller side of its 2-D
    parameters (a ``Linear(d, k)`` weight counts ``min(d, k)``); else 1."""
    config = getattr(model, "config", model)
    for name in ("d_model", "hidden_size", "embedding_dim"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    if isinstance(model, torch.nn.Module):
        return max((min(p.shape) for p in model.parameters() if p.dim() == 2), default=1)
    return 1


def parse_threads(value, option: str = "--threads") -> int:
    """``value`` (a command-line string or an int) as a thread count ``≥ 0`` (0 = the rule);
    ``ValueError`` naming ``option`` otherwise."""
    text = str(value).strip()
    try:
        threads = int(text)
    except ValueError:
        threads = None
    if threads is None or threads < 0 or isinstance(value, bool) or isinstance(value, float):
        raise ValueError(f"{option} must be an integer ≥ 0 (0 = chosen from the work size and the "
                         f"{available_cores()} available cores), got {value!r}")
    return threads


def set_threads(threads: int | None, rows: int, width: int) -> int:
    """Set torch's intra-op threads to ``threads``, or to :func:`choose_threads` when it is 0 or
    ``None``; returns the number set."""
    count = threads or choose_threads(rows, width)
    if count != torch.get_num_threads():
        torch.set_num_threads(count)
    return count
