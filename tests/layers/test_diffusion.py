"""Appendix A (weight diffusion) expresses the same H as the Kronecker form."""

import pytest
import torch

from hyperplex import DiffusionPHMLinear, PHMLinear, phm_parameter_count


@pytest.mark.parametrize("n,rule", [(1, "learned"), (2, "learned"), (4, "learned"), (4, "quaternion"), (8, "learned")])
def test_from_phm_expresses_the_same_matrix(n, rule):
    torch.manual_seed(n)
    phm = PHMLinear(16, 24, n, rule=rule, dtype=torch.float64)
    diff = DiffusionPHMLinear.from_phm(phm)
    torch.testing.assert_close(diff.dense_weight(), phm.dense_weight())
    x = torch.randn(3, 16, dtype=torch.float64)
    torch.testing.assert_close(diff(x), phm(x))
    back = diff.to_phm()
    torch.testing.assert_close(back.dense_weight(), phm.dense_weight())


def test_eq_a2_column_is_flattened_product():
    """Column j of group i of H is ψ(B_i T_j), the row-major flattening of B_i T_j (eq. A.2)."""
    torch.manual_seed(0)
    layer = DiffusionPHMLinear(6, 8, 2, dtype=torch.float64)  # d/n = 3, k/n = 4
    H = layer.dense_weight()
    for i in range(2):
        for j in range(3):
            expected = (layer.diffusion[i] @ layer.blocks[j]).reshape(-1)
            torch.testing.assert_close(H[:, i * 3 + j], expected)


def test_same_parameter_count_as_learned_phm():
    layer = DiffusionPHMLinear(32, 16, 4)
    assert sum(p.numel() for p in layer.parameters()) == phm_parameter_count(32, 16, 4) == 32 * 16 // 4 + 64 + 16


def test_rejects_sizes_not_divisible():
    with pytest.raises(ValueError, match="must divide both"):
        DiffusionPHMLinear(30, 16, 4)
