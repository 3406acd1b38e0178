"""``PHMAdapterConfig``: what a PHM delta adapter adds to which layers of a frozen model.

The adapter adds ``s · ΔW x`` to a frozen layer ``W x + b`` with ``ΔW = Σᵢ Aᵢ ⊗ Sᵢ`` (PHM eq. 3.3):
``n`` rules ``Aᵢ`` (n × n), ``n`` blocks ``Sᵢ`` (k/n × d/n), full or ``Sᵢ = Lᵢ Rᵢ`` of rank ``r``
(Compacter's "low-rank parameterized hypercomplex" layer, Mahabadi et al. 2021).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from hyperplex.layers.selection import glob_patterns
from hyperplex.transforms import TransformConfig

__all__ = ["PHMAdapterConfig", "adapter_parameter_count", "check_adapter_fields", "check_int", "check_dropout"]


def check_int(value, key: str, *, minimum: int = 1, none: str | None = None) -> int | None:
    """``value`` if it is an integer ≥ ``minimum`` (``None`` too when ``none`` says what it means), else
    ``ValueError`` naming ``key``: the one check of ``n``, ``rank`` and their kin in adapter configs."""
    if value is None and none is not None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer ≥ {minimum}"
        raise ValueError(f"{key} must be {f'{none} or ' if none else ''}{what}, got {value!r}")
    return value


def check_dropout(value, key: str) -> float:
    """``value`` as a float in ``[0, 1)``, else ``ValueError`` naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{key} must be a number in [0, 1), got {value!r}")
    return float(value)


def check_adapter_fields(prefix: str, n, rank, targets, dropout, none_rank: str) -> tuple:
    """``(n, rank, targets, dropout)`` checked and normalised (``targets`` a tuple); the ``ValueError`` names
    the key as ``prefix + key``. Shared by :class:`PHMAdapterConfig` and the ``model.adapter`` section."""
    return (check_int(n, f"{prefix}n"), check_int(rank, f"{prefix}rank", none=none_rank),
            glob_patterns(targets, f"{prefix}targets", required=True), check_dropout(dropout, f"{prefix}dropout"))


@dataclass(frozen=True)
class PHMAdapterConfig(TransformConfig):
    """Hyper-parameters of one PHM delta adapter; invalid values raise ``ValueError`` naming the field.

    A module is adapted when it is an ``nn.Linear`` (or ``transformers``' ``Conv1D``), its dotted name matches
    one of ``targets`` (``None``: every linear layer) and none of ``exclude`` — the one selection dialect of
    :mod:`hyperplex.transforms` (``fnmatch``, and a pattern ``P`` also matches any name ending in ``.P``, so
    ``"query"`` finds ``encoder.layer.0.attention.self.query``). Modules matching ``modules_to_save`` (same
    dialect; e.g. a new classification head) are trained in full by this adapter and saved with it.
    """

    n: int = field(default=4, metadata={"help": "Kronecker terms; must divide in and out features of every "
                                                "adapted layer; default 4"})
    rank: int | None = field(default=None, metadata={"help": "None: full Sᵢ (k/n × d/n); r: Sᵢ = Lᵢ Rᵢ with "
                                                             "Lᵢ = left[i] (k/n × r), Rᵢ = right[i] (r × d/n); "
                                                             "default None"})
    targets: Sequence[str] | None = field(default=None, metadata={
        "help": "glob patterns on dotted module names; each must match at least one linear layer; None = every "
                "linear layer"})
    exclude: Sequence[str] = field(default=(), metadata={
        "help": "glob patterns of linear layers left alone; each must match one; default none"})
    scale: float = field(default=1.0, metadata={"help": "s in y = W x + b + s·ΔW x; default 1.0"})
    shared_rule: bool = field(default=False, metadata={"help": "one set of Aᵢ for every adapted layer (Compacter); "
                                                               "default false: a rule per layer"})
    dropout: float = field(default=0.0, metadata={"help": "dropout on the adapter's input (as LoRA); default 0.0"})
    modules_to_save: Sequence[str] = field(default=(), metadata={
        "help": "glob patterns of modules (any type, e.g. a new head) that the adapter trains in full, as a copy "
                "per adapter, and saves with its weights; each must match a module; default none"})

    def __post_init__(self) -> None:
        set_ = lambda key, value: object.__setattr__(self, key, value)  # noqa: E731  (frozen)
        self._normalise_selection()
        set_("n", check_int(self.n, "PHMAdapterConfig.n"))
        set_("rank", check_int(self.rank, "PHMAdapterConfig.rank", none="None (full Sᵢ)"))
        set_("dropout", check_dropout(self.dropout, "PHMAdapterConfig.dropout"))
        set_("modules_to_save", glob_patterns(self.modules_to_save, "PHMAdapterConfig.modules_to_save"))
        if isinstance(self.scale, bool) or not isinstance(self.scale, (int, float)) or not math.isfinite(self.scale):
            raise ValueError(f"PHMAdapterConfig.scale must be a finite number, got {self.scale!r}")
        set_("scale", float(self.scale))
        if not isinstance(self.shared_rule, bool):
            raise ValueError(f"PHMAdapterConfig.shared_rule must be true or false, got {self.shared_rule!r}")

    @classmethod
    def from_dict(cls, data: dict, where: str | None = "adapter config") -> PHMAdapterConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError`` naming them and ``where``; a missing key
        takes its default (a spec without ``modules_to_save`` saves no module, one without ``exclude``
        excludes none)."""
        return super().from_dict(data, where)


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
