"""``PHMAdapterConfig``: what a PHM delta adapter adds to which layers of a frozen model.

The adapter adds ``s · ΔW x`` to a frozen layer ``W x + b`` with ``ΔW = Σᵢ Aᵢ ⊗ Sᵢ`` (PHM eq. 3.3):
``n`` rules ``Aᵢ`` (n × n), ``n`` blocks ``Sᵢ`` (k/n × d/n), full or ``Sᵢ = uᵢ vᵢ`` of rank ``r``
(Compacter's "low-rank parameterized hypercomplex" layer, Mahabadi et al. 2021).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

__all__ = ["PHMAdapterConfig", "adapter_parameter_count"]


@dataclass
class PHMAdapterConfig:
    """Hyper-parameters of one PHM delta adapter; invalid values raise ``ValueError`` naming the field.

    A module is adapted when it is an ``nn.Linear`` (or ``transformers``' ``Conv1D``) and its dotted
    name matches one of ``targets`` (:func:`fnmatch.fnmatchcase`; a pattern ``P`` also matches any
    name ending in ``.P``, so ``"query"`` finds ``encoder.layer.0.attention.self.query``).
    """

    n: int = field(default=4, metadata={"help": "Kronecker terms; must divide in and out features of every "
                                                "adapted layer; default 4"})
    rank: int | None = field(default=None, metadata={"help": "None: full Sᵢ (k/n × d/n); r: Sᵢ = uᵢ vᵢ with "
                                                             "uᵢ (k/n × r), vᵢ (r × d/n); default None"})
    targets: tuple[str, ...] = field(default=("*",), metadata={"help": "glob patterns on dotted module names; "
                                                                       "each must match at least one linear layer"})
    scale: float = field(default=1.0, metadata={"help": "s in y = W x + b + s·ΔW x; default 1.0"})
    shared_rule: bool = field(default=False, metadata={"help": "one set of Aᵢ for every adapted layer (Compacter); "
                                                               "default false: a rule per layer"})
    dropout: float = field(default=0.0, metadata={"help": "dropout on the adapter's input (as LoRA); default 0.0"})

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise ValueError(f"PHMAdapterConfig.n must be a positive integer, got {self.n!r}")
        if self.rank is not None and (not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1):
            raise ValueError(f"PHMAdapterConfig.rank must be None (full Sᵢ) or a positive integer, got {self.rank!r}")
        if isinstance(self.targets, str):  # a lone string would be read as a sequence of one-letter patterns
            self.targets = (self.targets,)
        try:
            targets = tuple(self.targets)
        except TypeError:
            raise ValueError(f"PHMAdapterConfig.targets must be a list of glob patterns, got {self.targets!r}") from None
        if not targets or not all(isinstance(t, str) and t for t in targets):
            raise ValueError(f"PHMAdapterConfig.targets must be a non-empty list of non-empty strings, got {self.targets!r}")
        self.targets = targets
        if isinstance(self.scale, bool) or not isinstance(self.scale, (int, float)) or not math.isfinite(self.scale):
            raise ValueError(f"PHMAdapterConfig.scale must be a finite number, got {self.scale!r}")
        self.scale = float(self.scale)
        if not isinstance(self.shared_rule, bool):
            raise ValueError(f"PHMAdapterConfig.shared_rule must be true or false, got {self.shared_rule!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"PHMAdapterConfig.dropout must be a number in [0, 1), got {self.dropout!r}")
        self.dropout = float(self.dropout)

    def to_dict(self) -> dict:
        """JSON-ready dict (``targets`` as a list)."""
        data = asdict(self)
        data["targets"] = list(self.targets)
        return data

    @classmethod
    def from_dict(cls, data: dict, where: str = "adapter config") -> "PHMAdapterConfig":
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError`` naming them and ``where``."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a mapping of PHMAdapterConfig fields, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown PHMAdapterConfig key(s) {unknown}; valid: {sorted(known)}")
        try:
            return cls(**data)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None


def adapter_parameter_count(in_features: int, out_features: int, n: int, rank: int | None = None,
                            rule: bool = True) -> int:
    """Trainable parameters of one PHM adapter on a ``d → k`` layer.

    ``k·d/n`` (full ``Sᵢ``) or ``n·r·(k/n + d/n) = r·(k + d)`` (rank ``r``), plus ``n³`` for the
    rule when ``rule`` (pass ``False`` for every layer but one when the rule is shared).
    """
    if in_features % n or out_features % n:
        raise ValueError(f"n={n} must divide in_features={in_features} and out_features={out_features}")
    blocks = out_features * in_features // n if rank is None else rank * (out_features + in_features)
    return blocks + (n ** 3 if rule else 0)
