"""benchmarks/probes/bench_streamed_shapes.py: a tiny run gives both ratios and auto's path for every point, and bad
arguments stop it before anything is timed. Skips where the native kernel cannot be built."""

from __future__ import annotations

import pytest
from conftest import load_benchmark

from hyperplex.layers import native


@pytest.fixture(scope="module")
def bench():
    try:
        native.enable_native_kernels()
    except Exception as err:  # no compiler or ninja, or a failing build: the benchmark cannot run here
        pytest.skip(f"native kernel not buildable here: {err}")
    native.enable_native_kernels(False)
    return load_benchmark("bench_streamed_shapes")


def test_tiny_run_gives_every_point(bench):
    rows = bench.main(["--shapes", "64:32", "32:64", "--ns", "2", "4", "--rows", "1", "3", "--rounds", "1",
                       "--repeats", "1", "--llc-mib", "0.01", "--threads", "1"])
    assert [(r["d"], r["k"], r["n"], r["rows"]) for r in rows] == [
        (d, k, n, m) for d, k in ((64, 32), (32, 64)) for n in (2, 4) for m in (1, 3)]
    for r in rows:
        assert r["auto"] > 0 and r["streamed"] > 0 and r["dense_ms"] > 0 and r["layers"] >= 2
        assert r["path"] in {"structured", "premixed", "materialized"}  # auto's own path: the kernel is off
        assert r["qualifies"] is False  # far under the factor bound
    assert not native.native_kernels_enabled()  # the run ends with the kernel off for auto


@pytest.mark.parametrize("argv", [["--shapes", "60:32", "--ns", "8"], ["--shapes", "64x32"], ["--shapes", "0:32"],
                                  ["--rounds", "0"], ["--llc-mib", "0"]])
def test_bad_arguments_stop_it(bench, argv):
    with pytest.raises(SystemExit):
        bench.main(argv)
