"""Activation-aware fitting: refine a converted layer so that ``‖(W − H) X‖`` is small on real inputs.

The SVD initialisations minimise ``‖W − H‖_F``, which weighs every input direction equally; a
layer's output error is ``‖X (W − H)ᵀ‖_F`` for the inputs ``X`` (rows) it actually sees, which lie
near a low-dimensional subspace. With the Gram matrix ``G = Xᵀ X`` (d × d) and any factor ``F``
with ``F Fᵀ = G`` (d × r, r ≤ min(rows, d)),

    ‖X (W − H)ᵀ‖²_F = tr((W − H) G (W − H)ᵀ) = ‖(W − H) F‖²_F,

so the loss needs only ``F``, not the inputs. :func:`capture_inputs` accumulates ``G`` per layer
with forward pre-hooks while a calibration callable runs the model (the dense model: every layer
sees the teacher's inputs); :func:`refine` then runs Adam on the layer's factors (``Aᵢ``, ``Sᵢ`` or
``left``, ``right``; the bias is unchanged) from the SVD start and keeps the best iterate.

:func:`whitened_layer` builds the layer in closed form instead (``init="whitened"`` /
``"whitened_als"``): low-rank by the SVD of ``W S`` with ``S Sᵀ = G`` (optimal), PHM by a Kronecker-sum
SVD whitened with a Kronecker-factored ``G ≈ G₁ ⊗ G₂``, optionally followed by alternating least squares
on the exact objective (:mod:`hyperplex.layers.conversion` holds the algebra).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from hyperplex.layers.conversion import lowrank_from_linear_whitened, phm_from_linear_whitened
from hyperplex.layers.lowrank import LowRankLinear
from hyperplex.layers.phm import PHMLinear, RuleSpec
from hyperplex.layers.selection import LinearLike

__all__ = ["capture_inputs", "refine", "relative_output_error", "whitened_layer", "WHITENED_INITS", "RIDGE"]

#: Conversion inits built by :func:`whitened_layer`; ``_als`` adds alternating least squares (PHM).
WHITENED_INITS = ("whitened", "whitened_als")
#: Default ridge ``λ`` per kind of the whitened fits, which use ``G + λ (tr G / d) I`` (:func:`whitened_layer`).
#: On all-MiniLM-L6-v2 (``benchmarks/probes/compare_inits.py``, PHM n = 4, 64 calibration captions) PHM with
#: alternating least squares reaches a sentence cosine of 0.00 / 0.44 / 0.36 at λ = 1e-6 / 0.1 / 1: an
#: unregularised fit drifts far from ``W`` in input directions of little calibration variance, which the
#: converted model's shifted inputs then excite. Low-rank: 0.66 / 0.65 / 0.56, so it keeps SVD-LLM's tiny ridge.
RIDGE = {"phm": 0.1, "lowrank": 1e-6}


def capture_inputs(module: nn.Module, layers: Mapping[str, nn.Module], calibrate: Callable[[nn.Module], object]
                   ) -> dict[str, Tensor]:
    """Run ``calibrate(module)`` without gradients and return, per layer name, a factor ``F`` (d × r,
    float64) of the Gram matrix ``Xᵀ X`` of the inputs ``X`` (rows × d) that layer received.

    Raises ``ValueError`` naming a layer that saw no input during calibration.
    """
    grams: dict[str, Tensor] = {}
    rows: dict[str, int] = {}

    def hook(name: str):
        def record(_module, args):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).double()  # (rows, d)
            grams[name] = grams.get(name, 0) + x.T @ x
            rows[name] = rows.get(name, 0) + x.shape[0]
        return record

    handles = [layer.register_forward_pre_hook(hook(name)) for name, layer in layers.items()]
    try:
        with torch.no_grad():
            calibrate(module)
    finally:
        for handle in handles:
            handle.remove()
    unseen = [name for name in layers if name not in grams]
    if unseen:
        raise ValueError(f"layer {unseen[0]!r} received no input while calibrate() ran ({len(unseen)} such layers); "
                         f"calibrate must run the model's forward")
    factors = {}
    for name, gram in grams.items():
        eigenvalues, vectors = torch.linalg.eigh(gram)  # G = Q Λ Qᵀ, ascending
        keep = eigenvalues > eigenvalues[-1] * 1e-12
        factors[name] = vectors[:, keep] * eigenvalues[keep].sqrt()  # (d, r): F Fᵀ = G
    return factors


def relative_output_error(weight: Tensor, effective: Tensor, factor: Tensor) -> float:
    """``‖(W − H) F‖_F / ‖W F‖_F`` = relative output error on the calibration inputs."""
    W, H, F = weight.detach().double(), effective.detach().double(), factor.double()
    return float(torch.linalg.norm((W - H) @ F) / torch.linalg.norm(W @ F).clamp_min(1e-300))


def refine(layer: PHMLinear | LowRankLinear, weight: Tensor, factor: Tensor, steps: int = 200, lr: float = 1e-2
           ) -> tuple[float, float]:
    """Adam on ``layer``'s factors to minimise ``‖(W − H) F‖²_F / ‖W F‖²_F``; keeps the best iterate.

    Args:
        layer: a ``PHMLinear`` or ``LowRankLinear`` (any module with ``dense_weight()``), changed in place.
        weight: the dense ``W``, ``(out, in)``.
        factor: ``F`` from :func:`capture_inputs`, ``(in, r)``.
        steps: Adam steps (cosine-decayed learning rate).
        lr: step size relative to each factor's root-mean-square value (factors differ in scale).

    Returns:
        ``(before, after)`` relative output errors (``after ≤ before``).
    """
    params = [p for name, p in layer.named_parameters() if name != "bias"]
    dtype = params[0].dtype
    W, F = weight.detach().to(dtype), factor.to(dtype)
    target = W @ F  # (out, r)
    scale = target.square().sum()
    if scale == 0 or steps <= 0:
        error = relative_output_error(weight, layer.dense_weight(), factor)
        return error, error
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(True)
    # Per-factor step sizes: the factors of one layer differ in scale by orders of magnitude.
    groups = [{"params": [p], "lr": lr * float(p.detach().square().mean().sqrt().clamp_min(1e-8))} for p in params]
    optimizer = torch.optim.Adam(groups, betas=(0.9, 0.999), eps=1e-12)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / steps)))
    best = [p.detach().clone() for p in params]
    with torch.no_grad():
        best_loss = float((target - layer.dense_weight() @ F).square().sum() / scale)
    before = math.sqrt(best_loss)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        with torch.enable_grad():
            loss = (target - layer.dense_weight() @ F).square().sum() / scale
            loss.backward()
        value = float(loss.detach())
        if value < best_loss:
            best_loss, best = value, [p.detach().clone() for p in params]
        optimizer.step()
        schedule.step()
    for p in params:
        p.grad = None
    with torch.no_grad():
        final = float((target - layer.dense_weight() @ F).square().sum() / scale)
        if final > best_loss:
            for p, saved in zip(params, best):
                p.copy_(saved)
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)
    if isinstance(layer, PHMLinear):
        layer.invalidate_cache()
    return before, relative_output_error(weight, layer.dense_weight(), factor)


def whitened_layer(dense: LinearLike, kind: str, n: int, rank: int | None, rule: RuleSpec, factor: Tensor,
                   als_sweeps: int = 0, ridge: float | None = None) -> PHMLinear | LowRankLinear:
    """A PHM or low-rank layer fitted in closed form to the output error on the calibration inputs.

    Args:
        dense: a linear-like object (``weight`` ``(out, in)``, ``bias``, ``in_features``, ``out_features``).
        kind: ``"phm"`` (:func:`~hyperplex.layers.conversion.phm_from_linear_whitened`: Kronecker-factored
            whitening, then ``als_sweeps`` sweeps of alternating least squares) or ``"lowrank"``
            (:func:`~hyperplex.layers.conversion.lowrank_from_linear_whitened`, rank ``rank``: the
            whitened SVD is already the optimum, so ``als_sweeps`` does nothing).
        n, rank, rule: the layer's structure.
        factor: ``F`` ``(in, r)`` from :func:`capture_inputs`; the Gram matrix is ``G = F Fᵀ``.
        ridge: ``λ``: the fit uses ``G + λ (tr G / in) I``, so it is defined when the calibration inputs
            span fewer than ``in`` directions, and ``H`` is pulled towards ``W`` (weight ``λ · tr G / in``)
            in directions they seldom visit. ``None``: ``RIDGE[kind]``.

    Returns:
        the layer (``dense``'s dtype and device, bias copied).
    """
    if kind not in RIDGE:
        raise ValueError(f"unknown kind {kind!r}; valid: 'phm', 'lowrank'")
    ridge = RIDGE[kind] if ridge is None else ridge
    F = factor.double()
    gram = F @ F.T  # (in, in)
    if kind == "phm":
        return phm_from_linear_whitened(dense, n, gram, rule, als_sweeps=als_sweeps, ridge=ridge)[0]
    if rank is None:
        raise ValueError("kind='lowrank' needs a rank")
    return lowrank_from_linear_whitened(dense, rank, gram, ridge=ridge)[0]
