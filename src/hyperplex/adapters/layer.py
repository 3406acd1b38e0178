"""The PHM delta and the layer that adds it to a frozen ``nn.Linear`` (or ``transformers``' ``Conv1D``).

``y = W x + b + s · ΔW x`` with ``ΔW = Σᵢ Aᵢ ⊗ Sᵢ`` (k × d), ``Aᵢ`` (n × n), ``Sᵢ`` (k/n × d/n) or
``Sᵢ = Lᵢ Rᵢ`` with ``Lᵢ = left[i]`` (k/n × r), ``Rᵢ = right[i]`` (r × d/n). Unmerged, ``ΔW x`` is computed
by the structured product and ``ΔW`` is never formed; merged, ``s·ΔW`` is folded into ``W`` and the layer
costs exactly what the base layer costs.
"""

from __future__ import annotations

import copy
import hashlib
import math
from typing import cast

import torch
from torch import Tensor, nn

from hyperplex.adapters.config import PHMAdapterConfig
from hyperplex.layers.functional import materialize_weight, phm_linear_structured
from hyperplex.layers.functional import phm_linear_lowrank as phm_lowrank_structured  # one home for the kernel
from hyperplex.layers.phm import check_factor_rank
from hyperplex.layers.selection import dense_sizes, dense_source, dense_tensors, is_dense

__all__ = ["PHMDelta", "AdapterWrapper", "PHMAdaptedLinear", "SavedModule", "phm_lowrank_structured",
           "tensors_sha256"]


def tensors_sha256(named: list[tuple[str, Tensor]]) -> str:
    """SHA-256 (hex) of ``(name, tensor)`` pairs in the order given: each name, dtype, shape and every byte."""
    digest = hashlib.sha256()
    for name, tensor in named:
        t = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            digest.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return digest.hexdigest()


