"""The int8 transform: :func:`quantize` swaps a model's dense, low-rank and PHM layers for the int8 layers of
:mod:`hyperplex.int8.layers`, in place; :func:`model_bytes` counts the bytes a model holds.

A quantised model takes and returns float tensors, like the float model; it is for inference: a forward in
training mode raises, and so does quantising it again.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.ao.nn.quantized.dynamic import Linear as _TorchDynamicLinear

from hyperplex.int8.layers import (
    PHM_PATHS,
    QUANTIZED_NAME,
    QuantizationError,
    QuantizedLinear,
    QuantizedLowRankLinear,
    QuantizedPHMLinear,
    is_int8_module,
    layer_entry,
    quantized_engine,
    quantized_layers,
)
from hyperplex.layers.lowrank import LowRankLinear
from hyperplex.layers.phm import PHMLinear
from hyperplex.transforms import TransformConfig, check_choice, select_layers

__all__ = ["Int8Config", "quantize", "model_bytes", "is_quantized", "relative_error", "factorised_layers"]


def is_quantized(model: nn.Module) -> bool:
    """Whether ``model`` holds any dynamic-quantised layer (one of ours, or PyTorch's)."""
    return any(is_int8_module(m) for m in model.modules())


@dataclass(frozen=True)
class Int8Config(TransformConfig):
    """int8 weights: each selected ``nn.Linear`` (exact type; not the ``out_proj`` of an ``nn.MultiheadAttention``),
    :class:`~hyperplex.LowRankLinear` and :class:`~hyperplex.PHMLinear` becomes its int8 layer
    (:mod:`hyperplex.int8.layers`). Invalid values raise ``ValueError`` naming the field."""

    targets: Sequence[str] | None = field(default=None, metadata={
        "help": "glob patterns on dotted layer names (fnmatch; a pattern P also matches names ending in .P); "
                "None = every dense, low-rank and PHM layer"})
    exclude: Sequence[str] = field(default=(), metadata={"help": "glob patterns of layers kept in float"})
    phm_path: str = field(default="auto", metadata={
        "help": "how an int8 PHM layer computes: auto (premixed when in ≤ out, else int8), int8, premixed, "
                "dequantized (see QuantizedPHMLinear)"})

    def __post_init__(self) -> None:
        self._normalise_selection()
        check_choice(self.phm_path, "Int8Config.phm_path", ("auto", *PHM_PATHS))


def _eligible(model: nn.Module) -> Iterator[tuple[str, PHMLinear | LowRankLinear | nn.Linear]]:
    """``(name, layer)`` for every layer :func:`quantize` can replace, in module order."""
    parents = {id(child): parent for _, parent in model.named_modules() for child in parent.children()}
    for name, layer in model.named_modules():
        if name == "":
            continue
        if isinstance(parents.get(id(layer)), nn.MultiheadAttention):
            continue  # nn.MultiheadAttention reads out_proj.weight directly
        if isinstance(layer, (PHMLinear, LowRankLinear)) or (isinstance(layer, nn.Linear) and type(layer) is nn.Linear):
            yield name, layer


def _config_of(config, phm_path: str | None, dtype: torch.dtype | None = None) -> Int8Config:
    """The :class:`Int8Config` of a call, new or old style (a dtype second argument, or ``phm_path=``: deprecated)."""
    if isinstance(config, Int8Config):
        if phm_path is not None:
            raise ValueError("quantize: give phm_path in the Int8Config, not beside it")
        return config
    if config is None and dtype is not None:
        config = dtype
    if config is None and phm_path is None:
        return Int8Config()
    if config is not None and not isinstance(config, torch.dtype):
        raise TypeError(f"quantize takes an Int8Config, got {type(config).__name__}")
    warnings.warn("quantize(model, dtype, phm_path=...) is deprecated and will be removed in the next release; use "
                  "hyperplex.quantize(model, Int8Config(...))", DeprecationWarning, stacklevel=3)
    if config is not None and config != torch.qint8:
        raise ValueError(f"dtype must be torch.qint8 (int8 weights), got {config}")
    return Int8Config(phm_path="auto" if phm_path is None else phm_path)


def quantize(model: nn.Module, config: Int8Config | None = None, *, phm_path: str | None = None,
             dtype: torch.dtype | None = None) -> nn.Module:
    """Quantise ``model``'s selected dense, low-rank and PHM layers to int8 in place; return ``model`` in eval mode.

    Args:
        model: any ``nn.Module`` (a converted ``SentenceTransformer`` or ``transformers`` model, a hyperplex
            model). Layers replaced: ``nn.Linear`` (exact type; not the ``out_proj`` of an
            ``nn.MultiheadAttention``) → :class:`QuantizedLinear`; :class:`LowRankLinear` →
            :class:`QuantizedLowRankLinear`; :class:`PHMLinear` (any ``n``) → :class:`QuantizedPHMLinear`.
            Everything else (embeddings, layer norms, GPT-2's ``Conv1D``) stays float.
        config: an :class:`Int8Config` (``None``: every eligible layer, ``phm_path="auto"``). The deprecated old
            form ``quantize(model, torch.qint8, phm_path=...)`` (also ``dtype=``) still works for one release, with
            a warning.

    Outputs: what PyTorch's dynamic int8 gives. One layer on Gaussian inputs: 1–2% relative error (tested below
    5%); a 2-layer random BERT's last hidden state: tested below 1%. A trained model can lose more: measure on
    your task (``hyperplex score-encoder`` for sentence encoders).

    Raises:
        QuantizationError: ``model`` is already quantised; it holds a parameter or buffer off the CPU (PyTorch's
            int8 kernels are CPU-only: ``model.cpu()`` first); no quantised engine; no layer to quantise.
        ValueError: a pattern of ``targets`` / ``exclude`` that matches no eligible layer (naming it); a bad
            ``phm_path``. All raised before ``model`` is changed.
    """
    config = _config_of(config, phm_path, dtype)
    already = next((name or type(m).__name__ for name, m in model.named_modules() if is_int8_module(m)), None)
    if already is not None:
        raise QuantizationError(f"{type(model).__name__} is already quantised (layer {already!r} is int8); "
                                f"quantise the float model once")
    off_cpu = next(((name, t.device) for name, t in (*model.named_parameters(), *model.named_buffers())
                    if t.device.type != "cpu"), None)
    if off_cpu is not None:
        raise QuantizationError(f"{type(model).__name__} holds {off_cpu[0]!r} on {off_cpu[1]}; int8 layers run on "
                                f"the CPU only (PyTorch's quantised kernels): move the model with model.cpu() first")
    quantized_engine()
    from hyperplex.guards import check_finite

    check_finite(model.named_parameters(), f"quantize {type(model).__name__}")  # NaN would quantise to garbage
    eligible = dict(_eligible(model))
    if not eligible:
        raise QuantizationError(f"{type(model).__name__} holds no nn.Linear, LowRankLinear or PHMLinear to quantise")
    chosen = select_layers(list(eligible), config.targets, config.exclude, "Int8Config",
                           "nn.Linear, LowRankLinear or PHMLinear layer")
    if not chosen:
        raise QuantizationError(f"Int8Config: targets/exclude leave no layer of {type(model).__name__} to quantise")
    built: dict[str, nn.Module] = {}
    for name in chosen:  # build every replacement first: a failure leaves the model as it was
        layer = eligible[name]
        new: nn.Module
        if isinstance(layer, PHMLinear):
            new = QuantizedPHMLinear.from_float(layer, config.phm_path)
        elif isinstance(layer, LowRankLinear):
            new = QuantizedLowRankLinear.from_float(layer)
        else:
            new = QuantizedLinear.from_weight(layer.weight, layer.bias)
        source = getattr(layer, "hyperplex_converted_from", None)
        if source is not None:
            cast(Any, new).hyperplex_quantized_from = source
        built[name] = new
    for name, new in built.items():
        for sub_name, sub in new.named_modules():
            setattr(sub, QUANTIZED_NAME, f"{name}.{sub_name}" if sub_name else name)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, new)
    return model.eval()


