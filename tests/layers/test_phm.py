"""PHMLinear: equivalences (n=1 ≡ nn.Linear, all paths ≡ Σ kron), gradients, init, errors, conversion."""

import contextlib
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyperplex import PHMLinear, phm_parameter_count
from hyperplex.algebra import ALGEBRAS, algebra_rule
from hyperplex.layers import kronecker_decompose, phm_linear_reference
from hyperplex.layers.functional import onednn_available

RULES_BY_N = {1: ["learned", "real"], 2: ["learned", "complex"], 4: ["learned", "quaternion"],
              8: ["learned", "octonion"], 16: ["learned", "sedenion"]}
CASES = [(n, rule) for n, rules in RULES_BY_N.items() for rule in rules]


def make(n, rule, d=32, k=16, dtype=torch.float64, **kw):
    torch.manual_seed(n)
    return PHMLinear(d, k, n, rule=rule, dtype=dtype, **kw)


# ---------------------------------------------------------------- n = 1 is nn.Linear
def test_n1_is_exactly_linear():
    torch.manual_seed(0)
    dense = nn.Linear(24, 12)
    phm = PHMLinear(24, 12, 1)
    assert sum(p.numel() for p in phm.parameters()) == 24 * 12 + 12
    with torch.no_grad():
        phm.phm_weight.copy_(dense.weight.view(1, 12, 24))
        phm.bias.copy_(dense.bias)
    x = torch.randn(5, 7, 24, requires_grad=True)
    y_dense, y_phm = dense(x), phm(x)
    assert torch.equal(y_dense, y_phm)
    g = torch.randn_like(y_dense)
    gx_dense, gw_dense = torch.autograd.grad(y_dense, (x, dense.weight), g)
    gx_phm, gw_phm = torch.autograd.grad(y_phm, (x, phm.phm_weight), g)
    assert torch.equal(gx_dense, gx_phm) and torch.equal(gw_dense, gw_phm.view(12, 24))


# ---------------------------------------------------------------- every path equals the reference
@pytest.mark.parametrize("n,rule", CASES)
@pytest.mark.parametrize("mode", ["structured", "premixed", "materialized", "auto"])
def test_forward_and_gradients_match_kron_reference(n, rule, mode):
    layer = make(n, rule, forward_mode=mode)
    x = torch.randn(3, 5, 32, dtype=torch.float64, requires_grad=True)
    params = [p for p in (layer.phm_rule, layer.phm_weight, layer.bias) if p.requires_grad]
    y = layer(x)
    ref = phm_linear_reference(x, layer.phm_rule, layer.phm_weight, layer.bias)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, *params], g)
    ref_grads = torch.autograd.grad(ref, [x, *params], g)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n,rule", CASES)
@pytest.mark.parametrize("mode", ["structured", "premixed", "materialized"])
def test_gradcheck(n, rule, mode):
    layer = make(n, rule, d=16 if n < 16 else 32, k=16, forward_mode=mode)
    x = torch.randn(2, layer.in_features, dtype=torch.float64, requires_grad=True)
    params = [p for p in (layer.phm_rule, layer.phm_weight, layer.bias) if p.requires_grad]
    names = [name for name, p in layer.named_parameters()]

    def fn(x, *ps):
        return torch.func.functional_call(layer, dict(zip(names, ps)), (x,))

    assert torch.autograd.gradcheck(fn, (x, *params))


def test_quaternion_layer_is_hamilton_product_of_weights_and_input():
    """Tay et al. eq. 3: with 1×1 blocks, a quaternion PHM layer computes W ⊗ x."""
    from hyperplex.algebra import hamilton

    layer = PHMLinear(4, 4, 4, rule="quaternion", bias=False, dtype=torch.float64)
    w = layer.phm_weight.detach().reshape(4)
    x = torch.randn(10, 4, dtype=torch.float64)
    torch.testing.assert_close(layer(x), hamilton(w.expand(10, 4), x))


