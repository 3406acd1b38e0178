"""The int8 layers: PyTorch's dynamic int8 linear, and the int8 forms of the low-rank and PHM layers.

* :class:`QuantizedLinear` — PyTorch's own dynamic-quantised linear (``torch.ao.nn.quantized.dynamic.Linear``,
  the module ``torch.ao.quantization.quantize_dynamic`` puts in, with the per-channel symmetric weight observer
  of ``per_channel_dynamic_qconfig``), plus a guard against training;
* :class:`QuantizedLowRankLinear`: ``right`` and ``left`` each an int8 :class:`QuantizedLinear` (per output
  channel), two int8 GEMMs;
* :class:`QuantizedPHMLinear`: the ``Sᵢ`` in int8 (stacked ``(k, d/n)``, one scale per output row of each ``Sᵢ``,
  or side by side ``(k/n, d)``, by the layer's path), the rule ``Aᵢ`` and the bias in float; ``H`` is never formed.

"Dynamic" means the weights are int8 at rest and each input is quantised per call (per tensor, from its
min/max); the matmul runs on int8 with int32 accumulation and the output is float. A quantised layer is for
inference: a forward in training mode raises.

PyTorch has deprecated these quantised tensors in favour of torchao and says so once per process; the notice is
not filtered. Why int8 stays on ``torch.ao``: ``docs/compress.md``, "int8: torch.ao or torchao".
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.ao.nn.quantized.dynamic import Linear as _TorchDynamicLinear

from hyperplex.layers.functional import (
    mix_partial_products,
    phm_linear_structured,
    premix_inputs,
    refuse_off_cpu,
    side_by_side,
)
from hyperplex.layers.lowrank import LowRankLinear
from hyperplex.layers.phm import PHMLinear

__all__ = [
    "QuantizedLinear", "QuantizedLowRankLinear", "QuantizedPHMLinear", "QuantizationError", "PHM_PATHS",
    "quantized_engine", "is_int8_module", "has_int8_layers", "quantized_layers", "layer_entry", "empty_layer",
]

#: How :class:`QuantizedPHMLinear` computes: ``"int8"`` (the input blocks against the stacked int8
#: ``Sᵢ`` on one dynamic-quantised GEMM, then the rule mixing in float) or ``"dequantized"`` (the
#: ``Sᵢ`` dequantised to float for the call, then :func:`phm_linear_structured`) or ``"premixed"`` (the
#: input blocks mixed by the rule in float, then one int8 GEMM against ``[S₁ … S_n]``); see
#: :class:`QuantizedPHMLinear`.
PHM_PATHS = ("int8", "premixed", "dequantized")
#: Quantised engines that run ``torch.ops.quantized.linear_dynamic`` on this CPU kind.
ENGINES = ("x86", "fbgemm", "onednn", "qnnpack")
#: Attribute every quantised module carries: its dotted name in the model (for error messages).
QUANTIZED_NAME = "hyperplex_quantized_name"


class QuantizationError(RuntimeError):
    """A model cannot be quantised, trained or loaded as asked; the message names the layer or file."""


def _supported_engines() -> list[str]:
    return list(torch.backends.quantized.supported_engines)


def quantized_engine() -> str:
    """The quantised engine in use (``torch.backends.quantized.engine``), after checking one is there.

    Raises:
        QuantizationError: this PyTorch build has none of ``x86``, ``fbgemm``, ``onednn``, ``qnnpack``
            among ``torch.backends.quantized.supported_engines`` (int8 layers cannot run).
    """
    available = _supported_engines()
    supported = [e for e in available if e in ENGINES]
    if not supported:
        raise QuantizationError(
            f"this PyTorch build has no quantised engine (torch.backends.quantized.supported_engines = "
            f"{available}; int8 layers need one of {', '.join(ENGINES)}); "
            "use the float model, or a PyTorch build for x86 or ARM CPUs")
    engine = torch.backends.quantized.engine
    if engine not in supported:
        torch.backends.quantized.engine = engine = supported[0]
    return engine


def _per_channel_int8(weight: Tensor) -> Tensor:
    """``weight`` ``(out, in)`` as a per-channel (axis 0) symmetric ``qint8`` tensor, as PyTorch's
    ``per_channel_dynamic_qconfig`` quantises it."""
    from torch.ao.quantization.observer import default_per_channel_weight_observer

    observer = default_per_channel_weight_observer()
    weight = weight.detach().float().contiguous()
    observer(weight)
    scales, zero_points = observer.calculate_qparams()
    return torch.quantize_per_channel(weight, scales.double(), zero_points.long(), 0, torch.qint8)


def _refuse_off_cpu(module: nn.Module, x: Tensor) -> None:
    name = getattr(module, QUANTIZED_NAME, "") or type(module).__name__
    refuse_off_cpu(f"int8 layer {name!r}", "PyTorch's quantised kernels are CPU-only; pass CPU inputs to the int8 "
                   "model (model.cpu()), or run the float model on the GPU", x)


def _training_error(module: nn.Module) -> QuantizationError:
    name = getattr(module, QUANTIZED_NAME, "") or type(module).__name__
    return QuantizationError(
        f"layer {name!r} is int8-quantised for inference and cannot be trained (the model is in training "
        f"mode); call model.eval(), or train the float model and quantise it afterwards")


class QuantizedLinear(_TorchDynamicLinear):
    """PyTorch's dynamic int8 linear (``torch.ao.nn.quantized.dynamic.Linear``) that refuses training.

    The weight ``(out_features, in_features)`` is ``qint8`` with one scale per output row (zero point
    0); the bias stays float. ``forward``: ``(*, in_features)`` float → ``(*, out_features)`` float.
    """

    def __init__(self, in_features: int, out_features: int, bias_: bool = True,
                 dtype: torch.dtype = torch.qint8) -> None:
        super().__init__(in_features, out_features, bias_=bias_, dtype=dtype)
        placeholder = torch._make_per_channel_quantized_tensor(  # per-channel from the start, values loaded later
            torch.zeros(out_features, in_features, dtype=torch.int8), torch.ones(out_features, dtype=torch.float64),
            torch.zeros(out_features, dtype=torch.int64), 0)
        self.set_weight_bias(placeholder, self._weight_bias()[1])
        self.eval()

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            raise _training_error(self)
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"expected input with last dimension {self.in_features}, got shape {tuple(x.shape)}")
        _refuse_off_cpu(self, x)
        if x.dim() == 1:  # the float layer takes one vector; the int8 GEMM wants rows
            return super().forward(x.float().unsqueeze(0)).squeeze(0).to(x.dtype)
        return super().forward(x.float()).to(x.dtype)

    @classmethod
    def from_weight(cls, weight: Tensor, bias: Tensor | None) -> QuantizedLinear:
        """Quantise a float ``weight`` ``(out, in)`` per output channel; ``bias`` ``(out,)`` or ``None``."""
        out_features, in_features = weight.shape
        layer = cls(in_features, out_features, bias_=bias is not None, dtype=torch.qint8)
        layer.set_weight_bias(_per_channel_int8(weight), None if bias is None else bias.detach().float())
        return layer.eval()

    def int8_state(self) -> dict[str, Tensor]:
        """The weight as plain tensors: ``weight_int8`` ``(out, in)`` int8, ``weight_scales`` ``(out,)``
        float64, ``weight_zero_points`` ``(out,)`` int64, and ``bias`` ``(out,)`` float32 if any."""
        weight, bias = self._weight_bias()
        state = {"weight_int8": weight.int_repr(), "weight_scales": weight.q_per_channel_scales(),
                 "weight_zero_points": weight.q_per_channel_zero_points()}
        if bias is not None:
            state["bias"] = bias.detach()
        return state

    def load_int8_state(self, state: dict[str, Tensor]) -> None:
        """Set the weight (and bias) from :meth:`int8_state`'s tensors, exactly."""
        weight = torch._make_per_channel_quantized_tensor(
            state["weight_int8"].to(torch.int8), state["weight_scales"].double(),
            state["weight_zero_points"].long(), 0)
        self.set_weight_bias(weight, state.get("bias"))

    def dequantized_weight(self) -> Tensor:
        """The int8 weight as float, ``(out_features, in_features)``."""
        return self._weight_bias()[0].dequantize()

    def held_bytes(self) -> int:
        """Bytes of the int8 weight, its scales and zero points, and the float bias."""
        return sum(t.numel() * t.element_size() for t in self.int8_state().values())


