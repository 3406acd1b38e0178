"""hyperplex: parameterized hypercomplex multiplication (PHM) layers and quaternion networks for NLP."""

from hyperplex import algebra
from hyperplex.layers import DiffusionPHMLinear, LowRankLinear, PHMLinear, matching_rank, phm_parameter_count

__version__ = "0.1.0"
__all__ = ["PHMLinear", "DiffusionPHMLinear", "LowRankLinear", "matching_rank", "phm_parameter_count", "algebra"]