# ---------------------------------------------------------------- parameter counts
@pytest.mark.parametrize("n,rule", CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_parameter_count(n, rule, bias):
    d, k = 64, 48
    layer = PHMLinear(d, k, n, bias=bias, rule=rule)
    expected = k * d // n + (n**3 if rule == "learned" and n > 1 else 0) + (k if bias else 0)
    assert sum(p.numel() for p in layer.parameters()) == expected == phm_parameter_count(d, k, n, rule, bias)
    assert f"n={n}" in repr(layer) and "fewer than dense" in repr(layer)


def test_custom_rule_tensor_is_fixed_buffer():
    rule = torch.randn(2, 2, 2)
    layer = PHMLinear(8, 4, 2, rule=rule)
    assert "phm_rule" in dict(layer.named_buffers()) and "phm_rule" not in dict(layer.named_parameters())
    torch.testing.assert_close(layer.phm_rule, rule)
    assert "rule=custom" in repr(layer)


# ---------------------------------------------------------------- bad arguments
@pytest.mark.parametrize(
    "args,kwargs,match",
    [
        ((30, 16, 4), {}, r"n=4 must divide both in_features=30 and out_features=16; valid n .*\[1, 2\]"),
        ((32, 18, 4), {}, r"out_features=18"),
        ((32, 16, 0), {}, r"positive integer"),
        ((32, 16, -2), {}, r"positive integer"),
        ((32, 16, 2.0), {}, r"positive integer"),
        ((32, 16, 4), {"rule": "quaternions"},
         r"unknown rule 'quaternions'; valid: 'learned', 'real', 'complex', 'quaternion'"),
        ((32, 16, 8), {"rule": "quaternion"}, r"rule 'quaternion' needs n=4, got n=8"),
        ((32, 16, 4), {"rule": torch.zeros(4, 4, 4)}, r"all zeros"),
        ((32, 16, 4), {"rule": torch.randn(4, 4)}, r"shape \(4, 4, 4\), got \(4, 4\)"),
        ((32, 16, 4), {"rule": torch.randn(2, 2, 2)}, r"shape \(4, 4, 4\), got \(2, 2, 2\)"),
        ((32, 16, 4), {"forward_mode": "fast"}, r"unknown forward_mode 'fast'; valid: auto, structured, materialized"),
    ],
)
def test_bad_arguments_raise_value_error(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        PHMLinear(*args, **kwargs)


def test_wrong_input_size_is_a_clear_error():
    with pytest.raises(ValueError, match=r"last dimension 32, got shape \(2, 31\)"):
        PHMLinear(32, 16, 4)(torch.randn(2, 31))


# ---------------------------------------------------------------- initialisation
@pytest.mark.parametrize("n,rule", [(2, "learned"), (4, "learned"), (8, "learned"), (16, "learned"),
                                    (4, "quaternion"), (8, "octonion"), (16, "sedenion")])
def test_init_variance_matches_dense(n, rule):
    """Averaged over seeds, Var(H) = 1/(3d) (nn.Linear's kaiming_uniform(a=√5)) and outputs keep their scale."""
    d, k, seeds = 64, 32, 200
    torch.manual_seed(0)
    x = torch.randn(256, d)
    h_var = out_var = 0.0
    for _ in range(seeds):
        layer = PHMLinear(d, k, n, rule=rule, bias=False)
        with torch.no_grad():
            h_var += layer.dense_weight().square().mean().item() / seeds
            out_var += layer(x).square().mean().item() / seeds
    dense_out = sum(nn.Linear(d, k, bias=False)(x).square().mean().item() for _ in range(seeds)) / seeds
    assert h_var == pytest.approx(1 / (3 * d), rel=0.1)
    assert out_var == pytest.approx(dense_out, rel=0.1)


def test_learned_rule_init_is_random_normal_with_variance_one_over_n():
    torch.manual_seed(0)
    rules = torch.stack([PHMLinear(64, 64, 8).phm_rule.detach() for _ in range(50)])
    assert rules.mean().abs() < 0.02
    assert rules.var().item() == pytest.approx(1 / 8, rel=0.05)


# ---------------------------------------------------------------- conversion
@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_from_linear_is_exact_on_kronecker_sums(n):
    torch.manual_seed(n)
    rule, weight = torch.randn(n, n, n, dtype=torch.float64), torch.randn(n, 6, 5, dtype=torch.float64)
    H = sum(torch.kron(rule[i], weight[i]) for i in range(n))
    dense = nn.Linear(5 * n, 6 * n, dtype=torch.float64)
    with torch.no_grad():
        dense.weight.copy_(H)
    layer, error = PHMLinear.from_linear(dense, n)
    assert error < 1e-10
    torch.testing.assert_close(layer.dense_weight(), H)
    x = torch.randn(4, 5 * n, dtype=torch.float64)
    torch.testing.assert_close(layer(x), dense(x))


def _frob_error(W, rule, weight):
    n = rule.shape[0]
    H = sum(torch.kron(rule[i], weight[i]) for i in range(n))
    return torch.linalg.norm(W - H) / torch.linalg.norm(W)


@pytest.mark.parametrize("n", [2, 4])
def test_from_linear_is_optimal_on_random_weights(n):
    """Reported error is the true error, the solution is stationary, and no optimised n-term sum beats it."""
    torch.manual_seed(0)
    dense = nn.Linear(16, 8, dtype=torch.float64)
    W = dense.weight.detach()
    layer, error = PHMLinear.from_linear(dense, n)
    rule = layer.phm_rule.detach().clone().requires_grad_()
    weight = layer.phm_weight.detach().clone().requires_grad_()
    loss = _frob_error(W, rule, weight)
    assert loss.item() == pytest.approx(error, rel=1e-9)
    g_rule, g_weight = torch.autograd.grad(loss, (rule, weight))
    assert g_rule.abs().max() < 1e-8 and g_weight.abs().max() < 1e-8
    for seed in range(3):  # gradient descent from random starts converges no lower
        torch.manual_seed(seed)
        r = torch.randn(n, n, n, dtype=torch.float64, requires_grad=True)
        s = (0.3 * torch.randn(n, 8 // n, 16 // n, dtype=torch.float64)).requires_grad_()
        opt = torch.optim.Adam([r, s], lr=0.02)
        for _ in range(600):
            opt.zero_grad()
            e = _frob_error(W, r, s)
            e.backward()
            opt.step()
        assert e.item() >= error - 1e-9


def test_from_linear_with_fixed_rule_is_least_squares():
    torch.manual_seed(0)
    dense = nn.Linear(16, 8, dtype=torch.float64)
    layer, error = PHMLinear.from_linear(dense, 4, rule="quaternion")
    assert not layer.rule_is_learned
    weight = layer.phm_weight.detach().clone().requires_grad_()
    loss = _frob_error(dense.weight.detach(), layer.phm_rule, weight)
    assert loss.item() == pytest.approx(error, rel=1e-9)
    (g,) = torch.autograd.grad(loss, weight)
    assert g.abs().max() < 1e-10  # normal equations hold


def test_kronecker_decompose_error_matches_singular_values():
    torch.manual_seed(0)
    W = torch.randn(12, 8, dtype=torch.float64)
    rule, weight, error = kronecker_decompose(W, 2)
    assert error == pytest.approx(_frob_error(W, rule, weight).item(), rel=1e-9)


@pytest.mark.parametrize("n,rule", [(1, "learned"), (4, "learned"), (4, "quaternion")])
def test_to_linear_computes_the_same_function(n, rule):
    layer = make(n, rule)
    linear = layer.to_linear()
    assert isinstance(linear, nn.Linear) and linear.weight.shape == (16, 32)
    x = torch.randn(3, 32, dtype=torch.float64)
    torch.testing.assert_close(linear(x), layer(x))


# ---------------------------------------------------------------- state, dtype, autocast, compile
@pytest.mark.parametrize("rule", ["learned", "quaternion"])
def test_state_dict_round_trip(rule):
    a, b = PHMLinear(16, 8, 4, rule=rule), PHMLinear(16, 8, 4, rule=rule)
    assert set(a.state_dict()) == {"phm_rule", "phm_weight", "bias"}
    b.load_state_dict(a.state_dict())
    x = torch.randn(3, 16)
    assert torch.equal(a(x), b(x))


def test_to_dtype():
    layer = PHMLinear(16, 8, 4)
    x = torch.randn(3, 16)
    y32 = layer(x)
    layer.to(torch.float64)
    assert layer.phm_weight.dtype == layer.phm_rule.dtype == torch.float64
    for mode in ["structured", "materialized"]:
        layer.forward_mode = mode
        y64 = layer(x.double())
        assert y64.dtype == torch.float64
        torch.testing.assert_close(y64.float(), y32, rtol=1e-5, atol=1e-6)
        with torch.no_grad():  # cached path must follow the dtype change too
            assert layer(x.double()).dtype == torch.float64


@pytest.mark.parametrize("mode", ["structured", "materialized"])
@pytest.mark.parametrize("rule", ["learned", "quaternion"])
def test_bf16_autocast_on_cpu(mode, rule):
    torch.manual_seed(0)
    layer = PHMLinear(64, 32, 4, rule=rule, forward_mode=mode)
    x = torch.randn(8, 64)
    ref = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), ref, rtol=0.05, atol=0.05)
    y.float().sum().backward()
    assert layer.phm_weight.grad is not None and torch.isfinite(layer.phm_weight.grad).all()


def test_torch_compile_fullgraph():
    from hyperplex.layers import PHMRule

    torch.manual_seed(0)
    x = torch.randn(4, 32)
    for layer in (PHMLinear(32, 16, 4), PHMLinear(32, 16, 4, rule=PHMRule(4), factor_rank=2)):
        for mode in ["structured", "materialized"]:
            layer.forward_mode = mode
            compiled = torch.compile(layer, fullgraph=True)
            y = compiled(x)
            torch.testing.assert_close(y, layer(x))
            y.sum().backward()
            assert layer.phm_rule.grad is not None
            layer.zero_grad()


# ---------------------------------------------------------------- dispatch and the cached H
def test_auto_dispatch_by_rows_weight_size_and_grad_mode():
    # The boundaries of PHMLinear.choose_mode fitted with benchmarks/bench_phm.py, warm and on cold stacks of
    # layers (docs/performance.md, "Cold cache"); hyperplex.layers.dispatch.PathSettings says why each exists.
    # Shapes only (the layer is never called), so large sizes cost nothing but the allocation.
    huge = PHMLinear(4096, 4096, 8, cache_dense=True)  # k·d = 2^24: the row budget is rows·n ≤ 256 in inference
    with torch.no_grad():
        assert huge.choose_mode(32) == "structured" and huge.choose_mode(33) == "cached"
    assert huge.choose_mode(256) == "structured" and huge.choose_mode(257) == "materialized"  # 257·8 > 2048
    assert PHMLinear(4096, 4096, 16).choose_mode(128) == "structured"  # the measured point
    assert PHMLinear(4096, 4096, 16).choose_mode(129) == "materialized"
    huge2 = PHMLinear(4096, 4096, 2, cache_dense=True)
    with torch.no_grad():  # rows·n ≤ 256 would allow 128 rows; the weight budget 2^24 / 2^17 also gives 128
        assert huge2.choose_mode(128) == "structured" and huge2.choose_mode(129) == "cached"
    del huge, huge2
    big = PHMLinear(1024, 1024, 4, cache_dense=True)  # k·d = 2^20
    assert big.choose_mode(1) == "structured"
    assert big.choose_mode(128) == "structured"  # 128 · 2^13 ≤ 2^20 and 128 · 4 ≤ 1024
    assert big.choose_mode(129) == "materialized"  # weight budget: 129 rows > 2^20 / 2^13
    assert big.choose_mode(4096) == "materialized"
    assert PHMLinear(1024, 1024, 16).choose_mode(65) == "materialized"  # 65 · 16 > 1024 (small weight)
    assert PHMLinear(2048, 2048, 16).choose_mode(65) == "materialized"  # 2^22: not a large weight (4096²)
    with torch.no_grad():
        assert big.choose_mode(1) == "structured"
        assert big.choose_mode(8) == "structured"  # 8 · 2^17 ≤ 2^20
        assert big.choose_mode(9) == "cached"
        assert big.choose_mode(4096) == "cached"
    small = PHMLinear(512, 512, 4, cache_dense=True)  # k·d = 2^18: cache-resident, H is cheap to read
    assert small.choose_mode(32) == "structured" and small.choose_mode(33) == "materialized"
    with torch.no_grad():
        assert small.choose_mode(1) == "cached"
    big.forward_mode = "materialized"
    assert big.choose_mode(1) == "materialized"
    big.forward_mode = "structured"
    with torch.no_grad():
        assert big.choose_mode(4096) == "structured"
    assert PHMLinear(8, 8, 1).choose_mode(1) == "dense"


def test_auto_steps_off_a_kernel_that_fails_here_with_one_warning(monkeypatch):
    # the kernel's failure (simulated: a CPU run cannot reach it) must not fail the model: auto warns once, names
    # the error, and answers through PyTorch's paths for the rest of the process; direct calls still raise
    from hyperplex.layers import triton_phm

    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("PTX .version 8.7 does not support .target sm_70")

    monkeypatch.setattr(triton_phm, "_FAILED", None)
    monkeypatch.setattr(triton_phm, "takes_triton", lambda x, layer: triton_phm.kernel_failed() is None)
    monkeypatch.setattr(triton_phm, "triton_phm_linear", broken)
    torch.manual_seed(0)
    layer = PHMLinear(24, 16, 4)
    x = torch.randn(3, 24)
    with torch.no_grad():
        expected = x @ layer.dense_weight().T + layer.bias
    with torch.no_grad(), pytest.warns(RuntimeWarning, match=r"Triton PHM kernel failed \(RuntimeError: PTX .*sm_70\)"):
        torch.testing.assert_close(layer(x), expected)
    assert "sm_70" in triton_phm.kernel_failed()
    import warnings

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        torch.testing.assert_close(layer(x), expected)
    assert len(calls) == 1


def test_inference_without_cache_dispatch_never_caches():
    # The default: no dense copy is kept. Without oneDNN, inference then takes, on weights of fewer than 2^20
    # elements for up to 128 rows, the pre-mixed path if the layer widens (k > d) and the structured path otherwise;
    # on larger weights the structured path while rows ≤ k·d / 2^14 and rows·n ≤ 256; and forms H for the call beyond.
    widening = PHMLinear(384, 1536, 4)  # k > d, 589,824 < 2^20 → pre-mixed up to 128 rows
    narrowing = PHMLinear(1536, 384, 4)  # k < d → structured up to 128 rows
    square = PHMLinear(384, 384, 4)  # k = d → structured up to 128 rows
    with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
        assert widening.choose_mode(1) == "premixed" and widening.choose_mode(128) == "premixed"
        assert widening.choose_mode(129) == "materialized"
        assert narrowing.choose_mode(1) == "structured" and narrowing.choose_mode(128) == "structured"
        assert narrowing.choose_mode(129) == "materialized"
        assert square.choose_mode(1) == "structured" and square.choose_mode(128) == "structured"
        assert square.choose_mode(129) == "materialized"
        assert PHMLinear(1024, 1020, 4).choose_mode(128) == "structured"  # just under 2^20 elements, narrowing
        assert PHMLinear(1024, 1024, 4).choose_mode(16) == "structured"  # 2^20 elements: the general rule ...
        assert PHMLinear(1024, 1024, 4).choose_mode(65) == "materialized"  # ... 65 > 2^20 / 2^14
        assert PHMLinear(4096, 4096, 4).choose_mode(64) == "structured"  # above 2^20; 64·4 ≤ 256
        assert PHMLinear(4096, 4096, 4).choose_mode(65) == "materialized"
    assert square.choose_mode(8) == "structured"  # with weight gradients: the training rule
    assert square.choose_mode(100) == "materialized"
    # with the cache, the 384² weight is cache-resident and the cached H wins at any rows
    square.cache_dense = True
    with torch.no_grad():
        assert square.choose_mode(1) == "cached"


@pytest.mark.skipif(not onednn_available(), reason="this PyTorch has no usable oneDNN linear")
def test_inference_dispatch_takes_onednn_between_few_and_many_rows(monkeypatch):
    # Pins the oneDNN rule of PHMLinear.choose_mode, fitted on stacks of MiniLM's and larger shapes
    # (docs/performance.md, "oneDNN"): weights of 2^20 elements and up, rows·n from 4 to 2·d, rows·k·d ≥ 2^23,
    # and the pre-mixed path keeps its rows.
    monkeypatch.setenv("HYPERPLEX_NATIVE", "0")  # the compiled kernel would take ≤ 4 rows on large layers
    widening, narrowing, square = PHMLinear(384, 1536, 4), PHMLinear(1536, 384, 4), PHMLinear(384, 384, 4)
    with torch.no_grad():
        # MiniLM's shapes stay off it by default (memory): the rules without oneDNN
        assert widening.choose_mode(100) == "premixed"
        assert narrowing.choose_mode(100) == square.choose_mode(100) == "structured"
        assert widening.choose_mode(129) == narrowing.choose_mode(129) == square.choose_mode(129) == "materialized"
        assert narrowing.choose_mode(20) == "structured"
        assert PHMLinear(1024, 1024, 4).choose_mode(7) == "structured"  # 7 · 2^20 < 2^23; 2^20 is not premixed
        assert PHMLinear(1024, 1024, 4).choose_mode(8) == "onednn"
        assert PHMLinear(1024, 1024, 4).choose_mode(512) == "onednn"  # 512·4 = 2·1024
        assert PHMLinear(1024, 1024, 4).choose_mode(513) == "materialized"
        big = PHMLinear(4096, 4096, 4)
        assert big.choose_mode(1) == "onednn" and big.choose_mode(2048) == "onednn"
        assert big.choose_mode(2049) == "materialized"
        assert PHMLinear(4096, 4096, 2).choose_mode(1) == "structured"  # rows·n < 4
        monkeypatch.setattr(PHMLinear, "path_settings",  # what a user who wants the speed sets
                            dataclasses.replace(PHMLinear.path_settings, onednn_min_weight=0))
        assert widening.choose_mode(128) == "premixed"  # its own rows
        assert widening.choose_mode(129) == "onednn" and widening.choose_mode(192) == "onednn"  # 192·4 = 2·384
        assert widening.choose_mode(193) == "materialized"
        assert narrowing.choose_mode(14) == "structured"  # 14 · 589,824 < 2^23
        assert narrowing.choose_mode(15) == "onednn" and narrowing.choose_mode(768) == "onednn"  # 768·4 = 2·1536
        assert narrowing.choose_mode(769) == "materialized"
        assert square.choose_mode(56) == "structured"  # 56 · 147,456 < 2^23: too little work for oneDNN
        assert square.choose_mode(57) == "onednn"  # the structured product, on oneDNN
        square.cache_dense = True
        assert square.choose_mode(100) == "cached"  # the cache, when asked for, is never bypassed
    assert square.choose_mode(100) == "materialized"  # weight gradients: the training rule
    with torch.no_grad():
        assert narrowing.choose_mode(20) == "onednn"
        assert narrowing.choose_mode(20, input_grad=True) == "structured"  # oneDNN has no backward
        with torch.backends.mkldnn.flags(enabled=False):
            assert narrowing.choose_mode(20) == "structured"  # oneDNN switched off by the user


@pytest.mark.parametrize("rows, shape, path", [(1, (384, 1536), "premixed"), (1, (384, 384), "structured"),
                                               (1, (1536, 384), "structured"),
                                               (200, (384, 384), "materialized"), (16, (1024, 1024), "onednn"),
                                               (37, (2048, 1024), "onednn")])
def test_default_inference_holds_no_dense_copy(rows, shape, path):
    if path == "onednn" and not onednn_available():
        pytest.skip("this PyTorch has no usable oneDNN linear")
    torch.manual_seed(0)
    layer = PHMLinear(*shape, 4).eval()
    x = torch.randn(rows, shape[0])
    with torch.inference_mode():
        assert layer.choose_mode(rows) == path
        y = layer(x)
        y2 = layer(x)
    assert layer._cache is None and layer.cached_bytes == 0
    torch.testing.assert_close(y, phm_linear_reference(x, layer.phm_rule, layer.phm_weight, layer.bias), rtol=1e-4,
                               atol=1e-5)
    torch.testing.assert_close(y, y2)


def test_cache_dense_weights_respects_the_byte_budget_and_releases():
    from hyperplex.layers import cache_dense_weights, cached_bytes, release_dense_caches

    torch.manual_seed(0)
    model = nn.Sequential(PHMLinear(64, 32, 4), nn.ReLU(), PHMLinear(32, 64, 2), PHMLinear(64, 64, 1)).eval()
    x = torch.randn(3, 64)
    with torch.no_grad():
        expected = model(x)
    one = 64 * 32 * 4  # bytes of the first H in fp32
    assert cache_dense_weights(model, max_bytes=one + 10) == one  # the second H (2,048 × 4 bytes) does not fit
    assert model[0].cache_dense and not model[2].cache_dense and not model[3].cache_dense  # n = 1 holds no H
    for layer in (model[0], model[2]):
        layer.forward_mode = "materialized"
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected)
    assert cached_bytes(model) == one and model[2].cached_bytes == 0
    assert cache_dense_weights(model) == one + 32 * 64 * 4  # no budget: every PHM layer with n > 1
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected)
    assert cached_bytes(model) == one + 32 * 64 * 4
    assert release_dense_caches(model) == one + 32 * 64 * 4
    assert cached_bytes(model) == 0 and not model[0].cache_dense
    with pytest.raises(ValueError, match="max_bytes"):
        cache_dense_weights(model, max_bytes=-1)
    with pytest.raises(TypeError, match="cache_dense"):
        model[0].cache_dense = 1