class QuantizedLowRankLinear(nn.Module):
    """int8 form of :class:`~hyperplex.layers.LowRankLinear`: ``y = L (R x) + b`` on two int8 GEMMs.

    ``right`` holds ``R`` ``(rank, d)`` and ``left`` holds ``L`` ``(k, rank)``, each a
    :class:`QuantizedLinear` with one scale per output row; the bias ``(k,)`` is float (in ``left``).

    Shape: input ``(*, d)``, output ``(*, k)``.
    """

    right: QuantizedLinear
    left: QuantizedLinear

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.right = QuantizedLinear(in_features, rank, bias_=False, dtype=torch.qint8).eval()
        self.left = QuantizedLinear(rank, out_features, bias_=bias, dtype=torch.qint8).eval()

    @classmethod
    def from_float(cls, layer: LowRankLinear) -> QuantizedLowRankLinear:
        """Quantise ``layer``'s ``right`` and ``left`` (per output row); the bias is kept in float."""
        new = cls(layer.in_features, layer.out_features, layer.rank, bias=layer.bias is not None)
        new.right = QuantizedLinear.from_weight(layer.right, None)
        new.left = QuantizedLinear.from_weight(layer.left, layer.bias)
        return new.eval()

    def forward(self, input: Tensor) -> Tensor:
        if self.training:
            raise _training_error(self)
        return self.left(self.right(input))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, int8"


