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


def _point(bench, phase, path, **ratios):
    """One grid point's measurements: ``ratios`` by variant (``None``: skipped), auto on ``path``."""
    out = {}
    for variant, r in ratios.items():
        m = bench.Measurement(1024, 1024, 4, 8, phase, variant, path=path if variant == "auto" else variant)
        if r is None:
            m.skipped = "timed in inference only"
        else:
            m.ratio = r
        out[variant] = m
    return {(1024, 4, 8): {phase: out}}


def test_the_path_check_weighs_the_paths_auto_could_have_taken(capsys):
    bench = load_benchmark("bench_phm")
    # auto took oneDNN, 0.50; the structured path ran 0.40: a wrong choice (1.25x)
    bench.print_auto_check(_point(bench, "infer", "onednn", auto=0.5, structured=0.4, premixed=0.6, onednn=0.5,
                                  materialized=0.3))
    text = capsys.readouterr().out
    assert "auto took onednn, 1.250x structured" in text and "0/1 right" in text
    # the kept H (0.30) is no rival in inference: auto does not keep one by default
    bench.print_auto_check(_point(bench, "infer", "onednn", auto=0.5, structured=0.6, premixed=0.7, onednn=0.5,
                                  materialized=0.3))
    assert "1/1 right" in capsys.readouterr().out
    # an uncached materialised choice in inference is timed by the auto column, not the cached one
    bench.print_auto_check(_point(bench, "infer", "materialized", auto=1.5, structured=1.2, premixed=2.0,
                                  onednn=1.6, materialized=1.0))
    assert "auto took materialized, 1.250x structured" in capsys.readouterr().out
    # training: the paths timed there are the structured and materialised ones
    bench.print_auto_check(_point(bench, "train", "structured", auto=1.3, structured=1.3, premixed=None, onednn=None,
                                  materialized=1.0))
    assert "auto took structured, 1.300x materialized" in capsys.readouterr().out


def test_the_cold_one_row_targets_are_the_deploy_issues(capsys):
    bench = load_benchmark("bench_phm")
    assert bench.COLD_ONE_ROW_TARGETS == {2: 0.60, 4: 0.30, 8: 0.16, 16: 0.12}
    results = {}
    for n, r in ((2, 0.55), (4, 0.33), (16, 0.12)):
        m = bench.Measurement(4096, 4096, n, 1, "infer", "auto", path="onednn")
        m.ratio = r
        results[(4096, n, 1)] = {"infer": {"auto": m}}
    bench.print_cold_targets(results)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["  d=k=4096, 1 row, inference fwd, auto <= 0.60x dense, n=2: PASS  0.550x (onednn)",
                     "  d=k=4096, 1 row, inference fwd, auto <= 0.30x dense, n=4: MISS  0.330x (onednn)",
                     "  d=k=4096, 1 row, inference fwd, auto <= 0.12x dense, n=16: PASS  0.120x (onednn)"]
    bench.print_cold_targets({(1024, 4, 1): {"infer": {}}})
    assert "not in the cold grid" in capsys.readouterr().out