class PHMDelta(nn.Module):
    """One adapter's ``s · ΔW`` for one layer: ``forward(x (..., d)) → (..., k)``, never forming ``ΔW``.

    Parameters: ``rule`` ``(n, n, n)`` (``rule[i]`` is ``Aᵢ``; the same ``nn.Parameter`` object in every
    layer when the rule is shared); ``weight`` ``(n, k/n, d/n)`` (full ``Sᵢ``) or ``left`` ``(n, k/n, r)``
    and ``right`` ``(n, r, d/n)`` (``Sᵢ = left[i] @ right[i]``).

    Initialisation makes ``ΔW = 0`` exactly while every parameter still gets a gradient at the first
    step or the next (as LoRA zeroes ``B``): ``Aᵢ ~ N(0, 1/n)`` (random, so the ``n`` terms differ —
    PHMLinear's reasoning), full ``Sᵢ = 0``; low rank ``Lᵢ = 0`` and ``Rᵢ ~ U(−1/√(d/n), 1/√(d/n))``.
    """

    def __init__(self, in_features: int, out_features: int, config: PHMAdapterConfig,
                 shared_rule: nn.Parameter | None = None, device=None, dtype=None) -> None:
        super().__init__()
        n, rank = config.n, config.rank
        if in_features % n or out_features % n:
            raise ValueError(f"n={n} must divide in_features={in_features} and out_features={out_features}")
        check_factor_rank(rank, in_features, out_features, n, key="rank")
        factory = {"device": device, "dtype": dtype}
        self.in_features, self.out_features, self.config = in_features, out_features, config
        self.rule = shared_rule if shared_rule is not None else nn.Parameter(torch.empty(n, n, n, **factory))
        k_n, d_n = out_features // n, in_features // n
        if rank is None:
            self.weight = nn.Parameter(torch.empty(n, k_n, d_n, **factory))
        else:
            self.left = nn.Parameter(torch.empty(n, k_n, rank, **factory))
            self.right = nn.Parameter(torch.empty(n, rank, d_n, **factory))
        self.dropout = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()
        self.reset_parameters(reset_rule=shared_rule is None)

    @staticmethod
    def init_rule(rule: Tensor) -> None:
        """``Aᵢ ~ N(0, 1/n)`` in place (shared rules are initialised once by the caller)."""
        with torch.no_grad():
            rule.normal_(0.0, 1.0 / math.sqrt(rule.shape[0]))

    def reset_parameters(self, reset_rule: bool = True) -> None:
        """``ΔW = 0``: see the class docstring."""
        if reset_rule:
            self.init_rule(self.rule)
        with torch.no_grad():
            if self.config.rank is None:
                self.weight.zero_()
            else:
                self.left.zero_()
                bound = 1.0 / math.sqrt(self.in_features // self.config.n)
                self.right.uniform_(-bound, bound)

    def blocks(self) -> Tensor:
        """The ``Sᵢ`` as ``(n, k/n, d/n)`` (formed from ``Lᵢ Rᵢ`` for a low-rank adapter)."""
        return self.weight if self.config.rank is None else self.left @ self.right

    def delta_weight(self) -> Tensor:
        """``s · ΔW`` as a ``(k, d)`` matrix (differentiable); used by merge and by tests."""
        return self.config.scale * materialize_weight(self.rule, self.blocks())

    def forward(self, x: Tensor) -> Tensor:
        x = self.dropout(x)
        if self.config.rank is None:
            out = phm_linear_structured(x, self.rule, self.weight)
        else:
            out = phm_lowrank_structured(x, self.rule, self.left, self.right)
        return out * self.config.scale if self.config.scale != 1.0 else out

    def extra_repr(self) -> str:
        c = self.config
        rank = "full" if c.rank is None else c.rank
        return (f"in_features={self.in_features}, out_features={self.out_features}, n={c.n}, rank={rank}, "
                f"scale={c.scale}, shared_rule={c.shared_rule}")


class AdapterWrapper(nn.Module):
    """What an adapter puts in a model in place of one of its modules (peft's ``BaseTunerLayer`` has this role).

    Attributes:
        base_layer: the wrapped module, frozen.
        adapters: ``nn.ModuleDict`` adapter name → what that adapter adds (a :class:`PHMDelta`, or a trained copy).
        active_adapter: name or ``None``.
        requires_grad_before: ``(parameter, requires_grad)`` of every parameter of the model from before the
            first adapter froze them: one list, shared by every wrapper in the model, given back when the
            last adapter is removed. Adapter state, so it lives here and not on the user's model.
    """

    def __init__(self, base_layer: nn.Module) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.adapters = nn.ModuleDict()
        self.active_adapter: str | None = None
        self.requires_grad_before: list[tuple[nn.Parameter, bool]] = []

    def set_active(self, name: str | None) -> None:
        """Make adapter ``name`` the active one here (``None`` where this wrapper does not hold it); only its
        parameters get ``requires_grad`` (a shared rule belongs to one adapter: no conflict)."""
        self.active_adapter = name if name is not None and name in self.adapters else None
        for key, module in self.adapters.items():
            module.requires_grad_(key == name)


def dense_signature(layer: nn.Module) -> str:
    """SHA-256 of a dense layer's ``weight`` and ``bias`` (:func:`tensors_sha256`)."""
    weight, bias = dense_tensors(layer)
    return tensors_sha256([(name, t) for name, t in (("weight", weight), ("bias", bias)) if t is not None])


class PHMAdaptedLinear(AdapterWrapper):
    """A frozen ``nn.Linear`` / ``Conv1D`` (``base_layer``) plus named PHM adapters, at most one active.

    ``forward(x (..., d)) → (..., k)``: ``base_layer(x) + adapters[active](x)``; ``base_layer(x)`` alone
    when no adapter is active or the active one is merged into ``base_layer.weight``.

    Attributes (beside :class:`AdapterWrapper`'s):
        adapters: ``nn.ModuleDict`` name → :class:`PHMDelta`.
        merged_adapter: name of the adapter folded into ``base_layer.weight``, or ``None``.
    """

    def __init__(self, base_layer: nn.Module) -> None:
        if not is_dense(base_layer):
            raise TypeError(f"a PHM adapter wraps nn.Linear or transformers' Conv1D, got {type(base_layer).__name__}")
        super().__init__(base_layer)
        self.in_features, self.out_features = dense_sizes(base_layer)
        self.merged_adapter: str | None = None
        self._unmerged_signature: str | None = None  # the base's signature, kept while an adapter is merged

    def base_signature(self) -> str:
        """:func:`dense_signature` of the base layer as it is without any adapter (also while one is merged)."""
        return self._unmerged_signature or dense_signature(self.base_layer)

    @property
    def weight(self) -> Tensor:
        """The base layer's weight (so code that reads ``layer.weight`` keeps working)."""
        return dense_tensors(self.base_layer)[0]

    @property
    def bias(self) -> Tensor | None:
        return dense_tensors(self.base_layer)[1]

    def forward(self, x: Tensor) -> Tensor:
        out = self.base_layer(x)
        if self.active_adapter is not None and self.merged_adapter is None:
            out = out + self.adapters[self.active_adapter](x)
        return out

    def folded_weight(self, sign: float = 1.0) -> Tensor:
        """``W ± s·ΔW`` for the active adapter, computed in at least float32 and returned in the weight's
        dtype (what a merge would write; shape of ``base_layer.weight``). The layer is not changed."""
        if self.active_adapter is None:
            raise RuntimeError("no adapter is active in this layer (hyperplex.adapters.set_active first)")
        delta = cast(PHMDelta, self.adapters[self.active_adapter]).delta_weight().detach()  # (k, d)
        weight = self.weight
        if dense_source(self.base_layer) == "conv1d":  # weight is (d, k), y = x W + b
            delta = delta.T
        compute = torch.promote_types(weight.dtype, torch.float32)
        with torch.no_grad():
            return (weight.to(compute) + sign * delta.to(compute)).to(weight.dtype)

    def check_foldable(self, where: str = "this layer") -> None:
        """RuntimeError naming ``where`` when merging the active adapter would write a NaN or ±inf into the
        frozen weight (a non-finite adapter, or a sum that overflows the weight's dtype, e.g. float16):
        ``unmerge`` could not undo it."""
        folded = self.folded_weight(+1.0)
        if not bool(torch.isfinite(folded).all()):
            bad = int((~torch.isfinite(folded)).sum())
            raise RuntimeError(f"cannot merge adapter {self.active_adapter!r} into {where}: {bad} weight(s) would "
                               f"become NaN or infinite in {self.weight.dtype} (a non-finite adapter, or "
                               f"an overflow); the weights are unchanged")

    def _fold(self, sign: float) -> None:
        """``W ← W ± s·ΔW`` for the active adapter (:meth:`folded_weight`)."""
        folded = self.folded_weight(sign)
        with torch.no_grad():
            self.weight.copy_(folded)

    def merge(self) -> None:
        """Fold the active adapter into ``base_layer.weight``; forward then costs the base layer's.
        Refused, with the weight unchanged, when the result would not be finite (:meth:`check_foldable`)."""
        if self.merged_adapter is not None:
            raise RuntimeError(f"adapter {self.merged_adapter!r} is already merged into this layer")
        if self.active_adapter is None:
            raise RuntimeError("no active adapter to merge")
        self.check_foldable()
        self._unmerged_signature = dense_signature(self.base_layer)
        self._fold(+1.0)
        self.merged_adapter = self.active_adapter

    def unmerge(self) -> None:
        """Subtract the merged adapter from ``base_layer.weight`` (restores it up to rounding)."""
        if self.merged_adapter is None:
            raise RuntimeError("no adapter is merged into this layer")
        if self.merged_adapter != self.active_adapter:  # set_active refuses while merged; guard anyway
            raise RuntimeError(f"merged adapter {self.merged_adapter!r} is not the active one")
        self._fold(-1.0)
        self.merged_adapter = self._unmerged_signature = None

    def extra_repr(self) -> str:
        return f"active_adapter={self.active_adapter!r}, merged_adapter={self.merged_adapter!r}"


class SavedModule(AdapterWrapper):
    """A module that adapters train in full and save (``PHMAdapterConfig.modules_to_save``): a new head, say.

    ``base_layer`` is the original module, frozen; each adapter holds its own copy of it in ``adapters``,
    made when the adapter is added, trained while it is active and saved with its weights. ``forward`` runs
    the active adapter's copy, or the original when no adapter here is active. Attributes that are not the
    wrapper's own are read from that module, so code that reads ``head.out_features`` keeps working.
    """

    _OWN = frozenset({"base_layer", "adapters", "active_adapter", "requires_grad_before"})

    def add_copy(self, name: str) -> None:
        """Give adapter ``name`` its own copy of the original module (same values, device, dtype)."""
        self.adapters[name] = copy.deepcopy(self.base_layer)

    def current(self) -> nn.Module:
        """The module ``forward`` runs: the active adapter's copy, or the original."""
        return self.base_layer if self.active_adapter is None else self.adapters[self.active_adapter]

    def forward(self, *args, **kwargs):
        return self.current()(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in self._OWN or name.startswith("_"):
                raise
            return getattr(self.current(), name)

    def extra_repr(self) -> str:
        return f"active_adapter={self.active_adapter!r}"