class QuantizedPHMLinear(nn.Module):
    r"""int8 form of :class:`~hyperplex.layers.PHMLinear`: ``y = x Hᵀ + b``, ``H = Σᵢ Aᵢ ⊗ Sᵢ``.

    Holds the ``Sᵢ`` in one :class:`QuantizedLinear` ``blocks`` (int8, one scale per row of its weight);
    the rule ``phm_rule`` ``(n, n, n)`` and ``bias`` ``(k,)`` stay float (buffers). ``H`` is never formed.
    ``path`` (:data:`PHM_PATHS`) picks the kernel and the layout of ``blocks``:

    * ``"int8"`` — the structure of :func:`~hyperplex.layers.phm_linear_structured`: ``blocks`` holds the
      stack ``(k, d/n)`` (``Sᵢ``'s row ``q`` is row ``i·k/n + q``: one scale per output row of each
      ``Sᵢ``); the input cut into ``n`` blocks ``(rows·n, d/n)`` goes through one dynamic int8 GEMM
      (``(rows·n, k)`` partial products), then the ``n²`` partials are mixed by the rule in float;
    * ``"premixed"`` — ``blocks`` holds ``[S₁ … S_n]`` side by side ``(k/n, d)`` (one scale per row ``q``,
      shared by the ``n`` blocks); the input blocks are mixed by the rule in float first
      (:func:`~hyperplex.layers.functional.premix_inputs`, ``n²·d`` multiply-adds per row), then one int8 GEMM
      ``(rows·n, d) × (d, k/n)`` gives the output directly;
    * ``"dequantized"`` — the ``int8`` layout, dequantised to float for each call (``k·d/n`` floats, freed
      after), then the float structured product.

    The mixing costs scale with ``k`` (``int8``, after the GEMM) or ``d`` (``premixed``, before it), so
    :func:`~hyperplex.int8.quantize` takes ``"premixed"`` when ``d ≤ k`` and ``"int8"`` otherwise, the faster
    of the two at each of MiniLM's shapes (``benchmarks/check_quantize.py`` measures them side by side);
    ``"dequantized"`` is the slowest and is kept as the reference.

    Shape: input ``(*, d)``, output ``(*, k)``.
    """

    phm_rule: Tensor
    bias: Tensor | None
    blocks: QuantizedLinear

    def __init__(self, in_features: int, out_features: int, n: int, bias: bool = True, rule_name: str = "learned",
                 path: str = "int8") -> None:
        super().__init__()
        if path not in PHM_PATHS:
            raise ValueError(f"unknown PHM path {path!r}; valid: {', '.join(PHM_PATHS)}")
        if in_features % n or out_features % n:
            raise ValueError(f"n={n} must divide in_features={in_features} and out_features={out_features}")
        self.in_features, self.out_features, self.n, self.path = in_features, out_features, n, path
        self.rule_name = rule_name
        self.register_buffer("phm_rule", torch.zeros(n, n, n))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        if path == "premixed":
            self.blocks = QuantizedLinear(in_features, out_features // n, bias_=False, dtype=torch.qint8).eval()
        else:
            self.blocks = QuantizedLinear(in_features // n, out_features, bias_=False, dtype=torch.qint8).eval()

    @classmethod
    def from_float(cls, layer: PHMLinear, path: str = "auto") -> QuantizedPHMLinear:
        """Quantise ``layer``'s ``Sᵢ``; rule and bias are copied in float. ``path``: one of :data:`PHM_PATHS`,
        or ``"auto"``: ``"premixed"`` when ``in_features ≤ out_features``, else ``"int8"``."""
        n, k, d = layer.n, layer.out_features, layer.in_features
        if path == "auto":
            path = "premixed" if d <= k else "int8"
        new = cls(d, k, n, bias=layer.bias is not None, rule_name=layer.rule_name, path=path)
        with torch.no_grad():
            new.phm_rule.copy_(layer.phm_rule.detach().float())
            if new.bias is not None and layer.bias is not None:
                new.bias.copy_(layer.bias.detach().float())
        weight = layer.factors().detach()  # Sᵢ of any layer (low-rank ones formed from their factors)
        stored = side_by_side(weight) if path == "premixed" else weight.reshape(k, d // n)
        new.blocks = QuantizedLinear.from_weight(stored, None)
        return new.eval()

    def dequantized_phm_weight(self) -> Tensor:
        """The ``Sᵢ`` as float, ``(n, k/n, d/n)``, whatever the stored layout."""
        n, k_n, d_n = self.n, self.out_features // self.n, self.in_features // self.n
        stored = self.blocks.dequantized_weight()
        if self.path == "premixed":
            return stored.view(k_n, n, d_n).permute(1, 0, 2).contiguous()
        return stored.view(n, k_n, d_n)

    def forward(self, input: Tensor) -> Tensor:
        if self.training:
            raise _training_error(self)
        if input.dim() == 0 or input.shape[-1] != self.in_features:
            raise ValueError(f"expected input with last dimension {self.in_features}, got shape {tuple(input.shape)}")
        _refuse_off_cpu(self, input)
        n, k_n, d_n = self.n, self.out_features // self.n, self.in_features // self.n
        if self.path == "dequantized":
            return phm_linear_structured(input, self.phm_rule, self.dequantized_phm_weight(), self.bias).to(input.dtype)
        lead = input.shape[:-1]
        if self.path == "premixed":
            out = self.blocks(premix_inputs(input.float(), self.phm_rule)).reshape(*lead, n * k_n)  # (B, a, q)
            return (out if self.bias is None else out + self.bias).to(input.dtype)
        blocks = input.reshape(-1, d_n).float()  # (B·n_c, d/n), rows ordered (b, c)
        rows = blocks.shape[0] // n
        partial = self.blocks(blocks)  # (B·n_c, n_i·k/n): X_c Sᵢᵀ for every c and i
        out = mix_partial_products(partial, self.phm_rule, rows).reshape(*lead, n * k_n)  # (B, a, q) → (..., k)
        if self.bias is not None:
            out = out + self.bias
        return out.to(input.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, n={self.n}, "
                f"rule={self.rule_name}, bias={self.bias is not None}, int8 S, path={self.path}")


_QUANTIZED_TYPES = (_TorchDynamicLinear, QuantizedLowRankLinear, QuantizedPHMLinear)


def is_int8_module(module: nn.Module) -> bool:
    """Whether ``module`` is a dynamic-quantised layer: one of ours, or one PyTorch put in directly."""
    return isinstance(module, _QUANTIZED_TYPES) or type(module).__module__.startswith("torch.ao.nn.quantized")


def _layer_kind(module: nn.Module) -> str:
    if isinstance(module, QuantizedPHMLinear):
        return "phm"
    if isinstance(module, QuantizedLowRankLinear):
        return "lowrank"
    return "linear"


def layer_entry(name: str, module: QuantizedLinear | QuantizedLowRankLinear | QuantizedPHMLinear) -> dict:
    """The JSON description of one int8 layer (what :func:`empty_layer` rebuilds)."""
    if isinstance(module, QuantizedPHMLinear):
        bias, extra = module.bias is not None, {"n": module.n, "rule": module.rule_name, "rank": None,
                                                "path": module.path}
    elif isinstance(module, QuantizedLowRankLinear):
        bias = module.left._weight_bias()[1] is not None
        extra = {"n": None, "rule": None, "rank": module.rank, "path": None}
    else:
        bias, extra = module._weight_bias()[1] is not None, {"n": None, "rule": None, "rank": None, "path": None}
    return {"name": name, "kind": _layer_kind(module), "in_features": module.in_features,
            "out_features": module.out_features, "bias": bias, **extra}


def empty_layer(entry: dict) -> nn.Module:
    """An int8 layer of the spec entry's kind and sizes, with placeholder values to be loaded."""
    d, k, bias = entry["in_features"], entry["out_features"], entry["bias"]
    if entry["kind"] == "phm":
        return QuantizedPHMLinear(d, k, entry["n"], bias=bias, rule_name=entry["rule"],
                                  path=entry["path"]).eval()
    if entry["kind"] == "lowrank":
        return QuantizedLowRankLinear(d, k, entry["rank"], bias=bias).eval()
    return QuantizedLinear(d, k, bias_=bias, dtype=torch.qint8).eval()


def has_int8_layers(model: nn.Module) -> bool:
    """Whether ``model`` holds a dynamic-quantised layer. Such a layer quantises each input per call with one scale
    for the whole tensor, so a sentence's output depends on the other sentences (and the padding) of its batch:
    scorers run such a model one sentence per forward, which is also how it is deployed at batch 1."""
    return any(is_int8_module(module) for module in model.modules())


def quantized_layers(model: nn.Module) -> dict[str, QuantizedPHMLinear | QuantizedLowRankLinear | QuantizedLinear]:
    """The top-level int8 layers :func:`~hyperplex.int8.transform.quantize` put in (not the ``QuantizedLinear``
    inside them)."""
    layers: dict[str, QuantizedPHMLinear | QuantizedLowRankLinear | QuantizedLinear] = {}
    for name, module in model.named_modules():
        if isinstance(module, (QuantizedPHMLinear, QuantizedLowRankLinear, QuantizedLinear)):
            if not any(name.startswith(f"{outer}.") for outer in layers):
                layers[name] = module
    return layers
