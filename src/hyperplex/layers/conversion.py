"""Every conversion between dense weights and the factorised layers, in one module.

- :func:`kronecker_decompose`: the best ``n``-term Kronecker sum of a matrix (Van Loan–Pitsianis).
- :func:`phm_from_linear` / :func:`lowrank_from_linear`: a dense layer → ``PHMLinear`` /
  ``LowRankLinear`` (behind ``PHMLinear.from_linear`` and ``LowRankLinear.from_linear``).
- :func:`to_linear`: any of them → ``nn.Linear`` computing the same function (behind ``to_linear()``).
- :func:`copy_into_like`: a dense weight into a layer of the same kind as a given one (how
  ``PHMLSTM.from_lstm`` converts each gate matrix).
- :func:`lowrank_from_linear_whitened` / :func:`phm_from_linear_whitened`: the same conversions fitted
  to the output error on inputs with a given Gram matrix (whitened SVD, Kronecker-factored whitening,
  alternating least squares).

Model-level conversion (walking a model, names, reports, saving) is :mod:`hyperplex.convert`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from hyperplex.layers.lowrank import LowRankLinear
from hyperplex.layers.phm import PHMLinear, PHMRule, RuleSpec
from hyperplex.layers.selection import DenseWeighted, LinearLike

__all__ = ["kronecker_decompose", "phm_from_linear", "lowrank_from_linear", "to_linear", "linear_from",
           "dense_weight", "copy_into_like", "lowrank_whitened", "kronecker_factor_gram",
           "kronecker_decompose_whitened",
           "kronecker_als", "lowrank_from_linear_whitened", "phm_from_linear_whitened"]


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

    When ``R`` has fewer than ``n`` singular values (``(k/n)·(d/n) < n``: tiny blocks), the fit is exact with
    that many terms; each remaining term starts as a random ``Aᵢ`` (scale ``1/√n``, as a fresh layer's rule)
    times ``Sᵢ = 0``, so ``H`` is unchanged and training can still move it.
    """
    k_n, d_n = matrix.shape[0] // n, matrix.shape[1] // n
    R = _rearrange(matrix, n)
    U, sigma, Vh = torch.linalg.svd(R, full_matrices=False)
    terms = min(n, sigma.numel())
    root = sigma[:terms].sqrt()
    rule = (U[:, :terms] * root).T.reshape(terms, n, n)  # rule[i, a, c]
    weight = (Vh[:terms] * root[:, None]).reshape(terms, k_n, d_n)
    if terms < n:
        rule = torch.cat([rule, torch.randn(n - terms, n, n, dtype=rule.dtype, device=rule.device) / n ** 0.5])
        weight = torch.cat([weight, weight.new_zeros(n - terms, k_n, d_n)])
    total = sigma.square().sum()
    error = float((sigma[n:].square().sum() / total).sqrt()) if total > 0 else 0.0
    return rule, weight, error


def phm_from_linear(linear: LinearLike, n: int, rule: RuleSpec = "learned", **kwargs) -> tuple[PHMLinear, float]:
    """Convert a dense layer; returns ``(layer, relative_error)`` with ``relative_error = ‖W − H‖_F / ‖W‖_F``.

    A learned rule gets the best ``n``-term Kronecker sum (:func:`kronecker_decompose`, exact when
    ``W`` is such a sum); a fixed rule gets the least-squares ``Sᵢ`` for that rule. The bias is copied.
    """
    _check_fittable(rule, kwargs)
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
        if layer.bias is not None and linear.bias is not None:
            layer.bias.copy_(linear.bias.detach())
    layer.invalidate_cache()
    return layer, error


