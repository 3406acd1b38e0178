"""Functional kernels: materialisation and the structured path against Σ kron."""

import pytest
import torch

import hyperplex.layers.functional as functional
from hyperplex.algebra import cayley_dickson_rule
from hyperplex.layers.dispatch import DEFAULT_PATH_SETTINGS, structured_weight_first, takes_blocked
from hyperplex.layers.functional import (
    materialize_weight,
    materialize_weights,
    onednn_available,
    onednn_padded_rows,
    phm_linear,
    phm_linear_blocked,
    phm_linear_onednn,
    phm_linear_reference,
    phm_linear_structured,
    signed_permutation,
)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_materialize_equals_kron_sum(n):
    torch.manual_seed(n)
    rule, weight = torch.randn(n, n, n, dtype=torch.float64), torch.randn(n, 3, 5, dtype=torch.float64)
    H = sum(torch.kron(rule[i], weight[i]) for i in range(n))
    torch.testing.assert_close(materialize_weight(rule, weight), H)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_materialize_weights_batches_the_per_layer_form_with_its_gradients(n):
    gen = torch.Generator().manual_seed(n)
    rules = torch.randn(3, n, n, n, dtype=torch.float64, generator=gen, requires_grad=True)
    weights = torch.randn(3, n, 2, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    formed = materialize_weights(rules, weights)
    assert formed.shape == (3, 2 * n, 5 * n)
    want = torch.stack([materialize_weight(rules[i], weights[i]) for i in range(3)])
    torch.testing.assert_close(formed, want)
    g = torch.randn(formed.shape, dtype=torch.float64, generator=gen)
    got = torch.autograd.grad((formed * g).sum(), (rules, weights))
    expected = torch.autograd.grad((want * g).sum(), (rules, weights))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


def test_materialize_weights_refuses_mismatched_shapes_by_name():
    with pytest.raises(ValueError, match=r"rules must be \(2, 4, 4, 4\) for weights \(2, 4, 3, 3\), got \(2, 2, "):
        materialize_weights(torch.ones(2, 2, 2, 2), torch.ones(2, 4, 3, 3))
    with pytest.raises(ValueError, match=r"expected rules \(L, n, n, n\) and weights \(L, n, k/n, d/n\)"):
        materialize_weights(torch.ones(3, 4, 4, 4), torch.ones(2, 4, 3, 3))


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_signed_permutation_gather_equals_matmul(n):
    rule = cayley_dickson_rule(n, dtype=torch.float64)
    weight = torch.randn(n, 2, 3, dtype=torch.float64)
    perm = signed_permutation(rule)
    assert perm is not None
    torch.testing.assert_close(materialize_weight(rule, weight, perm), materialize_weight(rule, weight))


def test_signed_permutation_rejects_dense_rules():
    assert signed_permutation(torch.randn(4, 4, 4)) is None
    assert signed_permutation(2 * cayley_dickson_rule(4)) is None


@pytest.mark.parametrize("lead", [(), (7,), (2, 3)])
def test_structured_handles_any_leading_shape(lead):
    torch.manual_seed(0)
    rule, weight, bias = torch.randn(4, 4, 4), torch.randn(4, 3, 2), torch.randn(12)
    x = torch.randn(*lead, 8)
    y = phm_linear_structured(x, rule, weight, bias)
    assert y.shape == (*lead, 12)
    torch.testing.assert_close(y, phm_linear_reference(x, rule, weight, bias), rtol=1e-5, atol=1e-5)


@pytest.fixture(params=["input_first", "weight_first"])
def orientation(request):
    """One of the structured product's two orientations, forced for every shape (``weight_first=``)."""
    return request.param == "weight_first"


@pytest.mark.parametrize("lead,n,k_n,d_n", [((5,), 2, 3, 4), ((2, 3), 4, 6, 2), ((1,), 4, 2, 6), ((0,), 4, 3, 3),
                                            ((3,), 8, 1, 2), ((2,), 3, 5, 7)])
def test_both_structured_orientations_equal_the_kron_sum_with_gradients(orientation, lead, n, k_n, d_n):
    torch.manual_seed(n * 10 + k_n)
    rule = torch.randn(n, n, n, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(n, k_n, d_n, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(n * k_n, dtype=torch.float64, requires_grad=True)
    x = torch.randn(*lead, n * d_n, dtype=torch.float64, requires_grad=True)
    probe = torch.randn(*lead, n * k_n, dtype=torch.float64)
    got = phm_linear_structured(x, rule, weight, bias, weight_first=orientation)
    want = phm_linear_reference(x, rule, weight, bias)
    torch.testing.assert_close(got, want)
    grads = torch.autograd.grad((got * probe).sum(), (x, rule, weight, bias))
    expected = torch.autograd.grad((want * probe).sum(), (x, rule, weight, bias))
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("with_bias", [True, False])
def test_one_row_mixes_in_one_product_with_the_bias_inside_in_every_precision(with_bias):
    # a decoding step's row takes a 2-D product with the bias added in it; the result must be the batched form's
    torch.manual_seed(2)
    rule, weight, x = torch.randn(4, 4, 4), torch.randn(4, 3, 5), torch.randn(1, 20)
    bias = torch.randn(12) if with_bias else None
    want = phm_linear_reference(x, rule, weight, bias)
    for lead in ((), (1,), (1, 1)):
        got = phm_linear_structured(x.view(*lead, 20), rule, weight, bias, weight_first=False)
        assert got.shape == (*lead, 12)
        torch.testing.assert_close(got.reshape(1, 12), want, rtol=1e-5, atol=1e-5)
    low = phm_linear_structured(x.bfloat16(), rule, weight.bfloat16(), bias, weight_first=False)
    assert low.dtype == torch.bfloat16  # a float32 bias follows the product's dtype
    torch.testing.assert_close(low.float(), want, rtol=0.05, atol=0.1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = phm_linear_structured(x, rule, weight, bias, weight_first=False)
    assert auto.dtype == torch.bfloat16
    torch.testing.assert_close(auto.float(), want, rtol=0.05, atol=0.1)


def test_structured_orientations_on_strided_input_and_a_float32_rule_with_bfloat16_factors(orientation):
    torch.manual_seed(1)
    rule, weight = torch.randn(4, 4, 4), torch.randn(4, 3, 2)
    x = torch.randn(8, 12)[:, ::2].T  # (6, 8), not contiguous
    torch.testing.assert_close(phm_linear_structured(x, rule, weight, weight_first=orientation),
                               phm_linear_reference(x, rule, weight), rtol=1e-5, atol=1e-5)
    low = phm_linear_structured(x.bfloat16(), rule, weight.bfloat16(), weight_first=orientation)
    assert low.dtype == torch.bfloat16  # the rule follows the product's dtype, as in the weight-first form
    torch.testing.assert_close(low.float(), phm_linear_reference(x, rule, weight), rtol=0.05, atol=0.1)


def test_structured_takes_the_weight_first_form_only_for_few_block_rows_on_large_weights():
    few = DEFAULT_PATH_SETTINGS.weight_first_max_rows_n  # rows·n; the weight bound is 1024² (docs/performance.md)
    assert structured_weight_first(few // 2, 2, 1024, 1024)  # rows·n at the limit, k·d at the limit
    assert structured_weight_first(1, 8, 4096, 4096)
    assert not structured_weight_first(few // 2 + 1, 2, 1024, 1024)  # one row more
    assert not structured_weight_first(2, 8, 4096, 4096)
    assert not structured_weight_first(1, 2, 1024, 1020)  # k·d one column short
    assert not structured_weight_first(1, 4, 384, 1536)  # MiniLM's shapes: always input-first


def test_phm_linear_modes_and_error():
    rule, weight = torch.randn(2, 2, 2), torch.randn(2, 3, 4)
    x = torch.randn(5, 8)
    torch.testing.assert_close(phm_linear(x, rule, weight, mode="structured"), phm_linear(x, rule, weight))
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        phm_linear(x, rule, weight, mode="fast")


# ---------------------------------------------------------------- forming H without a gradient
def _forms(rule, weight, permutation=None):
    """H formed in place (no gradient to record) and by the differentiable one-matmul form."""
    in_place = materialize_weight(rule, weight, permutation)
    recorded = materialize_weight(rule, weight.detach().requires_grad_(True), permutation)
    assert recorded.requires_grad and not in_place.requires_grad
    return in_place, recorded.detach()


@pytest.mark.parametrize("n,k_n,d_n", [(2, 3, 5), (3, 4, 2), (4, 6, 24), (4, 24, 6), (8, 2, 3)])
def test_in_place_form_equals_the_differentiable_form_and_the_kron_sum(n, k_n, d_n):
    torch.manual_seed(n + k_n)
    rule, weight = torch.randn(n, n, n, dtype=torch.float64), torch.randn(n, k_n, d_n, dtype=torch.float64)
    in_place, recorded = _forms(rule, weight)
    torch.testing.assert_close(in_place, recorded, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(in_place, sum(torch.kron(rule[i], weight[i]) for i in range(n)))
    with torch.inference_mode():
        torch.testing.assert_close(materialize_weight(rule, weight), in_place, rtol=0, atol=0)
    perm_rule = cayley_dickson_rule(n, dtype=torch.float64) if n in (2, 4, 8) else None
    if perm_rule is not None:  # the gather form of fixed ±1 rules, in place too
        in_place, recorded = _forms(perm_rule, weight, signed_permutation(perm_rule))
        torch.testing.assert_close(in_place, recorded, rtol=0, atol=0)
    for rule_dtype, weight_dtype in ((torch.float32, torch.float64), (torch.float64, torch.float32),
                                     (torch.float32, torch.bfloat16)):  # the factors' dtype, as the matmul gives
        r, w = rule.to(rule_dtype), weight.to(weight_dtype)
        in_place, recorded = _forms(r, w)
        assert in_place.dtype == recorded.dtype == weight_dtype
        torch.testing.assert_close(in_place, recorded)


def test_in_place_form_holds_nothing_of_hs_size_beside_h():
    """Forming H in inference must not hold a second k·d intermediate (the one-matmul form's blocks): the largest
    tensor any operation returns, besides H's own buffer, is one block row (k·d/n)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class NewStorages(TorchDispatchMode):
        """Bytes of every storage an operation allocates, except the one ``empty`` makes for ``H``."""

        def __init__(self, *known):
            super().__init__()
            self.known, self.sizes = {t.untyped_storage().data_ptr() for t in known}, [0]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for tensor in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in self.known:
                    self.known.add(tensor.untyped_storage().data_ptr())
                    if func is not torch.ops.aten.empty.memory_format:
                        self.sizes.append(tensor.untyped_storage().nbytes())
            return out

    n, k_n, d_n = 4, 16, 32
    rule, weight = torch.randn(n, n, n), torch.randn(n, k_n, d_n)
    h_bytes = n * k_n * n * d_n * 4
    with torch.no_grad(), NewStorages(rule, weight) as seen:
        materialize_weight(rule, weight)
    assert max(seen.sizes) <= h_bytes // n
    leaf = weight.clone().requires_grad_(True)
    with NewStorages(rule, leaf) as seen:  # the differentiable form: its blocks are a second H (the test can fail)
        materialize_weight(rule, leaf)
    assert h_bytes in seen.sizes and seen.sizes.count(h_bytes) == 2  # the blocks, then H


# ---------------------------------------------------------------- the structured product on oneDNN
needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this PyTorch has no usable oneDNN linear")


@needs_onednn
@pytest.mark.parametrize("n, d, k, lead", [(2, 8, 12, (5,)), (3, 9, 6, (2, 3)), (4, 384, 1536, (17,)),
                                           (4, 1536, 384, (33,)), (8, 64, 32, ()), (16, 256, 512, (4,))])
def test_onednn_equals_the_kronecker_reference(n, d, k, lead):
    torch.manual_seed(n * d + k)
    rule, weight, bias = torch.randn(n, n, n), torch.randn(n, k // n, d // n), torch.randn(k)
    x = torch.randn(*lead, d)
    want = phm_linear_reference(x.double(), rule.double(), weight.double(), bias.double())
    with torch.inference_mode():
        got = phm_linear_onednn(x, rule, weight, bias)
        no_bias = phm_linear(x, rule, weight, mode="onednn")
    assert got.shape == (*lead, k) and got.dtype == torch.float32
    scale = want.abs().max().item()
    assert (got.double() - want).abs().max().item() <= 1e-5 * scale  # float32 sums of d products
    torch.testing.assert_close(no_bias.double(), want - bias.double(), rtol=0, atol=1e-5 * scale)


@needs_onednn
def test_onednn_takes_strided_input_and_frozen_factors_under_grad_mode():
    torch.manual_seed(1)
    rule, weight = torch.randn(4, 4, 4), torch.randn(4, 6, 5)
    x = torch.randn(20, 7)[:, 1:6].repeat(1, 4)  # (20, 20), built from a strided view
    got = phm_linear_onednn(x.t().contiguous().t(), rule, weight)  # column-major input, no gradient anywhere
    torch.testing.assert_close(got, phm_linear_structured(x, rule, weight), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_onednn_pads_rows_to_a_bounded_set_of_shapes(monkeypatch):

    assert [onednn_padded_rows(r) for r in (1, 16, 17, 18, 33, 100, 1000, 1025)] == [1, 16, 18, 18, 36, 104, 1024, 1152]
    assert all(r <= onednn_padded_rows(r) <= r * 9 / 8 for r in range(1, 5000))  # at most 1/8 extra rows
    assert len({onednn_padded_rows(r) for r in range(1, 2049)}) == 16 + 8 * 7  # exact to 16, 8 per octave to 2048
    torch.manual_seed(3)
    rule, weight, bias = torch.randn(4, 4, 4), torch.randn(4, 5, 6), torch.randn(20)
    seen, real = set(), functional._onednn_linear
    monkeypatch.setattr(functional, "_onednn_linear", lambda x, w: seen.add(tuple(x.shape)) or real(x, w))
    for rows in range(1, 70):
        x = torch.randn(rows, 24)
        got = phm_linear_onednn(x, rule, weight, bias)  # padded rows computed, then dropped
        torch.testing.assert_close(got, phm_linear_structured(x, rule, weight, bias), rtol=1e-5, atol=1e-5)
    # 65-69 rows: one bucket, 72
    assert seen == {(onednn_padded_rows(r) * 4, 6) for r in range(1, 70)} and len(seen) == 16 + 8 + 8 + 1


@needs_onednn
def test_onednn_takes_empty_batches():
    rule, weight, bias = torch.randn(2, 2, 2), torch.randn(2, 3, 4), torch.randn(6)
    assert phm_linear_onednn(torch.randn(0, 8), rule, weight, bias).shape == (0, 6)
    assert phm_linear_onednn(torch.randn(2, 0, 8), rule, weight).shape == (2, 0, 6)


def test_onednn_refuses_what_it_cannot_run_by_name():
    rule, weight = torch.randn(2, 2, 2), torch.randn(2, 3, 4)
    x = torch.randn(5, 8)
    with pytest.raises(RuntimeError, match="no backward pass"):
        phm_linear_onednn(x.requires_grad_(), rule, weight)
    with pytest.raises(RuntimeError, match="float32 only"):
        phm_linear_onednn(torch.randn(5, 8, dtype=torch.float64), rule.double(), weight.double())
    with torch.backends.mkldnn.flags(enabled=False):
        assert not onednn_available()
        with pytest.raises(RuntimeError, match="switched off"):
            phm_linear_onednn(torch.randn(5, 8), rule, weight)
    with pytest.raises(RuntimeError, match="ONNX export|tracing"):
        torch.jit.trace(lambda t: phm_linear_onednn(t, rule, weight), torch.randn(5, 8))


def test_onednn_self_check_failure_turns_it_off_once_with_a_warning(monkeypatch):

    monkeypatch.setattr(functional, "_ONEDNN", {})
    monkeypatch.setattr(functional, "_onednn_linear", lambda x, w: x @ w.T + 1.0)  # a wrong oneDNN
    with pytest.warns(RuntimeWarning, match="failed its self-check"):
        assert not functional.onednn_available()
    assert not functional.onednn_available()  # decided once per process: no second warning, no second check
    assert "self-check" in functional.onednn_reason(torch.randn(2, 8), torch.randn(2, 2, 2), torch.randn(2, 3, 4))


# ---------------------------------------------------------------- H formed one block column at a time
@pytest.mark.parametrize("lead", [(5,), (2, 3), (0,)])
@pytest.mark.parametrize("n, k_n, d_n", [(2, 6, 4), (3, 2, 5), (4, 3, 8), (4, 8, 3), (8, 2, 2)])
def test_blocked_equals_the_kron_sum(n, k_n, d_n, lead):
    torch.manual_seed(n * 100 + k_n * 10 + d_n)
    rule, weight = torch.randn(n, n, n, dtype=torch.float64), torch.randn(n, k_n, d_n, dtype=torch.float64)
    bias, x = torch.randn(n * k_n, dtype=torch.float64), torch.randn(*lead, n * d_n, dtype=torch.float64)
    want = phm_linear_reference(x, rule, weight, bias)
    with torch.no_grad():
        got = phm_linear_blocked(x, rule, weight, bias)
        no_bias = phm_linear_blocked(x, rule, weight)
    assert got.shape == (*lead, n * k_n)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(no_bias, phm_linear_reference(x, rule, weight))


def test_blocked_writes_each_block_column_of_h_into_the_buffer_it_is_given():
    torch.manual_seed(0)
    n, k_n, d_n = 4, 3, 5
    rule, weight, x = torch.randn(n, n, n), torch.randn(n, k_n, d_n), torch.randn(7, n * d_n)
    buffer = torch.full((n * k_n * d_n + 9,), float("nan"))  # larger than needed: its start is used
    with torch.inference_mode():
        got = phm_linear_blocked(x, rule, weight, buffer=buffer)
    H = materialize_weight(rule, weight)
    torch.testing.assert_close(got, x @ H.T)
    # after the call the buffer holds the last block column of H, laid out (k, d/n)
    torch.testing.assert_close(buffer[:n * k_n * d_n].view(n * k_n, d_n), H[:, (n - 1) * d_n:])
    assert torch.isnan(buffer[n * k_n * d_n:]).all()


def test_blocked_refuses_gradients_tracing_and_bad_buffers_by_name():
    torch.manual_seed(0)
    rule, weight, x = torch.randn(2, 2, 2), torch.randn(2, 3, 4), torch.randn(5, 8)
    with pytest.raises(ValueError, match="no gradient is recorded"):
        phm_linear_blocked(x, rule, weight.clone().requires_grad_(True))
    with pytest.raises(ValueError, match="no gradient is recorded"):
        phm_linear_blocked(x.clone().requires_grad_(True), rule, weight)
    with torch.no_grad():  # frozen under no_grad: fine
        phm_linear_blocked(x, rule, weight.clone().requires_grad_(True))
        with pytest.raises(ValueError, match="nothing is traced"):
            torch.jit.trace(lambda t: phm_linear_blocked(t, rule, weight), (x,))
        with pytest.raises(ValueError, match="at least 24 elements"):
            phm_linear_blocked(x, rule, weight, buffer=torch.empty(23))
        with pytest.raises(ValueError, match="contiguous torch.float32"):
            phm_linear_blocked(x, rule, weight, buffer=torch.empty(24, dtype=torch.float64))
        with pytest.raises(ValueError, match="contiguous"):
            phm_linear_blocked(x, rule, weight, buffer=torch.empty(8, 6).T)  # 48 elements, strided
        with pytest.raises(ValueError, match="last dimension 8"):
            phm_linear_blocked(torch.randn(5, 6), rule, weight)


def test_the_blocked_form_is_taken_on_small_layers_with_wide_block_columns_only():
    assert takes_blocked(1536, 384, 4) and takes_blocked(384, 1536, 4) and takes_blocked(384, 384, 2)  # MiniLM
    assert not takes_blocked(1536, 384, 8)  # d/n = 48
    assert takes_blocked(384, 1536, 16)  # d/n = 96: the boundary is in
    assert not takes_blocked(1024, 1024, 4)  # 2^20 weights: the boundary is out
    assert takes_blocked(1020, 1024, 4)  # just under 2^20
    assert not takes_blocked(384, 384, 1)
