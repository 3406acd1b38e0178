"""PHM delta adapters for parameter-efficient fine-tuning of a frozen model (Compacter-style).

``y = W x + b + s · (Σᵢ Aᵢ ⊗ Sᵢ) x`` on the linear layers selected by name patterns; the base
weights stay frozen, ``ΔW`` is never formed unless merged. See ``docs/adapters.md``.

>>> config = PHMAdapterConfig(n=4, rank=8, targets=["query", "value"], modules_to_save=["classifier"])  # doctest: +SKIP
>>> add_adapter(model, "sst2", config)                                   # doctest: +SKIP
>>> trainable_parameters(model)                                         # doctest: +SKIP
>>> save_adapter(model, "sst2", "runs/sst2/adapter")                      # doctest: +SKIP
"""

from hyperplex.adapters.config import PHMAdapterConfig, adapter_parameter_count
from hyperplex.adapters.io import load_adapter, read_adapter_spec, save_adapter
from hyperplex.adapters.layer import PHMAdaptedLinear, PHMDelta, SavedModule, phm_lowrank_structured
from hyperplex.adapters.model import (
    ParameterCount,
    active_adapter,
    adapted_layers,
    adapter_config,
    adapter_names,
    add_adapter,
    merge,
    merge_and_unwrap,
    remove_adapter,
    saved_modules,
    set_active,
    trainable_parameters,
    unmerge,
)
from hyperplex.adapters.state_dict import adapter_state_dict, base_signature, load_adapter_state_dict
from hyperplex.adapters.targets import resolve_modules_to_save, resolve_targets

__all__ = [
    "PHMAdapterConfig", "adapter_parameter_count", "PHMAdaptedLinear", "PHMDelta", "SavedModule",
    "phm_lowrank_structured", "add_adapter", "set_active", "active_adapter", "merge", "unmerge", "merge_and_unwrap",
    "remove_adapter", "adapter_names", "adapted_layers", "saved_modules", "adapter_config", "adapter_state_dict",
    "load_adapter_state_dict", "base_signature", "save_adapter", "load_adapter", "read_adapter_spec",
    "resolve_targets", "resolve_modules_to_save", "trainable_parameters", "ParameterCount",
]
