"""The forward-path choice of ``PHMLinear`` (:mod:`hyperplex.layers.dispatch`): which path for which call."""

import contextlib
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from hyperplex.layers import PHMLinear, native
from hyperplex.layers.dispatch import (
    DEFAULT_PATH_SETTINGS,
    PathSettings,
    choose_path,
    formation,
    structured_weight_first,
    takes_blocked,
)
from hyperplex.layers.functional import onednn_available

GRID = json.loads((Path(__file__).parent / "data" / "dispatch_grid.json").read_text())


@contextlib.contextmanager
def _condition(cond: str, layer: PHMLinear, monkeypatch):
    """Put ``layer`` and the process in one of the grid's conditions (the same ones the grid was recorded with)."""
    with contextlib.ExitStack() as stack:
        if cond in ("frozen", "input_grad"):
            layer.requires_grad_(False)
        if cond in ("no_grad", "cache_no_grad", "float64", "native", "onednn_off", "onednn_everywhere", "autocast",
                    "meta") or cond.startswith("mode_"):
            stack.enter_context(torch.no_grad())
        if cond == "inference_mode":
            stack.enter_context(torch.inference_mode())
        if cond.startswith("cache") or cond.endswith("_cache"):
            layer.cache_dense = True
        if cond == "native":
            monkeypatch.setattr(native, "native_kernels_enabled", lambda: True)
        if cond == "onednn_off":
            stack.enter_context(torch.backends.mkldnn.flags(enabled=False))
        if cond == "onednn_everywhere":
            monkeypatch.setattr(PHMLinear, "path_settings",
                                dataclasses.replace(DEFAULT_PATH_SETTINGS, onednn_min_weight=0))
        if cond == "autocast":
            stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
        if cond.startswith("mode_"):
            layer.forward_mode = cond.split("_")[1]
        yield
    monkeypatch.undo()


@pytest.mark.skipif(not onednn_available(), reason="the grid was recorded where oneDNN's linear is usable")
def test_the_path_for_every_grid_case_is_the_one_the_code_took_before_the_dispatch_moved(monkeypatch):
    # tests/layers/data/dispatch_grid.json holds PHMLinear.choose_mode on these cases as computed by the code before
    # the path choice moved to hyperplex.layers.dispatch (the thresholds then class attributes of PHMLinear and
    # module constants of functional.py); the move must not change one choice.
    monkeypatch.setenv("HYPERPLEX_NATIVE", "0")  # the grid's "native" case turns the kernel on explicitly
    decode, rows = GRID["codes"], GRID["rows"]
    differences = []
    for case, want in GRID["paths"].items():
        cond, size, n = case.split()
        d, k = map(int, size.split("x"))
        layer = PHMLinear(d, k, int(n.split("=")[1]), dtype=torch.float64 if cond == "float64" else None,
                          device="meta" if cond == "meta" else None)
        with _condition(cond, layer, monkeypatch):
            got = [layer.choose_mode(r, input_grad=cond == "input_grad") for r in rows]
        differences += [(case, r, decode[w], g) for r, w, g in zip(rows, want, got) if decode[w] != g]
    assert not differences, differences[:10]
    blocked = set(GRID["takes_blocked"])
    sizes = {tuple(map(int, case.split()[1].split("x"))) for case in GRID["paths"]}  # (d, k)
    for d, k in sizes:
        for n in (1, 2, 3, 4, 8, 16, 32):
            assert takes_blocked(k, d, n) == (f"{k}x{d} n={n}" in blocked)
    weight_first = set(GRID["structured_weight_first"])
    for d, k in sizes:
        for n in (1, 2, 4, 8, 16):
            for r in (1, 2, 3, 4, 5, 8, 9):
                assert structured_weight_first(r, n, k, d) == (f"{k}x{d} n={n} rows={r}" in weight_first)


def _path(rows, d, k, n, **kw):
    kw.setdefault("dtype", torch.float32)
    kw.setdefault("device", torch.device("cpu"))
    kw.setdefault("weight_grad", False)
    return choose_path(rows, d, k, n, **kw)


def test_training_takes_the_structured_path_at_few_rows_and_forms_h_at_many():
    assert _path(1, 1024, 1024, 4, weight_grad=True) == "structured"
    assert _path(4096, 1024, 1024, 4, weight_grad=True) == "materialized"
    # a large weight keeps the structured path for more rows in training: forming H and its gradient costs more
    assert _path(128, 4096, 4096, 16, weight_grad=True) == "structured"
    assert _path(128, 2048, 2048, 16, weight_grad=True) == "materialized"


def test_inference_on_small_weights_mixes_first_when_the_layer_widens():
    with torch.backends.mkldnn.flags(enabled=False):
        assert _path(16, 384, 1536, 4) == "premixed"
        assert _path(16, 1536, 384, 4) == "structured"
        assert _path(16, 384, 384, 4) == "structured"
        assert _path(1000, 384, 1536, 4) == "materialized"


def test_the_cache_is_taken_when_asked_for_and_never_in_training():
    assert _path(1, 512, 512, 4, cache_dense=True) == "cached"  # a cache-resident H wins even at one row
    assert _path(4096, 1024, 1024, 4, cache_dense=True) == "cached"
    assert _path(4096, 1024, 1024, 4, cache_dense=True, weight_grad=True) == "materialized"


