"""Model-level adapter API: inject PHM adapters into a model's linear layers by name pattern,
switch, merge, remove, count, and read/write their weights as a flat state dict.

The model is changed in place: every adapted ``nn.Linear`` is replaced in its parent by a
:class:`~hyperplex.adapters.layer.PHMAdaptedLinear` that holds it as ``base_layer`` (so the base
weights' state-dict keys gain a ``.base_layer`` segment until :func:`remove_adapter` unwraps them).
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterator
from fnmatch import fnmatchcase
from typing import NamedTuple

import torch
from torch import Tensor, nn

from hyperplex.adapters.config import PHMAdapterConfig
from hyperplex.adapters.layer import PHMAdaptedLinear, PHMDelta, is_adaptable, linear_sizes

__all__ = ["add_adapter", "set_active", "active_adapter", "merge", "unmerge", "merge_and_unwrap", "remove_adapter",
           "adapter_names", "adapted_layers", "adapter_config", "adapter_state_dict", "load_adapter_state_dict",
           "expected_adapter_shapes", "resolve_targets", "trainable_parameters", "ParameterCount", "SHARED_RULE_KEY"]

#: Key of the shared rule in :func:`adapter_state_dict` (a rule per layer lives at ``<layer>.rule``).
SHARED_RULE_KEY = "shared_rule"


class ParameterCount(NamedTuple):
    """Distinct parameters of a model: ``trainable`` (``requires_grad``) and ``total``."""

    trainable: int
    total: int

    @property
    def fraction(self) -> float:
        return self.trainable / self.total if self.total else 0.0


#: Attribute (outside the state dict) holding each parameter's requires_grad from before the first adapter.
_FLAGS = "_hyperplex_requires_grad_before_adapters"


def _matches(name: str, pattern: str) -> bool:
    return fnmatchcase(name, pattern) or fnmatchcase(name, "*." + pattern)


def adapted_layers(model: nn.Module) -> Iterator[tuple[str, PHMAdaptedLinear]]:
    """``(dotted name, layer)`` for every :class:`PHMAdaptedLinear` in ``model`` (each once)."""
    for name, module in model.named_modules():
        if isinstance(module, PHMAdaptedLinear):
            yield name, module


def adapter_names(model: nn.Module) -> list[str]:
    """Names of the adapters attached to ``model``, in order of first appearance."""
    names: dict[str, None] = {}
    for _, layer in adapted_layers(model):
        names.update(dict.fromkeys(layer.adapters))
    return list(names)


def _deltas(model: nn.Module, name: str) -> list[tuple[str, PHMDelta]]:
    deltas = [(path, layer.adapters[name]) for path, layer in adapted_layers(model) if name in layer.adapters]
    if not deltas:
        known = adapter_names(model)
        raise KeyError(f"no adapter named {name!r} in the model; attached: {known or 'none'}")
    return deltas


def adapter_config(model: nn.Module, name: str) -> PHMAdapterConfig:
    """The :class:`PHMAdapterConfig` adapter ``name`` was added with."""
    return _deltas(model, name)[0][1].config


def active_adapter(model: nn.Module) -> str | None:
    """The active adapter's name, or ``None``."""
    active = {layer.active_adapter for _, layer in adapted_layers(model)} - {None}
    return next(iter(active), None)


def _merged(model: nn.Module) -> str | None:
    return next((layer.merged_adapter for _, layer in adapted_layers(model) if layer.merged_adapter), None)


#: Names an adapter may not have: attributes of the ``nn.ModuleDict`` that holds a layer's adapters.
_RESERVED = frozenset(dir(nn.ModuleDict()))


def _check_name(name: str, where: str = "adapter name") -> None:
    """ValueError naming ``where`` unless ``name`` can key a layer's adapters (checked before the model changes)."""
    if not isinstance(name, str) or not name or "." in name:
        raise ValueError(f"{where} must be a non-empty string without '.', got {reprlib.repr(name)}")
    if name in _RESERVED:
        raise ValueError(f"{where} {name!r} is an attribute of nn.Module (like 'training' or 'forward'); choose "
                         f"another name")


