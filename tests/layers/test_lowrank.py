"""The low-rank (SVD) baseline."""

import pytest
import torch
from torch import nn

from hyperplex import LowRankLinear, matching_rank, phm_parameter_count
from hyperplex.layers import lowrank_parameter_count


def test_forward_equals_dense_weight_and_param_count():
    layer = LowRankLinear(32, 16, 5)
    x = torch.randn(4, 32)
    torch.testing.assert_close(layer(x), x @ layer.dense_weight().T + layer.bias)
    assert sum(p.numel() for p in layer.parameters()) == lowrank_parameter_count(32, 16, 5) == 5 * 48 + 16


def test_from_linear_exact_on_low_rank_and_optimal():
    torch.manual_seed(0)
    dense = nn.Linear(20, 12, dtype=torch.float64)
    with torch.no_grad():
        dense.weight.copy_(torch.randn(12, 3, dtype=torch.float64) @ torch.randn(3, 20, dtype=torch.float64))
    layer, error = LowRankLinear.from_linear(dense, 3)
    assert error < 1e-12
    torch.testing.assert_close(layer.to_linear().weight, dense.weight)
    dense2 = nn.Linear(20, 12, dtype=torch.float64)
    layer2, error2 = LowRankLinear.from_linear(dense2, 4)
    W = dense2.weight.detach()
    assert error2 == pytest.approx((torch.linalg.norm(W - layer2.dense_weight()) / torch.linalg.norm(W)).item(),
                                   rel=1e-9)
    s = torch.linalg.svdvals(W)
    assert error2 == pytest.approx((s[4:].square().sum() / s.square().sum()).sqrt().item(), rel=1e-9)


@pytest.mark.parametrize("d,k,n", [(512, 512, 2), (512, 2048, 4), (300, 300, 5), (128, 128, 8)])
def test_matching_rank_never_exceeds_phm_budget(d, k, n):
    r = matching_rank(d, k, n)
    budget = phm_parameter_count(d, k, n)
    assert lowrank_parameter_count(d, k, r) <= budget < lowrank_parameter_count(d, k, r + 1)


def test_init_variance_matches_dense():
    torch.manual_seed(0)
    v = sum(LowRankLinear(64, 32, 8).dense_weight().detach().square().mean().item() for _ in range(200)) / 200
    assert v == pytest.approx(1 / (3 * 64), rel=0.1)


def test_bad_rank():
    with pytest.raises(ValueError, match="positive integer"):
        LowRankLinear(8, 8, 0)
    with pytest.raises(ValueError, match="exceeds min"):
        LowRankLinear(8, 4, 5)


@pytest.mark.parametrize("d,k,n,floor,nearest", [(128, 512, 8, 13, 14), (128, 512, 4, 25, 26), (128, 384, 8, 13, 13),
                                                 (512, 512, 4, 64, 64)])
def test_matching_rank_nearest_is_closest_to_phm_budget(d, k, n, floor, nearest):
    # 128→512 at n=8: PHM has 8³ + 128·512/8 = 8,704 weights; rank 13 = 8,320, rank 14 = 8,960 (closer)
    assert matching_rank(d, k, n) == floor
    r = matching_rank(d, k, n, rounding="nearest")
    assert r == nearest
    budget = phm_parameter_count(d, k, n, bias=False)
    assert all(abs(lowrank_parameter_count(d, k, r, bias=False) - budget)
               <= abs(lowrank_parameter_count(d, k, other, bias=False) - budget) for other in (r - 1, r + 1))
    with pytest.raises(ValueError, match="floor or nearest"):
        matching_rank(d, k, n, rounding="round")


def test_a_matched_rank_never_exceeds_a_dense_layers_rank():
    """On a small layer PHM n = 16's budget buys more than full rank (16³ rule weights); the rank stops there."""
    assert phm_parameter_count(32, 32, 16) > lowrank_parameter_count(32, 32, 32)
    assert matching_rank(32, 32, 16) == matching_rank(32, 32, 16, rounding="nearest") == 32
    LowRankLinear(32, 32, matching_rank(32, 32, 16))  # a rank the layer accepts
