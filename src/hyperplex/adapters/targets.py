"""Which modules of a model an adapter touches: the linear layers its ``targets`` select, the modules its
``modules_to_save`` select, and the names an adapter may have. Patterns follow the one dialect of
:mod:`hyperplex.layers.selection`. Nothing here changes the model.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterator, Sequence

from torch import nn

from hyperplex.adapters.config import PHMAdapterConfig
from hyperplex.adapters.layer import AdapterWrapper, PHMAdaptedLinear
from hyperplex.layers.selection import dense_sizes, is_dense, name_matches

__all__ = ["check_adapter_name", "outer_modules", "resolve_targets", "resolve_modules_to_save", "select_targets"]

#: Names an adapter may not have: attributes of the ``nn.ModuleDict`` that holds a wrapper's adapters.
_RESERVED = frozenset(dir(nn.ModuleDict()))


def check_adapter_name(name: str, where: str = "adapter name") -> None:
    """ValueError naming ``where`` unless ``name`` can key a wrapper's adapters (checked before the model changes)."""
    if not isinstance(name, str) or not name or "." in name:
        raise ValueError(f"{where} must be a non-empty string without '.', got {reprlib.repr(name)}")
    if name in _RESERVED:
        raise ValueError(f"{where} {name!r} is an attribute of nn.Module (like 'training' or 'forward'); choose "
                         f"another name")


def outer_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``(dotted name, module)`` of every module of ``model`` that is not inside an adapter wrapper (the
    wrappers themselves are listed), in module order: the model as its user sees it."""
    wrappers: list[str] = []
    for path, module in model.named_modules():
        if any(path.startswith(w + ".") for w in wrappers):
            continue
        if isinstance(module, AdapterWrapper):
            wrappers.append(path)
        yield path, module


def _inside(path: str, outer: Sequence[str]) -> bool:
    return any(path == o or path.startswith(o + ".") for o in outer)


def resolve_modules_to_save(model: nn.Module, patterns: Sequence[str],
                            key: str = "PHMAdapterConfig.modules_to_save") -> list[str]:
    """Dotted names of the modules ``patterns`` select (the outermost where a selected module holds another),
    in module order, the model itself never. ``ValueError`` naming ``key`` for a pattern that matches no module."""
    if not patterns:
        return []
    modules = [(path, module) for path, module in outer_modules(model) if path]
    for pattern in patterns:
        if not any(name_matches(path, pattern) for path, _ in modules):
            sample = ", ".join(path for path, _ in modules[:6]) + (", …" if len(modules) > 6 else "")
            raise ValueError(f"{key}: pattern {pattern!r} matches no module of the model; modules: {sample or 'none'}")
    selected: list[str] = []
    for path, _ in modules:
        if not _inside(path, selected) and any(name_matches(path, p) for p in patterns):
            selected.append(path)
    return selected


def select_targets(model: nn.Module, config: PHMAdapterConfig, key: str = "PHMAdapterConfig",
                   saved: Sequence[str] = ()) -> list[str]:
    """Dotted names of the linear layers ``config.targets`` select (all when ``None``) and ``config.exclude`` does
    not, outside the modules ``saved``, in module order; errors name ``key``, a pattern that matched nothing and
    every selected layer whose sizes ``n`` does not divide."""
    candidates: list[tuple[str, nn.Module]] = []
    others: dict[str, str] = {}
    in_saved: list[str] = []  # linear layers inside modules trained in full: no adapter goes there
    for path, module in outer_modules(model):
        if _inside(path, saved) and (isinstance(module, PHMAdaptedLinear) or is_dense(module)):
            in_saved.append(path)
        if _inside(path, saved) or _inside(path, [p for p, _ in candidates]):
            continue  # trained in full, or inside a linear layer already listed
        if isinstance(module, PHMAdaptedLinear) or is_dense(module):
            candidates.append((path, module.base_layer if isinstance(module, PHMAdaptedLinear) else module))
        elif path:
            others[path] = type(module).__name__
    targets = config.targets if config.targets is not None else ()
    for field, patterns in (("targets", targets), ("exclude", config.exclude)):
        for pattern in patterns:
            if not any(name_matches(p, pattern) for p, _ in candidates):
                overlap = [p for p in in_saved if name_matches(p, pattern)][:3]
                if overlap:
                    raise ValueError(f"{key}.{field}: pattern {pattern!r} matches only layers inside modules_to_save "
                                     f"({', '.join(overlap)}), which are trained in full and cannot also hold an "
                                     f"adapter; drop them from {field} or from modules_to_save")
                hit = [f"{p} ({t})" for p, t in others.items() if name_matches(p, pattern)][:3]
                why = f"; it matches only modules that are not linear layers: {', '.join(hit)}" if hit else ""
                sample = ", ".join(p for p, _ in candidates[:6]) + (", …" if len(candidates) > 6 else "")
                raise ValueError(f"{key}.{field}: pattern {pattern!r} matches no nn.Linear/Conv1D module{why}; "
                                 f"linear layers in the model: {sample or 'none'}")
    selected = [(p, m) for p, m in candidates
                if (config.targets is None or any(name_matches(p, t) for t in targets))
                and not any(name_matches(p, e) for e in config.exclude)]
    bad = [f"{p} ({d} → {k})" for p, m in selected for d, k in [dense_sizes(m)] if d % config.n or k % config.n]
    if bad:
        raise ValueError(f"{key}.n={config.n} must divide in and out features of every target layer; "
                         f"it does not for: {', '.join(bad)}")
    return [p for p, _ in selected]


def resolve_targets(model: nn.Module, targets, n: int = 1, key: str = "PHMAdapterConfig", exclude=()) -> list[str]:
    """Dotted names of the ``nn.Linear`` / ``Conv1D`` layers of ``model`` that the glob patterns ``targets``
    select and the patterns ``exclude`` do not (the rule of :class:`PHMAdapterConfig`), in module order.
    ``ValueError`` (its message starts with ``key``, e.g. ``model.adapter``) naming a pattern that matches no linear
    layer, or every selected layer whose in/out features ``n`` does not divide."""
    return select_targets(model, PHMAdapterConfig(n=n, targets=tuple(targets), exclude=tuple(exclude)), key)
