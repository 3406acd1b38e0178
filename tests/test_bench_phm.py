"""benchmarks/bench_phm.py says whether ``auto`` may take the compiled kernel in its run (it changes the ``auto``
column at few rows on large layers): off by default, on where `hyperplex native` installed it, off again under
HYPERPLEX_NATIVE=0."""

from __future__ import annotations

from conftest import load_benchmark
from hyperplex.layers import native


def test_the_header_says_whether_auto_may_take_the_native_kernel(kernel_cache, monkeypatch):
    bench = load_benchmark("bench_phm")
    assert bench.native_line(False).startswith("native PHM kernel: off (not installed; `hyperplex native` installs")
    native.install_native_kernels()
    assert bench.native_line(False) == "native PHM kernel: on (installed by `hyperplex native`)"
    monkeypatch.setenv(native.ENV_VAR, "0")
    assert bench.native_line(False) == "native PHM kernel: off (HYPERPLEX_NATIVE=0)"
    assert bench.native_line(True) == "native PHM kernel: on (--native)"