def resolve_targets(model: nn.Module, targets, n: int = 1, key: str = "PHMAdapterConfig") -> list[str]:
    """Dotted names of the ``nn.Linear`` / ``Conv1D`` layers of ``model`` that the glob patterns ``targets``
    select (the rule of :class:`PHMAdapterConfig`), in module order. ``ValueError`` (its message starts with
    ``key``, e.g. ``model.adapter``) naming a pattern that matches no linear layer, or every selected
    layer whose in/out features ``n`` does not divide."""
    return _resolve_targets(model, PHMAdapterConfig(n=n, targets=tuple(targets)), key)


def _resolve_targets(model: nn.Module, config: PHMAdapterConfig, key: str = "PHMAdapterConfig") -> list[str]:
    """Dotted names of the layers ``config.targets`` select; errors name the pattern that matched nothing
    and every selected layer whose sizes ``n`` does not divide."""
    candidates: list[str] = []
    others: dict[str, str] = {}
    for path, module in model.named_modules():
        if any(path.startswith(p + ".") for p in candidates) or ".base_layer" in path or ".adapters." in path:
            continue  # inside a wrapper already listed
        if isinstance(module, PHMAdaptedLinear) or is_adaptable(module):
            candidates.append(path)
        elif path:
            others[path] = type(module).__name__
    selected = [p for p in candidates if any(_matches(p, t) for t in config.targets)]
    for pattern in config.targets:
        if not any(_matches(p, pattern) for p in candidates):
            hit = [f"{p} ({t})" for p, t in others.items() if _matches(p, pattern)][:3]
            why = f"; it matches only modules that are not linear layers: {', '.join(hit)}" if hit else ""
            sample = ", ".join(candidates[:6]) + (", …" if len(candidates) > 6 else "")
            raise ValueError(f"{key}.targets: pattern {pattern!r} matches no nn.Linear/Conv1D module{why}; "
                             f"linear layers in the model: {sample or 'none'}")
    modules = dict(model.named_modules())
    bad = []
    for path in selected:
        d, k = linear_sizes(modules[path].base_layer if isinstance(modules[path], PHMAdaptedLinear) else modules[path])
        if d % config.n or k % config.n:
            bad.append(f"{path} ({d} → {k})")
    if bad:
        raise ValueError(f"{key}.n={config.n} must divide in and out features of every target layer; "
                         f"it does not for: {', '.join(bad)}")
    return selected