def test_cache_is_reused_and_never_stale():
    torch.manual_seed(0)
    layer = PHMLinear(32, 16, 4, forward_mode="materialized", cache_dense=True).eval()
    x = torch.randn(5, 32)
    with torch.no_grad():
        y1 = layer(x)
        H1 = layer._cache[1]
        layer(x)
        assert layer._cache[1] is H1  # reused, not re-formed
    # An optimizer step changes the parameters in place: the next call must see it.
    layer.train()
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    layer(x).square().sum().backward()
    opt.step()
    layer.eval()
    with torch.no_grad():
        y2 = layer(x)
        torch.testing.assert_close(y2, phm_linear_reference(x, layer.phm_rule, layer.phm_weight, layer.bias))
        assert not torch.allclose(y1, y2)
        # Manual in-place edits and load_state_dict bump version counters too.
        layer.phm_rule.mul_(2)
        torch.testing.assert_close(layer(x), phm_linear_reference(x, layer.phm_rule, layer.phm_weight, layer.bias))
        other = PHMLinear(32, 16, 4)
        layer.load_state_dict(other.state_dict())
        torch.testing.assert_close(layer(x), other(x))
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), other(x))
    # Outside inference mode, with gradients wanted, the cache is bypassed and gradients flow.
    layer(x).sum().backward()
    assert layer.phm_weight.grad is not None


