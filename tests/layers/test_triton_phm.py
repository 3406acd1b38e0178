"""The fused few-row Triton kernel (hyperplex.layers.triton_phm) against the float64 Kronecker reference.

Where CUDA is present the kernel runs on the GPU; elsewhere on CPU tensors under Triton's interpreter, which this
module switches on itself (``TRITON_INTERPRET=1`` is set here, before the kernel is first defined: the kernels are
built at first use, so setting it at import of this module is early enough, with no subprocess). The module skips
cleanly without Triton (``pip install 'hyperplex[triton]'``). Every output (and, where the reduction is shared out,
every float32 partial) is poisoned with NaN first, so an element the kernel never wrote fails the check.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from hyperplex.layers import (
    PHMLinear,  # noqa: E402
    triton_phm,  # noqa: E402
)
from hyperplex.layers.functional import phm_linear_reference  # noqa: E402
from hyperplex.layers.triton_phm import plan, takes_triton, triton_phm_linear, triton_reason  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not triton_phm.interpreting():
    pytest.skip("no CUDA and TRITON_INTERPRET is set to something other than 1", allow_module_level=True)


def _interpreter_fault() -> str | None:
    """Why this Triton's interpreter cannot run the kernel at all, or ``None``. Older interpreters (Triton 3.6)
    turn a loop bound that is a tensor into an int with ``int(array)``, which NumPy 2.4 refuses for an array of
    shape (1,): every call fails there, whatever the kernel computes. Only that NumPy error is taken as the
    environment's; anything else the kernel raises fails the tests below."""
    if DEVICE != "cpu":
        return None
    import numpy
    import triton

    try:
        triton_phm_linear(torch.ones(1, 4), torch.ones(2, 2, 2), torch.ones(2, 2, 2))
    except Exception as err:  # InterpreterError wraps the NumPy TypeError
        if "only 0-dimensional arrays can be converted to Python scalars" in str(err):
            return (f"Triton {triton.__version__}'s interpreter cannot run kernels with tensor loop bounds under "
                    f"NumPy {numpy.__version__} (newer Triton can)")
    return None


if (_fault := _interpreter_fault()) is not None:
    pytest.skip(_fault, allow_module_level=True)

#: ‖y − ref‖ / ‖ref‖ bounds. float32: full-precision products (input_precision="ieee") of a few hundred terms,
#: far under 1e-5. bfloat16: the reference is computed from the same bf16-rounded inputs, so what remains is the
#: output's rounding to bf16 (relative 2⁻⁹ per element) and the TF32 mixing on a GPU: under 1e-2.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}

#: (n, d, k): every n the issue names; square, widening, narrowing and non-power-of-two sizes, block widths that are
#: not multiples of the kernel's tiles (33/3 = 11, 136/8 = 17, 80/16 = 5), and blocks that are (256/2 = 128 and
#: 256/4 = 64: the kernel's unmasked path along j).
SHAPES = [(2, 64, 64), (2, 30, 94), (2, 256, 64), (3, 33, 12), (3, 96, 48), (4, 100, 96), (4, 64, 256), (4, 256, 96),
          (8, 136, 72), (8, 64, 64), (16, 80, 48), (16, 256, 128)]


def _reference(x, rule, weight, bias):
    return phm_linear_reference(x.double(), rule.double(), weight.double(), None if bias is None else bias.double())


