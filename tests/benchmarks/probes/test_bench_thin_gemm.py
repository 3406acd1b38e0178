"""benchmarks/probes/bench_thin_gemm.py: its forms compute the products they claim, and a tiny run gives every ratio."""

from __future__ import annotations

import pytest
import torch
from conftest import load_benchmark

from hyperplex.layers.functional import side_by_side


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_thin_gemm")


def test_forms_are_the_same_products(bench):
    torch.manual_seed(0)
    n, m, rows = 4, 8, 3
    S = torch.randn(n, m, m)
    table, inputs = bench.forms(S, rows)
    x, Z = inputs["X"], inputs["Z"]
    structured = table["structured"](S)  # (n·m, rows·n): row (i, q), column (b, c)
    torch.testing.assert_close(table["x_st"](S), structured.T)
    torch.testing.assert_close(table["bmm"](S).reshape(n * m, rows * n), structured)
    torch.testing.assert_close(structured, S.reshape(n * m, m) @ x.T)
    expected = Z.reshape(rows * n, n * m) @ side_by_side(S).T  # the pre-mixed GEMM against [S₁ … S_n]
    torch.testing.assert_close(table["premixed_accumulate"](S), expected)


def test_bound_is_the_larger_of_bytes_and_flops(bench):
    # d = 4096, one row: 2·4096² flops = 33.55 Mflop; at 50 Gflop/s that is 0.671 ms of a 4.0 ms dense layer
    assert bench.bound(4, 4096, 1, 4.0e-3, 50e9) == 0.25  # bytes bind: 1/4 > 0.168
    assert bench.bound(16, 4096, 1, 4.0e-3, 50e9) == pytest.approx(2 * 4096**2 / 50e9 / 4.0e-3)  # flops: 0.168
    assert bench.bound(16, 4096, 1, 4.0e-3, 50e9) == pytest.approx(0.16777, rel=1e-4)


@pytest.mark.skipif(not (torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight")),
                    reason="MKL's packed GEMM is not built into this torch")
def test_mkl_packed_form_is_the_premixed_product(bench):
    torch.manual_seed(0)
    n, m, rows = 4, 8, 3
    S = torch.randn(n, m, m)
    Z = torch.randn(rows * n, n * m)
    view = S.view(m, n * m)
    packed = torch.ops.mkl._mkl_reorder_linear_weight(view, rows * n)
    torch.testing.assert_close(torch.ops.mkl._mkl_linear(Z, packed, view, None, rows * n), Z @ view.T)
    assert bench.mkl_packed_ratio([S], Z, repeats=1) > 0


def test_tiny_run_gives_a_ratio_per_form(bench):
    results = bench.main(["--d", "64", "--rows", "2", "--ns", "2", "4", "--layers", "1", "--repeats", "1",
                          "--threads", "1"])
    assert set(results) == {2, 4}
    for row in results.values():
        assert {"structured", "x_st", "bmm", "premixed_stored", "premixed_accumulate"} <= set(row)
        assert all(ratio > 0 for ratio in row.values())
    assert results[2]["bound"] >= 0.5 and results[4]["bound"] >= 0.25
    with pytest.raises(SystemExit):
        bench.main(["--d", "60", "--ns", "8"])


def test_whole_forwards_time_eager_and_compiled_and_refuse_a_wrong_compile(bench, monkeypatch):
    torch.manual_seed(0)
    stack = [torch.randn(4, 8, 8) for _ in range(2)]
    monkeypatch.setattr(torch, "compile", lambda f, **kwargs: f)  # inductor takes tens of seconds; slow test below
    ratios = bench.whole_forwards(stack, rows=2, repeats=1, t_dense=1.0)
    assert set(ratios) == {"full", "compiled"} and all(r > 0 for r in ratios.values())
    monkeypatch.setattr(torch, "compile", lambda f, **kwargs: lambda x, rule, S: f(x, rule, S) + 1.0)
    with pytest.raises(AssertionError, match="compiled forward differs from eager"):
        bench.whole_forwards(stack, rows=2, repeats=1, t_dense=1.0)


@pytest.mark.slow
def test_compiled_structured_forward_matches_eager(bench):
    torch.manual_seed(0)
    ratios = bench.whole_forwards([torch.randn(2, 16, 16)], rows=1, repeats=1, t_dense=1.0)
    assert ratios["compiled"] > 0