@pytest.mark.parametrize("rule, mode, cache", [("learned", "auto", True), ("quaternion", "materialized", False),
                                               ("quaternion", "auto", True), ("learned", "materialized", False)])
def test_a_layer_built_under_inference_mode_runs_and_its_cache_follows_invalidate(rule, mode, cache):
    # Serving code often builds and loads a model inside torch.inference_mode(): the parameters are then
    # inference tensors, which have no version counter for the cache and the fixed rule's permutation to read.
    torch.manual_seed(0)
    x = torch.randn(300, 32)
    with torch.inference_mode():
        layer = PHMLinear(32, 16, 4, rule=rule, forward_mode=mode, cache_dense=cache).eval()
        assert layer.phm_weight.is_inference()
        expected = phm_linear_reference(x, layer.phm_rule, layer.phm_weight, layer.bias)
        torch.testing.assert_close(layer(x), expected)
        torch.testing.assert_close(layer(x[:1]), expected[:1])
        layer.phm_weight.mul_(2)  # in place: no counter moves, so the layer must be told
        layer.invalidate_cache()
        torch.testing.assert_close(layer(x), phm_linear_reference(x, layer.phm_rule, layer.phm_weight, layer.bias))
        assert not torch.allclose(layer(x), expected)
        layer.phm_weight = torch.nn.Parameter(layer.phm_weight * 0.5)  # a new tensor: a new data_ptr
        torch.testing.assert_close(layer(x), expected)