def _inputs(n, d, k, rows, dtype, with_bias, gen):
    x = torch.randn(rows, d, generator=gen).to(dtype)
    rule = torch.randn(n, n, n, generator=gen).to(dtype)
    weight = (torch.randn(n, k // n, d // n, generator=gen) / d ** 0.5).to(dtype)
    bias = torch.randn(k, generator=gen).to(dtype) if with_bias else None
    move = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    return move(x), move(rule), move(weight), move(bias)


def _relative_error(got, want):
    assert torch.isfinite(got).all(), "the kernel left unwritten (NaN-poisoned) or non-finite outputs"
    return ((got.double().cpu() - want.cpu()).norm() / want.cpu().norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("rows", [1, 64])
@pytest.mark.parametrize("n,d,k", SHAPES)
def test_matches_the_float64_reference(n, d, k, rows, with_bias, dtype):
    gen = torch.Generator().manual_seed(n * 1_000_003 + d * 1009 + k * 31 + rows * 7 + 2 * with_bias
                                        + (dtype == torch.bfloat16))
    x, rule, weight, bias = _inputs(n, d, k, rows, dtype, with_bias, gen)
    want = _reference(x, rule, weight, bias)
    out = torch.full((rows, k), float("nan"), dtype=dtype, device=DEVICE)
    p = plan(rows, n, k // n, d // n, dtype, 8)
    workspace = torch.full((p.splits, rows, k), float("nan"), device=DEVICE)
    got = triton_phm_linear(x, rule, weight, bias, out=out, programs=8, _workspace=workspace)
    assert got.data_ptr() == out.data_ptr() and got.dtype == dtype and got.shape == (rows, k)
    if p.splits > 1:  # every partial was written: none left at NaN
        assert torch.isfinite(workspace).all()
    assert _relative_error(got, want) < TOLERANCE[dtype]


@pytest.mark.parametrize("programs", [1, 3, 64, 10_000])
def test_every_split_of_the_reduction_gives_the_same_function(programs):
    """Sharing the reduction over terms and chunks (few programs up to as many as the sizes allow) changes only
    the order of the sums."""
    gen = torch.Generator().manual_seed(programs)
    x, rule, weight, bias = _inputs(8, 1000, 64, 2, torch.float32, True, gen)  # d/n = 125: a ragged last chunk
    splits = plan(2, 8, 8, 125, torch.float32, programs).splits
    assert (splits > 1) == (programs > 1)  # 3: three groups of terms (3, 3, 2); 64 and up: terms and chunks
    got = triton_phm_linear(x, rule, weight, bias, programs=programs)
    assert _relative_error(got, _reference(x, rule, weight, bias)) < TOLERANCE[torch.float32]


def test_leading_dimensions_and_a_strided_input():
    gen = torch.Generator().manual_seed(5)
    _, rule, weight, bias = _inputs(4, 64, 32, 1, torch.float32, True, gen)
    x = torch.randn(2, 3, 128, generator=gen).to(DEVICE)[..., ::2]  # (2, 3, 64), last-dim stride 2
    got = triton_phm_linear(x, rule, weight, bias)
    assert got.shape == (2, 3, 32)
    assert _relative_error(got, _reference(x, rule, weight, bias)) < TOLERANCE[torch.float32]
    rows = torch.randn(5, 100, generator=gen).to(DEVICE)[:, 8:72]  # rows 100 apart: read in place, not copied
    got = triton_phm_linear(rows, rule, weight, bias)
    assert _relative_error(got, _reference(rows, rule, weight, bias)) < TOLERANCE[torch.float32]


@pytest.mark.parametrize("rows,n,k_n,d_n", [(1, 2, 2048, 2048), (1, 16, 256, 256), (64, 16, 256, 256),
                                             (64, 2, 2048, 2048), (8, 3, 11, 33), (7, 8, 9, 17)])
@pytest.mark.parametrize("programs", [1, 528, 10 ** 6])
def test_plan_covers_every_term_and_column_exactly_once(rows, n, k_n, d_n, programs):
    p = plan(rows, n, k_n, d_n, torch.bfloat16, programs)
    assert p.block_m >= max(16, p.block_rows * n) and p.block_m & (p.block_m - 1) == 0
    terms = [i for g in range(p.i_groups) for i in range(g * p.i_per, min(n, (g + 1) * p.i_per))]
    columns = [j for c in range(p.j_chunks) for j in range(c * p.j_chunk, min(d_n, (c + 1) * p.j_chunk))]
    assert sorted(terms) == list(range(n)) and sorted(columns) == list(range(d_n))
    assert p.grid == (-(-k_n // p.block_q), -(-rows // p.block_rows), p.splits)
    assert p.j_chunk % p.block_j == 0 and p.num_warps in (4, 8)
    partials, factors = p.splits * rows * n * k_n * 4, n * k_n * d_n * 2
    assert p.splits == 1 or 4 * partials <= factors  # the partials stay under a quarter of the factors
    assert p.splits <= max(1, programs)


def test_forward_only_refuses_a_gradient():
    gen = torch.Generator().manual_seed(1)
    x, rule, weight, bias = _inputs(4, 32, 32, 2, torch.float32, True, gen)
    weight.requires_grad_(True)
    with pytest.raises(ValueError, match="triton_phm_linear cannot run here: it is forward-only"):
        triton_phm_linear(x, rule, weight, bias)
    with torch.no_grad():
        got = triton_phm_linear(x, rule, weight, bias)
    assert _relative_error(got, _reference(x, rule, weight.detach(), bias)) < TOLERANCE[torch.float32]


def test_bad_input_is_refused_by_name():
    gen = torch.Generator().manual_seed(2)
    x, rule, weight, bias = _inputs(4, 32, 32, 2, torch.float32, True, gen)
    with pytest.raises(ValueError, match="share one of"):
        triton_phm_linear(x.double(), rule, weight, bias)
    with pytest.raises(ValueError, match="last dimension 32"):
        triton_phm_linear(x[:, :16], rule, weight, bias)
    with pytest.raises(ValueError, match=r"bias must have shape \(32,\)"):
        triton_phm_linear(x, rule, weight, bias[:8])
    with pytest.raises(ValueError, match="out must be a contiguous"):
        triton_phm_linear(x, rule, weight, bias, out=torch.empty(3, 32, device=DEVICE))
    assert "different devices" in triton_reason(x, rule.to("meta"), weight, bias)


def test_auto_takes_it_only_for_cuda_inference_in_half_precision_at_few_rows(monkeypatch):
    """``takes_triton`` is the one decision: never a CPU input (even under the interpreter), never with a gradient
    to record, never float32, never past ``rows·n`` = TRITON_MAX_ROWS_N, never outside ``auto``, never after the
    kernel failed here."""
    layer = PHMLinear(32, 32, 4).to(DEVICE, torch.bfloat16)
    most = triton_phm.TRITON_MAX_ROWS_N // 4
    one = torch.randn(1, 32, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        assert takes_triton(one, layer) == (DEVICE == "cuda")
        assert takes_triton(torch.randn(most, 32, device=DEVICE, dtype=torch.bfloat16), layer) == (DEVICE == "cuda")
        assert not takes_triton(torch.randn(most + 1, 32, device=DEVICE, dtype=torch.bfloat16), layer)
        assert not takes_triton(one.float(), layer.float())  # float32 stays on PyTorch's paths
        layer.to(torch.bfloat16)
        layer.forward_mode = "structured"
        assert not takes_triton(one, layer)
        layer.forward_mode = "auto"
        monkeypatch.setattr(triton_phm, "_FAILED", "CompilationError: a card it was not built for")
        assert not takes_triton(one, layer)
        monkeypatch.setattr(triton_phm, "_FAILED", None)
    assert not takes_triton(one, layer)  # a weight gradient to record


def test_auto_asks_for_its_reduction_and_never_an_atomic_one_under_deterministic_algorithms(monkeypatch):
    """A layer's ``auto`` forward calls the kernel with :func:`auto_reduction`: AUTO_REDUCTION, but the one-kernel
    reduction (the same function, a fixed order) in place of the atomic one under use_deterministic_algorithms, so
    the layer neither fails there nor turns the kernel off for the process."""
    asked = []
    monkeypatch.setattr(triton_phm, "takes_triton", lambda x, layer: True)
    real = triton_phm.triton_phm_linear

    def spy(*args, reduction, **kwargs):
        asked.append(reduction)
        return real(*args, reduction=reduction, **kwargs)

    monkeypatch.setattr(triton_phm, "triton_phm_linear", spy)
    layer = PHMLinear(64, 256, 4).to(DEVICE)
    x = torch.randn(1, 64, device=DEVICE)
    with torch.no_grad():
        want = _reference(x, layer.phm_rule, layer.phm_weight, layer.bias)
        for auto in ("one-kernel", "atomic"):
            monkeypatch.setattr(triton_phm, "AUTO_REDUCTION", auto)
            assert _relative_error(layer(x), want) < TOLERANCE[torch.float32]
            try:
                torch.use_deterministic_algorithms(True)
                assert _relative_error(layer(x), want) < TOLERANCE[torch.float32]
            finally:
                torch.use_deterministic_algorithms(False)
    assert asked == ["one-kernel", "one-kernel", "atomic", "one-kernel"]
    assert triton_phm.kernel_failed() is None


@pytest.mark.parametrize("n,d,k,rows,programs", [(8, 1000, 64, 2, 64), (4, 64, 256, 1, 8), (2, 30, 94, 1, 3),
                                                  (16, 256, 128, 1, 10_000), (4, 100, 96, 64, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_one_kernel_reduction_gives_the_two_kernel_bits(n, d, k, rows, programs, dtype):
    """The last program of a tile sums the partials in the order the second kernel does: the same bits, every
    output written, and the arrival counters re-armed, so calls after it (which share the counters) agree too. On a
    GPU the call is repeated, so a program that read a partial before it was written would show as a difference."""
    gen = torch.Generator().manual_seed(n * 131 + d + k + rows)
    x, rule, weight, bias = _inputs(n, d, k, rows, dtype, True, gen)
    p = plan(rows, n, k // n, d // n, dtype, programs)
    two = triton_phm_linear(x, rule, weight, bias, programs=programs, reduction="two-kernel")
    repeats = 50 if DEVICE == "cuda" else 2
    for _ in range(repeats):
        out = torch.full((rows, k), float("nan"), dtype=dtype, device=DEVICE)
        one = triton_phm_linear(x, rule, weight, bias, programs=programs, reduction="one-kernel", out=out)
        assert torch.equal(one, two), "the one-kernel reduction differs from the two-kernel one"
        out = torch.full((rows, k), float("nan"), dtype=dtype, device=DEVICE)
        unrolled = triton_phm_linear(x, rule, weight, bias, programs=programs, out=out, _unroll_tail=True)
        assert torch.equal(unrolled, two), "the unrolled tail differs from the two-kernel reduction"
    if p.splits > 1:
        assert triton_phm._COUNTERS, "the one-kernel reduction ran without arrival counters"
    assert not any(c.any() for c in triton_phm._COUNTERS.values()), "an arrival counter was left armed"
    assert _relative_error(two, _reference(x, rule, weight, bias)) < TOLERANCE[dtype]


def test_an_unknown_reduction_is_refused_by_name():
    gen = torch.Generator().manual_seed(3)
    x, rule, weight, bias = _inputs(4, 32, 32, 2, torch.float32, True, gen)
    with pytest.raises(ValueError, match="reduction must be one of two-kernel, one-kernel, atomic, got 'tree'"):
        triton_phm_linear(x, rule, weight, bias, reduction="tree")


def _close_to(got, want, dtype):
    """The atomic reduction against the split-order one: float32 sums of the same partials in another order, so
    within a few float32 ulps before the cast; after a cast to bf16 an element may round to the neighbouring value."""
    assert torch.isfinite(got).all(), "the kernel left unwritten (NaN-poisoned) or non-finite outputs"
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-3)


@pytest.mark.parametrize("n,d,k,rows,programs", [(8, 1000, 64, 2, 64), (4, 64, 256, 1, 8), (2, 30, 94, 1, 3),
                                                  (16, 256, 128, 1, 10_000), (4, 100, 96, 64, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_atomic_reduction_gives_the_same_function_and_leaves_its_buffers_zero(n, d, k, rows, programs, dtype):
    """Each share adds its partial into the accumulator; the last to arrive reads the sum, writes every output and
    re-zeroes what it read, so the next call (which shares the accumulator and the counters) starts from zero. On a
    GPU the call is repeated, so a sum read before every share had added into it would show as a difference."""
    gen = torch.Generator().manual_seed(n * 17 + d + k + rows)
    x, rule, weight, bias = _inputs(n, d, k, rows, dtype, True, gen)
    p = plan(rows, n, k // n, d // n, dtype, programs)
    two = triton_phm_linear(x, rule, weight, bias, programs=programs, reduction="two-kernel")
    for _ in range(50 if DEVICE == "cuda" else 2):
        out = torch.full((rows, k), float("nan"), dtype=dtype, device=DEVICE)
        _close_to(triton_phm_linear(x, rule, weight, bias, programs=programs, reduction="atomic", out=out), two, dtype)
    if p.splits > 1:
        assert triton_phm._ACCUMULATORS, "the atomic reduction ran without an accumulator"
    assert not any(a.any() for a in triton_phm._ACCUMULATORS.values()), "an accumulator was left holding a sum"
    assert not any(c.any() for c in triton_phm._COUNTERS.values()), "an arrival counter was left armed"
    assert _relative_error(two, _reference(x, rule, weight, bias)) < TOLERANCE[dtype]


def test_a_larger_call_replaces_the_accumulator_and_keeps_the_old_one_alive(monkeypatch):
    """A call with more rows than the stream's accumulator holds gets a larger one; the smaller stays referenced
    (a CUDA graph captured with it goes on adding into it) and zero."""
    monkeypatch.setattr(triton_phm, "_ACCUMULATORS", {})
    monkeypatch.setattr(triton_phm, "_RETIRED", [])
    gen = torch.Generator().manual_seed(5)
    small = _inputs(4, 64, 256, 1, torch.float32, False, gen)
    large = _inputs(4, 1024, 512, 16, torch.float32, False, gen)
    _close_to(triton_phm_linear(*small[:3], programs=8, reduction="atomic"),
              triton_phm_linear(*small[:3], programs=8, reduction="two-kernel"), torch.float32)
    (first,) = triton_phm._ACCUMULATORS.values()
    assert first.numel() == 4096  # the smallest kept: 1 row × 256 outputs, raised to 4,096
    _close_to(triton_phm_linear(*large[:3], programs=8, reduction="atomic"),
              triton_phm_linear(*large[:3], programs=8, reduction="two-kernel"), torch.float32)
    (second,) = triton_phm._ACCUMULATORS.values()
    assert second.numel() == 16 * 512 and len(triton_phm._RETIRED) == 1 and triton_phm._RETIRED[0] is first
    assert not first.any() and not second.any()


def test_atomic_reduction_is_refused_under_deterministic_algorithms():
    """Its summation order varies, so torch.use_deterministic_algorithms(True) refuses it as PyTorch refuses its own
    such operations (a warning with warn_only=True); a call whose reduction is not shared out adds nothing
    atomically and runs."""
    gen = torch.Generator().manual_seed(6)
    x, rule, weight, bias = _inputs(4, 64, 256, 1, torch.float32, True, gen)
    assert plan(1, 4, 64, 16, torch.float32, 8).splits > 1 and plan(1, 4, 64, 16, torch.float32, 1).splits == 1
    want = triton_phm_linear(x, rule, weight, bias, programs=8, reduction="one-kernel")
    try:
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match=r"reduction='atomic'\) adds float32 partial sums in the order"):
            triton_phm_linear(x, rule, weight, bias, programs=8, reduction="atomic")
        assert torch.equal(triton_phm_linear(x, rule, weight, bias, programs=8, reduction="one-kernel"), want)
        triton_phm_linear(x, rule, weight, bias, programs=1, reduction="atomic")  # one share: nothing to refuse
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match="use_deterministic_algorithms"):
            got = triton_phm_linear(x, rule, weight, bias, programs=8, reduction="atomic")
        _close_to(got, want, torch.float32)
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("reduction", ["one-kernel", "atomic"])
def test_one_kernel_reduction_under_a_cuda_graph(reduction):
    """Captured after a warm-up on the capturing stream, the graph reuses that stream's counters (and accumulator);
    its replays give the eager bits (atomic: the eager function) and leave the counters re-armed."""
    gen = torch.Generator().manual_seed(4)
    x, rule, weight, bias = _inputs(16, 4096, 4096, 1, torch.bfloat16, True, gen)
    want = triton_phm_linear(x, rule, weight, bias, reduction=reduction)
    assert plan(1, 16, 256, 256, torch.bfloat16, triton_phm._programs(x.device)).splits > 1
    out = torch.empty_like(want)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        triton_phm_linear(x, rule, weight, bias, out=out, reduction=reduction)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        triton_phm_linear(x, rule, weight, bias, out=out, reduction=reduction)
    for _ in range(20):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        if reduction == "atomic":
            _close_to(out, want, torch.bfloat16)
        else:
            assert torch.equal(out, want)
    assert not any(c.any() for c in triton_phm._COUNTERS.values())
    assert not any(a.any() for a in triton_phm._ACCUMULATORS.values())


@pytest.mark.skipif(DEVICE != "cuda", reason="a layer of 4096² at the GPU's own plan: too slow for the interpreter")
@pytest.mark.parametrize("rows", [1, 8, 64])
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_one_kernel_reduction_at_the_benchmarked_size(n, rows):
    """d = k = 4096 in bf16 with the default plan (four programs a multiprocessor): the shares and tiles the
    benchmark times, where many programs of a tile arrive at nearly the same moment."""
    gen = torch.Generator().manual_seed(n * 100 + rows)
    x, rule, weight, bias = _inputs(n, 4096, 4096, rows, torch.bfloat16, True, gen)
    two = triton_phm_linear(x, rule, weight, bias, reduction="two-kernel")
    for _ in range(20):
        assert torch.equal(triton_phm_linear(x, rule, weight, bias, reduction="one-kernel"), two)
        assert torch.equal(triton_phm_linear(x, rule, weight, bias, _unroll_tail=True), two)
        _close_to(triton_phm_linear(x, rule, weight, bias, reduction="atomic"), two, torch.bfloat16)
    assert not any(c.any() for c in triton_phm._COUNTERS.values())
    assert not any(a.any() for a in triton_phm._ACCUMULATORS.values())
    assert _relative_error(two, _reference(x, rule, weight, bias)) < TOLERANCE[torch.bfloat16]
