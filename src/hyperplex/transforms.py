"""What the typed configs of the three transforms share: which layers (``targets`` / ``exclude``), field checks
that name the field, and ``to_dict`` / ``from_dict``.

The configs are :class:`hyperplex.PHMConfig` and :class:`hyperplex.LowRankConfig` (:func:`hyperplex.compress`),
:class:`hyperplex.Int8Config` (:func:`hyperplex.quantize`) and :class:`hyperplex.PHMAdapterConfig`
(:func:`hyperplex.add_adapter`).

**Selecting layers.** ``targets`` is a list of patterns (``None``: every layer the transform can take) and
``exclude`` a list of patterns of layers left alone, both in the one dialect of
:func:`hyperplex.layers.selection.name_matches`: a pattern matches a module's dotted name with
:func:`fnmatch.fnmatchcase` (``*`` also crosses dots), and a pattern ``P`` also matches any name ending in ``.P``,
as peft does — so ``"query"`` matches ``encoder.layer.0.attention.self.query``. A pattern that matches no layer is
an error naming it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

from hyperplex.layers.selection import glob_patterns, name_matches

__all__ = ["TransformConfig", "select_layers", "check_positive_int", "check_choice", "check_number"]


def select_layers(names: Sequence[str], targets: Sequence[str] | None, exclude: Sequence[str], key: str,
                  what: str = "layer") -> list[str]:
    """The ``names`` (dotted names of the layers a transform can take, in model order) that ``targets`` select
    (all when ``None``) and ``exclude`` does not. ``ValueError`` naming ``key`` and the pattern for a pattern of
    either list that matches none of ``names``, showing some of them."""
    for field, patterns in (("targets", targets or ()), ("exclude", exclude)):
        for pattern in patterns:
            if not any(name_matches(name, pattern) for name in names):
                shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
                raise ValueError(f"{key}.{field}: pattern {pattern!r} matches no {what}; the {len(names)} "
                                 f"{what}s are named like: {shown or '(none)'}")
    return [name for name in names
            if (targets is None or any(name_matches(name, p) for p in targets))
            and not any(name_matches(name, p) for p in exclude)]


def check_positive_int(value, key: str, *, none: bool = False) -> None:
    """``ValueError`` naming ``key`` unless ``value`` is an integer ≥ 1 (or ``None`` when ``none``)."""
    if value is None and none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be {'None or ' if none else ''}a positive integer, got {value!r}")


def check_choice(value, key: str, choices: Sequence[str]) -> None:
    """``ValueError`` naming ``key`` and the choices unless ``value`` is one of them."""
    if value not in choices:
        raise ValueError(f"{key} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")


def check_number(value, key: str, *, minimum: float | None = None, none: bool = False) -> None:
    """``ValueError`` naming ``key`` unless ``value`` is a finite number (≥ ``minimum``; or ``None`` when ``none``)."""
    if value is None and none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or (
            minimum is not None and value < minimum):
        bound = f" ≥ {minimum}" if minimum is not None else ""
        raise ValueError(f"{key} must be {'None or ' if none else ''}a finite number{bound}, got {value!r}")


_Config = TypeVar("_Config", bound="TransformConfig")


class TransformConfig:
    """Base of the frozen config dataclasses: ``targets`` / ``exclude`` normalised to tuples (``targets`` may be
    ``None``: every eligible layer), and the dict round trip used by the on-disk specs and the YAML configs."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # every subclass is a dataclass
    targets: Sequence[str] | None
    exclude: Sequence[str]

    def _normalise_selection(self) -> None:
        name = type(self).__name__
        targets = self.targets
        if targets is not None:
            targets = glob_patterns(targets, f"{name}.targets", required=True)
        object.__setattr__(self, "targets", targets)
        object.__setattr__(self, "exclude", glob_patterns(self.exclude, f"{name}.exclude"))

    def to_dict(self) -> dict:
        """JSON-ready dict of every field (tuples as lists)."""
        data: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            data[f.name] = list(value) if isinstance(value, tuple) else value
        return data

    @classmethod
    def from_dict(cls: type[_Config], data: dict, where: str | None = None) -> _Config:
        """Inverse of :meth:`to_dict`; a missing key takes its default. ``ValueError`` naming ``where`` (default:
        the class name) and the key for an unknown key or a bad value."""
        where = where or cls.__name__
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a mapping of {cls.__name__} fields, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        renamed = getattr(cls, "renamed_keys", {})
        for key in data:
            if key in renamed:
                raise ValueError(f"{where}: key {key!r} is now called {renamed[key]!r}; rename it")
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown {cls.__name__} key(s) {unknown}; valid: {sorted(known)}")
        try:
            return cls(**data)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
