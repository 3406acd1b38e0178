"""The PHM paper's Appendix A parameterisation ("weight diffusion"), ``DiffusionPHMLinear``.

``H = [s(B₁); …; s(Bₙ)]`` with ``s(Bᵢ) = [ψ(Bᵢ T₁); …; ψ(Bᵢ T_{d/n})]`` (eq. A.1–A.2): column
``j`` of the ``i``-th group of ``d/n`` columns of ``H`` is the row-major flattening of the
``n × k/n`` matrix ``Bᵢ Tⱼ``. Written out,

    H[a·k/n + q, i·d/n + j] = Σ_m B[i, a, m] · T[j, m, q],

and comparing with the Kronecker form ``H[a·k/n + q, c·d/n + j] = Σ_m A[m, a, c] S[m, q, j]``
shows the two are the same family of matrices under ``B[i, a, m] = A[m, a, i]`` and
``T[j, m, q] = S[m, q, j]`` — a relabelling of the same ``k·d/n + n³`` numbers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyperplex.layers.phm import PHMLinear, _resolve_n_and_rule

__all__ = ["DiffusionPHMLinear"]


class DiffusionPHMLinear(nn.Module):
    """PHM layer in the Appendix-A form. Same function class and parameter count as a
    learned-rule :class:`PHMLinear`; kept for fidelity to the paper and for conversion.

    Attributes:
        diffusion: ``B``, ``(n, n, n)``; ``diffusion[i]`` is the diffusion matrix ``Bᵢ``.
        blocks: ``T``, ``(d/n, n, k/n)``; ``blocks[j]`` is the partition ``Tⱼ``.
        bias: ``(k,)`` or ``None``.
    """

    def __init__(self, in_features: int, out_features: int, n: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        _resolve_n_and_rule(in_features, out_features, n, "learned")
        factory = {"device": device, "dtype": dtype}
        self.in_features, self.out_features, self.n = in_features, out_features, n
        self.diffusion = nn.Parameter(torch.empty(n, n, n, **factory))
        self.blocks = nn.Parameter(torch.empty(in_features // n, n, out_features // n, **factory))
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Same distribution of ``H`` as :meth:`PHMLinear.reset_parameters` with a learned rule."""
        bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():
            self.diffusion.normal_(0.0, 1.0 / math.sqrt(self.n))
            self.blocks.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, n={self.n}, "
                f"bias={self.bias is not None}")

    def dense_weight(self) -> Tensor:
        """``H`` of eq. A.1, ``(out_features, in_features)``."""
        H = torch.einsum("iam,jmq->aqij", self.diffusion, self.blocks)  # (a, q, i, j)
        return H.reshape(self.out_features, self.in_features)

    def forward(self, input: Tensor) -> Tensor:
        return F.linear(input, self.dense_weight(), self.bias)

    @classmethod
    def from_phm(cls, layer: PHMLinear) -> DiffusionPHMLinear:
        """The Appendix-A parameters expressing the same ``H`` as ``layer`` (any rule, shared or not; low-rank
        ``Sᵢ`` are formed)."""
        with torch.no_grad():
            factors = layer.factors()
            out = cls(layer.in_features, layer.out_features, layer.n, bias=layer.bias is not None,
                      device=factors.device, dtype=factors.dtype)
            out.diffusion.copy_(layer.phm_rule.permute(2, 1, 0))  # B[i, a, m] = A[m, a, i]
            out.blocks.copy_(factors.permute(2, 0, 1))  # T[j, m, q] = S[m, q, j]
            if out.bias is not None and layer.bias is not None:
                out.bias.copy_(layer.bias)
        return out

    def to_phm(self) -> PHMLinear:
        """The learned-rule :class:`PHMLinear` with the same ``H`` (inverse of :meth:`from_phm`)."""
        out = PHMLinear(self.in_features, self.out_features, self.n, bias=self.bias is not None,
                        device=self.blocks.device, dtype=self.blocks.dtype)
        with torch.no_grad():
            if out.rule_is_learned:
                out.phm_rule.copy_(self.diffusion.permute(2, 1, 0))
                out.phm_weight.copy_(self.blocks.permute(1, 2, 0))
            else:  # n = 1: the rule is the constant 1, fold B into S
                out.phm_weight.copy_(self.blocks.permute(1, 2, 0) * self.diffusion.reshape(()))
            if out.bias is not None and self.bias is not None:
                out.bias.copy_(self.bias)
        out.invalidate_cache()
        return out
