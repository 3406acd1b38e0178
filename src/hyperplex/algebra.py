"""Hypercomplex algebra: Cayley–Dickson multiplication rules and component-wise operations.

A hypercomplex *vector* of ``m`` numbers with ``n`` components each is stored as a real
tensor whose last dimension holds the ``n`` components one after another,
``[r; x; y; z]`` for quaternions (Tay et al. 2019, §3.5), so a real feature vector of size
``d`` is ``d / n`` hypercomplex numbers. :func:`split_components` gives the view
``(..., n, d/n)``; :func:`merge_components` undoes it.

A multiplication rule is a tensor ``rule`` of shape ``(n, n, n)`` in the PHM paper's form
(Zhang et al. 2021, eq. 3.5): ``rule[i]`` is the matrix ``A_i`` and

    (q ⊗ p)_a = Σ_i Σ_c rule[i, a, c] · q_i · p_c,

i.e. ``rule[i, a, c]`` is the coefficient of the basis unit ``e_a`` in ``e_i e_c``. A PHM
layer whose blocks ``S_i`` are the 1×1 scalars ``q_i`` therefore computes ``q ⊗ p``
(eq. 3.4–3.5).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "ALGEBRAS",
    "algebra_rule",
    "cayley_dickson_rule",
    "split_components",
    "merge_components",
    "multiply",
    "hamilton",
    "conjugate",
    "norm",
    "normalize",
    "component_activation",
]

#: Algebra names and their dimension (number of components).
ALGEBRAS: dict[str, int] = {"real": 1, "complex": 2, "quaternion": 4, "octonion": 8, "sedenion": 16}


def _cd_conj(x: np.ndarray) -> np.ndarray:
    out = -x
    out[0] = x[0]
    return out


def _cd_mul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Cayley–Dickson product (a, b)(c, d) = (ac − d*b, da + bc*)."""
    if x.shape[0] == 1:
        return x * y
    h = x.shape[0] // 2
    a, b, c, d = x[:h], x[h:], y[:h], y[h:]
    return np.concatenate([_cd_mul(a, c) - _cd_mul(_cd_conj(d), b), _cd_mul(d, a) + _cd_mul(b, _cd_conj(c))])


@cache
def _cd_table(n: int) -> np.ndarray:
    eye = np.eye(n)
    table = np.zeros((n, n, n))
    for i in range(n):
        for c in range(n):
            table[i, :, c] = _cd_mul(eye[i], eye[c])  # coefficients of e_i e_c
    table.setflags(write=False)
    return table


def cayley_dickson_rule(n: int, *, dtype: torch.dtype | None = None, device=None) -> Tensor:
    """Multiplication rule of the ``n``-dimensional Cayley–Dickson algebra, shape ``(n, n, n)``.

    ``n`` must be 1 (real), 2 (complex), 4 (quaternion; equals ``A_1..A_4`` of PHM eq. 3.5),
    8 (octonion) or 16 (sedenion). Entries are −1, 0 or 1, and every ``rule[:, a, c]`` has
    exactly one non-zero entry.
    """
    if n not in ALGEBRAS.values():
        raise ValueError(f"Cayley–Dickson algebras exist for n in {sorted(ALGEBRAS.values())}, got n={n}")
    return torch.tensor(_cd_table(n), dtype=dtype or torch.get_default_dtype(), device=device)


def algebra_rule(name: str, *, dtype: torch.dtype | None = None, device=None) -> Tensor:
    """Rule tensor ``(n, n, n)`` of a named algebra: one of :data:`ALGEBRAS`."""
    if name not in ALGEBRAS:
        raise ValueError(f"unknown algebra {name!r}; valid names: {', '.join(ALGEBRAS)}")
    return cayley_dickson_rule(ALGEBRAS[name], dtype=dtype, device=device)


def _check_divisible(x: Tensor, n: int) -> None:
    if n < 1 or x.shape[-1] % n:
        raise ValueError(f"last dimension {x.shape[-1]} is not divisible into {n} components")


def split_components(x: Tensor, num_components: int = 4) -> Tensor:
    """View ``(..., n·m)`` as ``(..., n, m)``: component ``i`` is ``out[..., i, :]``."""
    _check_divisible(x, num_components)
    return x.unflatten(-1, (num_components, x.shape[-1] // num_components))


def merge_components(x: Tensor) -> Tensor:
    """Inverse of :func:`split_components`: ``(..., n, m)`` → ``(..., n·m)``."""
    return x.flatten(-2)


def multiply(q: Tensor, p: Tensor, rule: Tensor) -> Tensor:
    """Hypercomplex product ``q ⊗ p`` under ``rule`` (shape ``(n, n, n)``), element-wise over numbers.

    ``q`` and ``p`` have shape ``(..., n·m)`` (broadcastable); returns ``(..., n·m)`` with
    ``out_a = Σ_{i,c} rule[i, a, c] q_i p_c``. ``rule`` may be learned (it is differentiable).
    """
    n = rule.shape[0]
    if rule.shape != (n, n, n):
        raise ValueError(f"rule must have shape (n, n, n), got {tuple(rule.shape)}")
    qs, ps = split_components(q, n), split_components(p, n)  # (..., n, m)
    return merge_components(torch.einsum("iac,...im,...cm->...am", rule.to(qs.dtype), qs, ps))


def hamilton(q: Tensor, p: Tensor) -> Tensor:
    """Hamilton product of quaternions, written out as PHM eq. 2.2 (Tay et al. eq. 2).

    ``q`` and ``p``: ``(..., 4·m)`` with components ``[r; x; y; z]``; returns ``(..., 4·m)``.
    """
    qr, qx, qy, qz = split_components(q, 4).unbind(-2)
    pr, px, py, pz = split_components(p, 4).unbind(-2)
    return torch.cat(
        [
            qr * pr - qx * px - qy * py - qz * pz,
            qx * pr + qr * px - qz * py + qy * pz,
            qy * pr + qz * px + qr * py - qx * pz,
            qz * pr - qy * px + qx * py + qr * pz,
        ],
        dim=-1,
    )


def conjugate(x: Tensor, num_components: int = 4) -> Tensor:
    """Conjugate: keep the real component, negate the ``n − 1`` imaginary ones."""
    parts = split_components(x, num_components)
    sign = torch.ones(num_components, 1, dtype=x.dtype, device=x.device)
    sign[1:] = -1
    return merge_components(parts * sign)


def norm(x: Tensor, num_components: int = 4) -> Tensor:
    """Euclidean norm of each hypercomplex number: ``(..., n·m)`` → ``(..., m)``."""
    return torch.linalg.vector_norm(split_components(x, num_components), dim=-2)


def normalize(x: Tensor, num_components: int = 4, eps: float = 1e-12) -> Tensor:
    """Unit hypercomplex numbers ``x / |x|`` (Tay et al. §2 "unit quaternion"); ``eps`` guards zero."""
    parts = split_components(x, num_components)
    return merge_components(parts / norm(x, num_components).clamp_min(eps).unsqueeze(-2))


def component_activation(x: Tensor, activation: Callable[[Tensor], Tensor], num_components: int = 4) -> Tensor:
    """Apply ``activation`` to each component separately (Tay et al. §3.1 "Nonlinearity").

    ``activation`` receives one component at a time, shape ``(..., m)``. For element-wise
    functions (ReLU, tanh) this equals ``activation(x)``; it matters for functions that
    look along the feature axis, such as a softmax or a layer norm per component.
    """
    parts = split_components(x, num_components).unbind(-2)
    return torch.cat([activation(part) for part in parts], dim=-1)
