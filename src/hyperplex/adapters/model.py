"""Model-level adapter API: inject PHM adapters into a model's linear layers by name pattern,
switch, merge, remove, count, and read/write their weights as a flat state dict.

The model is changed in place: every adapted ``nn.Linear`` is replaced in its parent by a
:class:`~hyperplex.adapters.layer.PHMAdaptedLinear`, and every module to save by a
:class:`~hyperplex.adapters.layer.SavedModule`, each holding the original as ``base_layer`` (so the
base weights' state-dict keys gain a ``.base_layer`` segment until :func:`remove_adapter` unwraps them).
All adapter state lives in those wrappers; nothing is set on the user's model object.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple, TypeVar, cast

import torch
from torch import Tensor, nn

from hyperplex.adapters.config import PHMAdapterConfig
from hyperplex.adapters.layer import AdapterWrapper, PHMAdaptedLinear, PHMDelta, SavedModule
from hyperplex.adapters.targets import check_adapter_name, outer_modules, resolve_modules_to_save, select_targets
from hyperplex.layers.selection import dense_sizes, is_dense

__all__ = ["add_adapter", "set_active", "active_adapter", "merge", "unmerge", "merge_and_unwrap", "remove_adapter",
           "adapter_names", "adapted_layers", "saved_modules", "adapter_deltas", "adapter_config",
           "adapter_layer_sizes", "adapter_saved_modules", "trainable_parameters", "ParameterCount"]

class ParameterCount(NamedTuple):
    """Distinct parameters of a model: ``trainable`` (``requires_grad``) and ``total``."""

    trainable: int
    total: int

    @property
    def fraction(self) -> float:
        return self.trainable / self.total if self.total else 0.0




def _wrappers(model: nn.Module) -> Iterator[tuple[str, AdapterWrapper]]:
    for name, module in model.named_modules():
        if isinstance(module, AdapterWrapper):
            yield name, module


def adapted_layers(model: nn.Module) -> Iterator[tuple[str, PHMAdaptedLinear]]:
    """``(dotted name, layer)`` for every :class:`PHMAdaptedLinear` in ``model`` (each once)."""
    for name, module in _wrappers(model):
        if isinstance(module, PHMAdaptedLinear):
            yield name, module


def saved_modules(model: nn.Module) -> Iterator[tuple[str, SavedModule]]:
    """``(dotted name, wrapper)`` for every module trained in full by an adapter (``modules_to_save``)."""
    for name, module in _wrappers(model):
        if isinstance(module, SavedModule):
            yield name, module


def adapter_names(model: nn.Module) -> list[str]:
    """Names of the adapters attached to ``model``, in order of first appearance."""
    names: dict[str, None] = {}
    for _, wrapper in _wrappers(model):
        names.update(dict.fromkeys(wrapper.adapters))
    return list(names)


def adapter_deltas(model: nn.Module, name: str) -> list[tuple[str, PHMDelta]]:
    """``(layer name, delta)`` of adapter ``name`` in module order; ``KeyError`` naming the attached ones."""
    deltas = [(path, cast(PHMDelta, layer.adapters[name])) for path, layer in adapted_layers(model)
              if name in layer.adapters]
    if not deltas:
        known = adapter_names(model)
        raise KeyError(f"no adapter named {name!r} in the model; attached: {known or 'none'}")
    return deltas


def adapter_config(model: nn.Module, name: str) -> PHMAdapterConfig:
    """The :class:`PHMAdapterConfig` adapter ``name`` was added with."""
    return adapter_deltas(model, name)[0][1].config


def adapter_layer_sizes(model: nn.Module, name: str) -> dict[str, tuple[int, int]]:
    """Layer name → ``(in_features, out_features)`` of every layer adapter ``name`` adapts."""
    return {path: (delta.in_features, delta.out_features) for path, delta in adapter_deltas(model, name)}


def adapter_saved_modules(model: nn.Module, name: str) -> dict[str, nn.Module]:
    """Module name → adapter ``name``'s own trained copy, for every module it trains in full."""
    adapter_deltas(model, name)  # KeyError for an unknown adapter
    return {path: wrapper.adapters[name] for path, wrapper in saved_modules(model) if name in wrapper.adapters}


def active_adapter(model: nn.Module) -> str | None:
    """The active adapter's name, or ``None``."""
    active = {wrapper.active_adapter for _, wrapper in _wrappers(model)} - {None}
    return next(iter(active), None)


def _merged(model: nn.Module) -> str | None:
    return next((layer.merged_adapter for _, layer in adapted_layers(model) if layer.merged_adapter), None)


