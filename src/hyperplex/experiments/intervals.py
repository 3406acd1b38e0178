"""Seeds → mean ± sample standard deviation with a two-sided 95% Student-t interval of the mean.

Pure functions on lists of floats (one value per seed); :mod:`hyperplex.experiments.markdown` and
:mod:`hyperplex.experiments.summary` print what they return.
"""

from __future__ import annotations

import math

__all__ = ["T_975", "t_quantile_975", "summarize"]

#: Two-sided 95% quantiles t_{0.975, df} of Student's t for df = 1…30 (standard tables); used when
#: scipy is not installed. Beyond 30 the normal quantile 1.96 is within 4% and is used instead.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile_975(df: int) -> float:
    """t_{0.975, df}: the half-width factor of a two-sided 95% interval (scipy if available, else
    the table :data:`T_975`)."""
    if df < 1:
        raise ValueError(f"a t-interval needs ≥ 2 values (df ≥ 1), got df = {df}")
    try:
        from scipy.stats import t as student_t
    except ImportError:
        return T_975[df - 1] if df <= len(T_975) else 1.96
    return float(student_t.ppf(0.975, df))


def summarize(values: list[float]) -> dict:
    """``{"n", "mean", "std", "ci95"}`` of per-seed values: ``std`` is the sample standard deviation
    (ddof = 1) and ``ci95 = mean ± t_{0.975,n−1}·std/√n`` (both ``None`` when n < 2)."""
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "ci95": None}
    mean = math.fsum(values) / n
    if n < 2:
        return {"n": 1, "mean": mean, "std": None, "ci95": None}
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile_975(n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci95": [mean - half, mean + half]}
