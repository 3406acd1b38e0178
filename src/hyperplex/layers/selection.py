"""Which layers of a model a tool works on: the dense layer types and the one pattern dialect for layer names.

Conversion (:func:`hyperplex.convert.convert_linears`) and adapters (:func:`hyperplex.adapters.add_adapter`)
both act on *dense layers* — ``nn.Linear`` and ``transformers``' GPT-2 ``Conv1D`` (``y = x W + b`` with
``W`` stored as ``(in, out)``) — chosen by glob patterns on their dotted module names. Both read them here.

The pattern dialect (:func:`name_matches`): :func:`fnmatch.fnmatchcase` on the whole dotted name, where
``*`` also crosses dots, and a pattern ``P`` also matches any name ending in ``.P``. So

- ``"query"`` matches ``query`` and ``encoder.layer.0.attention.self.query``, not ``query_proj``;
- ``"*.query"`` matches every name ending in ``.query`` (not a top-level ``query``);
- ``"ffn.linear1"`` matches ``ffn.linear1`` and ``encoder.layers.0.ffn.linear1``;
- ``"encoder.layer.*"`` matches everything below ``encoder.layer`` (also below ``bert.encoder.layer``);
- ``"*encoder.layer*"`` matches every name that contains ``encoder.layer``;
- ``"0"`` matches ``0`` and ``blocks.0`` (an ``nn.Sequential`` child), not ``10`` or ``0.fc``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Protocol, cast

from torch import Tensor, nn

__all__ = ["conv1d_class", "dense_source", "is_dense", "dense_sizes", "name_matches", "glob_patterns", "LinearLike",
           "DenseWeighted", "dense_tensors"]


class LinearLike(Protocol):
    """What a conversion reads from a dense layer ``y = x Wᵀ + b``: ``nn.Linear`` is one, and so is any object
    with these four attributes (``weight`` is ``(out, in)``)."""

    @property
    def weight(self) -> Tensor: ...

    @property
    def bias(self) -> Tensor | None: ...

    @property
    def in_features(self) -> int: ...

    @property
    def out_features(self) -> int: ...


class DenseWeighted(Protocol):
    """A factorised layer (``PHMLinear``, ``LowRankLinear``, ``DiffusionPHMLinear``): the ``(out, in)`` matrix
    it applies, formed by ``dense_weight()``, and its bias."""

    @property
    def bias(self) -> Tensor | None: ...

    def dense_weight(self) -> Tensor: ...


def conv1d_class() -> type | None:
    """``transformers.pytorch_utils.Conv1D`` when that module is loaded, else ``None``. A model holding a
    ``Conv1D`` has loaded it, so this never imports ``transformers``."""
    return getattr(sys.modules.get("transformers.pytorch_utils"), "Conv1D", None)


def dense_source(module: nn.Module) -> str | None:
    """``"linear"`` for an ``nn.Linear``, ``"conv1d"`` for a ``transformers`` ``Conv1D``, ``None`` otherwise."""
    if isinstance(module, nn.Linear):
        return "linear"
    conv1d = conv1d_class()
    if conv1d is not None and isinstance(module, conv1d):
        return "conv1d"
    return None


def is_dense(module: nn.Module) -> bool:
    """Whether ``module`` is a dense layer (``nn.Linear`` or ``Conv1D``)."""
    return dense_source(module) is not None


def dense_tensors(module: nn.Module) -> tuple[Tensor, Tensor | None]:
    """A dense layer's ``weight`` as stored (``(out, in)`` for ``nn.Linear``, ``(in, out)`` for ``Conv1D``) and its
    ``bias`` (``None`` where it has none)."""
    return cast(Tensor, module.weight), cast("Tensor | None", module.bias)


def dense_sizes(module: nn.Module) -> tuple[int, int]:
    """``(in_features, out_features)`` of a dense layer (``Conv1D`` stores its weight as ``(in, out)``)."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    d, k = dense_tensors(module)[0].shape
    return d, k


def name_matches(name: str, pattern: str) -> bool:
    """Whether the dotted module name ``name`` matches ``pattern`` in the dialect of the module docstring."""
    return fnmatchcase(name, pattern) or fnmatchcase(name, "*." + pattern)


def glob_patterns(value: str | Iterable[str] | None, key: str, *, required: bool = False) -> tuple[str, ...]:
    """``value`` as a tuple of patterns: a lone string is one pattern, ``None`` none. ``ValueError`` naming
    ``key`` for anything but non-empty strings, and for no pattern at all when ``required``."""
    if value is None:
        patterns: Sequence = ()
    elif isinstance(value, str):  # a lone string would otherwise be read as one-letter patterns
        patterns = (value,)
    else:
        try:
            patterns = tuple(value)
        except TypeError:
            raise ValueError(f"{key} must be a glob pattern or a list of glob patterns, got {value!r}") from None
    if not all(isinstance(p, str) and p for p in patterns) or (required and not patterns):
        need = "a non-empty list of" if required else "a list of"
        raise ValueError(f"{key} must be {need} non-empty glob patterns, got {value!r}")
    return tuple(patterns)