def add_adapter(model: nn.Module, name: str, config: PHMAdapterConfig, *, layers: list[str] | None = None,
                saved: list[str] | None = None) -> nn.Module:
    """Attach a PHM adapter called ``name``, configured by ``config``, to the layers of ``model`` that
    ``config.targets`` select, give it a trainable copy of every module ``config.modules_to_save`` selects,
    make it the active one, and freeze everything else.

    ``layers`` and ``saved`` (dotted names) replace the patterns by exact names; :func:`load_adapter` uses
    them so that exactly the saved modules are used. After the call only the new adapter's parameters (its
    deltas and its copies of the modules to save) have ``requires_grad``. At init the model computes exactly
    what it computed before. Errors (a pattern that matches nothing, sizes ``n`` does not divide, a module
    both adapted and saved) are raised before the model changes. Returns ``model`` (changed in place).
    """
    if not isinstance(config, PHMAdapterConfig):
        raise TypeError(f"add_adapter takes a PHMAdapterConfig (add_adapter(model, name, PHMAdapterConfig(n=4, ...))), "
                        f"got {type(config).__name__}")
    check_adapter_name(name)
    if name in adapter_names(model):
        raise ValueError(f"the model already has an adapter named {name!r}; "
                         "remove_adapter it first or pick another name")
    if (merged := _merged(model)) is not None:
        raise RuntimeError(f"adapter {merged!r} is merged into the weights; unmerge(model) before adding another")
    modules = dict(outer_modules(model))
    saved = resolve_modules_to_save(model, config.modules_to_save) if saved is None else list(saved)
    to_save = [(path, _module_to_save(modules, path)) for path in saved]
    paths = select_targets(model, config, saved=saved) if layers is None else list(layers)
    if not paths:
        raise ValueError(f"adapter {name!r}: no layers to adapt")
    targets = [(path, _target(modules, path, saved)) for path in paths]
    deltas = _new_deltas(targets, config)  # every delta made before the model changes: a size error leaves it as it was
    record = next((w.requires_grad_before for _, w in _wrappers(model)), None)
    if record is None:  # the first adapter: remember what was trainable
        record = [(param, param.requires_grad) for param in model.parameters()]
    for param in model.parameters():
        param.requires_grad_(False)
    for (_path, module), delta in zip(targets, deltas):
        _wrap(model, module, PHMAdaptedLinear, record).adapters[name] = delta
    for _path, module in to_save:
        _wrap(model, module, SavedModule, record).add_copy(name)
    set_active(model, name)
    return model


def _target(modules: dict[str, nn.Module], path: str, saved: list[str]) -> nn.Module:
    """The module at ``path`` if an adapter can go there (``ValueError`` naming it otherwise)."""
    if path == "":
        raise ValueError("cannot adapt the model's root module itself; put the layer inside a container module")
    module = modules.get(path)
    if module is None or not (isinstance(module, PHMAdaptedLinear) or is_dense(module)):
        raise ValueError(f"layer {path!r}: not an nn.Linear/Conv1D module in the model")
    inside = [s for s in saved if path == s or path.startswith(s + ".")]
    if inside:
        raise ValueError(f"layer {path!r}: inside {inside[0]!r}, a module trained in full (modules_to_save); a module "
                         f"is either adapted or trained in full, not both")
    return module


def _module_to_save(modules: dict[str, nn.Module], path: str) -> nn.Module:
    """The module at ``path`` if an adapter can train it in full (``ValueError`` naming it otherwise)."""
    module = modules.get(path)
    if path == "" or module is None:
        raise ValueError(f"module to save {path!r}: not a module of the model (the model itself cannot be saved)")
    adapted = [p for p, m in module.named_modules(prefix=path) if isinstance(m, PHMAdaptedLinear)]
    if adapted:
        raise ValueError(f"module to save {path!r}: it holds {adapted[0]!r}, a layer with a PHM adapter; a module is "
                         f"either adapted or trained in full, not both")
    return module


def _new_deltas(targets: list[tuple[str, nn.Module]], config: PHMAdapterConfig) -> list[PHMDelta]:
    reference = cast(Tensor, targets[0][1].weight)
    shared = None
    if config.shared_rule:
        shared = nn.Parameter(torch.empty(config.n, config.n, config.n, device=reference.device, dtype=reference.dtype))
        PHMDelta.init_rule(shared)
    deltas = []
    for path, module in targets:
        base = module.base_layer if isinstance(module, PHMAdaptedLinear) else module
        d, k = dense_sizes(base)
        try:
            deltas.append(PHMDelta(d, k, config, shared, device=base.weight.device, dtype=base.weight.dtype))
        except ValueError as e:
            raise ValueError(f"layer {path!r}: {e}") from None
    return deltas


_Wrapper = TypeVar("_Wrapper", bound=AdapterWrapper)


def _wrap(model: nn.Module, module: nn.Module, kind: type[_Wrapper],
          record: list[tuple[nn.Parameter, bool]]) -> _Wrapper:
    """``module`` itself if it is a ``kind`` wrapper already, else a new ``kind`` around it, put at every name
    the module is registered under (tied layers keep sharing one wrapper)."""
    if isinstance(module, kind):
        return module
    wrapper = kind(module)
    wrapper.requires_grad_before = record
    _replace(model, module, wrapper)
    return wrapper


