"""``PHMLinear``: the parameterized hypercomplex multiplication layer (Zhang et al. 2021, §3.2).

``y = H x + b`` with ``H = Σᵢ Aᵢ ⊗ Sᵢ`` (eq. 3.2–3.3): ``n`` rule matrices ``Aᵢ`` (n × n) and
``n`` blocks ``Sᵢ`` (k/n × d/n), so the layer holds ``k·d/n + n³`` weights instead of ``k·d``.
Beside the paper's layer: a rule shared by many layers (:class:`PHMRule`, as in Compacter and phc-gnn), a learned
rule started from an algebra's table (``rule_init``), and low-rank blocks ``Sᵢ = Lᵢ Rᵢ`` (``factor_rank``,
Compacter's PHM layer).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyperplex.algebra import ALGEBRAS
from hyperplex.layers import native, triton_phm
from hyperplex.layers.dispatch import (
    DEFAULT_PATH_SETTINGS,
    PathSettings,
    choose_path,
    formation,
    structured_weight_first,
)
from hyperplex.layers.functional import (
    formation_buffer,
    materialize_weight,
    materialize_weights,
    phm_linear_blocked,
    phm_linear_lowrank,
    phm_linear_onednn,
    phm_linear_premixed,
    phm_linear_structured,
    signed_permutation,
)
from hyperplex.layers.rule import PHMRule, rule_table
from hyperplex.layers.selection import LinearLike

__all__ = ["PHMLinear", "PHMRule", "phm_parameter_count", "shared_weights", "training_step_weights", "FORWARD_MODES",
           "ForwardMode", "cache_dense_weights", "cached_bytes", "release_dense_caches"]

#: A value of ``PHMLinear(forward_mode=...)``, for annotations (the values themselves: :data:`FORWARD_MODES`).
ForwardMode = Literal["auto", "structured", "materialized", "premixed", "onednn", "streamed"]
FORWARD_MODES: tuple[ForwardMode, ...] = ("auto", "structured", "materialized", "premixed", "onednn", "streamed")
#: The forward modes that read the stored ``Sᵢ`` directly, so a layer with low-rank ``Sᵢ`` cannot take them.
FULL_FACTOR_MODES = ("premixed", "onednn", "streamed")
RuleSpec = str | Tensor


def check_features(in_features, out_features) -> None:
    """Refuse layer sizes that are not positive integers (``in_features`` or ``out_features`` named); any integer
    type is one (a NumPy integer too), a float or a bool is not."""
    import operator

    for name, value in (("in_features", in_features), ("out_features", out_features)):
        try:
            size = operator.index(value)
        except TypeError:
            size = 0
        if isinstance(value, bool) or size < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _version_of(tensor: Tensor) -> int | None:
    """``tensor``'s version counter, which an in-place change advances; ``None`` for an inference tensor (made under
    ``torch.inference_mode()``), which has none: there only a new ``data_ptr`` or ``invalidate_cache`` tells."""
    return None if tensor.is_inference() else tensor._version


def _check_sizes(in_features: int, out_features: int, n: int) -> None:
    check_features(in_features, out_features)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if in_features % n or out_features % n:
        valid = [m for m in range(1, math.gcd(in_features, out_features) + 1)
                 if in_features % m == 0 and out_features % m == 0]
        raise ValueError(
            f"n={n} must divide both in_features={in_features} and out_features={out_features}; "
            f"valid n for these sizes: {valid}"
        )


def _resolve_n_and_rule(in_features: int, out_features: int, n: int, rule: RuleSpec) -> Tensor | None:
    """Validate sizes and rule; return the fixed rule tensor (or ``None`` for a learned rule)."""
    _check_sizes(in_features, out_features, n)
    if isinstance(rule, str) and rule == "learned":
        return None
    if isinstance(rule, str) and rule not in ALGEBRAS:
        raise ValueError(f"unknown rule {rule!r}; valid: 'learned', {', '.join(repr(a) for a in ALGEBRAS)}, "
                         f"an (n, n, n) tensor or a PHMRule")
    return rule_table(n, rule)


def check_factor_rank(factor_rank: int | None, in_features: int, out_features: int, n: int,
                      key: str = "factor_rank") -> None:
    """Refuse a rank of the blocks ``Sᵢ = Lᵢ Rᵢ`` that is not a positive integer or exceeds a block's rank
    (``key`` names the argument: ``factor_rank`` of a layer, ``rank`` of an adapter)."""
    if factor_rank is None:
        return
    if not isinstance(factor_rank, int) or isinstance(factor_rank, bool) or factor_rank < 1:
        raise ValueError(f"{key} must be a positive integer or None (full Sᵢ), got {factor_rank!r}")
    if factor_rank > min(in_features, out_features) // n:
        raise ValueError(f"{key}={factor_rank} exceeds the rank of an Sᵢ, min(k/n, d/n) = "
                         f"{min(in_features, out_features) // n} (in_features={in_features}, "
                         f"out_features={out_features}, n={n}); full Sᵢ ({key} None) hold fewer parameters")


def phm_parameter_count(in_features: int, out_features: int, n: int, rule: RuleSpec = "learned", bias: bool = True,
                        *, factor_rank: int | None = None, shared_rule: bool = False) -> int:
    """Trainable parameters of ``PHMLinear(in_features, out_features, n, bias, rule, factor_rank=...)``.

    Factors: ``k·d/n`` (full ``Sᵢ``) or ``r·(k + d)`` (``factor_rank = r``: ``n`` pairs ``Lᵢ`` ``(k/n, r)``,
    ``Rᵢ`` ``(r, d/n)``). Rule: ``n³`` for a learned rule with ``n > 1`` (whatever ``rule_init`` it starts
    from); nothing for a fixed rule, for ``n = 1`` (the 1×1 rule is redundant, PHM §3.4, and the layer is dense)
    and for a shared rule (``shared_rule=True`` or ``rule`` a :class:`PHMRule`: its ``n³`` are counted once, by
    the model that holds it, not per layer). Bias: ``k``.
    """
    if isinstance(rule, PHMRule):
        _check_sizes(in_features, out_features, n)
        shared_rule = True
        learned = False
    else:
        learned = _resolve_n_and_rule(in_features, out_features, n, rule) is None and n > 1 and not shared_rule
    check_factor_rank(factor_rank, in_features, out_features, n)
    factors = out_features * in_features // n if factor_rank is None else factor_rank * (in_features + out_features)
    return factors + (n**3 if learned else 0) + (out_features if bias else 0)


class PHMLinear(nn.Module):
    r"""Parameterized hypercomplex multiplication layer: ``y = x Hᵀ + b``, ``H = Σᵢ Aᵢ ⊗ Sᵢ``.

    A drop-in replacement for :class:`torch.nn.Linear` with about ``1/n`` of its parameters.

    Args:
        in_features: size ``d`` of each input sample; divisible by ``n``.
        out_features: size ``k`` of each output sample; divisible by ``n``.
        n: number of Kronecker terms (the hypercomplex dimension). ``n = 1`` is a dense layer.
        bias: learn an additive bias of size ``k``.
        rule: ``"learned"`` (the ``Aᵢ`` are parameters of this layer), an algebra name from
            :data:`hyperplex.algebra.ALGEBRAS` (``"quaternion"`` with ``n = 4`` is the quaternion
            feed-forward layer of Tay et al. eq. 3), or an ``(n, n, n)`` tensor — fixed rules, stored as the buffer
            ``phm_rule`` — or a :class:`PHMRule` shared with other layers (held as the submodule ``shared_rule``).
        rule_init: where a learned rule (``rule="learned"``) starts: ``"random"`` (``Aᵢ ~ N(0, 1/n)``), or an
            algebra name or ``(n, n, n)`` tensor whose table it starts from and then learns (``"quaternion"``: a
            layer that begins as the quaternion layer). Only with ``rule="learned"``.
        factor_rank: ``None`` (full ``Sᵢ``) or ``r``: each ``Sᵢ = Lᵢ Rᵢ`` with ``Lᵢ`` ``(k/n, r)`` and ``Rᵢ``
            ``(r, d/n)`` (Compacter's low-rank PHM layer): ``r·(k + d)`` factor weights instead of ``k·d/n``. Its
            structured path forms neither ``H`` nor any ``Sᵢ``; the paths that read stored ``Sᵢ`` (premixed, oneDNN,
            streamed) are not available, and ``auto`` takes the structured path where they would have been taken.
        forward_mode: ``"auto"`` (choose per call by shape and grad mode; :mod:`hyperplex.layers.dispatch`),
            ``"structured"`` (never form ``H``), ``"premixed"`` (never form ``H``: inputs mixed by the rule, then one
            GEMM against the ``Sᵢ`` side by side), ``"onednn"`` (inference only, CPU float32: the structured
            product on PyTorch's oneDNN linear), ``"materialized"`` (form ``H``, then one dense
            matmul) or ``"streamed"`` (inference only: the compiled kernel of :mod:`hyperplex.layers.native`,
            which ``auto`` also takes at few rows once ``hyperplex native`` has installed it or
            :func:`~hyperplex.layers.native.enable_native_kernels` has turned it on). All are exact.
        cache_dense: keep the formed ``H`` between calls that need no weight gradient (inference,
            frozen layers) and reuse it while no parameter changes. Off by default: the cache is a
            dense copy of the weight (``k·d`` numbers, ``n×`` the layer's own weights), the very
            memory PHM exists to save. Turn it on where speed at many rows matters more than memory,
            per layer or for a whole model under a byte budget with :func:`cache_dense_weights`.

    Attributes:
        phm_rule: ``(n, n, n)``; ``phm_rule[i]`` is ``Aᵢ``. Parameter if learned, else buffer; with a shared rule,
            the :class:`PHMRule`'s tensor.
        phm_weight: ``(n, k/n, d/n)``; ``phm_weight[i]`` is ``Sᵢ`` (full-rank layers only).
        phm_left, phm_right: ``(n, k/n, r)`` and ``(n, r, d/n)``; ``Sᵢ = phm_left[i] @ phm_right[i]``
            (``factor_rank = r`` only). :meth:`factors` gives the ``Sᵢ`` in either case.
        bias: ``(k,)`` or ``None``.
        path_settings: the :class:`~hyperplex.layers.dispatch.PathSettings` ``auto`` applies (a class attribute;
            replace it on the class or on one layer).

    Initialisation (:meth:`reset_parameters`): the entries of ``H`` get the variance that
    ``nn.Linear``'s default init gives its weight, ``1 / (3d)``, so swapping layers keeps
    activation scales. ``Var(H) = Σᵢ Var(Aᵢ[a, c]) · Var(S)``. Learned rules start as
    ``Aᵢ ~ N(0, 1/n)`` — random, because identical or zero ``Aᵢ`` would give every term the
    same (or no) gradient and ``H`` would stay a single Kronecker product; variance ``1/n`` so
    the ``n`` terms sum to ``Var(S)`` — and ``S ~ U(−1/√d, 1/√d)`` exactly as ``nn.Linear``.
    Other rules (fixed, started from a table, shared) scale ``S`` by ``1/√f`` with ``f`` the mean of
    ``Σᵢ Aᵢ[a, c]²`` of the rule's values (1 for every Cayley–Dickson algebra). Low-rank factors draw ``Rᵢ`` as
    ``S`` would be drawn and ``Lᵢ ~ N(0, 1/r)``, so ``Sᵢ = Lᵢ Rᵢ`` has ``S``'s variance. A shared rule is left
    alone (:meth:`PHMRule.reset_parameters` resets it). The bias is ``U(−1/√d, 1/√d)`` as in ``nn.Linear``.

    Shape:
        input ``(*, d)``, output ``(*, k)``.
    """

    path_settings: PathSettings = DEFAULT_PATH_SETTINGS
    _perm_key: tuple[int | None, int] | None  # the rule's (version, data_ptr) the signed permutation was read from

    def __init__(
        self,
        in_features: int,
        out_features: int,
        n: int,
        bias: bool = True,
        rule: RuleSpec | PHMRule = "learned",
        device=None,
        dtype=None,
        forward_mode: ForwardMode = "auto",
        cache_dense: bool = False,
        *,
        rule_init: str | Tensor = "random",
        factor_rank: int | None = None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.in_features, self.out_features, self.n = in_features, out_features, n
        _check_sizes(in_features, out_features, n)
        check_factor_rank(factor_rank, in_features, out_features, n)
        self.factor_rank = factor_rank
        self._register_rule(rule, rule_init, factory)
        self.forward_mode = forward_mode
        self.cache_dense = cache_dense
        k_n, d_n = out_features // n, in_features // n
        if factor_rank is None:
            self.phm_weight = nn.Parameter(torch.empty(n, k_n, d_n, **factory))
        else:
            self.phm_left = nn.Parameter(torch.empty(n, k_n, factor_rank, **factory))
            self.phm_right = nn.Parameter(torch.empty(n, factor_rank, d_n, **factory))
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        self._cache: tuple[tuple, Tensor] | None = None
        self.reset_parameters()

    def _register_rule(self, rule, rule_init, factory: dict) -> None:
        """``phm_rule`` as a parameter, a buffer, or the shared :class:`PHMRule` (submodule ``shared_rule``)."""
        n = self.n
        own_init = not (isinstance(rule_init, str) and rule_init == "random")
        if own_init and not (isinstance(rule, str) and rule == "learned"):
            raise ValueError("rule_init sets where a learned rule starts: it needs rule='learned' "
                             f"(got rule={rule if isinstance(rule, str) else type(rule).__name__!r}); a shared rule "
                             "starts from PHMRule(n, init=...)")
        start = rule_table(n, rule_init, key="rule_init") if own_init else None
        self._rule_start = start if n > 1 else None  # n = 1: the 1×1 rule is a constant (PHM §3.4)
        self.rule_init = rule_init if isinstance(rule_init, str) else "custom"
        if isinstance(rule, PHMRule):
            if rule.n != n:
                raise ValueError(f"the shared PHMRule has n={rule.n}, this layer n={n}")
            # what a copy of this layer with a rule of its own would be given (conversion, quantisation)
            self.rule_name = "learned" if "phm_rule" in rule._parameters else "custom"
            self.shared_rule = rule
            return
        fixed = _resolve_n_and_rule(self.in_features, self.out_features, n, rule)
        self.rule_name = rule if isinstance(rule, str) else "custom"
        if fixed is None and n > 1:
            self.register_parameter("phm_rule", nn.Parameter(torch.empty(n, n, n, **factory)))
            return
        if fixed is None:  # n = 1, where the 1×1 rule is redundant (PHM §3.4)
            fixed = torch.ones(1, 1, 1)
        self.register_buffer("phm_rule", fixed.to(**{k: v for k, v in factory.items() if v is not None}).to(
            dtype=factory["dtype"] or torch.get_default_dtype()))

    def __getattr__(self, name: str):
        if name == "phm_weight" and self.__dict__.get("factor_rank") is not None:
            raise AttributeError(f"this PHMLinear has low-rank factors (factor_rank={self.factor_rank}) and no "
                                 "phm_weight: its Sᵢ are phm_left @ phm_right (layer.factors()); code that reads "
                                 "or writes phm_weight needs a layer with full Sᵢ")
        return super().__getattr__(name)

    # ------------------------------------------------------------------ properties
    @property
    def phm_rule(self) -> Tensor:
        """``(n, n, n)``: the rule this layer computes with (its own, or the shared :class:`PHMRule`'s)."""
        shared = self._modules.get("shared_rule")
        if isinstance(shared, PHMRule):
            return shared.phm_rule
        own: Tensor | None = self._parameters.get("phm_rule")
        if own is None:
            own = self._buffers.get("phm_rule")
        if own is None:
            raise AttributeError("phm_rule")
        return own

    @property
    def forward_mode(self) -> str:
        return self._forward_mode

    @forward_mode.setter
    def forward_mode(self, mode: str) -> None:
        if mode not in FORWARD_MODES:
            raise ValueError(f"unknown forward_mode {mode!r}; valid: {', '.join(FORWARD_MODES)}")
        if self.factor_rank is not None and mode in FULL_FACTOR_MODES:
            raise ValueError(f"forward_mode {mode!r} reads full Sᵢ; a layer with factor_rank={self.factor_rank} takes "
                             f"'auto', 'structured' or 'materialized'")
        self._forward_mode = mode

    @property
    def cache_dense(self) -> bool:
        return self._cache_dense

    @cache_dense.setter
    def cache_dense(self, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"cache_dense must be True or False, got {enabled!r}")
        self._cache_dense = enabled
        if not enabled:
            self.invalidate_cache()

    @property
    def rule_is_learned(self) -> bool:
        """Whether the rule is a parameter (the layer's own or the shared :class:`PHMRule`'s); read from where it
        is registered, so that ``torch.func.functional_call`` swapping in plain tensors does not change it."""
        shared = self._modules.get("shared_rule")
        owner = shared if shared is not None else self
        return "phm_rule" in owner._parameters

    @property
    def rule_is_shared(self) -> bool:
        return "shared_rule" in self._modules

    def extra_repr(self) -> str:
        params = sum(p.numel() for p in self.parameters())
        dense = self.in_features * self.out_features + (self.out_features if self.bias is not None else 0)
        if self.rule_is_shared:
            rule = "shared"
        elif self.rule_is_learned:
            rule = "learned" if self.rule_init == "random" else f"learned from {self.rule_init}"
        else:
            rule = "dense" if self.n == 1 and self.rule_name == "learned" else self.rule_name
        rank = "" if self.factor_rank is None else f", factor_rank={self.factor_rank}"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, n={self.n}, rule={rule}{rank}, "
            f"bias={self.bias is not None}, params={params} ({dense / params:.2f}x fewer than dense)"
        )

    # ------------------------------------------------------------------ init
    def reset_parameters(self) -> None:
        """Initialise as documented in the class docstring (variance of ``H`` = ``nn.Linear``'s)."""
        bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():
            scale = 1.0
            if self.rule_is_learned and not self.rule_is_shared:
                if self._rule_start is None:
                    self.phm_rule.normal_(0.0, 1.0 / math.sqrt(self.n))
                elif not self.phm_rule.is_meta:
                    self.phm_rule.copy_(self._rule_start)
            if not self.phm_rule.is_meta and not (self.rule_is_learned and not self.rule_is_shared
                                                  and self._rule_start is None):
                f = float(self.phm_rule.double().square().sum(0).mean())  # a skeleton on meta: nothing to compute
                scale = 1.0 / math.sqrt(f) if f > 0 else 1.0
            if self.factor_rank is None:
                self.phm_weight.uniform_(-bound * scale, bound * scale)
            else:
                self.phm_right.uniform_(-bound * scale, bound * scale)
                self.phm_left.normal_(0.0, 1.0 / math.sqrt(self.factor_rank))
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)
        self.invalidate_cache()

    # ------------------------------------------------------------------ weights
    def factors(self) -> Tensor:
        """The ``Sᵢ`` as ``(n, k/n, d/n)``: ``phm_weight``, or ``phm_left @ phm_right`` formed (differentiable)."""
        return self.phm_weight if self.factor_rank is None else self.phm_left @ self.phm_right

    def _factor_tensors(self) -> tuple[Tensor, ...]:
        return (self.phm_weight,) if self.factor_rank is None else (self.phm_left, self.phm_right)

    def dense_weight(self) -> Tensor:
        """``H`` as an ``(out_features, in_features)`` matrix (differentiable)."""
        return materialize_weight(self.phm_rule, self.factors(), self._permutation())

    def _permutation(self):
        if self.rule_is_learned or self.n == 1 or torch.compiler.is_compiling():
            return None
        key = (_version_of(self.phm_rule), self.phm_rule.data_ptr())
        if getattr(self, "_perm_key", None) != key:
            self._perm, self._perm_key = signed_permutation(self.phm_rule), key
        return self._perm

    #: ``H`` formed once by :func:`shared_weights` for a run of calls (``None`` outside it).
    _shared_weight: Tensor | None = None

    def invalidate_cache(self) -> None:
        """Drop the cached ``H``. Needed only after changing parameters through ``.data``, which bypasses the
        version counters the cache checks, or in place on a layer built under ``torch.inference_mode()``, whose
        parameters are inference tensors and have no version counter."""
        self._cache = None

    @property
    def cached_bytes(self) -> int:
        """Bytes held by the cached ``H`` (0 when nothing is cached)."""
        return 0 if self._cache is None else self._cache[1].numel() * self._cache[1].element_size()

    def _cached_dense_weight(self) -> Tensor:
        factor = self._factor_tensors()[0]
        key = (tuple((t.data_ptr(), _version_of(t)) for t in (self.phm_rule, *self._factor_tensors())),
               factor.dtype, factor.device, torch.is_inference_mode_enabled())
        if self._cache is None or self._cache[0] != key:
            with torch.no_grad():
                self._cache = (key, self.dense_weight())
        return self._cache[1]

    def train(self, mode: bool = True):
        self.invalidate_cache()
        return super().train(mode)

    def _apply(self, fn, *args, **kwargs):
        self.invalidate_cache()
        self._perm_key = None
        return super()._apply(fn, *args, **kwargs)

    # ------------------------------------------------------------------ forward
    def _needs_weight_grad(self) -> bool:
        return torch.is_grad_enabled() and any(t.requires_grad for t in (self.phm_rule, *self._factor_tensors()))

    def choose_mode(self, rows: int, input_grad: bool = False) -> str:
        """The path ``forward`` takes for an input with ``rows`` rows: ``"structured"``, ``"premixed"``,
        ``"materialized"``, ``"onednn"``, ``"streamed"``, ``"cached"`` (materialized, reusing ``H``) or ``"dense"``
        (``n = 1``); :func:`hyperplex.layers.dispatch.choose_path` with this layer's sizes, settings and state.
        ``input_grad``: the input needs a gradient (``auto`` then keeps to the differentiable paths)."""
        factor = self._factor_tensors()[0]
        return choose_path(rows, self.in_features, self.out_features, self.n, dtype=factor.dtype,
                           device=factor.device, weight_grad=self._needs_weight_grad(), input_grad=input_grad,
                           cache_dense=self.cache_dense, forward_mode=self.forward_mode,
                           factor_rank=self.factor_rank, rule_dtype=self.phm_rule.dtype, settings=self.path_settings)

    def forward(self, input: Tensor) -> Tensor:
        if input.dim() == 0 or input.shape[-1] != self.in_features:
            raise ValueError(f"expected input with last dimension {self.in_features}, got shape {tuple(input.shape)}")
        if self.n == 1:  # exactly nn.Linear
            return F.linear(input, self.factors().view(self.out_features, self.in_features), self.bias)
        if self._shared_weight is not None:  # inside shared_weights(): H formed once for many calls
            self.__dict__["_shared_used"] = True  # read by shared_weights(together=True); no Module.__setattr__
            return F.linear(input, self._shared_weight, self.bias)
        if self.factor_rank is None and triton_phm.takes_triton(input, self):  # fused few-row kernel
            try:
                return triton_phm.triton_phm_linear(input, self.phm_rule, self.phm_weight, self.bias,
                                                    reduction=triton_phm.auto_reduction())
            except Exception as error:  # a kernel that does not build or launch here: warn, then PyTorch's paths
                triton_phm.give_up(error)
        rows = input.numel() // self.in_features
        mode = self.choose_mode(rows, input.requires_grad and torch.is_grad_enabled())
        if mode == "structured":
            if self.factor_rank is not None:
                return phm_linear_lowrank(input, self.phm_rule, self.phm_left, self.phm_right, self.bias)
            weight_first = structured_weight_first(rows, self.n, self.out_features, self.in_features,
                                                   self.path_settings)
            return phm_linear_structured(input, self.phm_rule, self.phm_weight, self.bias, weight_first=weight_first)
        if mode == "premixed":
            return phm_linear_premixed(input, self.phm_rule, self.phm_weight, self.bias)
        if mode == "streamed":
            return native.phm_linear_streamed(input, self.phm_rule, self.phm_weight, self.bias)
        if mode == "onednn":
            return phm_linear_onednn(input, self.phm_rule, self.phm_weight, self.bias)
        if mode == "materialized":
            return self._materialized_forward(input)
        return F.linear(input, self._weight_for(mode), self.bias)

    def _materialized_forward(self, input: Tensor) -> Tensor:
        """``F.linear`` with this call's ``H``: where nothing keeps ``H`` (no gradient, nothing recording), formed
        into the thread's reused buffer (no fresh allocation to page-fault in on every call;
        ``functional.formation_buffer``), one block column at a time where :func:`dispatch.formation` says so."""
        factor = self._factor_tensors()[0]
        k, d = self.out_features, self.in_features
        form = formation(k, d, self.n, input.dtype, factor.dtype, factor.device, self.path_settings)
        if form == "blocked":
            buffer = formation_buffer(k * d // self.n, factor.dtype, factor.device)
            return phm_linear_blocked(input, self.phm_rule, self.factors(), self.bias, buffer=buffer)
        if form == "buffer":
            buffer = formation_buffer(k * d, factor.dtype, factor.device)
            if buffer is not None:
                weight = materialize_weight(self.phm_rule, self.factors(), self._permutation(), out=buffer.view(k, d))
                return F.linear(input, weight, self.bias)
        return F.linear(input, self._weight_for("materialized"), self.bias)

    def _weight_for(self, mode: str) -> Tensor:
        """``H`` for a ``"materialized"`` (differentiable, formed for this call) or ``"cached"``
        (kept and reused) forward."""
        return self._cached_dense_weight() if mode == "cached" else self.dense_weight()

    # ------------------------------------------------------------------ conversion
    @classmethod
    def from_linear(cls, linear: LinearLike, n: int, rule: RuleSpec = "learned", **kwargs) -> tuple[PHMLinear, float]:
        """Convert a dense layer; returns ``(layer, ‖W − H‖_F / ‖W‖_F)``
        (:func:`hyperplex.layers.conversion.phm_from_linear`)."""
        from hyperplex.layers.conversion import phm_from_linear

        return phm_from_linear(linear, n, rule, **kwargs)

    def to_linear(self) -> nn.Linear:
        """An ``nn.Linear`` computing the same function (weight ``H``, same bias)."""
        from hyperplex.layers.conversion import to_linear

        return to_linear(self)


@contextmanager
def shared_weights(modules: nn.Module | Iterable[nn.Module | None], rows: int, *,
                   always: bool = False, together: bool = False) -> Iterator[None]:
    """Form each PHM layer's ``H`` once for a run of calls with the same weights.

    A recurrence calls the same layer at every time step with a few rows each time (an LSTM's
    ``W_h h_{t−1}`` on ``B`` rows, ``T`` times). Each call alone looks like the structured path's
    regime, yet forming ``H`` once and multiplying ``T`` times is cheaper: ``H``'s gradient is
    summed over the steps and flows back to ``Aᵢ`` and ``Sᵢ`` once, at the end of backward.

    Inside the context every :class:`PHMLinear` in ``modules`` (one module or several; ``None``
    entries are skipped) with ``n > 1`` whose
    :meth:`~PHMLinear.choose_mode` for ``rows`` (the total rows over all the calls) forms ``H``
    (``"materialized"`` or ``"cached"``; not the paths that never form it: structured, pre-mixed, oneDNN,
    streamed, which each call then takes for its own rows) computes with that one ``H``: ``dense_weight()``
    (differentiable when weight gradients are needed), or the kept ``H`` of a layer with ``cache_dense``. Without
    ``cache_dense`` the ``H`` lives only as long as the context. Results equal the per-call paths up to
    rounding. Do not change the parameters inside the context (an optimizer step): ``H`` would
    be stale. Contexts nest; the outer ``H`` is restored on exit.

    ``always=True`` forms ``H`` for every such layer in ``forward_mode="auto"`` whatever ``rows`` says: for a run
    of calls each of which costs its kernel launches more than its arithmetic (decoding on a GPU, eagerly: one
    ``F.linear`` a call is the fewest launches; :func:`hyperplex.models.search.decode` does this on CUDA). The
    ``H`` of every layer is then held for the context, as much memory as the dense model's weights.

    ``together=True`` forms the ``H`` of the layers that share a shape (``n``, ``k``, ``d``, dtypes, device; full
    factors and a learned rule) in one batched product (:func:`~hyperplex.layers.functional.materialize_weights`),
    so a model's many layers cost a few formation kernels instead of a few per layer, and their backward likewise:
    what the trainer does for each training step on a GPU, where a step is bound by its launches. Run the backward
    pass inside the context: the batched formation gives every layer of a group a gradient, zero for a layer the
    forward pass did not call, and on exit the parameters of such layers get back the ``None`` gradient they had
    on entry (an optimizer then skips them, as it would have).
    """
    roots = [modules] if isinstance(modules, nn.Module) else [m for m in modules if m is not None]
    layers = [m for root in roots for m in root.modules() if isinstance(m, PHMLinear) and m.n > 1]
    saved = [m._shared_weight for m in layers]
    grouped: list[PHMLinear] = []
    unset: set[int] = set()
    try:
        batch: dict[tuple, list[PHMLinear]] = {}
        for m in layers:
            if m._shared_weight is not None:
                continue
            if always and m.forward_mode == "auto":  # H whatever the rows: the kept one where there is one
                mode = "cached" if m.cache_dense and not m._needs_weight_grad() else "materialized"
            else:
                mode = m.choose_mode(rows)
            if together and mode == "materialized" and m.factor_rank is None and m._permutation() is None:
                rule, weight = m.phm_rule, m.phm_weight
                key = (tuple(weight.shape), weight.dtype, rule.dtype, weight.device)
                batch.setdefault(key, []).append(m)
            elif mode in ("materialized", "cached"):
                m._shared_weight = m._weight_for(mode)
        unset = {id(p) for group in batch.values() for m in group for p in (m.phm_rule, m.phm_weight)
                 if p.grad is None}
        for group in batch.values():
            if len(group) == 1:
                group[0]._shared_weight = group[0].dense_weight()
                continue
            formed = materialize_weights(torch.stack([m.phm_rule for m in group]),
                                         torch.stack([m.phm_weight for m in group]))
            for m, one in zip(group, formed.unbind(0)):
                m._shared_weight = one
                m.__dict__["_shared_used"] = False
            grouped.extend(group)
        yield
    finally:
        for m, kept in zip(layers, saved):
            m._shared_weight = kept
        if grouped:  # a parameter whose every owner is a grouped layer the context did not call: back to None
            idle = {id(m) for m in grouped if not m.__dict__.pop("_shared_used", False)}
            owners: dict[int, list[int]] = {}
            for m in layers:
                for p in (m.phm_rule, *m._factor_tensors()):
                    owners.setdefault(id(p), []).append(id(m))
            for m in grouped:
                if id(m) in idle:
                    for p in (m.phm_rule, m.phm_weight):
                        if id(p) in unset and all(owner in idle for owner in owners[id(p)]):
                            p.grad = None


def training_step_weights(model: nn.Module) -> contextlib.AbstractContextManager:
    """The context a training step runs its forward and backward passes in: on CUDA,
    :func:`shared_weights` with ``always`` and ``together`` (each group of same-shaped PHM layers forms its ``H``
    in one batched product for the step, the fewest kernel launches; on a GPU a model's step is bound by them, and
    CUDA training forms ``H`` at every row count anyway: ``PathSettings.cuda_structured_rows_training``); on the
    CPU, and while ``torch.compile`` traces (it fuses the formation itself), nothing: each layer takes its own path.
    The optimizer step goes after the context."""
    parameter = next(iter(model.parameters()), None)
    if parameter is None or parameter.device.type != "cuda" or torch.compiler.is_compiling():
        return contextlib.nullcontext()
    return shared_weights(model, 0, always=True, together=True)


def _phm_layers(model: nn.Module) -> list[PHMLinear]:
    return [m for m in model.modules() if isinstance(m, PHMLinear) and m.n > 1]


def cache_dense_weights(model: nn.Module, max_bytes: int | None = None) -> int:
    """Let PHM layers of ``model`` keep their formed ``H`` in inference, within a byte budget.

    Layers are taken in module order while the total dense size (``k·d`` elements × the
    weight's element size) stays within ``max_bytes`` (``None``: every layer); the others, and
    layers past the budget, have ``cache_dense`` turned off (dropping any ``H`` they held).
    Returns the bytes the chosen layers will hold once each has run. The trade-off: a cached
    layer runs the dense matmul (the fastest path at many rows) but holds ``n×`` its own
    weights; without the cache it reads only ``k·d/n`` weights per call and forms ``H``
    transiently when many rows make that faster.
    """
    if max_bytes is not None and (not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0):
        raise ValueError(f"max_bytes must be a non-negative integer or None, got {max_bytes!r}")
    total = 0
    for layer in _phm_layers(model):
        size = layer.in_features * layer.out_features * layer._factor_tensors()[0].element_size()
        fits = max_bytes is None or total + size <= max_bytes
        layer.cache_dense = fits
        total += size if fits else 0
    return total


def cached_bytes(model: nn.Module) -> int:
    """Bytes of ``H`` that the PHM layers of ``model`` hold right now."""
    return sum(layer.cached_bytes for layer in _phm_layers(model))


def release_dense_caches(model: nn.Module) -> int:
    """Turn ``cache_dense`` off on every PHM layer of ``model`` and free what they held; returns the bytes freed."""
    freed = cached_bytes(model)
    for layer in _phm_layers(model):
        layer.cache_dense = False
    return freed
