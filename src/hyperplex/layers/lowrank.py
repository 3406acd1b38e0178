"""``LowRankLinear``: the standard low-rank (truncated-SVD) baseline ``W ≈ L R``, with ``L`` the parameter
``left`` and ``R`` the parameter ``right``.

The reviewer's objection to the PHM paper (seminar slides, 004) is that it never compares
with low-rank factorisation at equal parameter count; :func:`matching_rank` gives that rank.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyperplex.layers.phm import RuleSpec, check_features, phm_parameter_count
from hyperplex.layers.selection import LinearLike

__all__ = ["LowRankLinear", "lowrank_parameter_count", "matching_rank"]


def lowrank_parameter_count(in_features: int, out_features: int, rank: int, bias: bool = True) -> int:
    """``rank · (d + k) (+ k)``."""
    return rank * (in_features + out_features) + (out_features if bias else 0)


def matching_rank(in_features: int, out_features: int, n: int, rule: RuleSpec = "learned", bias: bool = True,
                  rounding: str = "floor", *, factor_rank: int | None = None, shared_rule: bool = False) -> int:
    """Rank of the :class:`LowRankLinear` matching ``PHMLinear(in_features, out_features, n, bias, rule)`` (with
    ``factor_rank`` / a shared rule as :func:`~hyperplex.layers.phm.phm_parameter_count` counts them):
    ``floor``: the largest rank with no more parameters (at least 1); ``nearest``: the rank whose count
    is closest; neither above ``min(in_features, out_features)``, the rank of a dense layer. One rank costs
    ``d + k`` parameters, so on small layers ``floor`` can fall short by almost that much per layer (−2.7% of a
    d = 128 Transformer encoder at n = 8); ``nearest`` halves the worst case."""
    budget = (phm_parameter_count(in_features, out_features, n, rule, bias, factor_rank=factor_rank,
                                  shared_rule=shared_rule) - (out_features if bias else 0))
    if rounding == "floor":
        return max(1, min(min(in_features, out_features), budget // (in_features + out_features)))
    if rounding == "nearest":
        return max(1, min(min(in_features, out_features), round(budget / (in_features + out_features))))
    raise ValueError(f"rounding must be floor or nearest, got {rounding!r}")


class LowRankLinear(nn.Module):
    """``y = x (L R)ᵀ + b`` with ``L`` = ``left``: ``(k, rank)``, ``R`` = ``right``: ``(rank, d)``.

    Init: ``R ~ U(−1/√d, 1/√d)`` (as ``nn.Linear``) and ``L ~ N(0, 1/rank)`` so the entries of
    ``L R`` have ``nn.Linear``'s variance ``1/(3d)``; bias as ``nn.Linear``.

    Shape: input ``(*, d)``, output ``(*, k)``.
    """

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        check_features(in_features, out_features)
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise ValueError(f"rank must be a positive integer, got {rank!r}")
        if rank > min(in_features, out_features):
            raise ValueError(f"rank={rank} exceeds min(in_features={in_features}, out_features={out_features})")
        factory = {"device": device, "dtype": dtype}
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.left = nn.Parameter(torch.empty(out_features, rank, **factory))  # L
        self.right = nn.Parameter(torch.empty(rank, in_features, **factory))  # R
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():
            self.right.uniform_(-bound, bound)
            self.left.normal_(0.0, 1.0 / math.sqrt(self.rank))
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, "
                f"bias={self.bias is not None}")

    def dense_weight(self) -> Tensor:
        """``L R`` as an ``(out_features, in_features)`` matrix."""
        return self.left @ self.right

    def forward(self, input: Tensor) -> Tensor:
        return F.linear(F.linear(input, self.right), self.left, self.bias)

    @classmethod
    def from_linear(cls, linear: LinearLike, rank: int) -> tuple[LowRankLinear, float]:
        """Truncated SVD of the dense weight; returns ``(layer, ‖W − L R‖_F / ‖W‖_F)``
        (:func:`hyperplex.layers.conversion.lowrank_from_linear`)."""
        from hyperplex.layers.conversion import lowrank_from_linear

        return lowrank_from_linear(linear, rank)

    def to_linear(self) -> nn.Linear:
        """An ``nn.Linear`` computing the same function (weight ``L R``, same bias)."""
        from hyperplex.layers.conversion import to_linear

        return to_linear(self)
