"""One factory for every linear map in the models: dense, PHM (any ``n``, any rule),
quaternion (fixed Hamilton rule) or low-rank with the PHM layer's parameter budget.

Models never construct ``nn.Linear`` / ``PHMLinear`` directly; they call
:func:`make_linear` with a :class:`LinearSpec` taken from their config, so switching a whole
model to PHM is one config change (``linear: {kind: phm, n: 4}``). The kinds are a registry:
a new kind is one builder function plus one :func:`register_linear_kind` call, and the config's
choices, its error messages and ``docs/config.md`` follow the registry.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from torch import nn

from hyperplex.algebra import ALGEBRAS
from hyperplex.layers import LowRankLinear, PHMLinear, PHMRule, matching_rank


@dataclass(frozen=True)
class LinearKind:
    """A registered linear kind: ``build(in_features, out_features, spec, bias, factory) → module`` and the
    ``n`` its layers have (``None``: the spec's ``n``; PHM kinds need it to divide the sizes)."""

    build: Callable[..., nn.Module]
    components: int | None = None
    divides: bool = False
    help: str = ""


#: kind name → :class:`LinearKind`; read by :class:`LinearSpec` (choices) and :func:`make_linear`.
LINEAR_KINDS: dict[str, LinearKind] = {}


def register_linear_kind(name: str, kind: LinearKind) -> None:
    """Add (or replace) a linear kind under ``name``."""
    LINEAR_KINDS[name] = kind


def linear_kind_names() -> tuple[str, ...]:
    return tuple(LINEAR_KINDS)


@dataclass(frozen=True)
class LinearSpec:
    """How to build a linear map ``d → k``."""

    kind: str = field(
        default="dense",
        metadata={"choices": linear_kind_names,
                  "help": "dense: nn.Linear; phm: PHMLinear with n terms and `rule`; quaternion: PHMLinear "
                  "with n=4 and the fixed Hamilton rule; lowrank: rank-r factorisation with the largest r "
                  "whose parameter count does not exceed PHM with the same n (and factor_rank, shared_rule)"})
    n: int = field(default=4, metadata={"help": "number of Kronecker terms for phm/lowrank (ignored for dense; "
                                               "quaternion is always 4); must divide both sizes"})
    rule: str = field(default="learned", metadata={"help": "phm rule: learned, or a fixed algebra "
                                                          "(real, complex, quaternion, octonion, sedenion)"})
    rule_init: str = field(default="random", metadata={
        "help": "phm with rule learned: where the learned rule starts: random (Aᵢ ~ N(0, 1/n)), or an algebra "
                "with n components whose table it starts from and then learns (e.g. quaternion for n=4)"})
    shared_rule: bool = field(default=False, metadata={
        "help": "phm with rule learned: one learned rule for all the model's PHM layers of the same n "
                "(Compacter, phc-gnn), counted and saved once; every layer built from this spec shares it"})
    factor_rank: int | None = field(default=None, metadata={
        "help": "phm/quaternion: low-rank Sᵢ = Lᵢ Rᵢ of rank r (Compacter), r·(k+d) factor weights per layer "
                "instead of k·d/n; null = full Sᵢ; at most min(k, d)/n"})
    rank_rounding: Literal["floor", "nearest"] = field(default="floor", metadata={
        "help": "lowrank: floor = the largest rank whose parameters do not exceed PHM's; nearest = the rank whose "
                "count is closest to PHM's (equal-parameter tables on small layers, where one rank is d+k "
                "parameters)"})

    def __post_init__(self) -> None:
        if self.kind not in LINEAR_KINDS:
            raise ValueError(f"unknown linear kind {self.kind!r}; valid: {', '.join(LINEAR_KINDS)}")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise ValueError(f"linear n must be a positive integer, got {self.n!r}")
        if self.rule_init != "random" and self.rule_init not in ALGEBRAS:
            raise ValueError(f"unknown linear rule_init {self.rule_init!r}; valid: random, {', '.join(ALGEBRAS)}")
        if (self.rule_init != "random" or self.shared_rule) and self.kind == "phm" and self.rule != "learned":
            raise ValueError(f"linear rule_init and shared_rule apply to a learned rule; rule is {self.rule!r} "
                             "(a fixed table, the same in every layer already)")
        if not isinstance(self.shared_rule, bool):
            raise ValueError(f"linear shared_rule must be true or false, got {self.shared_rule!r}")
        if self.factor_rank is not None and (not isinstance(self.factor_rank, int) or isinstance(self.factor_rank, bool)
                                             or self.factor_rank < 1):
            raise ValueError(f"linear factor_rank must be a positive integer or null, got {self.factor_rank!r}")

    def __getstate__(self) -> dict:
        """Pickled and copied without the layers' shared rules (:func:`shared_rule_for`): those travel with the
        layers that hold them."""
        return {key: value for key, value in self.__dict__.items() if key != "_shared_rules"}

    @property
    def num_components(self) -> int:
        """``n`` of the layers this spec builds (1 for dense)."""
        fixed = LINEAR_KINDS[self.kind].components
        return self.n if fixed is None else fixed

    @property
    def needs_divisible(self) -> bool:
        """Whether ``n`` must divide the layer sizes (the PHM kinds)."""
        return LINEAR_KINDS[self.kind].divides

    def check_divides(self, *sizes: int, where: str = "") -> None:
        """Raise a ValueError naming ``where`` if ``n`` does not divide every size (PHM kinds)."""
        if self.needs_divisible:
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
    if not isinstance(spec, LinearSpec):
        raise TypeError(f"spec must be a LinearSpec (e.g. LinearSpec(kind='phm', n=4)) or None, got {spec!r}")
    return LINEAR_KINDS[spec.kind].build(in_features, out_features, spec, bias, {"device": device, "dtype": dtype})


def _lowrank(d: int, k: int, spec: LinearSpec, bias: bool, factory: dict) -> nn.Module:
    rank = matching_rank(d, k, spec.n, bias=bias, rounding=spec.rank_rounding, factor_rank=spec.factor_rank,
                         shared_rule=spec.shared_rule)
    return LowRankLinear(d, k, rank, bias=bias, **factory)


def shared_rule_for(spec: LinearSpec, n: int, factory: dict) -> PHMRule:
    """The :class:`PHMRule` that every PHM layer of ``n`` terms built from ``spec`` shares (made at the first).

    The rule belongs to the spec object, held weakly: the layers built from it (one model, from one loaded config)
    hold it, and once they are gone a later build starts a fresh one. A model built while another built from the
    same spec object is alive shares that model's rule; build each model from its own config, or from
    ``dataclasses.replace(spec)``."""
    rules = spec.__dict__.get("_shared_rules")
    if rules is None:
        rules = weakref.WeakValueDictionary()
        object.__setattr__(spec, "_shared_rules", rules)  # not a field: no config key, no effect on equality
    rule = rules.get(n)
    if rule is None:
        rule = PHMRule(n, init=spec.rule_init, **factory)
        rules[n] = rule
    return rule


def _phm(d: int, k: int, spec: LinearSpec, bias: bool, factory: dict) -> nn.Module:
    if spec.shared_rule and spec.n > 1:
        return PHMLinear(d, k, spec.n, bias=bias, rule=shared_rule_for(spec, spec.n, factory),
                         factor_rank=spec.factor_rank, **factory)
    return PHMLinear(d, k, spec.n, bias=bias, rule=spec.rule, rule_init=spec.rule_init, factor_rank=spec.factor_rank,
                     **factory)


register_linear_kind("dense", LinearKind(lambda d, k, spec, bias, f: nn.Linear(d, k, bias=bias, **f), components=1))
register_linear_kind("phm", LinearKind(_phm, divides=True))
register_linear_kind("quaternion", LinearKind(
    lambda d, k, spec, bias, f: PHMLinear(d, k, 4, bias=bias, rule="quaternion", factor_rank=spec.factor_rank, **f),
    components=4, divides=True))
register_linear_kind("lowrank", LinearKind(_lowrank))