def test_frozen_layer_uses_cache_and_passes_input_gradients():
    layer = PHMLinear(32, 16, 4, forward_mode="materialized", cache_dense=True).requires_grad_(False)
    x = torch.randn(5, 32, requires_grad=True)
    assert layer.choose_mode(5) == "cached"
    layer(x).sum().backward()
    torch.testing.assert_close(x.grad, layer.dense_weight().sum(0).expand(5, 32))


@pytest.mark.parametrize("name", list(ALGEBRAS))
def test_fixed_rule_materialization_uses_signed_permutation(name):
    n = ALGEBRAS[name]
    layer = PHMLinear(16 * max(1, 2 // n) if n < 16 else 32, 16, n, rule=name, dtype=torch.float64)
    torch.testing.assert_close(layer.phm_rule, algebra_rule(name, dtype=torch.float64))
    if n > 1:
        assert layer._permutation() is not None
    H = sum(torch.kron(layer.phm_rule[i], layer.phm_weight[i]) for i in range(n))
    torch.testing.assert_close(layer.dense_weight(), H)


# ---------------------------------------------------------------- shared_weights
def _recurrence(layer: PHMLinear, x0: torch.Tensor, steps: int) -> torch.Tensor:
    h, out = x0, []
    for _ in range(steps):
        h = torch.tanh(layer(h))
        out.append(h)
    return torch.stack(out).sum()


@pytest.mark.parametrize("mode", ["auto", "structured"])  # H formed once / the per-call path is kept
def test_shared_weights_equals_per_call_paths_with_gradients(mode):
    from hyperplex.layers import shared_weights

    torch.manual_seed(0)
    layer = PHMLinear(16, 16, 4, dtype=torch.float64, forward_mode=mode)
    x0 = torch.randn(2, 16, dtype=torch.float64)
    rows = 2 * 5
    expected = _recurrence(layer, x0, 5)
    grads = torch.autograd.grad(expected, [layer.phm_rule, layer.phm_weight, layer.bias])
    with shared_weights(layer, rows):
        assert (layer._shared_weight is not None) == (mode == "auto")
        got = _recurrence(layer, x0, 5)
    assert layer._shared_weight is None
    got_grads = torch.autograd.grad(got, [layer.phm_rule, layer.phm_weight, layer.bias])
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    for g, e in zip(got_grads, grads):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12)


def test_shared_weights_inference_reuses_cache_and_nests():
    from hyperplex.layers import shared_weights

    layer = PHMLinear(8, 8, 2, cache_dense=True).eval()
    dense = nn.Linear(8, 8)  # ignored: only PHM layers with n > 1 take part
    with torch.no_grad(), shared_weights([layer, None, dense], 10_000):
        outer = layer._shared_weight
        assert outer is layer._cached_dense_weight()
        with shared_weights(layer, 10_000):
            assert layer._shared_weight is outer
        assert layer._shared_weight is outer
        x = torch.randn(3, 8)
        torch.testing.assert_close(layer(x), x @ layer.dense_weight().T + layer.bias)
    assert layer._shared_weight is None


def test_shared_weights_keeps_the_paths_that_never_form_h():
    # In inference a large layer's few total rows take a path without H (structured, or oneDNN where it runs):
    # shared_weights forms no H for them, and forms it once where the per-call choice would be to form it.
    from hyperplex.layers import shared_weights

    layer = PHMLinear(1024, 1024, 4).eval()
    with torch.no_grad():
        assert layer.choose_mode(32) in ("structured", "onednn")
        with shared_weights(layer, 32):
            assert layer._shared_weight is None
        assert layer.choose_mode(1024) == "materialized"
        with shared_weights(layer, 1024):
            torch.testing.assert_close(layer._shared_weight, layer.dense_weight())
    small = PHMLinear(384, 1536, 4).eval()  # the pre-mixed path at up to 128 rows: no H either
    with torch.no_grad(), shared_weights(small, 128):
        assert small.choose_mode(128) == "premixed" and small._shared_weight is None


# ---------------------------------------------------------------- the reused buffer for H formed per call
@pytest.fixture
def fresh_buffers():
    from hyperplex.layers.functional import release_formation_buffers

    release_formation_buffers()
    yield
    release_formation_buffers()


def _materialized_layer(d, k, n=4, seed=0):
    torch.manual_seed(seed)
    layer = PHMLinear(d, k, n, forward_mode="materialized").eval()
    return layer


def test_per_call_h_is_formed_into_one_reused_buffer_and_outputs_are_unchanged(fresh_buffers):
    from hyperplex.layers.functional import formation_buffer_bytes

    small, large = _materialized_layer(32, 16, seed=1), _materialized_layer(48, 64, seed=2)
    x_small, x_large = torch.randn(5, 32), torch.randn(7, 48)
    with torch.no_grad():  # H formed into a fresh tensor, as before the buffer: the same operations, so equal bits
        want_small = F.linear(x_small, small.dense_weight(), small.bias)
        want_large = F.linear(x_large, large.dense_weight(), large.bias)
    with torch.inference_mode():
        got_small = small(x_small)
        assert formation_buffer_bytes() == 32 * 16 * 4
        got_large = large(x_large)  # grows to the larger H
        assert formation_buffer_bytes() == 48 * 64 * 4
        again_small = small(x_small)  # a view of the larger buffer: no new allocation
        assert formation_buffer_bytes() == 48 * 64 * 4
    with torch.no_grad():  # the buffer, made outside inference mode, is writable here too
        again_large = large(x_large)
    for got, want in ((got_small, want_small), (got_large, want_large), (again_small, want_small),
                      (again_large, want_large)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert small.cached_bytes == 0 and large.cached_bytes == 0  # no layer keeps an H of its own


def _blocked_from(columns: int, monkeypatch) -> None:
    monkeypatch.setattr(PHMLinear, "path_settings", dataclasses.replace(PHMLinear.path_settings,
                                                                        blocked_min_columns=columns))


def test_wide_block_columns_form_h_one_block_column_at_a_time(fresh_buffers, monkeypatch):
    from hyperplex.layers.functional import formation_buffer_bytes

    layer = _materialized_layer(32, 24, n=4, seed=5)  # d/n = 8
    x = torch.randn(2, 9, 32)
    want = layer(x)  # grad mode: H formed whole, differentiably
    _blocked_from(8, monkeypatch)
    with torch.inference_mode():
        got = layer(x)
    torch.testing.assert_close(got, want)
    assert formation_buffer_bytes() == 24 * 8 * 4  # one k x d/n block column, not the k x d H
    _blocked_from(9, monkeypatch)  # narrower than that: H formed whole
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), want)
    assert formation_buffer_bytes() == 24 * 32 * 4


