"""Linear layers: PHM (learned or fixed hypercomplex rules), its Appendix-A form, and low-rank."""

from hyperplex.layers.conversion import kronecker_decompose
from hyperplex.layers.diffusion import DiffusionPHMLinear
from hyperplex.layers.dispatch import PathSettings
from hyperplex.layers.functional import (
    formation_buffer_bytes,
    materialize_weight,
    materialize_weights,
    phm_linear,
    phm_linear_blocked,
    phm_linear_lowrank,
    phm_linear_premixed,
    phm_linear_reference,
    phm_linear_structured,
    release_formation_buffers,
)
from hyperplex.layers.lowrank import LowRankLinear, lowrank_parameter_count, matching_rank
from hyperplex.layers.phm import (
    FORWARD_MODES,
    ForwardMode,
    PHMLinear,
    PHMRule,
    cache_dense_weights,
    cached_bytes,
    phm_parameter_count,
    release_dense_caches,
    shared_weights,
    training_step_weights,
)

__all__ = [
    "PHMLinear", "PHMRule", "PathSettings", "DiffusionPHMLinear", "LowRankLinear", "FORWARD_MODES", "ForwardMode",
    "shared_weights", "training_step_weights", "cache_dense_weights", "cached_bytes", "release_dense_caches",
    "phm_parameter_count", "lowrank_parameter_count", "matching_rank", "kronecker_decompose",
    "materialize_weight", "materialize_weights", "phm_linear", "phm_linear_blocked", "phm_linear_lowrank",
    "phm_linear_premixed", "phm_linear_reference", "phm_linear_structured",
    "formation_buffer_bytes", "release_formation_buffers",
]
