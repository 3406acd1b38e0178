"""hyperplex: parameterized hypercomplex multiplication (PHM) layers and quaternion networks for NLP.

The three transforms of a model, one typed config and one call each (layers chosen with ``targets`` /
``exclude``, :mod:`hyperplex.transforms`)::

    import hyperplex as hp
    report = hp.compress(model, hp.PHMConfig(n=4, targets=["*attention*"]))   # or hp.LowRankConfig(n=4)
    hp.save_converted(model, "out/phm4"); model = hp.load_converted("out/phm4")
    hp.quantize(model, hp.Int8Config(exclude=["classifier"]))
    hp.save_quantized(model, "out/phm4-int8"); model = hp.load_quantized("out/phm4-int8")
    hp.add_adapter(model, "sst2", hp.PHMAdapterConfig(n=4, rank=8, targets=["query", "value"]))
    hp.save_adapter(model, "sst2", "out/adapter"); hp.load_adapter(model, "out/adapter")
"""

from hyperplex import _deprecated, algebra  # noqa: F401  (_deprecated: old import paths, for one release)
from hyperplex._version import __version__
from hyperplex.adapters import PHMAdapterConfig, add_adapter, load_adapter, save_adapter
from hyperplex.convert import ConversionReport, LoadError, load_converted, save_converted
from hyperplex.convert.compress import LowRankConfig, PHMConfig, compress
from hyperplex.int8 import Int8Config, QuantizationError, load_quantized, model_bytes, quantize, save_quantized
from hyperplex.layers import DiffusionPHMLinear, LowRankLinear, PHMLinear, PHMRule, matching_rank, phm_parameter_count

__all__ = [
    # layers
    "PHMLinear", "PHMRule", "DiffusionPHMLinear", "LowRankLinear", "matching_rank", "phm_parameter_count", "algebra",
    # compression: PHM / low-rank
    "PHMConfig", "LowRankConfig", "compress", "ConversionReport", "save_converted", "load_converted", "LoadError",
    # int8
    "Int8Config", "quantize", "save_quantized", "load_quantized", "model_bytes", "QuantizationError",
    # adapters
    "PHMAdapterConfig", "add_adapter", "save_adapter", "load_adapter",
    # the package version
    "__version__",
]
