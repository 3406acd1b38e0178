"""Seeds → mean ± sample standard deviation with a two-sided 95% Student-t interval of the mean.

Pure functions on lists of floats (one value per seed); :mod:`hyperplex.experiments.markdown` and
:mod:`hyperplex.experiments.summary` print what they return.
"""

from __future__ import annotations

import math

__all__ = ["t_quantile_975", "summarize"]


def t_quantile_975(df: float) -> float:
    """t_{0.975, df}: the half-width factor of a two-sided 95% interval, at any ``df`` ≥ 1 (a Welch–Satterthwaite
    ``df`` is fractional). SciPy's quantile, so the same records give the same intervals on every machine."""
    if not df >= 1:
        raise ValueError(f"a t-interval needs ≥ 2 values (df ≥ 1), got df = {df}")
    from scipy.stats import t as student_t  # here: importing scipy.stats takes a noticeable part of a second

    return float(student_t.ppf(0.975, df))


def summarize(values: list[float]) -> dict:
    """``{"n", "mean", "std", "ci95"}`` of per-seed values: ``std`` is the sample standard deviation
    (ddof = 1) and ``ci95 = mean ± t_{0.975,n−1}·std/√n`` (both ``None`` when n < 2; of zero width, ``[mean,
    mean]``, when the values are all equal, where scipy's t interval is NaN)."""
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "ci95": None}
    mean = math.fsum(values) / n
    if n < 2:
        return {"n": 1, "mean": mean, "std": None, "ci95": None}
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile_975(n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci95": [mean - half, mean + half]}