def _check_fittable(rule, kwargs: dict) -> None:
    """The fits write one layer's own rule and full ``Sᵢ``: a shared rule (fitting it to one layer would change
    every layer that shares it) and low-rank ``Sᵢ`` are refused by name."""
    if isinstance(rule, PHMRule):
        raise ValueError("cannot fit a shared PHMRule to one dense layer (it would change every layer sharing it); "
                         "convert with rule='learned' or a fixed algebra")
    if kwargs.get("factor_rank") is not None:
        raise ValueError("conversion fits full Sᵢ; factor_rank is not supported here (build PHMLinear(..., "
                         "factor_rank=r) and train or distil it)")


def lowrank_from_linear(linear: LinearLike, rank: int) -> tuple[LowRankLinear, float]:
    """Truncated SVD of the dense weight (optimal by Eckart–Young); returns
    ``(layer, ‖W − L R‖_F / ‖W‖_F)``."""
    W = linear.weight.detach()
    layer = LowRankLinear(linear.in_features, linear.out_features, rank, bias=linear.bias is not None,
                          device=W.device, dtype=W.dtype)
    U, sigma, Vh = torch.linalg.svd(W.double(), full_matrices=False)
    root = sigma[:rank].sqrt()
    with torch.no_grad():
        layer.left.copy_(U[:, :rank] * root)
        layer.right.copy_(root[:, None] * Vh[:rank])
        if layer.bias is not None and linear.bias is not None:
            layer.bias.copy_(linear.bias.detach())
    total = sigma.square().sum()
    error = float((sigma[rank:].square().sum() / total).sqrt()) if total > 0 else 0.0
    return layer, error


def dense_weight(layer: nn.Linear | DenseWeighted) -> Tensor:
    """The ``(out, in)`` matrix a linear-like layer applies (detached): ``W``, ``H`` or ``L R``."""
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


def to_linear(layer: nn.Linear | DenseWeighted) -> nn.Linear:
    """An ``nn.Linear`` computing the same function as ``layer`` (``PHMLinear``, ``LowRankLinear`` or ``nn.Linear``)."""
    return linear_from(dense_weight(layer), None if layer.bias is None else layer.bias.detach())


def copy_into_like(target: nn.Module, weight: Tensor, bias: Tensor | None) -> tuple[nn.Module, float]:
    """A module of the same kind as ``target`` (dense, PHM with its ``n`` and rule, low-rank with its rank)
    holding ``weight``/``bias``, or the nearest such map; returns ``(module, relative weight error)``."""
    dense = linear_from(weight, bias)
    if isinstance(target, nn.Linear):
        return dense, 0.0
    if isinstance(target, PHMLinear):
        if target.rule_is_shared or target.factor_rank is not None:
            raise TypeError("cannot copy a dense weight into a PHMLinear with a shared rule or factor_rank: "
                            "the fit is per layer and writes full Sᵢ")
        rule = "learned" if target.rule_is_learned or target.n == 1 else (
            target.rule_name if target.rule_name != "custom" else target.phm_rule)
        return phm_from_linear(dense, target.n, rule=rule, forward_mode=target.forward_mode)
    if isinstance(target, LowRankLinear):
        return lowrank_from_linear(dense, target.rank)
    raise TypeError(f"cannot copy weights into a {type(target).__name__}")


# -- activation-aware (whitened) fits -------------------------------------------------------------------
#
# Every function below minimises the output error on inputs X (rows × d) through their Gram matrix
# G = Xᵀ X (d × d): ‖X (W − M)ᵀ‖²_F = tr((W − M) G (W − M)ᵀ). ``ridge`` adds λ·(tr G / d)·I to G, which
# keeps the fit defined where X is rank deficient and adds λ·(tr G / d)·‖W − M‖²_F to the objective
# (input directions the calibration data never visited are fitted like the plain SVD fits them).


def _ridged_gram(gram: Tensor, ridge: float, d: int) -> Tensor:
    """``G + λ (tr G / d) I`` as a symmetric float64 ``(d, d)`` matrix (validated)."""
    if gram.shape != (d, d):
        raise ValueError(f"the Gram matrix must be ({d}, {d}) for a layer with {d} inputs, got {tuple(gram.shape)}")
    if ridge < 0:
        raise ValueError(f"ridge must be ≥ 0, got {ridge}")
    G = gram.detach().double()
    G = (G + G.T) / 2
    scale = float(G.diagonal().sum()) / d
    return G + (ridge * scale if scale > 0 else ridge) * torch.eye(d, dtype=G.dtype, device=G.device)