def test_cpu_inference_kernels_only_for_float32_without_input_gradient_or_low_rank():
    if not onednn_available():
        pytest.skip("no usable oneDNN linear")
    assert _path(16, 4096, 4096, 4) == "onednn"
    assert _path(16, 4096, 4096, 4, input_grad=True) == "structured"
    assert _path(16, 4096, 4096, 4, dtype=torch.float64) == "structured"
    assert _path(16, 4096, 4096, 4, factor_rank=8) == "structured"
    assert _path(16, 4096, 4096, 4, rule_dtype=torch.float64) == "structured"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _path(16, 4096, 4096, 4) == "structured"


def test_cuda_trains_through_a_formed_h_and_infers_structured_up_to_its_row_limit():
    cuda = torch.device("cuda")  # choose_path reads only the device's type: no GPU needed
    limit = DEFAULT_PATH_SETTINGS.cuda_structured_rows_uncached
    for rows in (1, 16, 64, 1024, 4096):
        assert _path(rows, 4096, 4096, 4, device=cuda, weight_grad=True) == "materialized"
        assert _path(rows, 1024, 1024, 16, device=cuda, weight_grad=True) == "materialized"
        with torch.backends.mkldnn.flags(enabled=False):  # the CPU rule without its CPU-only kernels
            cpu = _path(rows, 4096, 4096, 4)
        want = "structured" if cpu == "materialized" and rows <= limit else cpu
        assert _path(rows, 4096, 4096, 4, device=cuda) == want
        # with the cache, the general rule as on the CPU (a kept H is read, never formed)
        with torch.backends.mkldnn.flags(enabled=False):
            assert (_path(rows, 4096, 4096, 4, device=cuda, cache_dense=True)
                    == _path(rows, 4096, 4096, 4, cache_dense=True))
    assert _path(1024, 4096, 4096, 16, device=cuda) == "structured"  # the CPU rule forms H here
    assert _path(limit + 1, 4096, 4096, 16, device=cuda) == "materialized"
    assert _path(1024, 384, 1536, 4, device=cuda) == "structured"
    # the CUDA settings move the choice
    eager = dataclasses.replace(DEFAULT_PATH_SETTINGS, cuda_structured_rows_training=64,
                                cuda_structured_rows_uncached=0)
    assert _path(64, 4096, 4096, 4, device=cuda, weight_grad=True, settings=eager) == "structured"
    assert _path(65, 4096, 4096, 4, device=cuda, weight_grad=True, settings=eager) == "materialized"
    assert _path(1024, 4096, 4096, 16, device=cuda, settings=eager) == "materialized"


class _RowsThatRefuseComparison:
    """A row count that raises when compared or multiplied: what a symbolic size under ``torch.compile`` with
    dynamic shapes would turn into a guard (and a recompilation whenever a batch crossed the compared limit)."""

    def _refuse(self, *args):
        raise AssertionError("the row count was compared")

    __le__ = __lt__ = __ge__ = __gt__ = __mul__ = __rmul__ = _refuse


def test_cuda_training_decides_without_comparing_the_row_count():
    cuda = torch.device("cuda")
    for n, d, k in ((4, 4096, 4096), (16, 1024, 1024), (2, 384, 1536)):
        assert _path(_RowsThatRefuseComparison(), d, k, n, device=cuda, weight_grad=True) == "materialized"
        assert _path(_RowsThatRefuseComparison(), d, k, n, device=cuda, weight_grad=True, factor_rank=2) \
            == "materialized"
    with pytest.raises(AssertionError, match="compared"):  # the probe does catch a comparison
        _path(_RowsThatRefuseComparison(), 4096, 4096, 4, device=cuda)


def test_low_rank_factors_never_take_the_paths_that_read_full_factors(monkeypatch):
    monkeypatch.setattr(native, "native_kernels_enabled", lambda: True)
    for rows in (1, 2, 16, 100, 200, 4096):
        for d, k in ((384, 1536), (4096, 4096), (1024, 1024)):
            assert _path(rows, d, k, 4, factor_rank=2) in ("structured", "materialized")


def test_settings_change_the_choice_and_reject_bad_values():
    eager = dataclasses.replace(DEFAULT_PATH_SETTINGS, structured_row_limit_training=0)
    assert _path(1, 1024, 1024, 4, weight_grad=True, settings=eager) == "materialized"
    layer = PHMLinear(1024, 1024, 4)
    layer.path_settings = eager  # one layer only
    assert layer.choose_mode(1) == "materialized" and PHMLinear(1024, 1024, 4).choose_mode(1) == "structured"
    assert takes_blocked(384, 384, 4, dataclasses.replace(DEFAULT_PATH_SETTINGS, blocked_min_columns=97)) is False
    assert structured_weight_first(1, 4, 64, 64, dataclasses.replace(DEFAULT_PATH_SETTINGS, weight_first_min_weight=0))
    with pytest.raises(ValueError, match="PathSettings.small_weight must be a non-negative integer"):
        PathSettings(small_weight=-1)
    with pytest.raises(ValueError, match="onednn_min_work"):
        PathSettings(onednn_min_work=1.5)


def test_formation_forms_h_in_a_buffer_only_where_nothing_keeps_it():
    cpu = torch.device("cpu")
    assert formation(1536, 384, 4, torch.float32, torch.float32, cpu) == "graph"  # grad mode on: autograd saves H
    with torch.no_grad():
        assert formation(1536, 384, 4, torch.float32, torch.float32, cpu) == "blocked"
        assert formation(1536, 384, 4, torch.float64, torch.float32, cpu) == "buffer"  # F.linear casts
        assert formation(4096, 4096, 4, torch.float32, torch.float32, cpu) == "buffer"  # large: H whole
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert formation(1536, 384, 4, torch.float32, torch.float32, cpu) == "buffer"