def test_block_columns_step_aside_under_autocast_and_for_another_input_dtype(fresh_buffers, monkeypatch):
    from hyperplex.layers import functional

    _blocked_from(8, monkeypatch)
    layer = _materialized_layer(32, 24, n=4, seed=6)
    x = torch.randn(2, 9, 32)
    with torch.inference_mode():
        want = layer(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # F.linear on the whole H casts, as before
            got = layer(x)
        with pytest.raises(RuntimeError):  # another input dtype: F.linear's own error, as without block columns
            layer(x.double())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(ValueError, match="autocast"):
            functional.phm_linear_blocked(x, layer.phm_rule, layer.phm_weight)


def test_buffer_is_not_used_where_autograd_records(fresh_buffers):
    from hyperplex.layers.functional import formation_buffer_bytes

    first, second = _materialized_layer(16, 16, seed=3), _materialized_layer(16, 16, seed=4)
    for layer in (first, second):
        layer.requires_grad_(False)  # frozen layers, a gradient for the input only (as adapters train)
    x = torch.randn(6, 16, requires_grad=True)
    y = second(first(x))  # F.linear saves each H for the input's gradient: a shared buffer would be overwritten
    (g,) = torch.autograd.grad(y.sum(), x)
    h1, h2 = first.dense_weight(), second.dense_weight()
    torch.testing.assert_close(g, (torch.ones(6, 16) @ h2 @ h1))
    assert formation_buffer_bytes() == 0


def test_buffer_respects_its_byte_cap_and_threads_do_not_share(fresh_buffers, monkeypatch):
    import gc
    import threading
    import weakref

    from hyperplex.layers import functional
    from hyperplex.layers.functional import formation_buffer, formation_buffer_bytes, release_formation_buffers

    monkeypatch.setattr(functional, "FORMATION_BUFFER_MAX_BYTES", 16 * 16 * 4)
    assert formation_buffer(16 * 16, torch.float32, "cpu") is not None
    assert formation_buffer(16 * 16 + 1, torch.float32, "cpu") is None  # one number over the cap
    assert formation_buffer(16 * 16, torch.float32, "meta") is None  # the CPU only
    mine = formation_buffer(64, torch.float32, "cpu").data_ptr()
    theirs, held = [], []

    def other_thread():
        theirs.append(formation_buffer(64, torch.float32, "cpu").data_ptr())
        held.append(weakref.ref(functional._FORMATION.buffers[torch.float32]))

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    gc.collect()
    assert theirs[0] != mine
    assert held[0]() is None  # a thread's buffer goes with the thread
    assert formation_buffer(8, torch.float64, "cpu").dtype == torch.float64  # one buffer per dtype
    assert formation_buffer_bytes() == 16 * 16 * 4 + 8 * 8
    assert release_formation_buffers() == 16 * 16 * 4 + 8 * 8 and formation_buffer_bytes() == 0
    monkeypatch.setattr(functional, "FORMATION_BUFFER_MAX_BYTES", 0)  # off
    layer = _materialized_layer(16, 16)
    with torch.no_grad():
        layer(torch.randn(3, 16))
    assert formation_buffer_bytes() == 0


def test_materialize_weight_into_a_buffer_checks_what_it_is_given():
    from hyperplex.layers.functional import materialize_weight

    torch.manual_seed(0)
    rule, weight = torch.randn(4, 4, 4), torch.randn(4, 3, 2)
    out = torch.full((12, 8), float("nan"))
    with torch.no_grad():
        got = materialize_weight(rule, weight, out=out)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, sum(torch.kron(rule[i], weight[i]) for i in range(4)))
    with pytest.raises(ValueError, match="no gradient to record"):
        materialize_weight(rule, weight.requires_grad_(True), out=out)
    with torch.no_grad():
        with pytest.raises(ValueError, match="contiguous 12x8"):
            materialize_weight(rule, weight, out=torch.empty(8, 12))
        with pytest.raises(ValueError, match="contiguous 12x8"):
            materialize_weight(rule, weight, out=torch.empty(8, 12).T)