def _replace(model: nn.Module, old: nn.Module, new: nn.Module) -> None:
    """Put ``new`` at every name ``old`` is registered under in ``model``."""
    for path, module in list(model.named_modules(remove_duplicate=False)):
        if module is old:
            parent_name, _, child = path.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def set_active(model: nn.Module, name: str | None) -> None:
    """Make adapter ``name`` the active one (``None``: the base model alone). Only the active adapter's
    parameters get ``requires_grad``; the other adapters' are frozen. Refused while an adapter is merged."""
    if name is not None and name not in adapter_names(model):
        raise KeyError(f"no adapter named {name!r} in the model; attached: {adapter_names(model) or 'none'}")
    if (merged := _merged(model)) is not None and merged != name:
        raise RuntimeError(f"adapter {merged!r} is merged into the weights; unmerge(model) before switching")
    for _, wrapper in _wrappers(model):
        wrapper.set_active(name)


def _tied_elsewhere(model: nn.Module) -> dict[str, list[str]]:
    """For each adapted layer whose base weight is also reachable under a name that is not one of the
    layer's own aliases (an embedding tied to an output projection): those other names."""
    param_names: dict[int, list[str]] = {}
    for pname, param in model.named_parameters(remove_duplicate=False):
        param_names.setdefault(id(param), []).append(pname)
    aliases: dict[int, list[str]] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        aliases.setdefault(id(module), []).append(path)
    tied = {}
    for path, layer in adapted_layers(model):
        own = {f"{alias}.base_layer.weight" for alias in aliases[id(layer)]}
        others = [n for n in param_names.get(id(layer.base_layer.weight), []) if n not in own]
        if others:
            tied[path] = others
    return tied


def merge(model: nn.Module) -> int:
    """Fold the active adapter into the base weights (``W ← W + s·ΔW``) of every layer that has it;
    forward then costs what the base model costs. Returns the number of layers merged.

    Refused when an adapted layer's weight is tied to another module (e.g. an output projection
    sharing the embedding matrix): merging would change that module too.
    """
    name = active_adapter(model)
    if name is None:
        raise RuntimeError("no active adapter to merge; set_active(model, name) first")
    if (merged := _merged(model)) is not None:
        raise RuntimeError(f"adapter {merged!r} is already merged")
    tied = {p: o for p, o in _tied_elsewhere(model).items() if dict(adapted_layers(model))[p].active_adapter}
    if tied:
        where = "; ".join(f"{p} (weight also used as {', '.join(o)})" for p, o in tied.items())
        raise RuntimeError(f"cannot merge: the weight of {where} is tied to another module, which merging would change")
    active = [(path, layer) for path, layer in adapted_layers(model) if layer.active_adapter is not None]
    for path, layer in active:  # every layer checked before any weight is written
        layer.check_foldable(f"layer {path!r}")
    for _, layer in active:
        layer.merge()
    return len(active)


def unmerge(model: nn.Module) -> int:
    """Subtract the merged adapter from the base weights again (exact up to float rounding);
    returns the number of layers unmerged (0 when nothing was merged)."""
    count = 0
    for _, layer in adapted_layers(model):
        if layer.merged_adapter is not None:
            layer.unmerge()
            count += 1
    return count


def remove_adapter(model: nn.Module, name: str) -> None:
    """Detach adapter ``name``; a wrapper left with no adapter is replaced by its original module again, and
    once no adapter is left every parameter gets back the ``requires_grad`` it had before the first one."""
    adapter_deltas(model, name)
    if _merged(model) == name:
        raise RuntimeError(f"adapter {name!r} is merged into the weights; unmerge(model) before removing it")
    wrappers = [w for _, w in _wrappers(model)]
    for wrapper in wrappers:
        if name not in wrapper.adapters:
            continue
        del wrapper.adapters[name]
        if wrapper.active_adapter == name:
            wrapper.active_adapter = None
        if not len(wrapper.adapters):
            _replace(model, wrapper, wrapper.base_layer)
    _restore_flags_if_unadapted(model, wrappers[0].requires_grad_before)


def _restore_flags_if_unadapted(model: nn.Module, record: list[tuple[nn.Parameter, bool]]) -> None:
    """Once no adapter is left, give every parameter in ``record`` back the ``requires_grad`` it had before
    the first :func:`add_adapter` (which froze them)."""
    if not any(True for _ in _wrappers(model)):
        for param, flag in record:
            param.requires_grad_(flag)


def merge_and_unwrap(model: nn.Module) -> nn.Module:
    """Merge the active adapter (if any) and replace every wrapper by what runs in it: a linear layer by its
    base layer with the adapter baked in, a module to save by the active adapter's trained copy (the
    original where none is active). A plain model for deployment; the adapters are dropped. Returns ``model``."""
    if active_adapter(model) is not None and _merged(model) is None:
        merge(model)
    wrappers = [w for _, w in _wrappers(model)]
    for wrapper in wrappers:
        _replace(model, wrapper, wrapper.current() if isinstance(wrapper, SavedModule) else wrapper.base_layer)
    if wrappers:
        _restore_flags_if_unadapted(model, wrappers[0].requires_grad_before)
    return model


def trainable_parameters(model: nn.Module) -> ParameterCount:
    """Distinct parameters with ``requires_grad`` and in total (a shared rule counts once)."""
    params = list(model.parameters())  # de-duplicated by identity
    return ParameterCount(sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params))
