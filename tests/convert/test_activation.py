"""Activation-aware fitting: the Gram factor, the output error it measures, and refinement that lowers it."""

import pytest
import torch
from torch import nn

from hyperplex.convert import convert_linears
from hyperplex.convert.activation import RIDGE, capture_inputs, refine, relative_output_error
from hyperplex.layers import PHMLinear


def test_capture_inputs_factor_reproduces_the_gram_matrix():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 4))
    batches = [torch.randn(5, 8), torch.randn(2, 3, 8)]
    factors = capture_inputs(m, {"0": m[0], "2": m[2]}, lambda model: [model(b) for b in batches])
    X = torch.cat([b.reshape(-1, 8) for b in batches]).double()
    torch.testing.assert_close(factors["0"] @ factors["0"].T, X.T @ X)
    hidden = torch.relu(m[0](X.float())).double()
    torch.testing.assert_close(factors["2"] @ factors["2"].T, hidden.T @ hidden, rtol=1e-5, atol=1e-5)
    # the output error through F equals the error on the inputs themselves
    W, H = m[0].weight.detach(), torch.randn(6, 8)
    direct = torch.linalg.norm(X @ (W.double() - H.double()).T) / torch.linalg.norm(X @ W.T.double())
    assert relative_output_error(W, H, factors["0"]) == pytest.approx(float(direct), rel=1e-9)
    assert not m[0]._forward_pre_hooks  # hooks removed


def test_refine_lowers_output_error_on_low_dimensional_inputs():
    torch.manual_seed(0)
    dense = nn.Linear(16, 16)
    basis = torch.randn(3, 16)  # inputs live in a 3-dimensional subspace: the SVD fit ignores that
    X = torch.randn(200, 3) @ basis
    factors = capture_inputs(dense, {"d": dense}, lambda m: m(X))
    layer, _ = PHMLinear.from_linear(dense, 2)
    start = relative_output_error(dense.weight, layer.dense_weight(), factors["d"])
    before, after = refine(layer, dense.weight.detach(), factors["d"], steps=120)
    assert before == pytest.approx(start, rel=1e-5)
    assert after < 0.5 * before
    assert after == pytest.approx(relative_output_error(dense.weight, layer.dense_weight(), factors["d"]), rel=1e-6)
    torch.testing.assert_close(layer.bias, dense.bias)


def test_convert_linears_activation_init_reports_both_errors():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 16))
    X = torch.randn(64, 4) @ torch.randn(4, 16)
    plain = convert_linears(_copy(m), "phm", n=2, min_features=1, calibrate=lambda model: model(X))
    fitted = convert_linears(_copy(m), "phm", n=2, min_features=1, init="activation", calibrate=lambda model: model(X),
                             refine_steps=40)
    for a, b in zip(plain.converted, fitted.converted):
        assert b.output_error_svd == pytest.approx(a.output_error, rel=1e-5)
        assert b.output_error <= b.output_error_svd
    assert fitted.mean_output_error < plain.mean_output_error
    assert "mean output error" in str(fitted)


@pytest.mark.parametrize("kind", ["phm", "lowrank"])
def test_convert_linears_whitened_inits_lower_the_output_error(kind):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 16))
    X = torch.randn(256, 16) @ (torch.randn(16, 16) * torch.logspace(0, -2, 16)[:, None])  # correlated inputs
    run = lambda model: model(X)  # noqa: E731
    plain = convert_linears(_copy(m), kind, n=2, min_features=1, calibrate=run)
    whitened_model = _copy(m)
    whitened = convert_linears(whitened_model, kind, n=2, min_features=1, init="whitened", calibrate=run)
    als = convert_linears(_copy(m), kind, n=2, min_features=1, init="whitened_als", calibrate=run, als_sweeps=3)
    for a, b, c in zip(plain.converted, whitened.converted, als.converted):
        assert b.output_error_svd == pytest.approx(a.output_error, rel=1e-5)
        assert b.output_error <= a.output_error + 1e-6
        assert c.output_error <= b.output_error + 1e-6
        assert (b.rank, b.params_after) == (a.rank, a.params_after)  # same structure as the SVD start
    if kind == "lowrank":  # the whitened SVD is already the optimum: ALS has nothing to add
        assert [r.output_error for r in als.converted] == pytest.approx([r.output_error for r in whitened.converted])
    assert whitened.mean_output_error < plain.mean_output_error
    torch.testing.assert_close(whitened_model[0].bias, m[0].bias)
    assert type(whitened_model[0]).__name__ == ("PHMLinear" if kind == "phm" else "LowRankLinear")


@pytest.mark.parametrize("init", ["whitened", "whitened_als"])
def test_whitened_inits_need_calibration_and_change_nothing_without_it(init):
    m = nn.Sequential(nn.Linear(16, 16))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(ValueError, match=f"init='{init}' needs calibrate="):
        convert_linears(m, "phm", n=2, min_features=1, init=init)
    with pytest.raises(ValueError, match="als_sweeps must be a non-negative integer"):
        convert_linears(m, "phm", n=2, min_features=1, init=init, calibrate=lambda model: model(torch.randn(4, 16)),
                        als_sweeps=-1)
    with pytest.raises(ValueError, match="ridge must be ≥ 0"):
        convert_linears(m, "phm", n=2, min_features=1, init=init, calibrate=lambda model: model(torch.randn(4, 16)),
                        ridge=-1.0)
    assert isinstance(m[0], nn.Linear)
    for k, v in m.state_dict().items():
        torch.testing.assert_close(v, before[k])


@pytest.mark.parametrize("kind", ["phm", "lowrank"])
def test_whitened_ridge_defaults_per_kind_and_changes_the_fit(kind):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 16))
    X = torch.randn(64, 16) @ (torch.randn(16, 16) * torch.logspace(0, -3, 16)[:, None])
    run = lambda model: model(X)  # noqa: E731
    default, explicit, other = _copy(m), _copy(m), _copy(m)
    convert_linears(default, kind, n=2, min_features=1, init="whitened_als", calibrate=run)
    convert_linears(explicit, kind, n=2, min_features=1, init="whitened_als", calibrate=run, ridge=RIDGE[kind])
    convert_linears(other, kind, n=2, min_features=1, init="whitened_als", calibrate=run, ridge=10.0)
    torch.testing.assert_close(default[0].dense_weight(), explicit[0].dense_weight())
    assert not torch.allclose(default[0].dense_weight(), other[0].dense_weight())


def _copy(m):
    import copy
    return copy.deepcopy(m)


def test_whitened_lowrank_layer_needs_a_rank():
    from hyperplex.convert.activation import whitened_layer

    with pytest.raises(ValueError, match="needs a rank"):
        whitened_layer(nn.Linear(8, 8), "lowrank", 2, None, "learned", torch.randn(8, 16))