def test_shared_weights_always_forms_h_for_auto_layers_only():
    """``always=True`` (decoding on a GPU) forms H where the rows alone would keep a per-call path, for layers in
    ``auto``; a layer held to a path by its ``forward_mode`` keeps it; all are restored on exit."""
    from hyperplex.layers import shared_weights

    auto = PHMLinear(1024, 1024, 4).eval()
    held = PHMLinear(64, 64, 4, forward_mode="structured").eval()
    with torch.no_grad():
        assert auto.choose_mode(32) in ("structured", "onednn")
        with shared_weights([auto, held], 32, always=True):
            torch.testing.assert_close(auto._shared_weight, auto.dense_weight())
            assert held._shared_weight is None
            x = torch.randn(2, 1024)
            torch.testing.assert_close(auto(x), x @ auto.dense_weight().T + auto.bias)
    assert auto._shared_weight is None and held._shared_weight is None


def _stack_of_layers():
    """Six learned-rule layers in two shapes (a shared rule between two of them), a fixed-rule layer and a low-rank
    one (formed on their own), float64."""
    from hyperplex.layers import PHMRule

    torch.manual_seed(0)
    shared = PHMRule(4, dtype=torch.float64)
    layers = nn.ModuleList([PHMLinear(16, 16, 4, dtype=torch.float64) for _ in range(3)]
                           + [PHMLinear(16, 32, 4, dtype=torch.float64) for _ in range(2)]
                           + [PHMLinear(16, 16, 4, rule=shared, dtype=torch.float64),
                              PHMLinear(16, 16, 4, rule=shared, dtype=torch.float64),
                              PHMLinear(16, 16, 4, rule="quaternion", dtype=torch.float64),
                              PHMLinear(16, 16, 4, factor_rank=2, dtype=torch.float64)])
    return layers


def _run(layers, x, skip=()):
    return sum(layer(x).square().sum() for i, layer in enumerate(layers) if i not in skip)


