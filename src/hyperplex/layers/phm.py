"""``PHMLinear``: the parameterized hypercomplex multiplication layer (Zhang et al. 2021, §3.2).

``y = H x + b`` with ``H = Σᵢ Aᵢ ⊗ Sᵢ`` (eq. 3.2–3.3): ``n`` rule matrices ``Aᵢ`` (n × n) and
``n`` blocks ``Sᵢ`` (k/n × d/n), so the layer holds ``k·d/n + n³`` weights instead of ``k·d``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyperplex.algebra import ALGEBRAS, algebra_rule
from hyperplex.layers import native, triton_phm
from hyperplex.layers.functional import (
    formation_buffer, materialize_weight, onednn_available, phm_linear_blocked, phm_linear_onednn,
    phm_linear_premixed, phm_linear_structured, recording_operations, signed_permutation, takes_blocked,
)

__all__ = ["PHMLinear", "phm_parameter_count", "shared_weights", "FORWARD_MODES", "cache_dense_weights",
           "cached_bytes", "release_dense_caches"]

FORWARD_MODES = ("auto", "structured", "materialized", "premixed", "onednn", "streamed")
RuleSpec = str | Tensor


def _resolve_n_and_rule(in_features: int, out_features: int, n: int, rule: RuleSpec) -> Tensor | None:
    """Validate sizes and rule; return the fixed rule tensor (or ``None`` for a learned rule)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if in_features % n or out_features % n:
        valid = [m for m in range(1, math.gcd(in_features, out_features) + 1) if in_features % m == 0 and out_features % m == 0]
        raise ValueError(
            f"n={n} must divide both in_features={in_features} and out_features={out_features}; "
            f"valid n for these sizes: {valid}"
        )
    if isinstance(rule, Tensor):
        if rule.shape != (n, n, n):
            raise ValueError(f"a rule tensor for n={n} must have shape ({n}, {n}, {n}), got {tuple(rule.shape)}")
        if not bool(rule.detach().ne(0).any()):
            raise ValueError("the rule tensor is all zeros: H would be zero whatever the weights")
        return rule.detach().clone()
    if rule == "learned":
        return None
    if rule not in ALGEBRAS:
        raise ValueError(f"unknown rule {rule!r}; valid: 'learned', {', '.join(repr(a) for a in ALGEBRAS)}, or an (n, n, n) tensor")
    if ALGEBRAS[rule] != n:
        raise ValueError(f"rule {rule!r} needs n={ALGEBRAS[rule]}, got n={n}")
    return algebra_rule(rule)


def phm_parameter_count(in_features: int, out_features: int, n: int, rule: RuleSpec = "learned", bias: bool = True) -> int:
    """Trainable parameters of ``PHMLinear(in_features, out_features, n, bias, rule)``.

    ``k·d/n + n³ (+ k)`` for a learned rule with ``n > 1``; ``k·d/n (+ k)`` for a fixed rule
    and for ``n = 1``, where the 1×1 rule is redundant (PHM §3.4) and the layer is dense.
    """
    fixed = _resolve_n_and_rule(in_features, out_features, n, rule)
    learned_rule = fixed is None and n > 1
    return out_features * in_features // n + (n**3 if learned_rule else 0) + (out_features if bias else 0)