def _output_loss(residual: Tensor, gram: Tensor) -> Tensor:
    """``tr(E G Eᵀ)`` for ``E`` ``(k, d)`` and ``G`` ``(d, d)``: the squared output error of ``E``."""
    return (residual * (residual @ gram)).sum()


def _relative(loss: Tensor, reference: Tensor) -> float:
    return float((loss.clamp_min(0) / reference).sqrt()) if reference > 0 else float(loss > 0)


def lowrank_whitened(weight: Tensor, gram: Tensor, rank: int, ridge: float = 1e-6) -> tuple[Tensor, Tensor, float]:
    """Rank-``r`` ``L R`` minimising ``tr((W − L R) G (W − L R)ᵀ)`` (SVD-LLM's truncation-aware whitening).

    With the Cholesky factor ``G = S Sᵀ`` (``S`` lower triangular), ``tr((W − M) G (W − M)ᵀ) = ‖W S − M S‖²_F``
    and ``M ↦ M S`` is a bijection that keeps the rank, so by Eckart–Young the minimiser is
    ``M S = (W S)_r``, the truncated SVD ``P_r Σ_r Q_rᵀ`` of ``W S``: ``L = P_r Σ_r^{1/2}``,
    ``R = Σ_r^{1/2} Q_rᵀ S⁻¹`` (one triangular solve), each rank-one term rescaled so its column of ``L``
    and row of ``R`` have equal norms. The relative output error is ``√(Σ_{i>r} σᵢ²) / √(Σᵢ σᵢ²)``
    over the singular values of ``W S``.

    Args:
        weight: ``W``, ``(k, d)``.
        gram: ``G = Xᵀ X``, ``(d, d)``.
        rank: ``r``.
        ridge: ``λ``: the fit uses ``G + λ (tr G / d) I`` (a Cholesky factor exists for a rank-deficient ``G``).

    Returns:
        ``L`` ``(k, r)``, ``R`` ``(r, d)`` (float64, :class:`LowRankLinear`'s ``left`` and ``right``) and the
        relative output error on the ridged ``G``.
    """
    k, d = weight.shape
    G = _ridged_gram(gram, ridge, d)
    S, info = torch.linalg.cholesky_ex(G)
    if info:
        raise ValueError(f"the Gram matrix is not positive definite (Cholesky failed at column {int(info)}); "
                         f"use a ridge > 0")
    P, sigma, Qh = torch.linalg.svd(weight.detach().double() @ S, full_matrices=False)
    root = sigma[:rank].sqrt()
    L = P[:, :rank] * root  # (k, r)
    R = torch.linalg.solve_triangular(S, root[:, None] * Qh[:rank], upper=False, left=False)  # (r, d): Z S⁻¹
    balance = (R.norm(dim=1) / L.norm(dim=0).clamp_min(1e-300)).sqrt().clamp_min(1e-150)
    L, R = L * balance, R / balance[:, None]
    total = sigma.square().sum()
    return L, R, _relative(sigma[rank:].square().sum(), total)


def _symmetric_power(matrix: Tensor, power: float, floor: float) -> Tensor:
    """``M^p`` of a symmetric matrix, eigenvalues clamped at ``floor · λ_max`` first (so it is SPD)."""
    values, vectors = torch.linalg.eigh((matrix + matrix.T) / 2)
    values = values.clamp_min(float(values[-1].clamp_min(1e-300)) * floor)
    return (vectors * values.pow(power)) @ vectors.T


