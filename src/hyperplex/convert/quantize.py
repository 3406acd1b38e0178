"""int8 dynamic quantisation of dense, low-rank and PHM layers, and exact byte accounting.

:func:`quantize` replaces, in place,

* each ``nn.Linear`` by :class:`QuantizedLinear` — PyTorch's own dynamic-quantised linear
  (``torch.ao.nn.quantized.dynamic.Linear``, the module ``torch.ao.quantization.quantize_dynamic``
  puts in, with the per-channel symmetric weight observer of ``per_channel_dynamic_qconfig``),
  plus a guard against training;
* each :class:`~hyperplex.layers.LowRankLinear` by :class:`QuantizedLowRankLinear`: ``right`` and
  ``left`` each an int8 :class:`QuantizedLinear` (per output channel), two int8 GEMMs;
* each :class:`~hyperplex.layers.PHMLinear` by :class:`QuantizedPHMLinear`: the ``Sᵢ`` in int8 (stacked
  ``(k, d/n)``, one scale per output row of each ``Sᵢ``, or side by side ``(k/n, d)``, by the layer's
  path), the rule ``Aᵢ`` and the bias in float; ``H`` is never formed.

"Dynamic" means the weights are int8 at rest and each input is quantised per call (per tensor, from
its min/max); the matmul runs on int8 with int32 accumulation and the output is float. So a
quantised model takes and returns float tensors, like the float model.

A quantised model is for inference: a forward in training mode raises, and so does quantising it
again. :func:`save_quantized` / :func:`load_quantized` write and read it as safetensors of plain
tensors (int8 weights, float64 scales, int64 zero points, float biases) plus a JSON spec.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.ao.nn.quantized.dynamic import Linear as _TorchDynamicLinear

from hyperplex.layers.functional import mix_partial_products, phm_linear_structured, premix_inputs, side_by_side
from hyperplex.convert.serialize import QUANTIZED_SPEC_NAME, deduplicate_tensors, retie_aliases
from hyperplex.layers.lowrank import LowRankLinear
from hyperplex.layers.phm import PHMLinear

__all__ = [
    "quantize", "model_bytes", "is_quantized", "quantized_engine", "QuantizedLinear", "QuantizedLowRankLinear",
    "QuantizedPHMLinear", "QuantizationError", "PHM_PATHS", "save_quantized", "load_quantized", "relative_error",
    "factorised_layers",
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


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence PyTorch's deprecation notice for quantised tensors (raised on every quantize call)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*deprecated.*")
        yield


def _per_channel_int8(weight: Tensor) -> Tensor:
    """``weight`` ``(out, in)`` as a per-channel (axis 0) symmetric ``qint8`` tensor, as PyTorch's
    ``per_channel_dynamic_qconfig`` quantises it."""
    from torch.ao.quantization.observer import default_per_channel_weight_observer

    observer = default_per_channel_weight_observer()
    weight = weight.detach().float().contiguous()
    observer(weight)
    scales, zero_points = observer.calculate_qparams()
    return torch.quantize_per_channel(weight, scales.double(), zero_points.long(), 0, torch.qint8)


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

    def __init__(self, in_features: int, out_features: int, bias_: bool = True, dtype: torch.dtype = torch.qint8) -> None:
        with _quiet():
            super().__init__(in_features, out_features, bias_=bias_, dtype=dtype)
            placeholder = torch._make_per_channel_quantized_tensor(  # per-channel from the start, values loaded later
                torch.zeros(out_features, in_features, dtype=torch.int8), torch.ones(out_features, dtype=torch.float64),
                torch.zeros(out_features, dtype=torch.int64), 0)
            self.set_weight_bias(placeholder, self._weight_bias()[1])
        self.eval()

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            raise _training_error(self)
        return super().forward(x.float()).to(x.dtype)

    @classmethod
    def from_weight(cls, weight: Tensor, bias: Tensor | None) -> "QuantizedLinear":
        """Quantise a float ``weight`` ``(out, in)`` per output channel; ``bias`` ``(out,)`` or ``None``."""
        out_features, in_features = weight.shape
        with _quiet():
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
        with _quiet():
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

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        with _quiet():
            self.right = QuantizedLinear(in_features, rank, bias_=False, dtype=torch.qint8).eval()
            self.left = QuantizedLinear(rank, out_features, bias_=bias, dtype=torch.qint8).eval()

    @classmethod
    def from_float(cls, layer: LowRankLinear) -> "QuantizedLowRankLinear":
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
    :func:`quantize` takes ``"premixed"`` when ``d ≤ k`` and ``"int8"`` otherwise. Measured at MiniLM's
    shapes (n = 4; 12, 128, 800 rows; one thread; ``benchmarks/check_quantize.py``), as a ratio to the
    float dense layer: 384×384 premixed 1.5–2.0 vs int8 2.0–2.4; 1536×384 (k×d) premixed 0.46–0.80 vs
    int8 1.0–2.7; 384×1536 int8 0.59–1.3 vs premixed 1.1–1.9; ``"dequantized"`` was the slowest
    everywhere (1.8–4.8). PyTorch's int8 dense layer ran 0.29–0.77 there.

    Shape: input ``(*, d)``, output ``(*, k)``.
    """

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
        with _quiet():
            if path == "premixed":
                self.blocks = QuantizedLinear(in_features, out_features // n, bias_=False, dtype=torch.qint8).eval()
            else:
                self.blocks = QuantizedLinear(in_features // n, out_features, bias_=False, dtype=torch.qint8).eval()

    @classmethod
    def from_float(cls, layer: PHMLinear, path: str = "auto") -> "QuantizedPHMLinear":
        """Quantise ``layer``'s ``Sᵢ``; rule and bias are copied in float. ``path``: one of :data:`PHM_PATHS`,
        or ``"auto"``: ``"premixed"`` when ``in_features ≤ out_features``, else ``"int8"``."""
        n, k, d = layer.n, layer.out_features, layer.in_features
        if path == "auto":
            path = "premixed" if d <= k else "int8"
        new = cls(d, k, n, bias=layer.bias is not None, rule_name=layer.rule_name, path=path)
        with torch.no_grad():
            new.phm_rule.copy_(layer.phm_rule.detach().float())
            if layer.bias is not None:
                new.bias.copy_(layer.bias.detach().float())
        weight = layer.phm_weight.detach()
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
        if input.shape[-1] != self.in_features:
            raise ValueError(f"expected input with last dimension {self.in_features}, got shape {tuple(input.shape)}")
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


def is_quantized(model: nn.Module) -> bool:
    """Whether ``model`` holds any dynamic-quantised layer (one of ours, or PyTorch's)."""
    return any(isinstance(m, _QUANTIZED_TYPES) or type(m).__module__.startswith("torch.ao.nn.quantized")
               for m in model.modules())


def _targets(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``(name, layer)`` for every layer :func:`quantize` replaces, in module order."""
    parents = {id(child): parent for _, parent in model.named_modules() for child in parent.children()}
    for name, layer in model.named_modules():
        if name == "":
            continue
        if isinstance(parents.get(id(layer)), nn.MultiheadAttention):
            continue  # nn.MultiheadAttention reads out_proj.weight directly
        if isinstance(layer, (PHMLinear, LowRankLinear)) or type(layer) is nn.Linear:
            yield name, layer


def quantize(model: nn.Module, dtype: torch.dtype = torch.qint8, *, phm_path: str = "auto") -> nn.Module:
    """Quantise ``model``'s dense, low-rank and PHM layers to int8 in place; return ``model`` in eval mode.

    Args:
        model: any ``nn.Module`` (a converted ``SentenceTransformer`` or ``transformers`` model, a
            hyperplex model). Layers replaced: ``nn.Linear`` (exact type; not the ``out_proj`` of an
            ``nn.MultiheadAttention``) → :class:`QuantizedLinear`; :class:`LowRankLinear` →
            :class:`QuantizedLowRankLinear`; :class:`PHMLinear` (any ``n``; ``n = 1`` too) →
            :class:`QuantizedPHMLinear`. Everything else (embeddings, layer norms, GPT-2's ``Conv1D``)
            stays float.
        dtype: ``torch.qint8`` (the only one supported).
        phm_path: ``"auto"`` (default: per layer, ``"premixed"`` when ``d ≤ k``, else ``"int8"``),
            ``"int8"``, ``"premixed"`` or ``"dequantized"``, see :class:`QuantizedPHMLinear`.

    Outputs: what PyTorch's dynamic int8 gives. One layer on Gaussian inputs: 1–2% relative error
    (tested below 5%); a 2-layer random BERT's last hidden state: tested below 1%. A trained model
    can lose more: MiniLM's sentence embeddings keep a mean cosine of 0.947 to the float model's on 64
    Tatoeba sentences, the same to every digit as ``torch.ao.quantization.quantize_dynamic`` with
    ``per_channel_dynamic_qconfig`` (per-tensor weights: 0.885); measure on your task.

    Raises:
        QuantizationError: ``model`` is already quantised; it holds a parameter or buffer off the CPU
            (PyTorch's int8 kernels are CPU-only: ``model.cpu()`` first); no quantised engine; no layer to
            quantise.
        ValueError: another ``dtype``, or an unknown ``phm_path``; a NaN or infinite weight
            (:class:`hyperplex.guards.NonFiniteError`, naming it).
        All raised before ``model`` is changed.
    """
    if dtype != torch.qint8:
        raise ValueError(f"dtype must be torch.qint8 (int8 weights), got {dtype}")
    if phm_path not in ("auto", *PHM_PATHS):
        raise ValueError(f"unknown phm_path {phm_path!r}; valid: auto, {', '.join(PHM_PATHS)}")
    already = next((name or type(m).__name__ for name, m in model.named_modules()
                    if isinstance(m, _QUANTIZED_TYPES) or type(m).__module__.startswith("torch.ao.nn.quantized")), None)
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
    targets = list(_targets(model))
    if not targets:
        raise QuantizationError(f"{type(model).__name__} holds no nn.Linear, LowRankLinear or PHMLinear to quantise")
    built = {}
    for name, layer in targets:  # build every replacement first: a failure leaves the model as it was
        if isinstance(layer, PHMLinear):
            new = QuantizedPHMLinear.from_float(layer, phm_path)
        elif isinstance(layer, LowRankLinear):
            new = QuantizedLowRankLinear.from_float(layer)
        else:
            new = QuantizedLinear.from_weight(layer.weight, layer.bias)
        source = getattr(layer, "hyperplex_converted_from", None)
        if source is not None:
            new.hyperplex_quantized_from = source
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
    seen: set[tuple[int, int]] = set()
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
        for tensor in module.parameters(recurse=False):
            add(tensor)
        for tensor in module.buffers(recurse=False):
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



# ---------------------------------------------------------------------------------------------- save / load
QUANT_SPEC_NAME = QUANTIZED_SPEC_NAME  # the one name, shared with load_converted's refusal
QUANT_WEIGHTS_NAME = "model.int8.safetensors"
QUANT_FORMAT = "hyperplex-quantized"
QUANT_FORMAT_VERSION = 1


def _layer_kind(module: nn.Module) -> str:
    if isinstance(module, QuantizedPHMLinear):
        return "phm"
    if isinstance(module, QuantizedLowRankLinear):
        return "lowrank"
    return "linear"


def _layer_entry(name: str, module: nn.Module) -> dict:
    """The JSON description of one int8 layer (what :func:`_empty_layer` rebuilds)."""
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


def _empty_layer(entry: dict) -> nn.Module:
    """An int8 layer of the spec entry's kind and sizes, with placeholder values to be loaded."""
    d, k, bias = entry["in_features"], entry["out_features"], entry["bias"]
    if entry["kind"] == "phm":
        return QuantizedPHMLinear(d, k, entry["n"], bias=bias, rule_name=entry["rule"],
                                  path=entry["path"]).eval()
    if entry["kind"] == "lowrank":
        return QuantizedLowRankLinear(d, k, entry["rank"], bias=bias).eval()
    with _quiet():
        return QuantizedLinear(d, k, bias_=bias, dtype=torch.qint8).eval()


def _quantized_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The top-level int8 layers :func:`quantize` put in (not the ``QuantizedLinear`` inside them)."""
    layers: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        if isinstance(module, (QuantizedPHMLinear, QuantizedLowRankLinear, QuantizedLinear)):
            if not any(name.startswith(f"{outer}.") for outer in layers):
                layers[name] = module
    return layers


def factorised_layers(model: nn.Module) -> list[dict]:
    """The int8 PHM and low-rank layers of ``model`` in the form of
    :func:`hyperplex.convert.conversion_spec` (``name, kind, n, rule, rank, in_features, out_features, bias``)
    plus ``params``: the weights each holds (int8 and float together, bias included) — a quantised model's
    answer to "which layers are factorised, and how large are they"."""
    from hyperplex.layers.lowrank import lowrank_parameter_count
    from hyperplex.layers.phm import phm_parameter_count

    out = []
    for name, module in _quantized_layers(model).items():
        entry = _layer_entry(name, module)
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


def _non_persistent_buffers(model: nn.Module) -> dict[str, Tensor]:
    """Buffers outside the state dict (BERT's ``position_ids``): stored too, so a ``meta`` skeleton gets values."""
    return {f"{name}.{leaf}" if name else leaf: module._buffers[leaf]
            for name, module in model.named_modules() for leaf in module._non_persistent_buffers_set
            if module._buffers.get(leaf) is not None}


def _plain_state(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The quantised model's state as plain tensors (each :class:`QuantizedLinear` as its
    :meth:`~QuantizedLinear.int8_state`), a tensor shared under several keys stored once; and
    ``alias -> kept key``."""
    int8 = {name: m for name, m in model.named_modules() if isinstance(m, _TorchDynamicLinear)}
    foreign = [name for name, m in int8.items() if not isinstance(m, QuantizedLinear)]
    if foreign:
        raise QuantizationError(f"layer {foreign[0]!r} was quantised by PyTorch directly; save_quantized "
                                f"writes models quantised by hyperplex.convert.quantize")
    entries = [(k, v) for k, v in {**model.state_dict(), **_non_persistent_buffers(model)}.items()
               if not any(k.startswith(f"{name}.") for name in int8)]
    for name, module in int8.items():
        entries += [(f"{name}.{key}", value) for key, value in module.int8_state().items()]
    return deduplicate_tensors(entries)


def _float_twin(module: nn.Module) -> nn.Module:
    """The float layer a quantised one stands for, with its dequantised weights (for the skeleton files)."""
    if isinstance(module, QuantizedPHMLinear):
        rule = module.phm_rule if module.rule_name == "custom" else module.rule_name
        twin = PHMLinear(module.in_features, module.out_features, module.n, bias=module.bias is not None, rule=rule)
        with torch.no_grad():
            if twin.rule_is_learned or module.n == 1:
                twin.phm_rule.copy_(module.phm_rule)
            twin.phm_weight.copy_(module.dequantized_phm_weight())
    elif isinstance(module, QuantizedLowRankLinear):
        twin = LowRankLinear(module.in_features, module.out_features, module.rank,
                             bias=module.left._weight_bias()[1] is not None)
    else:
        twin = nn.Linear(module.in_features, module.out_features, bias=module._weight_bias()[1] is not None)
    source = getattr(module, "hyperplex_quantized_from", None)
    if source is not None:
        setattr(twin, "hyperplex_converted_from", source)
    return twin.eval()


def save_quantized(model: nn.Module, folder, tokenizer=None) -> str:
    """Write a model :func:`quantize` made to ``folder``; :func:`load_quantized` reads it back with
    bit-identical outputs.

    The folder holds what :func:`~hyperplex.convert.save_converted` writes to rebuild the float
    architecture (``hyperplex_convert.json``, ``config.json`` or a ``SentenceTransformer``'s module
    files, tokenizer files) except its float weights, plus

    * ``model.int8.safetensors``: every tensor of the quantised model, each int8 weight as
      ``NAME.weight_int8`` (int8, ``(out, in)``), ``NAME.weight_scales`` (float64, ``(out,)``),
      ``NAME.weight_zero_points`` (int64, ``(out,)``) and ``NAME.bias`` (float32); the rest (embeddings,
      layer norms, PHM rules and biases) at its own dtype;
    * ``hyperplex_quantize.json``: format name and version, the weights file and its SHA-256 (checked by
      :func:`load_quantized`), and one entry per int8 layer (``name``, ``kind`` ``linear|lowrank|phm``,
      sizes, ``n``/``rank``/``rule``, ``bias``, the PHM ``path``).

    Raises:
        QuantizationError: ``model`` is not quantised by :func:`quantize`. Nothing is written then.
    """
    import copy
    import json
    import os
    import tempfile
    from pathlib import Path

    from safetensors.torch import save_file

    from hyperplex.convert.serialize import SPEC_NAME, WEIGHTS_NAME, _sources, save_converted, spec_digest
    from hyperplex.fileio import sha256_file
    from hyperplex.guards import check_finite, check_output_folder, write_set

    folder = os.fspath(folder)
    layers = _quantized_layers(model)
    if not layers:
        raise QuantizationError(f"{type(model).__name__} holds no int8 layer; quantise it first "
                                f"(hyperplex.convert.quantize) or save it with save_converted")
    # the float folder it came from, or another model's folder, would no longer load as itself
    check_output_folder(folder, "save_quantized", QUANT_SPEC_NAME, _sources(model))
    tensors, aliases = _plain_state(model)
    check_finite(((k, v) for k, v in tensors.items() if not k.endswith("weight_zero_points")),
                 f"save_quantized {folder}")
    twin = copy.deepcopy(model)
    for name in layers:
        parent_name, _, child = name.rpartition(".")
        setattr(twin.get_submodule(parent_name), child, _float_twin(twin.get_submodule(name)))
    spec = {
        "format": QUANT_FORMAT, "version": QUANT_FORMAT_VERSION, "weights": QUANT_WEIGHTS_NAME,
        "weight_dtype": "qint8", "scheme": "per-output-channel symmetric int8 weights, dynamic int8 activations",
        "aliases": aliases,
        "layers": [_layer_entry(name, m) for name, m in layers.items()],
    }
    os.makedirs(folder, exist_ok=True)
    files = []  # (path, writer): one set with the weights, the int8 spec last
    with tempfile.TemporaryDirectory(dir=folder, prefix=".save-int8-") as scratch:
        save_converted(twin, scratch, tokenizer=tokenizer)
        for root, _, names in os.walk(scratch):
            for file in sorted(names):
                rel = os.path.relpath(os.path.join(root, file), scratch)
                if rel == WEIGHTS_NAME:
                    continue
                with open(os.path.join(root, file), "rb") as handle:
                    data = handle.read()
                if rel == SPEC_NAME:  # the float weights are not written here: no checksum of a file it lacks
                    data = (json.dumps({**json.loads(data), "sha256": {}}, indent=2) + "\n").encode("utf-8")
                os.makedirs(os.path.dirname(os.path.join(folder, rel)), exist_ok=True)
                files.append((os.path.join(folder, rel), lambda tmp, data=data: Path(tmp).write_bytes(data)))

    def write(tmp: str) -> None:
        save_file(tensors, tmp, metadata={"format": "pt", "hyperplex": QUANT_FORMAT, "spec_sha256": spec_digest(spec)})
        spec["sha256"] = {QUANT_WEIGHTS_NAME: sha256_file(tmp)}
    write_set([*files, (os.path.join(folder, QUANT_WEIGHTS_NAME), write),
               (os.path.join(folder, QUANT_SPEC_NAME),
                lambda tmp: Path(tmp).write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8"))])
    return folder


def _read_quant_spec(folder: str) -> dict:
    import json
    import os

    from hyperplex.convert.serialize import LoadError

    path = os.path.join(folder, QUANT_SPEC_NAME)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder}: no such folder")
    if not os.path.isfile(path):
        raise LoadError(f"{folder}: no {QUANT_SPEC_NAME}; not a folder written by hyperplex.convert.save_quantized")
    try:
        with open(path, encoding="utf-8") as handle:
            spec = json.load(handle)
    except json.JSONDecodeError as err:
        raise LoadError(f"{path}: invalid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(spec, dict) or spec.get("format") != QUANT_FORMAT:
        raise LoadError(f"{path}: key 'format' is {spec.get('format') if isinstance(spec, dict) else spec!r}, "
                        f"expected {QUANT_FORMAT!r}")
    if spec.get("version") != QUANT_FORMAT_VERSION:
        raise LoadError(f"{path}: format version {spec.get('version')!r}; this hyperplex reads version "
                        f"{QUANT_FORMAT_VERSION}")
    for key in ("weights", "layers"):
        if key not in spec:
            raise LoadError(f"{path}: missing key {key!r}")
    required = ("name", "kind", "in_features", "out_features", "bias", "n", "rule", "rank", "path")
    for i, entry in enumerate(spec["layers"] if isinstance(spec["layers"], list) else [None]):
        missing = [k for k in required if not isinstance(entry, dict) or k not in entry]
        if missing:
            raise LoadError(f"{path}: layers[{i}] misses key {missing[0]!r}; expected {list(required)}")
        if entry["kind"] == "phm" and entry["path"] not in PHM_PATHS:
            raise LoadError(f"{path}: layers[{i}] key 'path' is {entry['path']!r}; valid: {', '.join(PHM_PATHS)}")
    return spec


def _float_layer_matches(layer: nn.Module, entry: dict) -> bool:
    """Whether ``layer`` (in the rebuilt float model) is what the int8 spec entry was quantised from."""
    kinds = {"phm": PHMLinear, "lowrank": LowRankLinear, "linear": nn.Linear}
    if not isinstance(layer, kinds.get(entry.get("kind"), ())) or (entry["kind"] == "linear" and type(layer) is not nn.Linear):
        return False
    if (layer.in_features, layer.out_features, layer.bias is not None) != (
            entry["in_features"], entry["out_features"], entry["bias"]):
        return False
    return getattr(layer, "n", None) == entry["n"] and getattr(layer, "rank", None) == entry["rank"]


def load_quantized(folder, model: nn.Module | None = None) -> nn.Module:
    """Rebuild a model :func:`save_quantized` wrote, in eval mode, with bit-identical outputs.

    The float architecture is rebuilt as :func:`~hyperplex.convert.load_converted` does (for
    ``transformers`` models and ``SentenceTransformer`` models on the ``meta`` device, from the folder's
    config files), each layer the spec names is replaced by an empty int8 layer, and every tensor of
    ``model.int8.safetensors`` is put in place; no float weight of a quantised layer is ever built.

    Args:
        folder: the folder :func:`save_quantized` wrote.
        model: the float architecture to load into (required for a plain ``nn.Module``, as for
            :func:`~hyperplex.convert.load_converted`); changed in place, after every check, and returned.

    Raises:
        QuantizationError: this PyTorch has no quantised engine (checked first, before any file is read).
        LoadError: no or malformed ``hyperplex_quantize.json``; an int8 layer of the spec that the
            rebuilt model does not have (or has with other sizes); a tensor missing, unexpected, or of
            another shape or dtype — each naming the file and the layer or tensor.
    """
    import copy
    import os

    from hyperplex.convert import serialize
    from hyperplex.fileio import UnsafePathError, check_folder_files, sha256_file

    quantized_engine()
    folder = os.fspath(folder)
    spec = _read_quant_spec(folder)
    spec_path = os.path.join(folder, QUANT_SPEC_NAME)
    weights_path = os.path.join(folder, os.path.basename(str(spec["weights"])))
    if not os.path.isfile(weights_path):
        raise serialize.LoadError(f"{folder}: {spec_path} names the weights file {spec['weights']!r}, which is missing")
    try:
        check_folder_files(folder)
    except UnsafePathError as err:
        raise serialize.LoadError(str(err)) from None
    expected_sha = spec.get("sha256", {}).get(spec["weights"]) if isinstance(spec.get("sha256"), dict) else None
    if expected_sha is None:
        raise serialize.LoadError(f"{spec_path}: key 'sha256' records no checksum for the weights file {spec['weights']!r}")
    if sha256_file(weights_path) != expected_sha:
        raise serialize.LoadError(f"{weights_path}: SHA-256 does not match the one {QUANT_SPEC_NAME} records (key "
                                  f"'sha256'); the file is damaged or was changed after saving")
    float_spec = serialize._read_spec(folder)
    float_spec_path = os.path.join(folder, serialize.SPEC_NAME)
    library = float_spec["model"].get("library")
    if model is None:
        if library == "transformers":
            model = serialize._skeleton_transformers(folder, float_spec["model"])
        elif library == "sentence-transformers":
            model = serialize._skeleton_sentence_transformer(folder)
        else:
            raise serialize.LoadError(f"{float_spec_path}: the model is a plain {float_spec['model'].get('class')}; "
                                      f"pass the float architecture as load_quantized(folder, model=...)")
    if not any(t.is_meta for t in model.state_dict().values()):
        # the caller's model: every check runs on a meta copy first, so a refusal leaves it unchanged
        _restore(copy.deepcopy(model).to("meta"), spec, float_spec, spec_path, float_spec_path, weights_path)
    _restore(model, spec, float_spec, spec_path, float_spec_path, weights_path)
    model.hyperplex_loaded_from = os.path.realpath(folder)
    return model.eval()


def _restore(model: nn.Module, spec: dict, float_spec: dict, spec_path: str, float_spec_path: str,
             weights_path: str) -> None:
    """Give the float ``model`` the int8 layers of ``spec`` and every tensor of the weights file
    (:func:`load_quantized`)."""
    from safetensors import safe_open

    from hyperplex.convert import serialize
    from hyperplex.convert.linears import apply_spec

    if float_spec.get("dtype"):
        model.to(getattr(torch, str(float_spec["dtype"])))
    try:
        apply_spec(model, float_spec["layers"], where=float_spec_path)
    except ValueError as err:
        raise serialize.LoadError(str(err)) from None
    replacements = {}
    for i, entry in enumerate(spec["layers"]):
        name = entry.get("name") if isinstance(entry, dict) else None
        try:
            layer = model.get_submodule(name) if isinstance(name, str) and name else None
        except AttributeError:
            layer = None
        if layer is None or not _float_layer_matches(layer, entry):
            found = "missing" if layer is None else f"a {type(layer).__name__}"
            raise serialize.LoadError(f"{spec_path}: int8 layer {name!r} (layers[{i}]: {entry}) is {found} in the "
                                      f"rebuilt {type(model).__name__}; a model folder of another architecture?")
        replacements[name] = _empty_layer(entry)
    for name, new in replacements.items():
        for sub_name, sub in new.named_modules():
            setattr(sub, QUANTIZED_NAME, f"{name}.{sub_name}" if sub_name else name)
        source = getattr(model.get_submodule(name), "hyperplex_converted_from", None)
        if source is not None:
            new.hyperplex_quantized_from = source
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, new)

    int8 = {name: m for name, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    targets = {k: v for k, v in {**model.state_dict(keep_vars=True), **_non_persistent_buffers(model)}.items()
               if not any(k.startswith(f"{name}.") for name in int8)}
    for name, module in int8.items():
        targets.update({f"{name}.{key}": value for key, value in module.int8_state().items()})
    aliases = spec.get("aliases", {})
    if not isinstance(aliases, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()):
        raise serialize.LoadError(f"{spec_path}: key 'aliases' is not an object of tensor names to tensor names")
    with safe_open(weights_path, framework="pt") as handle:
        recorded = (handle.metadata() or {}).get("spec_sha256")
        if recorded is not None and recorded != serialize.spec_digest(spec):
            raise serialize.LoadError(f"{weights_path}: the spec {QUANT_SPEC_NAME} was changed after saving (its "
                                      f"SHA-256 is not the one the weights file records, metadata 'spec_sha256')")
        stored = set(handle.keys())
        serialize._check_aliases(aliases, stored, targets, weights_path, QUANT_SPEC_NAME)
        unexpected = sorted(stored - set(targets))
        if unexpected:
            raise serialize.LoadError(f"{weights_path}: tensor {unexpected[0]!r} has no place in the rebuilt "
                                      f"{type(model).__name__} ({len(unexpected)} such tensors)")
        keys = {key: key if key in stored else aliases.get(key) for key in targets}
        missing = sorted(k for k, source in keys.items() if source not in stored)
        if missing:
            raise serialize.LoadError(f"{weights_path}: tensor {missing[0]!r} is not in the file ({len(missing)} missing)")
        loaded = {}
        for key, target in targets.items():
            tensor = handle.get_tensor(keys[key])
            if tuple(tensor.shape) != tuple(target.shape) or tensor.dtype != target.dtype:
                raise serialize.LoadError(f"{weights_path}: tensor {key!r} is {tensor.dtype} {tuple(tensor.shape)} in the "
                                          f"file but {target.dtype} {tuple(target.shape)} in the rebuilt model")
            loaded[key] = tensor
    from hyperplex.guards import NonFiniteError, check_finite

    weights = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    try:
        check_finite(((k, v) for k, v in loaded.items() if k in weights or k.endswith("weight_scales")), weights_path)
    except NonFiniteError as err:
        raise serialize.LoadError(str(err)) from None
    for key, value in loaded.items():
        owner_name, _, leaf = key.rpartition(".")
        if any(key.startswith(f"{name}.") for name in int8):
            continue
        owner = model.get_submodule(owner_name)
        if leaf in owner._parameters:
            old = owner._parameters[leaf]
            owner._parameters[leaf] = nn.Parameter(value, requires_grad=old.requires_grad)
        else:
            owner._buffers[leaf] = value
    retie_aliases(model, aliases)  # one Parameter under both names again, as in the saved model
    for name, module in int8.items():
        module.load_int8_state({key[len(name) + 1:]: value for key, value in loaded.items()
                                if key.startswith(f"{name}.")})
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise serialize.LoadError(f"{weights_path}: tensor {left[0]!r} of the rebuilt {type(model).__name__} has no "
                                  f"value in the file ({len(left)} such tensors)")