def model_bytes(model: nn.Module) -> int:
    """Bytes ``model`` holds in its tensors: every parameter and buffer at its dtype (a tensor shared by
    several modules counted once), plus for each int8 layer its int8 weight (1 byte per weight), its
    per-channel scales (float64) and zero points (int64) and its float bias.

    This is what :func:`save_quantized` writes, give or take the file's header. It does not count
    what the int8 engine adds when it packs a weight for its GEMM (fbgemm keeps the int8 weight plus a
    packed int8 copy and one int32 offset per row: resident memory grew by 1.98× the int8 bytes for 40
    layers of 1536 × 384 on the x86 engine) nor PHM ``H`` caches; measure resident memory for those.
    """
    seen: set[tuple[int, int | torch.SymInt]] = set()
    total = 0

    def add(tensor: Tensor | None) -> None:
        nonlocal total
        if tensor is None or tensor.is_meta:
            return
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset()) if tensor.numel() else (id(tensor), 0)
        if key in seen:
            return
        seen.add(key)
        total += tensor.numel() * tensor.element_size()

    for module in model.modules():
        for tensor in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
            add(tensor)
        if isinstance(module, QuantizedLinear) or type(module) is _TorchDynamicLinear:
            weight, bias = module._weight_bias()
            total += weight.numel() * weight.element_size()
            total += sum(t.numel() * t.element_size() for t in (weight.q_per_channel_scales(),
                                                               weight.q_per_channel_zero_points())) \
                if weight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric) else 16
            add(bias)
    return total


def relative_error(reference: Tensor, approximation: Tensor) -> float:
    """``‖approximation − reference‖_F / ‖reference‖_F`` (float64)."""
    ref, approx = reference.detach().double(), approximation.detach().double()
    norm = torch.linalg.norm(ref)
    return float(torch.linalg.norm(approx - ref) / norm) if norm > 0 else float(torch.linalg.norm(approx))


def factorised_layers(model: nn.Module) -> list[dict]:
    """The int8 PHM and low-rank layers of ``model`` in the form of
    :func:`hyperplex.convert.conversion_spec` (``name, kind, n, rule, rank, in_features, out_features, bias``)
    plus ``params``: the weights each holds (int8 and float together, bias included) — a quantised model's
    answer to "which layers are factorised, and how large are they"."""
    from hyperplex.layers.lowrank import lowrank_parameter_count
    from hyperplex.layers.phm import phm_parameter_count

    out = []
    for name, module in quantized_layers(model).items():
        entry = layer_entry(name, module)
        if entry["kind"] == "phm":
            entry["params"] = phm_parameter_count(entry["in_features"], entry["out_features"], entry["n"],
                                                  "learned" if entry["rule"] == "learned" else entry["rule"],
                                                  entry["bias"])
        elif entry["kind"] == "lowrank":
            entry["params"] = lowrank_parameter_count(entry["in_features"], entry["out_features"], entry["rank"],
                                                      entry["bias"])
        else:
            continue
        out.append(entry)
    return out
