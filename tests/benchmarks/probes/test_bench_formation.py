"""benchmarks/probes/bench_formation.py: its two forms compute the layer, and a tiny run gives every ratio."""

from __future__ import annotations

import pytest
import torch
from conftest import load_benchmark

from hyperplex.layers import PHMLinear


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_formation")


def test_both_forms_compute_each_layer_of_the_stack(bench):
    torch.manual_seed(0)
    layers = [PHMLinear(16, 24, n=4).eval() for _ in range(2)]
    x = torch.randn(5, 16)
    with torch.inference_mode():
        want = [layer.dense_weight() for layer in layers]
        for name, run in bench.forms(layers).items():
            for got, layer, H in zip(run(x), layers, want):
                torch.testing.assert_close(got, x @ H.T + layer.bias, msg=name)


def test_tiny_run_gives_both_ratios_and_the_form_the_layer_takes(bench, monkeypatch):
    import dataclasses

    from hyperplex.layers import PHMLinear

    monkeypatch.setattr(PHMLinear, "path_settings",  # d/n = 12 takes it, 6 does not
                        dataclasses.replace(PHMLinear.path_settings, blocked_min_columns=7))
    results = bench.main(["--shapes", "24x16", "--ns", "2", "4", "--rows", "3", "--layers", "1", "--rounds", "1",
                          "--threads", "1"])
    assert set(results) == {(24, 16, 2, 3), (24, 16, 4, 3)}
    for row in results.values():
        assert row["dense_ms"] > 0 and row["whole"] > 0 and row["blocked"] > 0
    # d/n = 12 and 6
    assert results[(24, 16, 2, 3)]["takes"] == "blocked" and results[(24, 16, 4, 3)]["takes"] == "whole"


@pytest.mark.parametrize("argv", [["--shapes", "24by16"], ["--shapes", "24x16", "--ns", "5"], ["--rows", "0"]])
def test_bad_arguments_exit_with_a_message(bench, argv):
    with pytest.raises(SystemExit):
        bench.main(argv)