def kronecker_factor_gram(gram: Tensor, n: int, floor: float = 1e-8) -> tuple[Tensor, Tensor]:
    """Nearest Kronecker product ``G ≈ G₁ ⊗ G₂`` (``G₁`` ``(n, n)``, ``G₂`` ``(d/n, d/n)``), both SPD.

    The Van Loan–Pitsianis rearrangement maps ``G₁ ⊗ G₂`` to the rank-one ``vec(G₁) vec(G₂)ᵀ``, so the
    leading singular pair of ``R(G)`` gives the Frobenius-nearest product. For a symmetric positive
    semi-definite ``G`` both factors are symmetric and (up to a common sign) positive semi-definite
    (Van Loan & Pitsianis 1993); they are symmetrised, signed so their traces are positive,
    their eigenvalues clamped at ``floor · λ_max`` and scaled so that ``tr G₁ = n``.
    """
    d = gram.shape[0]
    U, sigma, Vh = torch.linalg.svd(_rearrange(gram, n), full_matrices=False)
    G1 = (U[:, 0] * sigma[0].sqrt()).reshape(n, n)
    G2 = (Vh[0] * sigma[0].sqrt()).reshape(d // n, d // n)
    if G1.trace() < 0:
        G1, G2 = -G1, -G2
    G1, G2 = _symmetric_power(G1, 1.0, floor), _symmetric_power(G2, 1.0, floor)
    scale = float(G1.trace()) / n
    return G1 / scale, G2 * scale


def _kron_right(weight: Tensor, left: Tensor, right: Tensor, n: int) -> Tensor:
    """``W (L ⊗ R)`` for ``W`` ``(k, d)``, ``L`` ``(n, n)``, ``R`` ``(d/n, d/n)``, without forming ``L ⊗ R``."""
    k, d = weight.shape
    return torch.einsum("kcj,ce,jf->kef", weight.reshape(k, n, d // n), left, right).reshape(k, d)


def _balance_kronecker(rule: Tensor, blocks: Tensor) -> tuple[Tensor, Tensor]:
    """Rescale each pair ``(Aᵢ, Sᵢ)`` to equal Frobenius norms (``Aᵢ ⊗ Sᵢ`` unchanged), as the SVD split does."""
    a = rule.flatten(1).norm(dim=1)
    s = blocks.flatten(1).norm(dim=1)
    c = (s / a.clamp_min(1e-300)).sqrt().where((a > 0) & (s > 0), torch.ones_like(a))
    return rule * c[:, None, None], blocks / c[:, None, None]


def _kronecker_sum(rule: Tensor, blocks: Tensor) -> Tensor:
    """``Σᵢ Aᵢ ⊗ Sᵢ`` ``(k, d)`` from ``rule`` ``(n, n, n)`` and ``blocks`` ``(n, k/n, d/n)``."""
    n, k_n, d_n = blocks.shape
    return torch.einsum("iac,iqj->aqcj", rule, blocks).reshape(n * k_n, n * d_n)


def kronecker_decompose_whitened(weight: Tensor, gram: Tensor, n: int, ridge: float = 1e-6
                                 ) -> tuple[Tensor, Tensor, float]:
    """An ``n``-term Kronecker sum fitted to the output error through a Kronecker-factored covariance.

    With ``G ≈ G₁ ⊗ G₂`` (:func:`kronecker_factor_gram` of the ridged ``G``) and the symmetric roots
    ``G₁^{1/2}``, ``G₂^{1/2}``, ``tr((W − H)(G₁ ⊗ G₂)(W − H)ᵀ) = ‖W' − H'‖²_F`` with
    ``W' = W (G₁^{1/2} ⊗ G₂^{1/2})`` and ``H' = Σᵢ (Aᵢ G₁^{1/2}) ⊗ (Sᵢ G₂^{1/2})`` (mixed-product rule
    ``(A ⊗ S)(B ⊗ T) = AB ⊗ ST``). ``H'`` is again an ``n``-term Kronecker sum, so :func:`kronecker_decompose`
    of ``W'`` is optimal for the factored covariance, and ``Aᵢ = A'ᵢ G₁^{-1/2}``, ``Sᵢ = S'ᵢ G₂^{-1/2}``
    undo the whitening exactly. Optimal for the true ``G`` when ``G`` is a Kronecker product; equal to
    :func:`kronecker_decompose` when ``G ∝ I``. Pairs are rebalanced to equal norms.

    Returns ``rule`` ``(n, n, n)``, ``weight`` ``(n, k/n, d/n)`` (float64) and the relative output error
    ``√(tr(E G Eᵀ) / tr(W G Wᵀ))`` on the ridged ``G`` (``E = W − H``).
    """
    k, d = weight.shape
    W = weight.detach().double()
    G = _ridged_gram(gram, ridge, d)
    G1, G2 = kronecker_factor_gram(G, n)
    rule, blocks, _ = kronecker_decompose(_kron_right(W, _symmetric_power(G1, 0.5, 0.0),
                                                      _symmetric_power(G2, 0.5, 0.0), n), n)
    rule = rule @ _symmetric_power(G1, -0.5, 0.0)  # Aᵢ = A'ᵢ G₁^{-1/2}
    blocks = blocks @ _symmetric_power(G2, -0.5, 0.0)  # Sᵢ = S'ᵢ G₂^{-1/2}
    rule, blocks = _balance_kronecker(rule, blocks)
    error = _relative(_output_loss(W - _kronecker_sum(rule, blocks), G), _output_loss(W, G))
    return rule, blocks, error


def _solve_spd(system: Tensor, rhs: Tensor) -> Tensor:
    """``X`` with ``X · system = rhs`` for a symmetric PSD ``system`` ``(m, m)``, ``rhs`` ``(r, m)``
    (least squares with the smallest norm when ``system`` is singular)."""
    L, info = torch.linalg.cholesky_ex(system)
    if not info:
        return torch.cholesky_solve(rhs.T, L).T
    return torch.linalg.lstsq(system, rhs.T, rcond=1e-12).solution.T


def kronecker_als(weight: Tensor, gram: Tensor, rule: Tensor, blocks: Tensor, sweeps: int = 4,
                  update_rule: bool = True) -> tuple[Tensor, Tensor, list[float]]:
    """Alternating least squares on ``L(A, S) = tr((W − H) G (W − H)ᵀ)``, ``H = Σᵢ Aᵢ ⊗ Sᵢ``.

    Indices: ``H[(a, q), (c, j)] = Σᵢ Aᵢ[a, c] Sᵢ[q, j]`` (``a, c < n``, ``q < k/n``, ``j < d/n``); ``Y = W G``.
    ``L`` is a convex quadratic in the ``Sᵢ`` for fixed ``Aᵢ`` and vice versa, so each half-step is
    one linear solve and ``L`` never increases.

    - ``S``-step: collect row ``q`` of every ``Sᵢ`` into ``s_q`` (``d`` entries, index ``(i, j)``). Row
      ``(a, q)`` of ``H`` is ``(B_a ⊗ I) s_q`` with ``B_a[c, i] = Aᵢ[a, c]``, so ``∂L/∂s_q = 0`` reads
      ``N s_q = Σ_a (B_a ⊗ I)ᵀ G w_{a,q}`` with one ``d × d`` matrix for every ``q``:
      ``N[(i, j), (i', j')] = Σ_{c,c'} K[c, i, c', i'] G[(c, j), (c', j')]``,
      ``K[c, i, c', i'] = Σ_a Aᵢ[a, c] A_{i'}[a, c']``,
      right-hand side ``Σ_{a,c} Aᵢ[a, c] Y[(a, q), (c, j)]``.
    - ``A``-step: row ``a`` of every ``Aᵢ`` forms ``α_a`` (``n²`` entries, index ``(i, c)``); ``∂L/∂α_a = 0``
      reads ``P α_a = b_a`` with one ``n² × n²`` matrix
      ``P[(i, c), (i', c')] = Σ_{j,j'} T[i, j, i', j'] G[(c, j), (c', j')]``,
      ``T[i, j, i', j'] = Σ_q Sᵢ[q, j] S_{i'}[q, j']``,
      ``b_a[i, c] = Σ_{q,j} Sᵢ[q, j] Y[(a, q), (c, j)]``.

    Only ``d × d``, ``n² × n²`` and ``(k, d)`` matrices are formed. A sweep is an ``S``-step then an
    ``A``-step (``update_rule=False``: the ``S``-step only, for a fixed rule, where one step is optimal).

    Args:
        weight: ``W`` ``(k, d)``; gram: ``G`` ``(d, d)`` (used as given: add any ridge before).
        rule: start ``Aᵢ`` ``(n, n, n)``; blocks: start ``Sᵢ`` ``(n, k/n, d/n)``.
        sweeps: number of sweeps.

    Returns:
        the best ``rule``, ``blocks`` seen (float64; pairs rebalanced to equal norms when the rule is
        updated, else ``rule`` is returned as given) and the relative
        output error ``√(L / tr(W G Wᵀ))`` after the start and after every half-step.
    """
    W, G = weight.detach().double(), gram.detach().double()
    A, S = rule.detach().double().clone(), blocks.detach().double().clone()
    n, k_n, d_n = S.shape
    G4 = G.reshape(n, d_n, n, d_n)  # G[(c, j), (c', j')]
    G_cc = G4.permute(0, 2, 1, 3).reshape(n * n, d_n * d_n)  # [(c, c'), (j, j')]
    Y = (W @ G).reshape(n, k_n, n, d_n)  # Y[a, q, c, j]
    reference = _output_loss(W, G)

    def loss(A: Tensor, S: Tensor) -> float:
        return _relative(_output_loss(W - _kronecker_sum(A, S), G), reference)

    history = [loss(A, S)]
    best = (history[0], A.clone(), S.clone())
    for _ in range(sweeps):
        K = torch.einsum("iac,kae->ceik", A, A).reshape(n * n, n * n)  # [(c, c'), (i, i')]
        N = (K.T @ G_cc).reshape(n, n, d_n, d_n).permute(0, 2, 1, 3).reshape(n * d_n, n * d_n)  # [(i, j), (i', j')]
        rhs = torch.einsum("iac,aqcj->qij", A, Y).reshape(k_n, n * d_n)
        S = _solve_spd((N + N.T) / 2, rhs).reshape(k_n, n, d_n).permute(1, 0, 2).contiguous()
        history.append(loss(A, S))
        if history[-1] < best[0]:
            best = (history[-1], A.clone(), S.clone())
        if not update_rule:
            continue
        S_flat = S.permute(1, 0, 2).reshape(k_n, n * d_n)
        # [(i, i'), (j, j')]
        T = (S_flat.T @ S_flat).reshape(n, d_n, n, d_n).permute(0, 2, 1, 3).reshape(n * n, d_n * d_n)
        P = (T @ G_cc.T).reshape(n, n, n, n).permute(0, 2, 1, 3).reshape(n * n, n * n)  # [(i, c), (i', c')]
        b = torch.einsum("iqj,aqcj->aic", S, Y).reshape(n, n * n)
        A = _solve_spd((P + P.T) / 2, b).reshape(n, n, n).permute(1, 0, 2).contiguous()  # A[i, a, c]
        history.append(loss(A, S))
        if history[-1] < best[0]:
            best = (history[-1], A.clone(), S.clone())
    A, S = _balance_kronecker(best[1], best[2]) if update_rule else (best[1], best[2])
    return A, S, history


def lowrank_from_linear_whitened(linear: LinearLike, rank: int, gram: Tensor, ridge: float = 1e-6
                                 ) -> tuple[LowRankLinear, float]:
    """:func:`lowrank_from_linear` fitted to the output error on inputs of Gram ``gram`` ``(d, d)``
    (:func:`lowrank_whitened`); returns ``(layer, relative output error on the ridged Gram)``."""
    W = linear.weight.detach()
    layer = LowRankLinear(linear.in_features, linear.out_features, rank, bias=linear.bias is not None,
                          device=W.device, dtype=W.dtype)
    L, R, error = lowrank_whitened(W, gram, rank, ridge)
    with torch.no_grad():
        layer.left.copy_(L)
        layer.right.copy_(R)
        if layer.bias is not None and linear.bias is not None:
            layer.bias.copy_(linear.bias.detach())
    return layer, error


def phm_from_linear_whitened(linear: LinearLike, n: int, gram: Tensor, rule: RuleSpec = "learned", als_sweeps: int = 0,
                             ridge: float = 1e-6, **kwargs) -> tuple[PHMLinear, float]:
    """:func:`phm_from_linear` fitted to the output error on inputs of Gram ``gram`` ``(d, d)``.

    A learned rule gets whichever of :func:`kronecker_decompose_whitened` and the plain
    :func:`kronecker_decompose` has the lower output error on ``gram`` without the ridge (the Kronecker-factored
    whitening is optimal only when ``G`` is a Kronecker product, and can lose to the plain fit when ``G``
    is far from one); with ``als_sweeps > 0``, :func:`kronecker_als` then runs that many sweeps on the
    exact (ridged) objective from there. So the output error on ``gram`` is never above the plain
    fit's, and with ``ridge = 0`` ALS never ends above the whitened start. A fixed rule keeps its
    ``Aᵢ`` and takes the ``Sᵢ`` minimising the output error (one ``S``-step, exact). ``n = 1`` copies
    ``W``. Returns ``(layer, relative output error on the ridged Gram)``; the bias is copied.
    """
    _check_fittable(rule, kwargs)
    W = linear.weight.detach()
    layer = PHMLinear(linear.in_features, linear.out_features, n, bias=linear.bias is not None, rule=rule,
                      device=W.device, dtype=W.dtype, **kwargs)
    k_n, d_n = layer.out_features // n, layer.in_features // n
    G = _ridged_gram(gram, ridge, layer.in_features)
    with torch.no_grad():
        if n == 1:
            layer.phm_weight.copy_(W.view(1, k_n, d_n))
            error = 0.0
        elif layer.rule_is_learned:
            rule_t, blocks, error = kronecker_decompose_whitened(W, G, n, ridge=0.0)
            svd_rule, svd_blocks, _ = kronecker_decompose(W, n)
            raw = _ridged_gram(gram, 0.0, layer.in_features)  # the choice is made on the calibration error itself
            errors = [_relative(_output_loss(W.double() - _kronecker_sum(r, b), raw), _output_loss(W.double(), raw))
                      for r, b in ((rule_t, blocks), (svd_rule, svd_blocks))]
            if errors[1] < errors[0]:  # G far from a Kronecker product: the plain start can fit better
                rule_t, blocks = svd_rule, svd_blocks
            error = _relative(_output_loss(W.double() - _kronecker_sum(rule_t, blocks), G), _output_loss(W.double(), G))
            if als_sweeps > 0:
                rule_t, blocks, history = kronecker_als(W, G, rule_t, blocks, als_sweeps)
                error = min(history)
            layer.phm_rule.copy_(rule_t)
            layer.phm_weight.copy_(blocks)
        else:
            A = layer.phm_rule.detach().double()
            _, blocks, history = kronecker_als(W, G, A, torch.zeros(n, k_n, d_n, dtype=torch.float64), 1,
                                               update_rule=False)
            layer.phm_weight.copy_(blocks)
            error = history[-1]
        if layer.bias is not None and linear.bias is not None:
            layer.bias.copy_(linear.bias.detach())
    layer.invalidate_cache()
    return layer, error
