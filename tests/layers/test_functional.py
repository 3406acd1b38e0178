"""Functional kernels: materialisation and the structured path against Σ kron."""

import pytest
import torch

from hyperplex.algebra import cayley_dickson_rule
from hyperplex.layers.functional import (
    materialize_weight, phm_linear, phm_linear_reference, phm_linear_structured, signed_permutation,
)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_materialize_equals_kron_sum(n):
    torch.manual_seed(n)
    rule, weight = torch.randn(n, n, n, dtype=torch.float64), torch.randn(n, 3, 5, dtype=torch.float64)
    H = sum(torch.kron(rule[i], weight[i]) for i in range(n))
    torch.testing.assert_close(materialize_weight(rule, weight), H)


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


def test_phm_linear_modes_and_error():
    rule, weight = torch.randn(2, 2, 2), torch.randn(2, 3, 4)
    x = torch.randn(5, 8)
    torch.testing.assert_close(phm_linear(x, rule, weight, mode="structured"), phm_linear(x, rule, weight))
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        phm_linear(x, rule, weight, mode="fast")
