"""benchmarks/probes/bench_paths.py: a tiny run times every forced path and reports auto's choice."""

from __future__ import annotations

import pytest
import torch
from conftest import load_benchmark

from hyperplex.layers import PHMLinear


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_paths")


def test_tiny_run_gives_every_path_and_autos_choice(bench):
    results = bench.main(["--shapes", "16x24", "24x16", "--ns", "2", "--rows", "3", "--layers", "1",
                          "--rounds", "2", "--threads", "1"])
    assert set(results) == {(16, 24, 2, 3), (24, 16, 2, 3)}
    for (d, k, n, rows), row in results.items():
        assert all(row[path] > 0 for path in bench.PATHS) and row["dense_ms"] > 0
        assert row["fastest"] == min(bench.PATHS, key=row.get)
        with torch.inference_mode():
            assert row["auto"] == PHMLinear(d, k, n).eval().choose_mode(rows)  # the layer's own inference rule


@pytest.mark.parametrize("argv", [["--shapes", "16x"], ["--shapes", "16x24", "--ns", "3"], ["--layers", "0"]])
def test_bad_arguments_exit_with_a_message(bench, argv):
    with pytest.raises(SystemExit):
        bench.main(argv)
