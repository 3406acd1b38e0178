"""Activation-aware (whitened) conversions: each fit minimises the output error ‖(W − M) Xᵀ‖_F on inputs X."""

import pytest
import torch
from torch import nn

from hyperplex.layers.conversion import (
    kronecker_als,
    kronecker_decompose,
    kronecker_decompose_whitened,
    kronecker_factor_gram,
    lowrank_from_linear_whitened,
    lowrank_whitened,
    phm_from_linear,
    phm_from_linear_whitened,
)

D = torch.float64


def _kron_sum(rule, blocks):
    return sum(torch.kron(rule[i], blocks[i]) for i in range(rule.shape[0]))


def _inputs(rows, d, seed=0):
    """Inputs with a correlated, far-from-identity covariance (mixing matrix with a decaying spectrum)."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(d, d, generator=g, dtype=D) * torch.logspace(0, -2, d, dtype=D)[:, None]
    return torch.randn(rows, d, generator=g, dtype=D) @ mix


def _error(W, M, X):
    W, M = W.detach(), M.detach()
    return float(torch.linalg.norm((W - M) @ X.T) / torch.linalg.norm(W @ X.T))


# ------------------------------------------------------------------------------------------- low-rank
def test_lowrank_whitened_is_the_closed_form_optimum_and_beats_svd_and_every_candidate():
    torch.manual_seed(0)
    W, X, rank = torch.randn(24, 16, dtype=D), _inputs(300, 16), 5
    G = X.T @ X
    L, R, error = lowrank_whitened(W, G, rank, ridge=0.0)
    assert L.shape == (24, rank) and R.shape == (rank, 16)
    ours = _error(W, L @ R, X)
    # theory: with G = S Sᵀ, the error is the discarded singular values of W S
    sigma = torch.linalg.svdvals(W @ torch.linalg.cholesky(G))
    theory = float((sigma[rank:].square().sum() / sigma.square().sum()).sqrt())
    assert ours == pytest.approx(theory, rel=1e-9) and error == pytest.approx(theory, rel=1e-9)
    P, s, Qh = torch.linalg.svd(W)
    plain = _error(W, (P[:, :rank] * s[:rank]) @ Qh[:rank], X)
    assert ours < plain
    for scale in (1e-3, 1e-1, 1.0):  # random rank-r candidates, near the optimum and far from it
        for _ in range(10):
            candidate = (L + scale * torch.randn_like(L)) @ (R + scale * torch.randn_like(R))
            assert ours <= _error(W, candidate, X) + 1e-12
    # each rank-one term is balanced: equal norms of L's column and R's row
    torch.testing.assert_close(L.norm(dim=0), R.norm(dim=1))


def test_lowrank_whitened_with_identity_gram_is_the_truncated_svd():
    W = torch.randn(12, 20, dtype=D)
    L, R, error = lowrank_whitened(W, 3.0 * torch.eye(20, dtype=D), 4, ridge=0.0)
    P, s, Qh = torch.linalg.svd(W, full_matrices=False)
    torch.testing.assert_close(L @ R, (P[:, :4] * s[:4]) @ Qh[:4])
    assert error == pytest.approx(float((s[4:].square().sum() / s.square().sum()).sqrt()), rel=1e-9)


def test_lowrank_whitened_needs_a_ridge_for_rank_deficient_inputs():
    W, X = torch.randn(8, 16, dtype=D), torch.randn(5, 16, dtype=D)  # 5 rows span 5 of 16 directions
    with pytest.raises(ValueError, match="not positive definite.*ridge"):
        lowrank_whitened(W, X.T @ X, 3, ridge=0.0)
    U, V, _ = lowrank_whitened(W, X.T @ X, 3, ridge=1e-6)
    assert torch.isfinite(U).all() and torch.isfinite(V).all()
    with pytest.raises(ValueError, match=r"Gram matrix must be \(16, 16\)"):
        lowrank_whitened(W, torch.eye(8, dtype=D), 3)


def test_lowrank_from_linear_whitened_keeps_dtype_and_bias():
    torch.manual_seed(0)
    dense = nn.Linear(16, 12)
    X = _inputs(100, 16).float()
    layer, error = lowrank_from_linear_whitened(dense, 4, (X.T @ X).double(), ridge=0.0)
    assert layer.left.dtype == torch.float32 and layer.rank == 4
    torch.testing.assert_close(layer.bias, dense.bias)
    assert _error(dense.weight.double(), layer.dense_weight().double(), X.double()) == pytest.approx(error, rel=1e-4)


# ------------------------------------------------------------------------------------------- Kronecker
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_phm_whitened_is_never_worse_than_svd_on_correlated_inputs(n, seed):
    torch.manual_seed(seed)
    dense = nn.Linear(24, 16).double()
    W, X = dense.weight.detach(), _inputs(400, 24, seed=seed)
    rule, blocks, error = kronecker_decompose_whitened(W, X.T @ X, n, ridge=0.0)
    assert rule.shape == (n, n, n) and blocks.shape == (n, 16 // n, 24 // n)
    assert _error(W, _kron_sum(rule, blocks), X) == pytest.approx(error, rel=1e-9)
    layer, chosen = phm_from_linear_whitened(dense, n, X.T @ X, ridge=0.0)
    svd_rule, svd_blocks, _ = kronecker_decompose(W, n)
    plain = _error(W, _kron_sum(svd_rule, svd_blocks), X)
    assert chosen == pytest.approx(min(error, plain), rel=1e-9)
    assert _error(W, layer.dense_weight().detach(), X) == pytest.approx(chosen, rel=1e-9)


def test_kronecker_whitened_beats_svd_when_the_covariance_is_kronecker_like():
    torch.manual_seed(0)
    W = torch.randn(16, 24, dtype=D)
    G = torch.kron(_spd(4, 1), _spd(6, 2)) + 0.05 * _spd(24, 3)  # a product plus a little of something else
    rule, blocks, error = kronecker_decompose_whitened(W, G, 4, ridge=0.0)
    svd_rule, svd_blocks, _ = kronecker_decompose(W, 4)
    E = W - _kron_sum(svd_rule, svd_blocks)
    assert error < float(((E @ G * E).sum() / (W @ G * W).sum()).sqrt())


def test_kronecker_whitened_with_identity_gram_is_the_svd_start():
    W = torch.randn(12, 8, dtype=D)
    rule, blocks, _ = kronecker_decompose_whitened(W, 5.0 * torch.eye(8, dtype=D), 2, ridge=0.0)
    svd_rule, svd_blocks, _ = kronecker_decompose(W, 2)
    torch.testing.assert_close(_kron_sum(rule, blocks), _kron_sum(svd_rule, svd_blocks))
    torch.testing.assert_close(rule, svd_rule)  # same SVD, same balanced split
    torch.testing.assert_close(blocks, svd_blocks)


def _spd(size, seed):
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(size, size, generator=g, dtype=D)
    return m @ m.T + 0.1 * torch.eye(size, dtype=D)


def test_kronecker_factor_gram_recovers_an_exact_product():
    G1, G2 = _spd(3, 1), _spd(4, 2)
    F1, F2 = kronecker_factor_gram(torch.kron(G1, G2), 3)
    torch.testing.assert_close(torch.kron(F1, F2), torch.kron(G1, G2))
    assert float(F1.trace()) == pytest.approx(3.0)
    assert torch.linalg.eigvalsh(F1).min() > 0 and torch.linalg.eigvalsh(F2).min() > 0
    torch.testing.assert_close(F1, F1.T)


def test_kronecker_whitened_is_optimal_when_the_gram_is_a_kronecker_product():
    torch.manual_seed(0)
    n, W = 2, torch.randn(8, 12, dtype=D)
    G = torch.kron(_spd(2, 3), _spd(6, 4))
    rule, blocks, error = kronecker_decompose_whitened(W, G, n, ridge=0.0)
    # ALS from the whitened start finds nothing better ...
    _, _, history = kronecker_als(W, G, rule, blocks, sweeps=5)
    assert min(history) == pytest.approx(error, rel=1e-8)
    # ... and ALS from the SVD start and from random starts converges to no better value
    starts = [kronecker_decompose(W, n)[:2]] + [(torch.randn(n, n, n, dtype=D), torch.randn(n, 4, 6, dtype=D))
                                                for _ in range(2)]
    for start in starts:
        _, _, history = kronecker_als(W, G, *start, sweeps=25)
        assert min(history) >= error * (1 - 1e-8)


# ------------------------------------------------------------------------------------------- ALS
def test_als_is_monotone_and_improves_on_the_whitened_start():
    torch.manual_seed(0)
    W, X = torch.randn(16, 24, dtype=D), _inputs(400, 24, seed=7)
    G = X.T @ X
    rule, blocks, start = kronecker_decompose_whitened(W, G, 4, ridge=0.0)
    rule2, blocks2, history = kronecker_als(W, G, rule, blocks, sweeps=6)
    assert len(history) == 1 + 2 * 6
    assert history[0] == pytest.approx(start, rel=1e-9)
    assert all(b <= a * (1 + 1e-10) for a, b in zip(history, history[1:]))
    assert history[-1] < start
    assert _error(W, _kron_sum(rule2, blocks2), X) == pytest.approx(min(history), rel=1e-9)
    torch.testing.assert_close(rule2.flatten(1).norm(dim=1), blocks2.flatten(1).norm(dim=1))


def _brute_force_blocks(W, G, rule):
    """min over the Sᵢ of tr((W − H) G (W − H)ᵀ) by forming the full design matrix (tiny sizes only)."""
    n = rule.shape[0]
    k, d = W.shape
    R = torch.linalg.cholesky(G)
    columns = []
    for i in range(n):
        for q in range(k // n):
            for j in range(d // n):
                basis = torch.zeros(n, k // n, d // n, dtype=D)
                basis[i, q, j] = 1.0
                columns.append((_kron_sum(rule, basis) @ R).reshape(-1))
    design = torch.stack(columns, dim=1)
    return torch.linalg.lstsq(design, (W @ R).reshape(-1, 1)).solution.reshape(n, k // n, d // n)


def test_als_block_step_matches_the_brute_force_least_squares():
    torch.manual_seed(1)
    W, G = torch.randn(6, 4, dtype=D), _spd(4, 5)
    rule = torch.randn(2, 2, 2, dtype=D)
    _, blocks, _ = kronecker_als(W, G, rule, torch.zeros(2, 3, 2, dtype=D), sweeps=1, update_rule=False)
    torch.testing.assert_close(blocks, _brute_force_blocks(W, G, rule))


def test_phm_whitened_fixed_rule_keeps_the_rule_and_solves_the_blocks_exactly():
    torch.manual_seed(2)
    dense = nn.Linear(8, 12).double()
    X = _inputs(60, 8, seed=3)
    layer, error = phm_from_linear_whitened(dense, 4, X.T @ X, rule="quaternion", ridge=0.0)
    plain, _ = phm_from_linear(dense, 4, rule="quaternion")
    torch.testing.assert_close(layer.phm_rule, plain.phm_rule)
    expected = _brute_force_blocks(dense.weight.detach(), X.T @ X, layer.phm_rule.double())
    torch.testing.assert_close(layer.phm_weight.detach(), expected)
    assert _error(dense.weight.detach(), layer.dense_weight().detach(), X) == pytest.approx(error, rel=1e-8)
    torch.testing.assert_close(layer.bias, dense.bias)


def test_phm_from_linear_whitened_als_beats_whitened_and_n1_is_exact():
    torch.manual_seed(3)
    dense = nn.Linear(24, 16)
    X = _inputs(300, 24, seed=4).float()
    G = (X.T @ X).double()
    whitened, e1 = phm_from_linear_whitened(dense, 2, G, ridge=0.0)
    als, e2 = phm_from_linear_whitened(dense, 2, G, als_sweeps=3, ridge=0.0)
    assert whitened.phm_weight.dtype == torch.float32 and e2 < e1
    W = dense.weight.double()
    assert _error(W, als.dense_weight().double(), X.double()) == pytest.approx(e2, rel=1e-4)
    torch.testing.assert_close(als.bias, dense.bias)
    one, error = phm_from_linear_whitened(dense, 1, G)
    assert error == 0.0
    torch.testing.assert_close(one.dense_weight(), dense.weight)
