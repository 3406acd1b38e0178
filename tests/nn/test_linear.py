import pytest
import torch
from torch import nn

from hyperplex.layers import LowRankLinear, PHMLinear, lowrank_parameter_count, phm_parameter_count
from hyperplex.nn import LinearSpec, make_linear


def count(m):
    return sum(p.numel() for p in m.parameters())


def test_dense_is_nn_linear():
    layer = make_linear(8, 12, LinearSpec("dense"))
    assert type(layer) is nn.Linear and count(layer) == 8 * 12 + 12


@pytest.mark.parametrize("n", [1, 2, 4])
def test_phm_counts(n):
    layer = make_linear(8, 12, LinearSpec("phm", n=n))
    assert isinstance(layer, PHMLinear) and count(layer) == phm_parameter_count(8, 12, n)


def test_quaternion_uses_fixed_hamilton_rule():
    layer = make_linear(8, 12, LinearSpec("quaternion", n=7))  # n ignored for quaternion
    assert layer.n == 4 and not layer.rule_is_learned
    x = torch.randn(3, 8)
    torch.testing.assert_close(layer(x), x @ layer.dense_weight().T + layer.bias)


def test_lowrank_budget_not_above_phm():
    layer = make_linear(16, 16, LinearSpec("lowrank", n=4))
    assert isinstance(layer, LowRankLinear)
    assert count(layer) == lowrank_parameter_count(16, 16, layer.rank) <= phm_parameter_count(16, 16, 4)


def test_bad_spec_errors():
    with pytest.raises(ValueError, match="unknown linear kind 'conv'"):
        LinearSpec("conv")
    with pytest.raises(ValueError, match="positive integer"):
        LinearSpec("phm", n=0)
    with pytest.raises(ValueError, match="n=4 does not divide size 10 in encoder"):
        LinearSpec("phm", n=4).check_divides(8, 10, where="encoder")
    LinearSpec("dense", n=4).check_divides(10)  # dense never complains
