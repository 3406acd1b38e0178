"""Every conversion between dense weights and the factorised layers, in one module.

- :func:`kronecker_decompose`: the best ``n``-term Kronecker sum of a matrix (Van Loan–Pitsianis).
- :func:`phm_from_linear` / :func:`lowrank_from_linear`: a dense layer → ``PHMLinear`` /
  ``LowRankLinear`` (behind ``PHMLinear.from_linear`` and ``LowRankLinear.from_linear``).
- :func:`to_linear`: any of them → ``nn.Linear`` computing the same function (behind ``to_linear()``).
- :func:`copy_into_like`: a dense weight into a layer of the same kind as a given one (how
  ``PHMLSTM.from_lstm`` converts each gate matrix).

Model-level conversion (walking a model, names, reports, saving) is :mod:`hyperplex.convert`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from hyperplex.layers.lowrank import LowRankLinear
from hyperplex.layers.phm import PHMLinear, RuleSpec

__all__ = ["kronecker_decompose", "phm_from_linear", "lowrank_from_linear", "to_linear", "linear_from",
           "dense_weight", "copy_into_like"]


def _rearrange(matrix: Tensor, n: int) -> Tensor:
    """Van Loan–Pitsianis rearrangement (float64): ``R[(a, c), (q, j)] = H[a·k/n + q, c·d/n + j]``."""
    k_n, d_n = matrix.shape[0] // n, matrix.shape[1] // n
    return matrix.detach().double().reshape(n, k_n, n, d_n).permute(0, 2, 1, 3).reshape(n * n, k_n * d_n)


def kronecker_decompose(matrix: Tensor, n: int) -> tuple[Tensor, Tensor, float]:
    """Best ``n``-term Kronecker-sum approximation ``matrix ≈ Σᵢ Aᵢ ⊗ Sᵢ`` (Van Loan & Pitsianis 1993).

    Rearranging ``H`` (k × d) into ``R`` (n² × k·d/n²) with ``R[(a, c), (q, j)] = H[a·k/n + q, c·d/n + j]``
    turns a Kronecker sum into a sum of rank-one terms ``vec(Aᵢ) vec(Sᵢ)ᵀ``, so by Eckart–Young the
    truncated SVD of ``R`` is optimal in Frobenius norm. Singular values are split evenly
    (``√σ`` to each factor). Returns ``rule (n, n, n)``, ``weight (n, k/n, d/n)`` and the relative
    error ``‖H − Ĥ‖_F / ‖H‖_F`` (computed from the discarded singular values).
    """
    k_n, d_n = matrix.shape[0] // n, matrix.shape[1] // n
    R = _rearrange(matrix, n)
    U, sigma, Vh = torch.linalg.svd(R, full_matrices=False)
    root = sigma[:n].sqrt()
    rule = (U[:, :n] * root).T.reshape(n, n, n)  # rule[i, a, c]
    weight = (Vh[:n] * root[:, None]).reshape(n, k_n, d_n)
    total = sigma.square().sum()
    error = float((sigma[n:].square().sum() / total).sqrt()) if total > 0 else 0.0
    return rule, weight, error


def phm_from_linear(linear: nn.Linear, n: int, rule: RuleSpec = "learned", **kwargs) -> tuple[PHMLinear, float]:
    """Convert a dense layer; returns ``(layer, relative_error)`` with ``relative_error = ‖W − H‖_F / ‖W‖_F``.

    A learned rule gets the best ``n``-term Kronecker sum (:func:`kronecker_decompose`, exact when
    ``W`` is such a sum); a fixed rule gets the least-squares ``Sᵢ`` for that rule. The bias is copied.
    """
    W = linear.weight.detach()
    layer = PHMLinear(linear.in_features, linear.out_features, n, bias=linear.bias is not None, rule=rule,
                      device=W.device, dtype=W.dtype, **kwargs)
    k_n, d_n = layer.out_features // n, layer.in_features // n
    with torch.no_grad():
        if n == 1:
            layer.phm_weight.copy_(W.view(1, k_n, d_n))
            error = 0.0
        elif layer.rule_is_learned:
            rule_t, weight, error = kronecker_decompose(W, n)
            layer.phm_rule.copy_(rule_t)
            layer.phm_weight.copy_(weight)
        else:  # min ‖R − vec(A) Sᵀ‖ over S for the fixed rule: S = A⁺ R
            R = _rearrange(W, n)
            A = layer.phm_rule.double().permute(1, 2, 0).reshape(n * n, n)  # columns vec(Aᵢ)
            S = torch.linalg.lstsq(A, R).solution
            layer.phm_weight.copy_(S.reshape(n, k_n, d_n))
            error = float(torch.linalg.norm(R - A @ S) / torch.linalg.norm(R).clamp_min(1e-300))
        if layer.bias is not None:
            layer.bias.copy_(linear.bias.detach())
    layer.invalidate_cache()
    return layer, error


def lowrank_from_linear(linear: nn.Linear, rank: int) -> tuple[LowRankLinear, float]:
    """Truncated SVD of the dense weight (optimal by Eckart–Young); returns ``(layer, ‖W − UV‖_F / ‖W‖_F)``."""
    W = linear.weight.detach()
    layer = LowRankLinear(linear.in_features, linear.out_features, rank, bias=linear.bias is not None,
                          device=W.device, dtype=W.dtype)
    U, sigma, Vh = torch.linalg.svd(W.double(), full_matrices=False)
    root = sigma[:rank].sqrt()
    with torch.no_grad():
        layer.left.copy_(U[:, :rank] * root)
        layer.right.copy_(root[:, None] * Vh[:rank])
        if layer.bias is not None:
            layer.bias.copy_(linear.bias.detach())
    total = sigma.square().sum()
    error = float((sigma[rank:].square().sum() / total).sqrt()) if total > 0 else 0.0
    return layer, error


def dense_weight(layer: nn.Module) -> Tensor:
    """The ``(out, in)`` matrix a linear-like layer applies (detached): ``W``, ``H`` or ``U V``."""
    return layer.weight.detach() if isinstance(layer, nn.Linear) else layer.dense_weight().detach()


def linear_from(weight: Tensor, bias: Tensor | None) -> nn.Linear:
    """An ``nn.Linear`` holding copies of ``weight`` ``(out, in)`` and ``bias``, on their device and dtype."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device,
                       dtype=weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)
    return linear


def to_linear(layer: nn.Module) -> nn.Linear:
    """An ``nn.Linear`` computing the same function as ``layer`` (``PHMLinear``, ``LowRankLinear`` or ``nn.Linear``)."""
    return linear_from(dense_weight(layer), None if layer.bias is None else layer.bias.detach())


def copy_into_like(target: nn.Module, weight: Tensor, bias: Tensor | None) -> tuple[nn.Module, float]:
    """A module of the same kind as ``target`` (dense, PHM with its ``n`` and rule, low-rank with its rank)
    holding ``weight``/``bias``, or the nearest such map; returns ``(module, relative weight error)``."""
    dense = linear_from(weight, bias)
    if isinstance(target, nn.Linear):
        return dense, 0.0
    if isinstance(target, PHMLinear):
        rule = "learned" if target.rule_is_learned or target.n == 1 else (
            target.rule_name if target.rule_name != "custom" else target.phm_rule)
        return phm_from_linear(dense, target.n, rule=rule, forward_mode=target.forward_mode)
    if isinstance(target, LowRankLinear):
        return lowrank_from_linear(dense, target.rank)
    raise TypeError(f"cannot copy weights into a {type(target).__name__}")
