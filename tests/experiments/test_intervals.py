"""hyperplex.experiments.intervals: mean, sample std and the 95% t-interval, against hand-computed values."""

import math

import pytest

from hyperplex.experiments.intervals import summarize, t_quantile_975


def test_statistics_hand_computed():
    s = summarize([1.0, 2.0, 3.0])
    assert (s["n"], s["mean"], s["std"]) == (3, 2.0, 1.0)
    assert s["ci95"] == pytest.approx([2 - 4.303 / math.sqrt(3), 2 + 4.303 / math.sqrt(3)], rel=1e-3)
    assert summarize([5.0]) == {"n": 1, "mean": 5.0, "std": None, "ci95": None}
    assert [t_quantile_975(df) for df in (1, 9)] == pytest.approx([12.706, 2.262], rel=1e-3)
    assert t_quantile_975(2.5) == pytest.approx(3.5747, rel=1e-4)  # a Welch df, not floored to 2 (4.303)
    for bad in (0, 0.5, float("nan")):
        with pytest.raises(ValueError, match="df"):
            t_quantile_975(bad)
