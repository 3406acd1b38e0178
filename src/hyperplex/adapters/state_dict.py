"""An adapter's weights as a flat state dict, the shapes a config implies, and the signature of the base
weights an adapter was trained on (what :mod:`hyperplex.adapters.io` writes and checks).

Keys: ``<layer>.rule`` / ``<layer>.weight`` (full ``Sᵢ``) / ``<layer>.left`` and ``<layer>.right`` (low rank)
for every adapted layer, one :data:`SHARED_RULE_KEY` when the rule is shared, and ``<module>.<key>`` for
every entry of the state dict of the adapter's copy of each module it trains in full (``modules_to_save``).
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor, nn

from hyperplex.adapters.config import PHMAdapterConfig
from hyperplex.adapters.layer import PHMAdaptedLinear, dense_signature
from hyperplex.adapters.model import adapter_deltas, adapter_saved_modules

__all__ = ["SHARED_RULE_KEY", "adapter_state_dict", "load_adapter_state_dict", "expected_adapter_shapes",
           "state_mismatch", "base_signature"]

#: Key of the shared rule in :func:`adapter_state_dict` (a rule per layer lives at ``<layer>.rule``).
SHARED_RULE_KEY = "shared_rule"


def expected_adapter_shapes(config: PHMAdapterConfig, layers: dict[str, tuple[int, int]],
                            saved: dict[str, dict[str, tuple[int, ...]]] | None = None) -> dict[str, tuple[int, ...]]:
    """Key → shape of :func:`adapter_state_dict` for ``config`` on ``layers`` (name → (in, out) features) and
    the modules to save ``saved`` (name → their state dict's key → shape)."""
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
    for path, entries in (saved or {}).items():
        shapes.update({f"{path}.{key}": tuple(shape) for key, shape in entries.items()})
    return shapes


def _flat(model: nn.Module, name: str) -> dict[str, Tensor]:
    state: dict[str, Tensor] = {}
    for path, delta in adapter_deltas(model, name):
        for pname, param in delta.named_parameters(recurse=False):
            key = SHARED_RULE_KEY if (pname == "rule" and delta.config.shared_rule) else f"{path}.{pname}"
            state[key] = param
    for path, module in adapter_saved_modules(model, name).items():
        state.update({f"{path}.{key}": t for key, t in module.state_dict(keep_vars=True).items()})
    return state


def adapter_state_dict(model: nn.Module, name: str) -> dict[str, Tensor]:
    """Adapter ``name``'s weights only (detached; the keys of the module docstring). For adapter-only
    checkpoints; the inverse is :func:`load_adapter_state_dict`."""
    return {key: param.detach() for key, param in _flat(model, name).items()}


def state_mismatch(expected: dict[str, tuple[int, ...]], state: dict[str, Tensor]) -> str | None:
    """What differs between the key → shape table ``expected`` and ``state`` (missing keys, unexpected
    keys, wrong shapes, five of each at most), or ``None`` when they agree."""
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong = [f"{k}: expected {expected[k]}, found {tuple(state[k].shape)}" for k in expected
             if k in state and tuple(state[k].shape) != tuple(expected[k])]
    if not (missing or unexpected or wrong):
        return None

    def five(items: list[str]) -> str:
        return f"{items[:5]}{' …' if len(items) > 5 else ''}"
    return f"missing keys {five(missing)}, unexpected keys {five(unexpected)}, wrong shapes {five(wrong)}"


def load_adapter_state_dict(model: nn.Module, name: str, state: dict[str, Tensor], where: str = "state dict") -> None:
    """Copy ``state`` (as from :func:`adapter_state_dict`) into adapter ``name``; every key must be present
    with its exact shape, and no other key (the error names the keys and ``where``). Nothing is copied
    unless all match."""
    params = _flat(model, name)
    problem = state_mismatch({k: tuple(p.shape) for k, p in params.items()}, state)
    if problem:
        raise ValueError(f"{where}: does not fit adapter {name!r}: {problem}")
    with torch.no_grad():
        for key, param in params.items():
            param.copy_(state[key])


def base_signature(model: nn.Module, layers: list[str]) -> str:
    """SHA-256 (hex) of the base weights under the linear layers ``layers`` (dotted names): one line
    ``name<TAB>SHA-256 of its weight and bias`` per layer, in name order, hashed. An adapted layer counts
    with its base weights as they are without any adapter, also while one is merged into them."""
    lines = []
    for path in sorted(layers):
        module = model.get_submodule(path)
        digest = module.base_signature() if isinstance(module, PHMAdaptedLinear) else dense_signature(module)
        lines.append(f"{path}\t{digest}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()