@pytest.mark.parametrize("skip", [(), (1, 5)], ids=["all_called", "two_not_called"])
def test_shared_weights_together_gives_the_per_layer_gradients(skip):
    """Same-shaped layers form H in one batched product per group; the outputs and every parameter's gradient are
    the per-layer paths', and a layer the step did not call keeps the None gradient it had (layer 5 shares its rule
    with layer 6, which is called, so the shared rule's gradient stays)."""
    from hyperplex.layers import shared_weights

    x = torch.randn(3, 16, dtype=torch.float64)
    layers = _stack_of_layers()
    want_loss = _run(layers, x, skip)
    want_loss.backward()
    want = {name: None if p.grad is None else p.grad.clone() for name, p in layers.named_parameters()}
    layers.zero_grad(set_to_none=True)
    with shared_weights(layers, 0, always=True, together=True):
        assert all(m._shared_weight is not None for m in layers)
        loss = _run(layers, x, skip)
        loss.backward()
    assert all(m._shared_weight is None for m in layers)
    torch.testing.assert_close(loss, want_loss)
    for name, p in layers.named_parameters():
        if want[name] is None:
            assert p.grad is None, f"{name} got a gradient though its layer was not called"
        else:
            torch.testing.assert_close(p.grad, want[name], msg=name)


def test_shared_weights_together_keeps_a_gradient_that_a_layer_outside_the_groups_gave():
    """An uncalled grouped layer's rule, shared with a low-rank layer (formed alone) that was called, keeps the
    gradient the low-rank layer gave it; the uncalled layer's own factors go back to None."""
    from hyperplex.layers import PHMRule, shared_weights

    torch.manual_seed(1)
    shared = PHMRule(4, dtype=torch.float64)
    layers = nn.ModuleList([PHMLinear(16, 16, 4, dtype=torch.float64),  # its own rule: in the group, called
                            PHMLinear(16, 16, 4, rule=shared, dtype=torch.float64),  # in the group, not called
                            PHMLinear(16, 16, 4, rule=shared, factor_rank=2, dtype=torch.float64)])
    x = torch.randn(3, 16, dtype=torch.float64)
    _run(layers, x, skip=(1,)).backward()
    want = shared.phm_rule.grad.clone()
    layers.zero_grad(set_to_none=True)
    with shared_weights(layers, 0, always=True, together=True):
        _run(layers, x, skip=(1,)).backward()
    torch.testing.assert_close(shared.phm_rule.grad, want)
    assert layers[1].phm_weight.grad is None and layers[0].phm_weight.grad is not None


def test_shared_weights_together_forms_same_shaped_layers_in_one_product(monkeypatch):
    from hyperplex.layers import functional, phm, shared_weights

    calls = []
    real = functional.materialize_weights
    monkeypatch.setattr(phm, "materialize_weights", lambda r, w: calls.append(tuple(w.shape)) or real(r, w))
    layers = _stack_of_layers()
    with shared_weights(layers, 0, always=True, together=True):
        pass
    # the five 16×16 learned-rule layers (two with the shared rule) in one product, the two 16×32 in another; the
    # fixed-rule and low-rank layers formed alone
    assert sorted(calls) == [(2, 4, 8, 4), (5, 4, 4, 4)]


def test_training_step_weights_batches_on_cuda_only(monkeypatch):
    """On the CPU each layer keeps its own path; on CUDA (the model's device) same-shaped layers form together."""
    from hyperplex.layers import phm, training_step_weights

    layers = _stack_of_layers()
    with training_step_weights(layers):
        assert all(m._shared_weight is None for m in layers)
    seen = []
    monkeypatch.setattr(phm, "shared_weights",
                        lambda model, rows, **kw: seen.append(kw) or contextlib.nullcontext())
    on_cuda = type("P", (), {"device": torch.device("cuda")})()  # reports CUDA; no GPU needed to ask the question
    monkeypatch.setattr(nn.ModuleList, "parameters", lambda self, recurse=True: iter([on_cuda]))
    with training_step_weights(layers):
        pass
    assert seen == [{"always": True, "together": True}]


@pytest.mark.parametrize("k,d,n", [(48, 64, 16), (8, 4, 4), (4, 4, 4)])
def test_kronecker_decompose_of_tiny_blocks_is_exact_with_trainable_spare_terms(k, d, n):
    """(k/n)·(d/n) < n: the rearranged matrix has fewer singular values than terms. The fit is exact with those;
    each spare term is a random rule times a zero block, so H is unchanged and its gradient still reaches them."""
    torch.manual_seed(0)
    W = torch.randn(k, d, dtype=torch.float64)
    rule, weight, error = kronecker_decompose(W, n)
    assert rule.shape == (n, n, n) and weight.shape == (n, k // n, d // n) and error == pytest.approx(0.0, abs=1e-12)
    H = sum(torch.kron(rule[i], weight[i]) for i in range(n))
    torch.testing.assert_close(H, W)
    spare = (k // n) * (d // n)
    assert spare < n and torch.all(weight[spare:] == 0) and torch.all(rule[spare:].flatten(1).norm(dim=1) > 0)


@pytest.mark.parametrize("sizes", [(0, 8), (8.0, 8), (-8, 8), ("8", 8), (8, True)])
def test_sizes_that_are_not_positive_integers_are_refused_by_name(sizes):
    from hyperplex import LowRankLinear

    name = "in_features" if sizes[1] == 8 and not isinstance(sizes[1], bool) else "out_features"
    with pytest.raises(ValueError, match=f"{name} must be a positive integer"):
        PHMLinear(*sizes, 2)
    with pytest.raises(ValueError, match=f"{name} must be a positive integer"):
        LowRankLinear(*sizes, 2)
    import numpy as np

    assert PHMLinear(np.int64(8), 8, 2).in_features == 8  # any integer type is a size


def test_a_rule_with_nan_or_inf_is_refused():
    bad = torch.ones(2, 2, 2)
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="rule tensor holds NaN or infinite"):
        PHMLinear(8, 8, 2, rule=bad)
    with pytest.raises(ValueError, match="rule_init tensor holds NaN or infinite"):
        PHMLinear(8, 8, 2, rule_init=torch.full((2, 2, 2), float("inf")))


def test_a_zero_dimensional_input_is_refused_with_the_expected_dimension():
    with pytest.raises(ValueError, match=r"expected input with last dimension 8, got shape \(\)"):
        PHMLinear(8, 8, 2)(torch.tensor(1.0))
