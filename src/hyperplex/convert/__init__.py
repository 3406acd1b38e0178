"""Convert a pretrained model's dense layers to PHM or low-rank layers, back, to disk and from disk.

Nothing here imports ``transformers`` or ``sentence-transformers`` at import time; they are needed
only for the models that come from them. From Python, use :func:`hyperplex.compress` with a
:class:`hyperplex.PHMConfig` or :class:`hyperplex.LowRankConfig`; this package holds the parts.

* :func:`compress` with :class:`PHMConfig` / :class:`LowRankConfig` (:mod:`.compress`), and :func:`to_dense`, its exact
  inverse (:mod:`.linears`); :func:`convert_linears` is the deprecated form of :func:`compress`;
* :func:`save_converted` / :func:`load_converted` — safetensors + JSON spec, no pickle (:mod:`.serialize`);
* :func:`export_onnx` / :func:`export_onnx_folder` — ONNX graphs of the factors (:mod:`.onnx`).

int8 lives in :mod:`hyperplex.int8`, encoder scoring in :mod:`hyperplex.scoring`.
"""

from hyperplex.convert.compress import LowRankConfig, PHMConfig, compress
from hyperplex.convert.linears import CONVERTED_FROM, apply_spec, conversion_spec, convert_linears, to_dense
from hyperplex.convert.report import ConversionReport, LayerReport
from hyperplex.convert.serialize import LoadError, load_converted, save_converted

__all__ = [
    "PHMConfig", "LowRankConfig", "compress", "convert_linears", "to_dense", "conversion_spec", "apply_spec",
    "CONVERTED_FROM", "ConversionReport", "LayerReport", "save_converted", "load_converted", "LoadError",
]

from hyperplex._deprecated import attribute_getter  # noqa: E402  names that moved out, for one release

__getattr__ = attribute_getter("hyperplex.convert")
