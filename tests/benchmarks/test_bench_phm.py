"""benchmarks/bench_phm.py: the header says whether ``auto`` may take the compiled kernel in its run (it changes the
``auto`` column at few rows on large layers): off by default, on where `hyperplex native` installed it, off again
under HYPERPLEX_NATIVE=0; the targets sections judge given measurements as they should (their records, not the
printed text)."""

from __future__ import annotations

import pytest
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


def _check(checks, fragment):
    """The one record of ``checks`` whose target names ``fragment``."""
    found = [c for c in checks if fragment in c["target"]]
    assert len(found) == 1, [c["target"] for c in checks]
    return found[0]


def test_the_path_check_weighs_the_paths_auto_could_have_taken():
    bench = load_benchmark("bench_phm")
    # auto took oneDNN, 0.50; the structured path ran 0.40: a wrong choice (1.25x)
    checks = bench.auto_checks(_point(bench, "infer", "onednn", auto=0.5, structured=0.4, premixed=0.6, onednn=0.5,
                                      materialized=0.3))
    choice = _check(checks, "inference fwd, auto's path")
    assert choice["verdict"] == "MISS" and choice["value"] == 0 and len(choice["misses"]) == 1
    within = _check(checks, "inference fwd, auto <= 1.10x")
    assert within["verdict"] == "MISS" and within["value"] == pytest.approx(0.5 / 0.3)
    assert _check(checks, "training fwd+bwd, auto <= 1.10x")["verdict"] == "n/a"  # no training point
    # the kept H (0.30) is no rival in inference: auto does not keep one by default
    checks = bench.auto_checks(_point(bench, "infer", "onednn", auto=0.5, structured=0.6, premixed=0.7, onednn=0.5,
                                      materialized=0.3))
    choice = _check(checks, "inference fwd, auto's path")
    assert (choice["verdict"], choice["value"], choice["misses"]) == ("PASS", 1.0, [])
    # an uncached materialised choice in inference is timed by the auto column (1.5), not the cached one (1.0)
    results = _point(bench, "infer", "materialized", auto=1.5, structured=1.2, premixed=2.0, onednn=1.6,
                     materialized=1.0)
    assert bench.wrong_choices(results, "infer") and _check(bench.auto_checks(results),
                                                            "inference fwd, auto's path")["verdict"] == "MISS"
    # training: the paths timed there are the structured and materialised ones
    results = _point(bench, "train", "structured", auto=1.3, structured=1.3, premixed=None, onednn=None,
                     materialized=1.0)
    choice = _check(bench.auto_checks(results), "training fwd+bwd, auto's path")
    assert choice["verdict"] == "MISS" and len(choice["misses"]) == 1
    assert _check(bench.auto_checks(results), "training fwd+bwd, auto <= 1.10x")["value"] == pytest.approx(1.3)


def test_the_cold_one_row_targets_are_the_deploy_issues():
    bench = load_benchmark("bench_phm")
    assert bench.COLD_ONE_ROW_TARGETS == {2: 0.60, 4: 0.30, 8: 0.16, 16: 0.12}
    results = {}
    for n, r in ((2, 0.55), (4, 0.33), (16, 0.12)):
        m = bench.Measurement(4096, 4096, n, 1, "infer", "auto", path="onednn")
        m.ratio = r
        results[(4096, n, 1)] = {"infer": {"auto": m}}
    checks = bench.cold_targets(results)
    assert [(c["value"], c["verdict"], c["detail"]) for c in checks] == [
        (0.55, "PASS", "onednn"), (0.33, "MISS", "onednn"), (0.12, "PASS", "onednn")]
    assert [c["verdict"] for c in bench.cold_targets({(1024, 4, 1): {"infer": {}}})] == ["n/a"]


def test_the_warm_targets_read_the_grid():
    bench = load_benchmark("bench_phm")
    results = {}
    for n, auto, kron in ((2, 0.5, 6.0), (4, 0.4, 5.0)):
        results[(4096, n, 1)] = {"infer": {}}
        for variant, r in (("auto", auto), ("kron", kron)):
            m = bench.Measurement(4096, 4096, n, 1, "infer", variant)
            m.ratio = r
            results[(4096, n, 1)]["infer"][variant] = m
    checks = bench.warm_targets(results, [4096], [2, 4], [1])
    assert [c["verdict"] for c in checks[:2]] == ["PASS", "MISS"]  # 0.50 <= 0.60; 0.40 > 0.35
    assert [c["value"] for c in checks[2:4]] == [pytest.approx(12.0), pytest.approx(12.5)]  # kron / auto
    assert checks[-1]["verdict"] == "n/a"  # no rows >= 1024: the training target is not evaluated
    assert [c["verdict"] for c in bench.warm_targets({}, [1024], [2], [1])] == ["n/a"]


def test_a_point_where_the_kernel_failed_is_not_timed_as_the_kernel(monkeypatch):
    # auto takes the fused kernel (simulated on the CPU), which fails at its first call: the point's auto column
    # then timed PyTorch's paths, so it must be reported as skipped with the error, not labelled "triton"
    import torch
    from torch import nn

    from hyperplex.layers import PHMLinear, triton_phm

    bench = load_benchmark("bench_phm")

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(triton_phm, "_FAILED", None)
    monkeypatch.setattr(triton_phm, "takes_triton", lambda x, layer: triton_phm.kernel_failed() is None)
    monkeypatch.setattr(triton_phm, "triton_phm_linear", broken)
    args = bench.parse_args(["--device", "cpu", "--budget-s", "0.05", "--repeats", "2", "--block-ms", "1"])
    layers = {"dense": nn.Linear(32, 32), "auto": PHMLinear(32, 32, 4)}
    with pytest.warns(RuntimeWarning, match="Triton PHM kernel failed"):
        out = bench.measure_config(layers, 32, 32, 4, 1, "infer", args, torch.device("cpu"), torch.float32)
    assert out["auto"].path == "triton"
    assert out["auto"].skipped.startswith("the fused Triton kernel failed (RuntimeError: no kernel image")
    assert not out["dense"].skipped
