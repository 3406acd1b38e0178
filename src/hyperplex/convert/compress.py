"""``compress(model, config)``: a pretrained model's dense layers swapped for PHM or low-rank layers, in place.

>>> import hyperplex as hp                                                                  # doctest: +SKIP
>>> report = hp.compress(model, hp.PHMConfig(n=4, targets=["*attention*", "*intermediate.dense"]))  # doctest: +SKIP
>>> report = hp.compress(model, hp.LowRankConfig(n=4))    # rank matched to PHM n=4's parameters  # doctest: +SKIP

Layers are selected with ``targets`` / ``exclude`` (:mod:`hyperplex.transforms`); a dense layer is an
``nn.Linear`` or ``transformers``' GPT-2 ``Conv1D``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from torch import nn

from hyperplex.convert.linears import INITS, convert_layers
from hyperplex.convert.report import ConversionReport
from hyperplex.transforms import TransformConfig, check_choice, check_number, check_positive_int

__all__ = ["PHMConfig", "LowRankConfig", "compress"]

_SELECTION_HELP = ("glob patterns on dotted layer names (fnmatch; a pattern P also matches names ending in .P); "
                   "None = every dense layer")


def _check_common(config, name: str) -> None:
    config._normalise_selection()
    check_positive_int(config.n, f"{name}.n")
    check_choice(config.init, f"{name}.init", INITS)
    if isinstance(config.min_features, bool) or not isinstance(config.min_features, int) or config.min_features < 0:
        raise ValueError(f"{name}.min_features must be an integer ≥ 0, got {config.min_features!r}")
    if isinstance(config.refine_steps, bool) or not isinstance(config.refine_steps, int) or config.refine_steps < 0:
        raise ValueError(f"{name}.refine_steps must be an integer ≥ 0, got {config.refine_steps!r}")
    sweeps = getattr(config, "als_sweeps", 0)  # PHM only: low-rank's whitened fit is already exact
    if isinstance(sweeps, bool) or not isinstance(sweeps, int) or sweeps < 0:
        raise ValueError(f"{name}.als_sweeps must be an integer ≥ 0, got {sweeps!r}")
    check_number(config.ridge, f"{name}.ridge", minimum=0, none=True)


@dataclass(frozen=True)
class PHMConfig(TransformConfig):
    """PHM compression: each selected dense layer ``W`` (k × d) becomes a :class:`~hyperplex.PHMLinear` with
    ``H = Σᵢ Aᵢ ⊗ Sᵢ`` (``n`` terms, ``Aᵢ`` n × n, ``Sᵢ`` k/n × d/n) fitted to ``W``. Invalid values raise
    ``ValueError`` naming the field."""

    n: int = field(default=4, metadata={"help": "Kronecker terms; must divide both sizes of a layer to convert it"})
    targets: Sequence[str] | None = field(default=None, metadata={"help": _SELECTION_HELP})
    exclude: Sequence[str] = field(default=(), metadata={"help": "glob patterns of layers kept dense"})
    init: str = field(default="svd", metadata={"help": f"one of {', '.join(INITS)}; see hyperplex.convert.linears"})
    rule: str = field(default="learned", metadata={"help": "learned, or an algebra name (quaternion, ...)"})
    min_features: int = field(default=32, metadata={"help": "layers with min(in, out) below this stay dense"})
    refine_steps: int = field(default=200, metadata={"help": "Adam steps per layer for init='activation'"})
    als_sweeps: int = field(default=4, metadata={"help": "ALS sweeps per layer for init='whitened_als'"})
    ridge: float | None = field(default=None, metadata={"help": "whitened inits' ridge λ; None = the kind's default"})

    def __post_init__(self) -> None:
        _check_common(self, "PHMConfig")
        if not isinstance(self.rule, str):
            raise ValueError(f"PHMConfig.rule must be 'learned' or an algebra name, got {type(self.rule).__name__}; "
                             f"a custom rule tensor goes to PHMLinear directly")
        if self.rule != "learned":
            from hyperplex.layers.phm import PHMLinear

            try:
                PHMLinear(self.n, self.n, self.n, rule=self.rule)
            except ValueError as err:
                raise ValueError(f"PHMConfig.rule: {err}") from None


@dataclass(frozen=True)
class LowRankConfig(TransformConfig):
    """Low-rank compression: each selected dense layer becomes a :class:`~hyperplex.LowRankLinear` ``L R`` (its
    truncated SVD), of rank ``rank``, or by default the largest rank with no more parameters than a learned-rule
    PHM layer of ``n`` terms (:func:`~hyperplex.matching_rank`). Invalid values raise ``ValueError`` naming the
    field."""

    n: int = field(default=4, metadata={"help": "the PHM n whose parameter count the rank matches (rank=None)"})
    rank: int | None = field(default=None, metadata={"help": "explicit rank; None = matched to PHM n"})
    targets: Sequence[str] | None = field(default=None, metadata={"help": _SELECTION_HELP})
    exclude: Sequence[str] = field(default=(), metadata={"help": "glob patterns of layers kept dense"})
    init: str = field(default="svd", metadata={"help": f"one of {', '.join(INITS)}; see hyperplex.convert.linears"})
    min_features: int = field(default=32, metadata={"help": "layers with min(in, out) below this stay dense"})
    refine_steps: int = field(default=200, metadata={"help": "Adam steps per layer for init='activation'"})
    ridge: float | None = field(default=None, metadata={"help": "whitened inits' ridge λ; None = the kind's default"})

    def __post_init__(self) -> None:
        _check_common(self, "LowRankConfig")
        check_positive_int(self.rank, "LowRankConfig.rank", none=True)


def compress(model: nn.Module, config: PHMConfig | LowRankConfig, *,
             calibrate: Callable[[nn.Module], object] | None = None) -> ConversionReport:
    """Replace ``model``'s selected dense layers by PHM (:class:`PHMConfig`) or low-rank (:class:`LowRankConfig`)
    layers, in place, and return the :class:`~hyperplex.convert.ConversionReport` (every dense layer, converted or
    left dense with the reason).

    Args:
        model: any ``nn.Module`` (a ``transformers`` model, a ``SentenceTransformer``, your own).
        config: which layers and how (see the config classes).
        calibrate: ``calibrate(model)`` runs the model on calibration inputs; needed by the ``activation`` and
            ``whitened*`` inits, and with any init it makes the report carry each layer's output error.

    Raises:
        ValueError: a pattern of ``targets`` or ``exclude`` that matches no dense layer (naming it); an ``n`` that
            divides no selected layer; nothing left to convert; a selected layer with NaN/inf values or on the
            meta device; a calibrated init without ``calibrate``. Raised before the model is changed.
        TypeError: ``config`` is not a :class:`PHMConfig` or :class:`LowRankConfig`.
    """
    if isinstance(config, PHMConfig):
        kind, rank, rule = "phm", None, config.rule
    elif isinstance(config, LowRankConfig):
        kind, rank, rule = "lowrank", config.rank, "learned"
    else:
        raise TypeError(f"compress takes a PHMConfig or LowRankConfig, got {type(config).__name__}; int8 is "
                        f"hyperplex.quantize(model, Int8Config(...)), adapters hyperplex.add_adapter")
    return convert_layers(model, kind, config.n, rank=rank, rule=rule, include=config.targets,
                          exclude=config.exclude, min_features=config.min_features, init=config.init,
                          calibrate=calibrate, refine_steps=config.refine_steps,
                          als_sweeps=getattr(config, "als_sweeps", 4),
                          ridge=config.ridge, key=type(config).__name__)