class PHMLinear(nn.Module):
    r"""Parameterized hypercomplex multiplication layer: ``y = x Hᵀ + b``, ``H = Σᵢ Aᵢ ⊗ Sᵢ``.

    A drop-in replacement for :class:`torch.nn.Linear` with about ``1/n`` of its parameters.

    Args:
        in_features: size ``d`` of each input sample; divisible by ``n``.
        out_features: size ``k`` of each output sample; divisible by ``n``.
        n: number of Kronecker terms (the hypercomplex dimension). ``n = 1`` is a dense layer.
        bias: learn an additive bias of size ``k``.
        rule: ``"learned"`` (the ``Aᵢ`` are parameters), an algebra name from
            :data:`hyperplex.algebra.ALGEBRAS` (``"quaternion"`` with ``n = 4`` is the quaternion
            feed-forward layer of Tay et al. eq. 3), or an ``(n, n, n)`` tensor; fixed rules are
            stored as the buffer ``phm_rule``.
        forward_mode: ``"auto"`` (choose per call by shape and grad mode), ``"structured"``
            (never form ``H``), ``"premixed"`` (never form ``H``: inputs mixed by the rule, then one
            GEMM against the ``Sᵢ`` side by side), ``"onednn"`` (inference only, CPU float32: the structured
            product on PyTorch's oneDNN linear, which ``auto`` takes on weights of 2²⁰ elements and up between a
            few rows and ``rows·n = 2d``), ``"materialized"`` (form ``H``, then one dense
            matmul) or ``"streamed"`` (inference only: the compiled kernel of :mod:`hyperplex.layers.native`,
            which ``auto`` also takes at few rows once ``hyperplex native`` has installed it or
            :func:`~hyperplex.layers.native.enable_native_kernels` has turned it on). All are exact.
        cache_dense: keep the formed ``H`` between calls that need no weight gradient (inference,
            frozen layers) and reuse it while no parameter changes. Off by default: the cache is a
            dense copy of the weight (``k·d`` numbers, ``n×`` the layer's own weights), the very
            memory PHM exists to save. Turn it on where speed at many rows matters more than memory,
            per layer or for a whole model under a byte budget with :func:`cache_dense_weights`.

    Attributes:
        phm_rule: ``(n, n, n)``; ``phm_rule[i]`` is ``Aᵢ``. Parameter if learned, else buffer.
        phm_weight: ``(n, k/n, d/n)``; ``phm_weight[i]`` is ``Sᵢ``.
        bias: ``(k,)`` or ``None``.

    Initialisation (:meth:`reset_parameters`): the entries of ``H`` get the variance that
    ``nn.Linear``'s default init gives its weight, ``1 / (3d)``, so swapping layers keeps
    activation scales. ``Var(H) = Σᵢ Var(Aᵢ[a, c]) · Var(S)``. Learned rules start as
    ``Aᵢ ~ N(0, 1/n)`` — random, because identical or zero ``Aᵢ`` would give every term the
    same (or no) gradient and ``H`` would stay a single Kronecker product; variance ``1/n`` so
    the ``n`` terms sum to ``Var(S)`` — and ``S ~ U(−1/√d, 1/√d)`` exactly as ``nn.Linear``.
    Fixed rules scale ``S`` by ``1/√f`` with ``f`` the mean of ``Σᵢ Aᵢ[a, c]²`` (1 for every
    Cayley–Dickson algebra). The bias is ``U(−1/√d, 1/√d)`` as in ``nn.Linear``.

    Shape:
        input ``(*, d)``, output ``(*, k)``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        n: int,
        bias: bool = True,
        rule: RuleSpec = "learned",
        device=None,
        dtype=None,
        forward_mode: Literal["auto", "structured", "materialized", "premixed", "onednn", "streamed"] = "auto",
        cache_dense: bool = False,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        fixed = _resolve_n_and_rule(in_features, out_features, n, rule)
        self.in_features, self.out_features, self.n = in_features, out_features, n
        self.rule_name = rule if isinstance(rule, str) else "custom"
        self.forward_mode = forward_mode
        self.cache_dense = cache_dense
        if fixed is None and n > 1:
            self.phm_rule = nn.Parameter(torch.empty(n, n, n, **factory))
        else:  # fixed algebra, custom tensor, or n = 1 where the 1×1 rule is redundant (PHM §3.4)
            if fixed is None:
                fixed = torch.ones(1, 1, 1)
            self.register_buffer("phm_rule", fixed.to(**{k: v for k, v in factory.items() if v is not None}).to(
                dtype=dtype or torch.get_default_dtype()))
        self.phm_weight = nn.Parameter(torch.empty(n, out_features // n, in_features // n, **factory))
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        self._cache: tuple[tuple, Tensor] | None = None
        self.reset_parameters()

    # ------------------------------------------------------------------ properties
    @property
    def forward_mode(self) -> str:
        return self._forward_mode

    @forward_mode.setter
    def forward_mode(self, mode: str) -> None:
        if mode not in FORWARD_MODES:
            raise ValueError(f"unknown forward_mode {mode!r}; valid: {', '.join(FORWARD_MODES)}")
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
        return isinstance(self.phm_rule, nn.Parameter)

    def extra_repr(self) -> str:
        params = sum(p.numel() for p in self.parameters())
        dense = self.in_features * self.out_features + (self.out_features if self.bias is not None else 0)
        rule = "learned" if self.rule_is_learned else ("dense" if self.n == 1 and self.rule_name == "learned" else self.rule_name)
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, n={self.n}, rule={rule}, "
            f"bias={self.bias is not None}, params={params} ({dense / params:.2f}x fewer than dense)"
        )

    # ------------------------------------------------------------------ init
    def reset_parameters(self) -> None:
        """Initialise as documented in the class docstring (variance of ``H`` = ``nn.Linear``'s)."""
        bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():
            if self.rule_is_learned:
                self.phm_rule.normal_(0.0, 1.0 / math.sqrt(self.n))
                scale = 1.0
            elif self.phm_rule.is_meta:  # a skeleton whose values are about to be loaded: nothing to compute
                scale = 1.0
            else:
                f = float(self.phm_rule.double().square().sum(0).mean())
                scale = 1.0 / math.sqrt(f)
            self.phm_weight.uniform_(-bound * scale, bound * scale)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)
        self.invalidate_cache()

    # ------------------------------------------------------------------ weights
    def dense_weight(self) -> Tensor:
        """``H`` as an ``(out_features, in_features)`` matrix (differentiable)."""
        return materialize_weight(self.phm_rule, self.phm_weight, self._permutation())

    def _permutation(self):
        if self.rule_is_learned or self.n == 1 or torch.compiler.is_compiling():
            return None
        key = (self.phm_rule._version, self.phm_rule.data_ptr())
        if getattr(self, "_perm_key", None) != key:
            self._perm, self._perm_key = signed_permutation(self.phm_rule), key
        return self._perm

    #: ``H`` formed once by :func:`shared_weights` for a run of calls (``None`` outside it).
    _shared_weight: Tensor | None = None

    def invalidate_cache(self) -> None:
        """Drop the cached ``H``. Needed only after changing parameters through ``.data``,
        which bypasses the version counters the cache checks."""
        self._cache = None

    @property
    def cached_bytes(self) -> int:
        """Bytes held by the cached ``H`` (0 when nothing is cached)."""
        return 0 if self._cache is None else self._cache[1].numel() * self._cache[1].element_size()

    def _cached_dense_weight(self) -> Tensor:
        key = (
            self.phm_rule.data_ptr(), self.phm_rule._version, self.phm_weight.data_ptr(), self.phm_weight._version,
            self.phm_weight.dtype, self.phm_weight.device, torch.is_inference_mode_enabled(),
        )
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
        return torch.is_grad_enabled() and (self.phm_weight.requires_grad or self.phm_rule.requires_grad)

    #: ``auto`` takes the structured path only while ``rows · n`` is at most this (with / without
    #: weight gradients) ...
    STRUCTURED_ROW_LIMIT_TRAINING = 1024
    STRUCTURED_ROW_LIMIT_INFERENCE = 256
    #: With weight gradients and an ``H`` of at least ``LARGE_WEIGHT`` elements (4096² and up), the
    #: training limit is ``STRUCTURED_ROW_LIMIT_TRAINING_LARGE``: forming ``H`` and its gradient
    #: then moves 2 × 64 MiB per step, and at 4096², n = 16, 128 rows the structured step was
    #: 1.3× faster than the materialised one both warm and cold (n = 4 / 8 at rows·n = 2048: level).
    #: At 1024² the same rows·n = 2048 (n = 16, 128 rows) made the structured step 3× slower, so
    #: the larger limit is kept to large weights; sizes above 4096² are extrapolated, unmeasured.
    STRUCTURED_ROW_LIMIT_TRAINING_LARGE = 2048
    LARGE_WEIGHT = 2 ** 24
    #: ... and while ``rows ≤ k·d / WEIGHT_PER_ROW`` (k·d = elements of ``H``). The structured path
    #: saves reading ``H`` from memory; a small ``H`` sits in cache and reading it is cheap, so the
    #: row budget grows with the weight's size (inference: 512² → 0 rows, 1024² → 8, 4096² → 128;
    #: training: 512² → 32 rows, 1024² → 128). Fitted on CPU with benchmarks/bench_phm.py on one
    #: layer in a loop (warm cache) and re-checked on stacks of layers whose weights overflow the
    #: last-level cache, as a model's do (``--mode cold``); docs/performance.md gives both tables
    #: and the points where the two regimes disagree.
    WEIGHT_PER_ROW_TRAINING = 2 ** 13
    WEIGHT_PER_ROW_INFERENCE = 2 ** 17
    #: In inference with ``cache_dense``, an ``H`` of at most this many elements (2 MiB in fp32, a
    #: per-core L2) is read from cache at little cost, so the cached path wins even for one row.
    CACHE_RESIDENT_WEIGHT = 2 ** 19
    #: In inference without the cache, the materialised path forms ``H`` on every call (as in
    #: training, without the backward pass), so the structured path keeps more rows: ``rows ≤
    #: k·d / WEIGHT_PER_ROW_UNCACHED`` (384² → 9 rows, 384×1536 → 36, 1024² → 64). Measured on a
    #: stack of MiniLM's 36 layer shapes (/proc-cold, one thread): at 12 rows the structured path
    #: was 0.65–0.85× the per-call materialised one for n = 4, 8; at 48 rows and more it was slower.
    WEIGHT_PER_ROW_UNCACHED = 2 ** 14
    #: In inference without the cache, a weight of fewer than ``SMALL_WEIGHT`` elements (4 MiB in fp32) takes, for up
    #: to ``SMALL_WEIGHT_ROW_LIMIT`` rows, the pre-mixed path if it widens (``k > d``: one GEMM of reduction length
    #: ``d`` against the ``Sᵢ`` side by side) and the structured path otherwise (square or narrowing). Measured with
    #: ``benchmarks/bench_paths.py`` on MiniLM's shapes (2026-11-27, one thread, 6-layer stacks, n = 2 / 4 / 8, time ×
    #: dense), after the structured product went input-first and the per-call ``H`` got its block columns:
    #: 384 → 1536 pre-mixed 0.57–0.68 at 16 rows, 0.91–0.94 at 96 and 0.95–1.01 at 128 (forming ``H`` 1.03–1.16
    #: there); 384² structured 0.72–0.86 at 16 rows against pre-mixed 0.84–0.89, and 1.08–1.23 at 128 against forming
    #: ``H`` 1.16–1.36; 1536 → 384 structured 0.69–0.90 at 16 rows and 1.02–1.10 at 128 (forming ``H`` 1.12–1.19). At
    #: 192 rows the best and the next path were within 0.01–0.10 of each other, and from 256 rows (n = 4) forming ``H``
    #: won on all three shapes. Before that day this rule was the pre-mixed path for
    #: ``k ≥ d`` up to 64 rows, and the structured path only to ``k·d / 2^14`` rows (36 on 1536 → 384). Larger weights
    #: keep the general rules: the side-by-side copy of the ``Sᵢ`` would be read and written on every call, and from
    #: 2^20 on oneDNN runs the structured product faster.
    SMALL_WEIGHT = 2 ** 20
    SMALL_WEIGHT_ROW_LIMIT = 128
    #: In inference without the cache (CPU, float32, no gradient), ``auto`` runs the structured product on oneDNN
    #: (:func:`~hyperplex.layers.functional.phm_linear_onednn`) on weights of at least ``ONEDNN_MIN_WEIGHT`` elements
    #: where ``ONEDNN_MIN_ROWS_N ≤ rows·n ≤ ONEDNN_ROWS_PER_INPUT · d`` and ``rows · k·d ≥ ONEDNN_MIN_WORK``, except
    #: where the pre-mixed path was chosen. oneDNN's call costs some tens of µs more than PyTorch's structured path,
    #: so tiny problems (fewer than 8 rows on 1024²) stay on it; from there up to ``rows·n = 2d`` oneDNN beat the
    #: structured, pre-mixed and per-call materialised paths on stacks of 1024² and 4096² layers (n = 2–16, 1 and 2
    #: threads; at 4096² by 1.3–2.0× over the next best at 4–256 rows). Beyond ``rows·n = 2d`` forming ``H`` wins:
    #: the partial products (``rows·n·k`` numbers) and the mixing (``n²/d`` of the product's work) grow with ``n``.
    #: On MiniLM's smaller shapes oneDNN won too from about 16 rows (measured before the rule for small weights above
    #: took its present form), but they stay off it for memory: with oneDNN, its code, kernels and caches took 10–15 MB of
    #: a PHM n = 4 MiniLM's 32 MB saving (memory in use after encoding, fresh processes) and half of it at peak, for
    #: 1.0–1.1× of the teacher's speed at batch 32 (0.8–1.1× without). Set ``ONEDNN_MIN_WEIGHT = 0`` on the class (or
    #: ``forward_mode="onednn"`` on a layer) to trade that memory for the speed. Measured 2026-11-27
    #: (docs/performance.md, "oneDNN").
    ONEDNN_MIN_ROWS_N = 4
    ONEDNN_ROWS_PER_INPUT = 2
    ONEDNN_MIN_WORK = 2 ** 23
    ONEDNN_MIN_WEIGHT = 2 ** 20

    def _streamable(self) -> bool:
        """Whether ``auto`` may hand this call to the compiled kernel or to oneDNN: float32 on the CPU, outside
        autocast, ``torch.compile``, tracing and ONNX export (which need PyTorch operations to record)."""
        return (self.phm_weight.device.type == "cpu" and self.phm_weight.dtype == torch.float32
                and self.phm_rule.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
                and not recording_operations())

    def choose_mode(self, rows: int, input_grad: bool = False) -> str:
        """The path ``forward`` takes for an input with ``rows`` rows: ``"structured"``, ``"premixed"``,
        ``"materialized"``, ``"streamed"``, ``"cached"`` (materialized, reusing ``H``) or ``"dense"`` (``n = 1``).
        ``input_grad``: the input needs a gradient (``auto`` then keeps to the differentiable paths)."""
        if self.n == 1:
            return "dense"
        inference = not self._needs_weight_grad() and not torch.compiler.is_compiling()
        cacheable = inference and self.cache_dense
        mode = self.forward_mode
        if mode == "auto":
            # Few rows on a large weight: reading k·d/n weights instead of k·d wins (memory-bound).
            # Many rows, or a cache-resident weight: the matmul is compute-bound and forming H once
            # (or reusing the cached H, which costs nothing to form) beats the structured path's
            # n² mixing.
            weight = self.in_features * self.out_features
            if inference and not cacheable and weight < self.SMALL_WEIGHT and rows <= self.SMALL_WEIGHT_ROW_LIMIT:
                mode = "premixed" if self.out_features > self.in_features else "structured"
            else:
                if cacheable:
                    limit, per_row = self.STRUCTURED_ROW_LIMIT_INFERENCE, self.WEIGHT_PER_ROW_INFERENCE
                elif inference:
                    limit, per_row = self.STRUCTURED_ROW_LIMIT_INFERENCE, self.WEIGHT_PER_ROW_UNCACHED
                else:
                    limit, per_row = self.STRUCTURED_ROW_LIMIT_TRAINING, self.WEIGHT_PER_ROW_TRAINING
                    if weight >= self.LARGE_WEIGHT:
                        limit = self.STRUCTURED_ROW_LIMIT_TRAINING_LARGE
                structured = rows * self.n <= limit and rows * per_row <= weight
                if cacheable and weight <= self.CACHE_RESIDENT_WEIGHT:
                    structured = False
                mode = "structured" if structured else "materialized"
            if inference and not cacheable and not input_grad and self._streamable():
                # The compiled kernel (when it is on) streams the factors once at few rows on large layers ...
                if (mode != "materialized" and rows <= native.STREAMED_ROW_LIMIT
                        and weight // self.n >= native.STREAMED_MIN_FACTORS and native.native_kernels_enabled()):
                    mode = "streamed"
                # ... else oneDNN runs the structured product, where it measured fastest.
                elif (weight >= self.ONEDNN_MIN_WEIGHT
                      and self.ONEDNN_MIN_ROWS_N <= rows * self.n <= self.ONEDNN_ROWS_PER_INPUT * self.in_features
                      and rows * weight >= self.ONEDNN_MIN_WORK
                      and mode != "premixed" and onednn_available()):
                    mode = "onednn"
        if mode == "materialized" and cacheable:
            return "cached"
        return mode

    def forward(self, input: Tensor) -> Tensor:
        if input.shape[-1] != self.in_features:
            raise ValueError(f"expected input with last dimension {self.in_features}, got shape {tuple(input.shape)}")
        if self.n == 1:  # exactly nn.Linear
            return F.linear(input, self.phm_weight.view(self.out_features, self.in_features), self.bias)
        if self._shared_weight is not None:  # inside shared_weights(): H formed once for many calls
            return F.linear(input, self._shared_weight, self.bias)
        if input.is_cuda and triton_phm.takes_triton(input, self):  # the fused few-row kernel: inference on CUDA
            return triton_phm.triton_phm_linear(input, self.phm_rule, self.phm_weight, self.bias)
        mode = self.choose_mode(input.numel() // self.in_features, input.requires_grad and torch.is_grad_enabled())
        if mode == "structured":
            return phm_linear_structured(input, self.phm_rule, self.phm_weight, self.bias)
        if mode == "premixed":
            return phm_linear_premixed(input, self.phm_rule, self.phm_weight, self.bias)
        if mode == "streamed":
            return native.phm_linear_streamed(input, self.phm_rule, self.phm_weight, self.bias)
        if mode == "onednn":
            return phm_linear_onednn(input, self.phm_rule, self.phm_weight, self.bias)
        if mode == "materialized" and not torch.is_grad_enabled() and not recording_operations():
            # H for this call only, used at once and saved by nothing: formed into the thread's reused buffer
            # (no fresh allocation to page-fault in on every call; functional.formation_buffer) — one block column
            # (k × d/n) at a time on small layers whose block columns are wide enough (takes_blocked)
            if (takes_blocked(self.out_features, self.in_features, self.n) and input.device.type == "cpu"
                    and input.dtype == self.phm_weight.dtype and not torch.is_autocast_enabled(input.device.type)):
                buffer = formation_buffer(self.out_features * self.in_features // self.n, self.phm_weight.dtype,
                                          self.phm_weight.device)
                return phm_linear_blocked(input, self.phm_rule, self.phm_weight, self.bias, buffer=buffer)
            buffer = formation_buffer(self.out_features * self.in_features, self.phm_weight.dtype, self.phm_weight.device)
            if buffer is not None:
                weight = materialize_weight(self.phm_rule, self.phm_weight, self._permutation(),
                                            out=buffer.view(self.out_features, self.in_features))
                return F.linear(input, weight, self.bias)
        return F.linear(input, self._weight_for(mode), self.bias)

    def _weight_for(self, mode: str) -> Tensor:
        """``H`` for a ``"materialized"`` (differentiable, formed for this call) or ``"cached"``
        (kept and reused) forward."""
        return self._cached_dense_weight() if mode == "cached" else self.dense_weight()

    # ------------------------------------------------------------------ conversion
    @classmethod
    def from_linear(cls, linear: nn.Linear, n: int, rule: RuleSpec = "learned", **kwargs) -> tuple["PHMLinear", float]:
        """Convert a dense layer; returns ``(layer, ‖W − H‖_F / ‖W‖_F)``
        (:func:`hyperplex.layers.conversion.phm_from_linear`)."""
        from hyperplex.layers.conversion import phm_from_linear

        return phm_from_linear(linear, n, rule, **kwargs)

    def to_linear(self) -> nn.Linear:
        """An ``nn.Linear`` computing the same function (weight ``H``, same bias)."""
        from hyperplex.layers.conversion import to_linear

        return to_linear(self)


@contextmanager
def shared_weights(modules: nn.Module | Iterable[nn.Module | None], rows: int) -> Iterator[None]:
    """Form each PHM layer's ``H`` once for a run of calls with the same weights.

    A recurrence calls the same layer at every time step with a few rows each time (an LSTM's
    ``W_h h_{t−1}`` on ``B`` rows, ``T`` times). Each call alone looks like the structured path's
    regime, yet forming ``H`` once and multiplying ``T`` times is cheaper: ``H``'s gradient is
    summed over the steps and flows back to ``Aᵢ`` and ``Sᵢ`` once, at the end of backward.

    Inside the context every :class:`PHMLinear` in ``modules`` (one module or several; ``None``
    entries are skipped) with ``n > 1`` whose
    :meth:`~PHMLinear.choose_mode` for ``rows`` (the total rows over all the calls) forms ``H``
    (``"materialized"`` or ``"cached"``; not the paths that never form it: structured, pre-mixed, oneDNN,
    streamed, which each call then takes for its own rows) computes with that one ``H``: ``dense_weight()`` (differentiable when weight
    gradients are needed), or the kept ``H`` of a layer with ``cache_dense``. Without
    ``cache_dense`` the ``H`` lives only as long as the context. Results equal the per-call paths up to
    rounding. Do not change the parameters inside the context (an optimizer step): ``H`` would
    be stale. Contexts nest; the outer ``H`` is restored on exit.
    """
    roots = [modules] if isinstance(modules, nn.Module) else [m for m in modules if m is not None]
    layers = [m for root in roots for m in root.modules() if isinstance(m, PHMLinear) and m.n > 1]
    saved = [m._shared_weight for m in layers]
    try:
        for m in layers:
            if m._shared_weight is not None:
                continue
            mode = m.choose_mode(rows)
            if mode in ("materialized", "cached"):
                m._shared_weight = m._weight_for(mode)
        yield
    finally:
        for m, weight in zip(layers, saved):
            m._shared_weight = weight


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
        size = layer.in_features * layer.out_features * layer.phm_weight.element_size()
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