def add_adapter(model: nn.Module, name: str, config: PHMAdapterConfig | None = None, *,
                layers: list[str] | None = None, **kwargs) -> nn.Module:
    """Attach a PHM adapter called ``name`` to the layers of ``model`` that ``config.targets`` select,
    make it the active one, and freeze everything else.

    ``config`` may be given as keyword arguments instead (``add_adapter(model, "a", n=4, rank=8,
    targets=["query", "value"])``). ``layers`` (dotted names) bypasses the patterns; :func:`load_adapter`
    uses it so that exactly the saved layers are adapted. After the call only the new adapter's
    parameters have ``requires_grad`` (set it on a new classification head yourself). At init the
    model computes exactly what it computed before. Returns ``model`` (changed in place).
    """
    if config is None:
        config = PHMAdapterConfig(**kwargs)
    elif kwargs:
        raise TypeError(f"pass either a PHMAdapterConfig or keyword arguments, not both (got {sorted(kwargs)})")
    _check_name(name)
    if name in adapter_names(model):
        raise ValueError(f"the model already has an adapter named {name!r}; remove_adapter it first or pick another name")
    if (merged := _merged(model)) is not None:
        raise RuntimeError(f"adapter {merged!r} is merged into the weights; unmerge(model) before adding another")
    paths = _resolve_targets(model, config) if layers is None else list(layers)
    if not paths:
        raise ValueError(f"adapter {name!r}: no layers to adapt")
    modules = dict(model.named_modules())
    wrappers: list[tuple[str, nn.Module]] = []
    for path in paths:
        if path == "":
            raise ValueError("cannot adapt the model's root module itself; put the layer inside a container module")
        module = modules.get(path)
        if module is None or not (isinstance(module, PHMAdaptedLinear) or is_adaptable(module)):
            raise ValueError(f"layer {path!r}: not an nn.Linear/Conv1D module in the model")
        wrappers.append((path, module))
    # Create every delta before changing the model, so a size error leaves it untouched.
    reference = wrappers[0][1].weight if wrappers else None
    shared = None
    if config.shared_rule and reference is not None:
        shared = nn.Parameter(torch.empty(config.n, config.n, config.n, device=reference.device, dtype=reference.dtype))
        PHMDelta.init_rule(shared)
    deltas = []
    for path, module in wrappers:
        base = module.base_layer if isinstance(module, PHMAdaptedLinear) else module
        d, k = linear_sizes(base)
        try:
            deltas.append(PHMDelta(d, k, config, shared, device=base.weight.device, dtype=base.weight.dtype))
        except ValueError as e:
            raise ValueError(f"layer {path!r}: {e}") from None
    if not any(True for _ in adapted_layers(model)):  # the first adapter: remember what was trainable
        model.__dict__[_FLAGS] = [(param, param.requires_grad) for param in model.parameters()]
    for param in model.parameters():
        param.requires_grad_(False)
    # A module registered under several names (tied layers) is wrapped once and the wrapper put at every name.
    wrapped: dict[int, PHMAdaptedLinear] = {}
    all_paths: dict[int, list[str]] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        all_paths.setdefault(id(module), []).append(path)
    for (path, module), delta in zip(wrappers, deltas):
        if isinstance(module, PHMAdaptedLinear):
            wrapper = module
        else:
            wrapper = wrapped.get(id(module)) or PHMAdaptedLinear(module)
            for alias in all_paths[id(module)]:
                _set_submodule(model, alias, wrapper)
            wrapped[id(module)] = wrapper
        wrapper.adapters[name] = delta
    set_active(model, name)
    return model


