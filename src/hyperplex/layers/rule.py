"""``PHMRule``: the ``n`` rule matrices ``Aᵢ`` of PHM layers as one module, to share among layers (Compacter,
phc-gnn), and :func:`rule_table`, the checked ``(n, n, n)`` table of an algebra or a given tensor."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from hyperplex.algebra import ALGEBRAS, algebra_rule

__all__ = ["PHMRule", "rule_table"]


def rule_table(n: int, table: str | Tensor, key: str = "rule") -> Tensor:
    """The ``(n, n, n)`` rule tensor of an algebra name (:data:`hyperplex.algebra.ALGEBRAS`) or a copy of a given
    tensor, checked; ``key`` names the argument in errors."""
    if isinstance(table, Tensor):
        if table.shape != (n, n, n):
            raise ValueError(f"a {key} tensor for n={n} must have shape ({n}, {n}, {n}), got {tuple(table.shape)}")
        if not bool(torch.isfinite(table.detach()).all()):
            raise ValueError(f"the {key} tensor holds NaN or infinite values")
        if not bool(table.detach().ne(0).any()):
            raise ValueError(f"the {key} tensor is all zeros: H would be zero whatever the weights")
        return table.detach().clone()
    if table not in ALGEBRAS:
        raise ValueError(f"unknown {key} {table!r}; valid: {', '.join(repr(a) for a in ALGEBRAS)}, "
                         "or an (n, n, n) tensor")
    if ALGEBRAS[table] != n:
        raise ValueError(f"{key} {table!r} needs n={ALGEBRAS[table]}, got n={n}")
    return algebra_rule(table)



class PHMRule(nn.Module):
    """The ``n`` rule matrices ``Aᵢ`` as one module, to share among PHM layers: ``PHMLinear(..., rule=shared)``.

    Every layer given the same ``PHMRule`` computes with the one tensor ``phm_rule``, learns it together with the
    others (its gradient sums over the layers) and registers it as the submodule ``shared_rule``, so ``.to()``,
    ``parameters()`` and ``state_dict()`` reach it from each layer. ``named_parameters()`` and the parameter tables
    count it once; ``state_dict()`` lists it under every layer's ``shared_rule.phm_rule`` key (PyTorch's way with a
    tied tensor), ``torch.save`` and hyperplex's safetensors checkpoints store it once, and loading fills the one
    tensor.

    Args:
        n: the hypercomplex dimension of the layers that will share it.
        init: ``"random"`` (``Aᵢ ~ N(0, 1/n)``, as a layer's own learned rule), an algebra name with ``n``
            components (``"quaternion"`` for ``n = 4``), or an ``(n, n, n)`` tensor to start from.
        learn: a parameter (``True``) or a fixed buffer (``False``, e.g. one algebra for the whole model).

    Attributes:
        phm_rule: ``(n, n, n)``; ``phm_rule[i]`` is ``Aᵢ``.
    """

    def __init__(self, n: int, init: str | Tensor = "random", learn: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"PHMRule n must be a positive integer, got {n!r}")
        if not isinstance(learn, bool):
            raise TypeError(f"PHMRule learn must be True or False, got {learn!r}")
        self.n = n
        self._table = None if isinstance(init, str) and init == "random" else rule_table(n, init, key="PHMRule init")
        self.init_name = init if isinstance(init, str) else "custom"
        rule = torch.empty(n, n, n, device=device, dtype=dtype or torch.get_default_dtype())
        if learn:
            self.phm_rule = nn.Parameter(rule)
        else:
            if self._table is None:
                raise ValueError("a fixed PHMRule (learn=False) needs init= an algebra name or an (n, n, n) tensor")
            self.register_buffer("phm_rule", rule)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``Aᵢ ~ N(0, 1/n)`` for ``init="random"``, else the table given as ``init``."""
        with torch.no_grad():
            if self.phm_rule.is_meta:
                return
            if self._table is None:
                self.phm_rule.normal_(0.0, 1.0 / math.sqrt(self.n))
            else:
                self.phm_rule.copy_(self._table)

    def extra_repr(self) -> str:
        return f"n={self.n}, init={self.init_name}, learn={isinstance(self.phm_rule, nn.Parameter)}"
