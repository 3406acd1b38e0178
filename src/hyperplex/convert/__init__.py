"""Convert a pretrained model's dense layers to PHM or low-rank layers, back, to disk and from disk.

Nothing here imports ``transformers`` or ``sentence-transformers`` at import time; they are needed
only for the models that come from them.

* :func:`convert_linears` / :func:`to_dense` — in-place conversion and its exact inverse (:mod:`.linears`);
* :func:`save_converted` / :func:`load_converted` — safetensors + JSON spec, no pickle (:mod:`.serialize`);
* :func:`quantize` / :func:`model_bytes` / :func:`save_quantized` / :func:`load_quantized` — int8 (:mod:`.quantize`);
* :mod:`.quality` — teacher/student agreement, zero-shot WikiQA ranking, SST-2 probe.
"""

from hyperplex.convert.linears import CONVERTED_FROM, apply_spec, conversion_spec, convert_linears, to_dense
from hyperplex.convert.report import ConversionReport, LayerReport
from hyperplex.convert.quantize import (
    QuantizationError, is_quantized, load_quantized, model_bytes, quantize, save_quantized,
)
from hyperplex.convert.serialize import LoadError, load_converted, save_converted

__all__ = [
    "convert_linears", "to_dense", "conversion_spec", "apply_spec", "CONVERTED_FROM",
    "ConversionReport", "LayerReport", "save_converted", "load_converted", "LoadError",
    "quantize", "model_bytes", "is_quantized", "save_quantized", "load_quantized", "QuantizationError",
]