def _set_submodule(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_name, _, child = path.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def set_active(model: nn.Module, name: str | None) -> None:
    """Make adapter ``name`` the active one (``None``: the base model alone). Only the active adapter's
    parameters get ``requires_grad``; the other adapters' are frozen. Refused while an adapter is merged."""
    if name is not None and name not in adapter_names(model):
        raise KeyError(f"no adapter named {name!r} in the model; attached: {adapter_names(model) or 'none'}")
    if (merged := _merged(model)) is not None and merged != name:
        raise RuntimeError(f"adapter {merged!r} is merged into the weights; unmerge(model) before switching")
    for _, layer in adapted_layers(model):
        layer.active_adapter = name if name in layer.adapters else None
        for key, delta in layer.adapters.items():
            delta.requires_grad_(key == name)  # a shared rule belongs to one adapter: no conflict


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
    """Detach adapter ``name``; a layer left with no adapter is replaced by its base layer again."""
    _deltas(model, name)
    if _merged(model) == name:
        raise RuntimeError(f"adapter {name!r} is merged into the weights; unmerge(model) before removing it")
    for path, layer in list(adapted_layers(model)):
        if name not in layer.adapters:
            continue
        del layer.adapters[name]
        if layer.active_adapter == name:
            layer.active_adapter = None
        if not len(layer.adapters):
            _unwrap(model, layer)
    _restore_flags_if_unadapted(model)


def _restore_flags_if_unadapted(model: nn.Module) -> None:
    """Once no adapter is left, give every base parameter back the ``requires_grad`` it had before the
    first :func:`add_adapter` (which froze them)."""
    if any(True for _ in adapted_layers(model)):
        return
    for param, flag in model.__dict__.pop(_FLAGS, []):
        param.requires_grad_(flag)


def _unwrap(model: nn.Module, layer: PHMAdaptedLinear) -> None:
    for alias, module in list(model.named_modules(remove_duplicate=False)):
        if module is layer:
            _set_submodule(model, alias, layer.base_layer)


def merge_and_unwrap(model: nn.Module) -> nn.Module:
    """Merge the active adapter (if any) and replace every wrapper by its base layer: a plain model
    with the adapter baked in, for deployment. The adapters are dropped. Returns ``model``."""
    if active_adapter(model) is not None and _merged(model) is None:
        merge(model)
    for _, layer in list(adapted_layers(model)):
        _unwrap(model, layer)
    _restore_flags_if_unadapted(model)
    return model


def expected_adapter_shapes(config: PHMAdapterConfig, layers: dict[str, tuple[int, int]]) -> dict[str, tuple[int, ...]]:
    """Key → shape of :func:`adapter_state_dict` for ``config`` on ``layers`` (name → (in, out) features)."""
    n, r = config.n, config.rank
    shapes: dict[str, tuple[int, ...]] = {SHARED_RULE_KEY: (n, n, n)} if config.shared_rule else {}
    for path, (d, k) in layers.items():
        if not config.shared_rule:
            shapes[f"{path}.rule"] = (n, n, n)
        if r is None:
            shapes[f"{path}.weight"] = (n, k // n, d // n)
        else:
            shapes[f"{path}.left"] = (n, k // n, r)
            shapes[f"{path}.right"] = (n, r, d // n)
    return shapes


def _flat(model: nn.Module, name: str) -> dict[str, Tensor]:
    state: dict[str, Tensor] = {}
    for path, delta in _deltas(model, name):
        for pname, param in delta.named_parameters(recurse=False):
            key = SHARED_RULE_KEY if (pname == "rule" and delta.config.shared_rule) else f"{path}.{pname}"
            state[key] = param
    return state


def adapter_state_dict(model: nn.Module, name: str) -> dict[str, Tensor]:
    """Adapter ``name``'s weights only (detached): ``<layer>.rule`` / ``<layer>.weight`` (full ``Sᵢ``) /
    ``<layer>.left`` and ``<layer>.right`` (low rank), and one :data:`SHARED_RULE_KEY` when the rule is
    shared. For adapter-only checkpoints; the inverse is :func:`load_adapter_state_dict`."""
    return {key: param.detach() for key, param in _flat(model, name).items()}


def load_adapter_state_dict(model: nn.Module, name: str, state: dict[str, Tensor], where: str = "state dict") -> None:
    """Copy ``state`` (as from :func:`adapter_state_dict`) into adapter ``name``; every key must be present
    with its exact shape, and no other key (the error names the keys and ``where``). Nothing is copied
    unless all match."""
    params = _flat(model, name)
    missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
    if missing or unexpected:
        raise ValueError(f"{where}: adapter {name!r} keys differ: missing {missing[:5]}{' …' if len(missing) > 5 else ''}, "
                         f"unexpected {unexpected[:5]}{' …' if len(unexpected) > 5 else ''}")
    wrong = [f"{k}: expected {tuple(p.shape)}, found {tuple(state[k].shape)}" for k, p in params.items()
             if tuple(state[k].shape) != tuple(p.shape)]
    if wrong:
        raise ValueError(f"{where}: shapes differ for adapter {name!r}: {'; '.join(wrong[:5])}")
    with torch.no_grad():
        for key, param in params.items():
            param.copy_(state[key])


def trainable_parameters(model: nn.Module) -> ParameterCount:
    """Distinct parameters with ``requires_grad`` and in total (a shared rule counts once)."""
    params = list(model.parameters())  # de-duplicated by identity
    return ParameterCount(sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params))
