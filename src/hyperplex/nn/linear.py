"""One factory for every linear map in the models: dense, PHM (any ``n``, any rule),
quaternion (fixed Hamilton rule) or low-rank with the PHM layer's parameter budget.

Models never construct ``nn.Linear`` / ``PHMLinear`` directly; they call
:func:`make_linear` with a :class:`LinearSpec` taken from their config, so switching a whole
model to PHM is one config change (``linear: {kind: phm, n: 4}``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from torch import nn

from hyperplex.layers import LowRankLinear, PHMLinear, matching_rank

#: Valid values of :attr:`LinearSpec.kind`.
LINEAR_KINDS = ("dense", "phm", "quaternion", "lowrank")


@dataclass(frozen=True)
class LinearSpec:
    """How to build a linear map ``d → k``."""

    kind: Literal["dense", "phm", "quaternion", "lowrank"] = field(
        default="dense",
        metadata={"help": "dense: nn.Linear; phm: PHMLinear with n terms and `rule`; quaternion: PHMLinear "
                  "with n=4 and the fixed Hamilton rule; lowrank: rank-r factorisation with the largest r "
                  "whose parameter count does not exceed PHM with the same n"})
    n: int = field(default=4, metadata={"help": "number of Kronecker terms for phm/lowrank (ignored for dense; "
                                               "quaternion is always 4); must divide both sizes"})
    rule: str = field(default="learned", metadata={"help": "phm rule: learned, or a fixed algebra "
                                                          "(real, complex, quaternion, octonion, sedenion)"})
    rank_rounding: Literal["floor", "nearest"] = field(default="floor", metadata={
        "help": "lowrank: floor = the largest rank whose parameters do not exceed PHM's; nearest = the rank whose "
                "count is closest to PHM's (equal-parameter tables on small layers, where one rank is d+k "
                "parameters)"})

    def __post_init__(self) -> None:
        if self.kind not in LINEAR_KINDS:
            raise ValueError(f"unknown linear kind {self.kind!r}; valid: {', '.join(LINEAR_KINDS)}")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise ValueError(f"linear n must be a positive integer, got {self.n!r}")

    @property
    def num_components(self) -> int:
        """``n`` of the layers this spec builds (1 for dense)."""
        return {"dense": 1, "quaternion": 4}.get(self.kind, self.n)

    def check_divides(self, *sizes: int, where: str = "") -> None:
        """Raise a ValueError naming ``where`` if ``n`` does not divide every size (PHM kinds)."""
        if self.kind in ("phm", "quaternion"):
            bad = [s for s in sizes if s % self.num_components]
            if bad:
                at = f" in {where}" if where else ""
                raise ValueError(f"linear n={self.num_components} does not divide size {bad[0]}{at}; "
                                 f"every hidden size must be a multiple of n")


def make_linear(in_features: int, out_features: int, spec: LinearSpec | None = None, bias: bool = True,
                device=None, dtype=None) -> nn.Module:
    """Build the linear map ``in_features → out_features`` described by ``spec`` (dense if ``None``).

    Shape: input ``(*, in_features)``, output ``(*, out_features)``.
    """
    spec = spec or LinearSpec()
    factory = {"device": device, "dtype": dtype}
    if spec.kind == "dense":
        return nn.Linear(in_features, out_features, bias=bias, **factory)
    if spec.kind == "quaternion":
        return PHMLinear(in_features, out_features, 4, bias=bias, rule="quaternion", **factory)
    if spec.kind == "phm":
        return PHMLinear(in_features, out_features, spec.n, bias=bias, rule=spec.rule, **factory)
    rank = matching_rank(in_features, out_features, spec.n, bias=bias, rounding=spec.rank_rounding)
    return LowRankLinear(in_features, out_features, rank, bias=bias, **factory)
