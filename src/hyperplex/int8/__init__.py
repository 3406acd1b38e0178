"""int8 weights for dense, low-rank and PHM layers: the layers (:mod:`.layers`), the transform that puts them in a
model (:mod:`.transform`) and the folder format (:mod:`.folder`). From Python, use :func:`hyperplex.quantize`
with an :class:`hyperplex.Int8Config`; this package holds the parts.
"""

from hyperplex.int8.folder import (
    QUANT_FORMAT,
    QUANT_FORMAT_VERSION,
    QUANT_SPEC_NAME,
    QUANT_WEIGHTS_NAME,
    load_model_folder,
    load_quantized,
    save_quantized,
)
from hyperplex.int8.layers import (
    PHM_PATHS,
    QuantizationError,
    QuantizedLinear,
    QuantizedLowRankLinear,
    QuantizedPHMLinear,
    quantized_engine,
)
from hyperplex.int8.transform import Int8Config, factorised_layers, is_quantized, model_bytes, quantize, relative_error

__all__ = [
    "Int8Config", "quantize", "model_bytes", "is_quantized", "factorised_layers", "relative_error", "save_quantized",
    "load_quantized", "load_model_folder", "QUANT_SPEC_NAME", "QUANT_WEIGHTS_NAME", "QUANT_FORMAT",
    "QUANT_FORMAT_VERSION", "QuantizedLinear", "QuantizedLowRankLinear", "QuantizedPHMLinear", "QuantizationError",
    "PHM_PATHS", "quantized_engine",
]
