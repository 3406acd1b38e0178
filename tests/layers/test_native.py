"""The compiled streamed PHM kernel (hyperplex.layers.native): equal to the Kronecker reference on every shape,
independent of the thread count, inference only, and taken by ``auto`` exactly where it applies.

The kernel is built once per machine (about a minute, then cached); without a C++ compiler or ninja the module
skips, except for the test that the build error names what is missing."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import SUBPROCESS_ENV, without_compiler
from hypothesis import given, settings
from hypothesis import strategies as st

from hyperplex.layers import PHMLinear, native
from hyperplex.layers.functional import phm_linear_reference, phm_linear_structured


@pytest.fixture(scope="module")
def kernel():
    try:
        native.enable_native_kernels()
    except RuntimeError as err:
        pytest.skip(f"native kernel not buildable here: {err}")
    except Exception as err:  # a compiler that is present but fails: report it as a skip, with the cause
        pytest.skip(f"native kernel build failed: {type(err).__name__}: {err}")
    native.enable_native_kernels(False)  # each test turns `auto`'s use on itself
    return native


@pytest.fixture
def enabled(kernel):
    kernel.enable_native_kernels()
    yield kernel
    kernel.enable_native_kernels(False)


def _case(n, d_n, k_n, rows, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    rule = torch.randn(n, n, n, generator=g)
    weight = torch.randn(n, k_n, d_n, generator=g)
    x = torch.randn(rows, n * d_n, generator=g)
    b = torch.randn(n * k_n, generator=g) if bias else None
    return x, rule, weight, b


def _reference(x, rule, weight, bias):
    return phm_linear_reference(x.double(), rule.double(), weight.double(), None if bias is None else bias.double())


def _assert_close_to_reference(y, ref, magnitude=None):
    assert y.dtype == torch.float32 and y.shape == ref.shape
    if magnitude is None:  # float32 sums of d terms against a float64 reference: relative to the output's scale
        scale = ref.abs().max().item()
        assert (y.double() - ref).abs().max().item() <= 2e-6 * scale * max(1.0, ref.shape[-1] ** 0.5 / 8)
    else:  # each output against the size of the terms it sums (cancellation leaves a small output, not a small error)
        bound = 16 * 2.0 ** -24 * magnitude
        assert bool(((y.double() - ref).abs() <= bound).all()), ((y.double() - ref).abs() / magnitude).max().item()


def _magnitude(x, rule, weight, bias):
    """``Σ |Aᵢ[a, c]| |Sᵢ[q, j]| |x_c[j]| + |b|`` per output: the size of the terms a float32 sum of the product adds
    up."""
    return _reference(x.abs(), rule.abs(), weight.abs(), None if bias is None else bias.abs())


# ---------------------------------------------------------------- values
@pytest.mark.parametrize("n,d_n,k_n,rows", [
    (4, 16, 8, 1),       # vector loop only, one tile
    (4, 1024, 1024, 1),  # d = k = 4096 at one row: the decoding shape the kernel is for
    (16, 256, 256, 2),   # many factors, 32 pre-mixed rows: the transposed 6 × 16 tile
    (16, 24, 13, 1),     # 16 pre-mixed rows, a tail of features
    (8, 6, 7, 1),        # the rule mixing four j at a time: d/n % 4 = 2, so the groups end at each factor
    (16, 5, 3, 2),       # the same with two rows, and d/n shorter than two groups
    (8, 17, 9, 3),       # 24 pre-mixed rows (the transposed 12 × 8 tile), d/n % 8 and k/n % 12 tails
    (2, 96, 50, 5),      # 10 pre-mixed rows: the 6 × 2 tile along j, an odd tile of features
    (3, 11, 4, 7),       # n not a power of two, rows shorter than one vector
    (1, 40, 13, 1),      # n = 1: one factor, one pre-mixed row (the 12 × 1 tile)
    (4, 96, 384, 30),    # a MiniLM shape with a sentence's worth of rows
])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_kronecker_reference(kernel, n, d_n, k_n, rows, bias):
    x, rule, weight, b = _case(n, d_n, k_n, rows, bias)
    with torch.no_grad():
        y = kernel.phm_linear_streamed(x, rule, weight, b)
    _assert_close_to_reference(y, _reference(x, rule, weight, b))


def test_leading_dimensions_and_untouched_inputs(kernel):
    x, rule, weight, b = _case(4, 24, 12, 6)
    x = x.reshape(2, 3, 96)
    before = [t.clone() for t in (x, rule, weight, b)]
    with torch.inference_mode():
        y = kernel.phm_linear_streamed(x, rule, weight, b)
    assert y.shape == (2, 3, 48)
    _assert_close_to_reference(y.reshape(6, 48), _reference(x.reshape(6, 96), rule, weight, b))
    for t, t0 in zip((x, rule, weight, b), before):  # the kernel accumulates into a fresh output, never the bias
        assert torch.equal(t, t0)


def test_empty_and_non_contiguous_inputs(kernel):
    x, rule, weight, b = _case(4, 8, 8, 5)
    with torch.no_grad():
        assert kernel.phm_linear_streamed(x[:0], rule, weight, b).shape == (0, 32)
        assert kernel.phm_linear_streamed(x[:0].reshape(2, 0, 32), rule, weight, b).shape == (2, 0, 32)
        xt = x.T.contiguous().T  # same values, column-major storage
        assert not xt.is_contiguous()
        _assert_close_to_reference(kernel.phm_linear_streamed(xt, rule, weight.transpose(1, 2).contiguous()
                                                              .transpose(1, 2), b), _reference(x, rule, weight, b))


@pytest.mark.parametrize("n,d_n,k_n,rows,many_threads", [
    (8, 512, 512, 2, 2),  # enough feature tiles to split across threads
    (16, 129, 40, 1, 3),  # three threads split a factor's j in the rule mixing (its groups of four j)
])
def test_result_does_not_depend_on_thread_count(kernel, n, d_n, k_n, rows, many_threads):
    x, rule, weight, b = _case(n, d_n, k_n, rows)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with torch.no_grad():
            one = kernel.phm_linear_streamed(x, rule, weight, b)
        torch.set_num_threads(max(many_threads, threads))
        with torch.no_grad():
            many = kernel.phm_linear_streamed(x, rule, weight, b)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)  # each output is summed by one thread in a fixed order


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 6), d_n=st.integers(1, 40), k_n=st.integers(1, 20), rows=st.integers(1, 9),
       bias=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_matches_reference_on_random_shapes(kernel, n, d_n, k_n, rows, bias, seed):
    x, rule, weight, b = _case(n, d_n, k_n, rows, bias, seed)
    with torch.no_grad():
        y = kernel.phm_linear_streamed(x, rule, weight, b)
    # n·d float32 products per output, summed in some order: within 16 units of rounding of their total size
    # (typically a few; a plain bound on the output's own size fails where the terms cancel, as hypothesis found)
    _assert_close_to_reference(y, _reference(x, rule, weight, b), _magnitude(x, rule, weight, b))


# ---------------------------------------------------------------- refusals
def test_refuses_what_it_cannot_compute(kernel):
    x, rule, weight, b = _case(4, 8, 8, 2)
    with pytest.raises(RuntimeError, match="no backward pass"):
        kernel.phm_linear_streamed(x.requires_grad_(), rule, weight, b)
    with torch.no_grad(), pytest.raises(RuntimeError, match="float32 only"):
        kernel.phm_linear_streamed(x.double(), rule.double(), weight.double(), b.double())
    layer = PHMLinear(32, 32, 4, forward_mode="streamed")  # asked for explicitly, in training
    with pytest.raises(RuntimeError, match="streamed PHM kernel cannot run here: it has no backward pass"):
        layer(torch.randn(2, 32))


def _without_compiler(monkeypatch, enabled):
    """No kernel built or cached yet, no C++ compiler or ninja to build it, and ``_enabled`` as given."""
    without_compiler(monkeypatch)
    monkeypatch.setattr(native, "_enabled", enabled)


def test_build_error_names_what_is_missing(monkeypatch):
    _without_compiler(monkeypatch, enabled=False)
    with pytest.raises(RuntimeError, match=r"needs c\+\+ and ninja to compile phm_stream\.cpp.*hyperplex\[native\]"):
        native.enable_native_kernels()
    assert not native.native_kernels_enabled()  # nothing changed


def test_self_check_passes_on_this_build_and_catches_a_wrong_one(kernel, monkeypatch):
    results = native.self_check()
    assert [(r["n"], r["d"], r["k"], r["rows"]) for r in results] == list(native.SELF_CHECK_SHAPES)
    assert all(0 <= r["error"] <= native.SELF_CHECK_TOLERANCE for r in results)

    class Wrong:  # a build that drops one term of the sum, e.g. a miscompiled tail
        __file__ = "wrong.so"

        @staticmethod
        def phm_stream(x, rule, weight, bias):
            return phm_linear_reference(x, rule[1:], weight[1:], bias)

    monkeypatch.setattr(native, "_module", Wrong)
    with pytest.raises(RuntimeError, match=r"kernel \(wrong\.so\) is wrong at n=2, 96 -> 100, 5 rows: largest "
                                           r"difference .* of the largest output \(tolerance 1e-05\)"):
        native.self_check()


def test_a_cached_build_loads_without_a_compiler(kernel):
    """What a serving image made by `hyperplex native` relies on: a new process with no C++ compiler loads the
    library built earlier for this CPU, source and torch, and it computes the same product."""
    code = ("import torch; from hyperplex.layers import native; print(native.build_native_kernels()); "
            "g = torch.Generator().manual_seed(0); x = torch.randn(3, 64, generator=g); "
            "r = torch.randn(4, 4, 4, generator=g); w = torch.randn(4, 8, 16, generator=g); "
            "print(native.phm_linear_streamed(x, r, w).double().sum().item())")
    env = {**os.environ, "CXX": "/nonexistent/c++"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    path, total = out.stdout.split()
    assert path == native.build_native_kernels()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=g)
    rule, weight = torch.randn(4, 4, 4, generator=g), torch.randn(4, 8, 16, generator=g)
    assert float(total) == pytest.approx(_reference(x, rule, weight, None).sum().item(), rel=1e-5, abs=1e-4)


def test_a_broken_or_foreign_cache_is_not_loaded(monkeypatch, tmp_path):
    """A cached library that does not import (a build cut short) is compiled again — here, with no compiler, that
    is the usual error naming what is missing — and a change of the source or of torch changes the name, so
    a library built from other code is never picked up."""
    name = native._library_name()
    real_load_cached = native._load_cached
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    (tmp_path / name).mkdir()
    (tmp_path / name / f"{name}.so").write_bytes(b"not a library")
    assert native._cached_library(name) == tmp_path / name / f"{name}.so"
    with pytest.warns(RuntimeWarning, match="is not the library this package built"):
        assert native._load_cached(name) is None
    assert native._cached_library(name) is None  # removed: the next build links it again
    (tmp_path / name / f"{name}.so").write_bytes(b"not a library")
    without_compiler(monkeypatch)
    monkeypatch.setattr(native, "_load_cached", real_load_cached)  # this test's point: the broken file is tried
    with pytest.raises(RuntimeError, match=r"needs c\+\+ and ninja to compile"), pytest.warns(RuntimeWarning):
        native.build_native_kernels()
    (tmp_path / name / "lock").touch()  # cpp_extension is building it right now
    assert native._cached_library(name) is None

    edited = tmp_path / "phm_stream.cpp"
    edited.write_bytes(native.SOURCE.read_bytes() + b"\n// edited\n")
    monkeypatch.setattr(native, "SOURCE", edited)
    assert native._library_name() != name
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", torch.__version__ + ".other")
    assert native._library_name() != name and native._library_name().startswith(name[:-12])


# ---------------------------------------------------------------- PHMLinear's `auto`
def _qualifying_layer():
    return PHMLinear(1024, 1024, 4).eval()  # 2^18 numbers in its factors: the least that `auto` streams


@pytest.mark.parametrize("value", ["1", "true", " ON "])
def test_environment_variable_turns_the_kernel_on(kernel, monkeypatch, value):
    monkeypatch.setattr(native, "_enabled", None)  # no call of enable_native_kernels: the variable decides
    monkeypatch.setenv(native.ENV_VAR, value)
    with torch.no_grad():
        assert _qualifying_layer().choose_mode(1) == "streamed"
    assert native.native_kernels_enabled()


@pytest.mark.parametrize("value", [None, "", "auto", "0", "off"])
def test_environment_variable_unset_or_off_leaves_it_off_where_not_installed(kernel_cache, monkeypatch, value):
    if value is None:
        monkeypatch.delenv(native.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(native.ENV_VAR, value)
    with torch.no_grad():
        assert _qualifying_layer().choose_mode(1) == "structured"


def test_a_call_overrides_the_environment_variable(kernel, monkeypatch):
    monkeypatch.setattr(native, "_enabled", None)
    monkeypatch.setenv(native.ENV_VAR, "1")
    native.enable_native_kernels(False)  # monkeypatch restores _enabled afterwards
    with torch.no_grad():
        assert _qualifying_layer().choose_mode(1) == "structured"


def test_environment_variable_with_an_unknown_value_is_refused(monkeypatch):
    monkeypatch.setattr(native, "_enabled", None)
    monkeypatch.setenv(native.ENV_VAR, "maybe")
    with pytest.raises(ValueError, match=r"HYPERPLEX_NATIVE='maybe': "
                                         r"expected one of 1, true, .*, off, auto \(or empty\)"):
        with torch.no_grad():
            _qualifying_layer()(torch.randn(1, 1024))


def test_environment_variable_with_no_compiler_fails_where_the_kernel_is_needed(monkeypatch):
    _without_compiler(monkeypatch, enabled=None)
    monkeypatch.setenv(native.ENV_VAR, "1")
    small = PHMLinear(64, 64, 4).eval()  # too small for the kernel: runs as before, nothing is built
    with torch.no_grad():
        assert small(torch.randn(1, 64)).shape == (1, 64)
        with pytest.raises(RuntimeError, match=r"HYPERPLEX_NATIVE=1 asks for hyperplex's native PHM kernel, which "
                                               r"could not be built: .*needs c\+\+ and ninja"):
            _qualifying_layer()(torch.randn(1, 1024))
    assert native._enabled is None  # still undecided: nothing was turned on


def test_a_failed_build_under_the_environment_variable_is_not_retried_on_every_call(monkeypatch):
    _without_compiler(monkeypatch, enabled=None)
    monkeypatch.setenv(native.ENV_VAR, "1")
    builds = []
    real_build = native._build
    monkeypatch.setattr(native, "_build", lambda *a: builds.append(1) or real_build(*a))
    layer = _qualifying_layer()
    with torch.no_grad():
        for _ in range(3):
            with pytest.raises(RuntimeError, match=r"HYPERPLEX_NATIVE=1 asks .* could not be built: .*needs c\+\+"):
                layer(torch.randn(1, 1024))
    assert len(builds) == 1  # one compile attempt, then the same error
    with pytest.raises(RuntimeError, match=r"needs c\+\+ and ninja"):
        native.enable_native_kernels()  # an explicit call does try again
    assert len(builds) == 2
    monkeypatch.setenv(native.ENV_VAR, "0")
    with torch.no_grad():
        assert layer.choose_mode(1) == "structured"  # the variable turned off: PyTorch's path, no error


def test_auto_takes_the_kernel_only_where_it_applies(enabled):
    big = PHMLinear(1024, 1024, 4)  # 2^18 numbers in its factors: the least that qualifies
    small = PHMLinear(1024, 1024, 8)  # half of that
    narrowing = PHMLinear(4096, 1024, 4)  # k < d: streamed too (it won at every such shape that qualifies)
    narrow_small = PHMLinear(3072, 768, 16)  # 147,456 factor numbers: under the bound
    limit = native.STREAMED_ROW_LIMIT
    with torch.no_grad():
        assert big.choose_mode(1) == big.choose_mode(limit) == "streamed"
        assert big.choose_mode(limit + 1) != "streamed"
        assert big.choose_mode(1, input_grad=True) == "structured"  # the input needs a gradient: PyTorch's path
        assert small.choose_mode(1) != "streamed" and narrow_small.choose_mode(1) != "streamed"
        assert narrowing.choose_mode(1) == narrowing.choose_mode(limit) == "streamed"
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert big.choose_mode(1) != "streamed"
    assert big.choose_mode(1) == "structured"  # training: weight gradients needed
    big.cache_dense = True
    with torch.no_grad():
        assert big.choose_mode(1) != "streamed"  # the user chose the dense cache
    big.cache_dense = False
    with torch.no_grad():
        assert big.double().choose_mode(1) != "streamed"
    native.enable_native_kernels(False)
    with torch.no_grad():
        assert PHMLinear(1024, 1024, 4).choose_mode(1) == "structured"


@pytest.mark.parametrize("d,k,n", [(1024, 2048, 8), (2048, 512, 4)])
def test_auto_output_equals_the_structured_path(enabled, d, k, n):
    torch.manual_seed(0)
    layer = PHMLinear(d, k, n).eval()
    x = torch.randn(3, d)
    with torch.inference_mode():
        assert layer.choose_mode(3) == "streamed"
        y = layer(x)
    ref = phm_linear_structured(x.double(), layer.phm_rule.double(), layer.phm_weight.double(), layer.bias.double())
    _assert_close_to_reference(y, ref.detach())
    y_train = layer(x)  # with gradients: a differentiable path, same values
    assert y_train.requires_grad
    torch.testing.assert_close(y_train.detach(), y, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- installed by `hyperplex native`
def _marker(folder):
    import json

    return json.loads((folder / native.INSTALL_MARKER).read_text())


def test_an_installed_build_is_taken_where_the_variable_is_unset(kernel_cache, monkeypatch):
    import hashlib

    layer = _qualifying_layer()
    with torch.no_grad():
        assert layer.choose_mode(1) == "structured"  # nothing installed in this cache
    assert native.installed_native_kernel() is None
    installed = native.install_native_kernels()
    library = kernel_cache / f"{kernel_cache.name}.so"
    assert installed["library"] == str(library) and installed["marker"] == str(kernel_cache / native.INSTALL_MARKER)
    record = _marker(kernel_cache)
    assert record["sha256"] == hashlib.sha256(library.read_bytes()).hexdigest()
    assert record["self_check"] == installed["self_check"]
    assert len(record["self_check"]) == len(native.SELF_CHECK_SHAPES)
    assert all(r["error"] <= native.SELF_CHECK_TOLERANCE for r in record["self_check"])
    assert native.installed_native_kernel() == library
    with torch.no_grad():
        assert layer.choose_mode(1) == "streamed"  # HYPERPLEX_NATIVE unset: the installed build
        assert layer.choose_mode(native.STREAMED_ROW_LIMIT + 1) != "streamed"  # only where it applies
        x = torch.randn(2, 1024)
        _assert_close_to_reference(layer(x), phm_linear_reference(x.double(), layer.phm_rule.double(),
                                                                  layer.phm_weight.double(), layer.bias.double()))
        monkeypatch.setenv(native.ENV_VAR, "0")
        assert layer.choose_mode(1) == "structured"  # off, installed or not
        monkeypatch.delenv(native.ENV_VAR)
        native.enable_native_kernels(False)  # an explicit call overrides the install too
        assert layer.choose_mode(1) == "structured"
        monkeypatch.setattr(native, "_enabled", None)
        assert layer.choose_mode(1) == "streamed"
        assert native.uninstall_native_kernels() == installed["marker"]
        assert layer.choose_mode(1) == "structured"  # from this process's next call
    assert native.uninstall_native_kernels() is None and library.is_file()  # the build stays cached


def test_an_installed_build_that_changed_since_its_check_is_not_used(kernel_cache):
    native.install_native_kernels()
    library = kernel_cache / f"{kernel_cache.name}.so"
    changed = library.with_name("changed.so")  # another file than the one the self-check ran, put in its place by
    changed.write_bytes(library.read_bytes() + b"\0")  # a rename: this process has the old one mapped, and
    os.replace(changed, library)  # writing over a mapped library in place crashes the process that maps it
    layer = _qualifying_layer()
    with pytest.warns(RuntimeWarning, match=r"is not the build that `hyperplex native` checked .* run `hyperplex "
                                            r"native` again"):
        with torch.no_grad():
            assert layer.choose_mode(1) == "structured"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # looked for once per process: no second warning
        with torch.no_grad():
            assert layer.choose_mode(1) == "structured"


def test_a_build_that_fails_its_self_check_is_not_installed(kernel_cache, monkeypatch):
    native.install_native_kernels()
    assert (kernel_cache / native.INSTALL_MARKER).is_file()

    def wrong(tolerance=native.SELF_CHECK_TOLERANCE):
        raise RuntimeError("the native PHM kernel (x.so) is wrong at n=2")

    monkeypatch.setattr(native, "self_check", wrong)
    with pytest.raises(RuntimeError, match="is wrong at n=2"):
        native.install_native_kernels()
    assert not (kernel_cache / native.INSTALL_MARKER).exists()  # the earlier mark went with it
    assert native.installed_native_kernel() is None


def test_a_new_process_without_a_compiler_takes_the_installed_kernel(kernel_cache):
    """The serving story: `hyperplex native` ran once (in an image, say); a process started later, with no C++
    compiler and HYPERPLEX_NATIVE unset, streams the qualifying layers; HYPERPLEX_NATIVE=0 keeps it off."""
    native.install_native_kernels()
    code = ("import torch; from hyperplex.layers import PHMLinear, native\n"
            "layer = PHMLinear(1024, 1024, 4).eval()\n"
            "with torch.no_grad(): print(layer.choose_mode(1), native._module is not None)")
    env = {**SUBPROCESS_ENV, "CXX": "/nonexistent/c++", "TORCH_EXTENSIONS_DIR": str(kernel_cache.parent)}
    env.pop(native.ENV_VAR, None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["streamed", "True"]
    out = subprocess.run([sys.executable, "-c", code], env={**env, native.ENV_VAR: "0"}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["structured", "False"]  # off: the library is not even loaded


def test_looking_for_an_installed_build_creates_nothing_and_follows_torchs_folder_rule(monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    name = native._library_name()
    root = tmp_path / "extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    assert native.installed_native_kernel() is None and native._cached_library(name) is None
    assert not root.exists()  # torch's own helper would have made root/name
    assert native._build_folder(name) == Path(cpp_extension._get_build_directory(name, verbose=False))
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    folder = native._build_folder(name)
    existed = folder.exists()
    try:
        assert folder == Path(cpp_extension._get_build_directory(name, verbose=False))
    finally:
        if not existed:
            folder.rmdir()  # what torch's helper just made


# ---------------------------------------------------------------- a damaged cache is never opened
def _no_dlopen(monkeypatch):
    import importlib.util

    def refuse(*args, **kwargs):
        raise AssertionError("a cached library was opened before its checksum was checked")

    monkeypatch.setattr(importlib.util, "spec_from_file_location", refuse)


def test_a_truncated_installed_library_is_not_opened_and_is_rebuilt(kernel_cache, monkeypatch):
    """Opening a truncated shared library kills the process with SIGBUS: the SHA-256 the install mark records is
    checked first. `hyperplex native` (the remedy) then builds the library again instead of dying the same way."""
    native.install_native_kernels()
    module = native._module  # the good build, loaded: what the stand-in compiler below returns
    library = kernel_cache / f"{kernel_cache.name}.so"
    good = library.read_bytes()
    truncated = library.with_name("cut.so")
    truncated.write_bytes(good[: len(good) // 2])
    os.replace(truncated, library)  # a rename: this process keeps its mapping of the good file
    for attr in ("_module", "_installed", "_enabled"):
        monkeypatch.setattr(native, attr, None)
    with monkeypatch.context() as m:
        _no_dlopen(m)
        with pytest.warns(RuntimeWarning, match="is not the library this package built"):
            assert native._load_cached(kernel_cache.name) is None
    assert not library.exists() and not (kernel_cache / native.INSTALL_MARKER).exists()
    assert native.installed_native_kernel() is None  # HYPERPLEX_NATIVE unset: PyTorch's paths, no crash

    library.write_bytes(good[: len(good) // 2])  # damaged again; now `hyperplex native` runs over it
    built = []

    def compile_again(name, verbose):  # stands in for the compiler: links the good library again
        built.append(name)
        library.write_bytes(good)
        return module

    monkeypatch.setattr(native, "_compile", compile_again)
    monkeypatch.setattr(module, "__file__", str(library), raising=False)
    with pytest.warns(RuntimeWarning, match="is not the library this package built"):
        result = native.install_native_kernels()
    assert built == [kernel_cache.name] and library.read_bytes() == good
    assert native.installed_native_kernel() == library and result["self_check"]
    assert native._recorded_checksums(kernel_cache) == {native._sha256(library)}


def test_an_unknown_environment_value_is_refused_before_anything_is_built(monkeypatch, tmp_path, capsys):
    from hyperplex import cli

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv(native.ENV_VAR, "banana")
    monkeypatch.setattr(native, "_build",
                        lambda verbose=False: pytest.fail("built although HYPERPLEX_NATIVE is invalid"))
    assert cli.main(["native"]) == 1
    assert "HYPERPLEX_NATIVE='banana': expected one of" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing built, nothing installed
