"""Which forward path ``PHMLinear`` takes: the thresholds, one reason each, and the functions that apply them.

Every path computes the same ``y = x Hᵀ + b`` (``H = Σᵢ Aᵢ ⊗ Sᵢ``, ``k × d``); they differ in what they read and
compute (``hyperplex.layers.functional``). The choice depends on the call (rows, grad mode, autocast, tracing),
the layer (``k``, ``d``, ``n``, dtype, device, ``cache_dense``, ``forward_mode``) and the process (oneDNN's
self-check, the compiled kernel). In short (docs/performance.md, "When each path wins, and why"):

- few rows on a large weight are memory-bound: the paths that never form ``H`` read ``k·d/n`` weights instead of
  ``k·d`` (structured, pre-mixed, oneDNN, streamed);
- many rows are compute-bound: forming ``H`` once for the call (materialized) or reusing a kept ``H`` (cached)
  runs one dense GEMM and skips the ``n²`` mixing.

The thresholds are the fields of :class:`PathSettings`; ``PHMLinear.path_settings`` holds the one in use (set it on
the class for every layer, or on one layer, e.g. ``dataclasses.replace(PHMLinear.path_settings,
onednn_min_weight=0)``). :func:`choose_path` applies them; :func:`takes_blocked` and
:func:`structured_weight_first` choose between two forms of one path. The measurements behind each number are in
docs/performance.md (sections named below) and were taken with ``benchmarks/`` on this project's CPU, the ``cuda_*``
ones on a GPU (``benchmarks/gpu/check.sh``); the code keeps only why each rule exists.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

__all__ = ["PATHS", "PathSettings", "DEFAULT_PATH_SETTINGS", "choose_path", "formation", "recording_operations",
           "structured_weight_first", "takes_blocked"]

#: What :func:`choose_path` returns: the ``forward_mode`` values other than ``"auto"``, plus ``"cached"`` (the
#: materialized path reusing a kept ``H``) and ``"dense"`` (``n = 1``: exactly ``nn.Linear``).
PATHS = ("structured", "premixed", "onednn", "streamed", "materialized", "cached", "dense")


@dataclass(frozen=True)
class PathSettings:
    """The thresholds of ``PHMLinear``'s path choice (``forward_mode="auto"``). Sizes count elements of ``H``
    (``k·d``); ``rows`` is the number of input rows of the call. Each field's comment says why it exists; the
    measurements are in docs/performance.md."""

    # -- structured or materialized ("When each path wins, and why"; "Cold cache: a stack of layers") --
    #: Training: structured while ``rows·n`` is at most this; past it the ``n²`` mixing and skinny products cost more
    #: than forming ``H`` and its gradient once.
    structured_row_limit_training: int = 1024
    #: Training on a weight of at least ``large_weight``: forming a large ``H`` and its gradient moves twice its size
    #: per step, so the structured path keeps more rows ("Training (forward + backward), where one threshold did
    #: change").
    structured_row_limit_training_large: int = 2048
    #: The weight size from which ``structured_row_limit_training_large`` applies (4096²); below it the structured
    #: step at those rows was slower (its products' inner dimension ``d/n`` is short).
    large_weight: int = 2 ** 24
    #: Inference: structured while ``rows·n`` is at most this; the cached ``H`` costs nothing to form, so the dense
    #: GEMM wins earlier than in training.
    structured_row_limit_inference: int = 256
    #: Training: structured only while ``rows ≤ k·d / weight_per_row_training``; a small ``H`` sits in cache and is
    #: cheap to read, so the row budget grows with the weight.
    weight_per_row_training: int = 2 ** 13
    #: Inference with ``cache_dense``: as above, against a kept ``H`` that is never formed per call.
    weight_per_row_inference: int = 2 ** 17
    #: Inference without the cache: ``H`` is formed on every call (no backward), so the structured path keeps more
    #: rows than with the cache, fewer than in training.
    weight_per_row_uncached: int = 2 ** 14
    #: With ``cache_dense``, a kept ``H`` of at most this many elements (2 MiB in float32) is read from a per-core
    #: cache, so the cached GEMM wins even at one row ("Cold cache": a warm-cache rule).
    cache_resident_weight: int = 2 ** 19

    # -- small weights in inference without the cache --
    # (``benchmarks/probes/bench_paths.py``; docs/phm.md, "Forward paths")
    #: Weights below this take, up to ``small_weight_row_limit`` rows, the pre-mixed path when the layer widens
    #: (``k > d``: one GEMM of reduction length ``d``) and the structured path otherwise; larger weights keep the
    #: general rule (the side-by-side copy of the ``Sᵢ`` is read and written on every call).
    small_weight: int = 2 ** 20
    #: Past this many rows forming ``H`` for the call won on every small shape measured.
    small_weight_row_limit: int = 128

    # -- oneDNN in CPU float32 inference without the cache ("oneDNN: the structured product in the default install") --
    #: oneDNN runs the structured product where ``rows·n`` is at least this: below, its per-call overhead (tens of
    #: µs) outweighs what it saves.
    onednn_min_rows_n: int = 4
    #: ... and at most ``onednn_rows_per_input · d``: beyond, the partial products (``rows·n·k``) and the mixing grow
    #: with ``n`` and forming ``H`` wins.
    onednn_rows_per_input: int = 2
    #: ... and where ``rows·k·d`` is at least this, for the same reason as ``onednn_min_rows_n``.
    onednn_min_work: int = 2 ** 23
    #: ... on weights of at least this many elements. Smaller (MiniLM-sized) layers stay off oneDNN for memory: its
    #: code, kernels and caches took a third of a PHM n = 4 MiniLM's saving. ``0`` trades that memory for speed.
    onednn_min_weight: int = 2 ** 20

    # -- forms of one path --
    #: The structured product runs weight-first (``S Xᵀ``: BLAS streams ``S`` once) on weights of at least this many
    #: elements ... ("The structured product input-first")
    weight_first_min_weight: int = 2 ** 20
    #: ... called with ``rows·n`` at most this; everywhere else input-first (``X Sᵀ``, the mixing on a view) was
    #: faster.
    weight_first_max_rows_n: int = 8
    #: A per-call ``H`` is formed one block column at a time (``phm_linear_blocked``) only where the block columns
    #: are at least this wide (``d/n``): each of its ``n`` GEMMs has reduction length ``d/n`` ("One block column at a
    #: time") ...
    blocked_min_columns: int = 96
    #: ... and the weight has fewer elements than this; on larger layers it was level or slower.
    blocked_max_weight: int = 2 ** 20

    # -- CUDA (docs/performance.md, "On a GPU"; eager float32 on an H200, where a layer's call at these sizes is
    # bound by its kernel launches rather than by its bytes) --
    #: Training on CUDA: structured while ``rows`` is at most this. Forming ``H`` (fewer, larger kernels) was as fast
    #: or faster at every measured point from 1 to 1,024 rows, so by default never.
    cuda_structured_rows_training: int = 0
    #: Inference on CUDA without the cache: structured while ``rows`` is at most this; ``H`` formed for the call was
    #: slower at three of four measured 1,024-row points (1.2–2.8× the structured path's time; 7% faster at 4096²,
    #: n = 16), and no point beyond was measured.
    cuda_structured_rows_uncached: int = 1024

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"PathSettings.{f.name} must be a non-negative integer, got {value!r}")


#: The settings ``PHMLinear`` uses unless ``PHMLinear.path_settings`` is replaced.
DEFAULT_PATH_SETTINGS = PathSettings()


def recording_operations() -> bool:
    """Whether PyTorch operations are being recorded into a graph (``torch.compile``, tracing, ONNX export): then
    the paths that write into buffers in place or call a compiled kernel step aside for plain operations."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


def structured_weight_first(rows: int, n: int, k: int, d: int, settings: PathSettings = DEFAULT_PATH_SETTINGS) -> bool:
    """Whether the structured product for ``rows`` rows through a ``k × d`` layer with ``n`` terms runs
    weight-first (``S Xᵀ``) rather than input-first (``X Sᵀ``); see :class:`PathSettings`."""
    return k * d >= settings.weight_first_min_weight and rows * n <= settings.weight_first_max_rows_n


def takes_blocked(k: int, d: int, n: int, settings: PathSettings = DEFAULT_PATH_SETTINGS) -> bool:
    """Whether a per-call ``H`` of a ``k × d`` layer with ``n`` terms is formed one block column at a time
    (``phm_linear_blocked``) rather than whole; see :class:`PathSettings`."""
    return n > 1 and d // n >= settings.blocked_min_columns and k * d < settings.blocked_max_weight


def formation(k: int, d: int, n: int, input_dtype: torch.dtype, weight_dtype: torch.dtype,
              device: torch.device, settings: PathSettings = DEFAULT_PATH_SETTINGS) -> str:
    """How the materialized path forms this call's ``H``: ``"blocked"`` (one block column at a time into a reused
    buffer), ``"buffer"`` (whole, written into a reused buffer) or ``"graph"`` (whole, a fresh differentiable
    tensor). The reused buffer holds only an ``H`` that no gradient and no recorded graph keeps; the block columns
    also need the CPU (``phm_linear_blocked`` is CPU-only), the input in the factors' dtype and no autocast
    (``F.linear`` on the whole ``H`` does the casting)."""
    if torch.is_grad_enabled() or recording_operations():
        return "graph"
    if (device.type == "cpu" and takes_blocked(k, d, n, settings) and input_dtype == weight_dtype
            and not torch.is_autocast_enabled(device.type)):
        return "blocked"
    return "buffer"


def choose_path(rows: int, in_features: int, out_features: int, n: int, *, dtype: torch.dtype,
                device: torch.device, weight_grad: bool, input_grad: bool = False, cache_dense: bool = False,
                forward_mode: str = "auto", factor_rank: int | None = None, rule_dtype: torch.dtype | None = None,
                settings: PathSettings = DEFAULT_PATH_SETTINGS) -> str:
    """The path (one of :data:`PATHS`) for a call with ``rows`` input rows.

    ``dtype`` / ``device``: the factors' (``rule_dtype``: the rule's, if it differs); ``weight_grad``: a weight
    gradient will be recorded (grad mode on and a parameter requires it); ``input_grad``: the input needs a
    gradient (then only differentiable paths); ``cache_dense``: the layer keeps ``H`` in inference;
    ``factor_rank``: the ``Sᵢ`` are low rank (their product never forms ``Sᵢ``, so the CPU inference kernels, which
    read the ``Sᵢ``, are not taken); grad mode, autocast and tracing are read from the process.
    """
    if n == 1:
        return "dense"
    inference = not weight_grad and not torch.compiler.is_compiling()
    cacheable = inference and cache_dense
    path = forward_mode
    if path == "auto" and device.type == "cuda" and not inference:
        # decided before the general rule: under torch.compile with dynamic shapes each comparison of the row
        # count becomes a guard, and the general rule's, overruled here anyway, would recompile the step whenever a
        # batch crossed one of its limits
        return _cuda_training_path(rows, settings)
    if path == "auto":
        path = _general_path(rows, in_features, out_features, n, inference, cacheable, settings)
        if factor_rank is not None and path == "premixed":
            path = "structured"  # low-rank Sᵢ: the structured product never forms them; pre-mixing needs them whole
        if device.type == "cuda":
            path = _cuda_path(path, rows, cacheable, settings)
        elif (device.type == "cpu" and inference and not cacheable and not input_grad and factor_rank is None
              and _cpu_float32_eager(dtype, rule_dtype or dtype)):
            path = _cpu_inference_path(path, rows, in_features, out_features, n, settings)
    if path == "materialized" and cacheable:
        return "cached"
    return path


def _general_path(rows: int, d: int, k: int, n: int, inference: bool, cacheable: bool,
                  settings: PathSettings) -> str:
    """Structured, pre-mixed or materialized by rows, weight size and grad mode (any device)."""
    weight = d * k
    if inference and not cacheable and weight < settings.small_weight and rows <= settings.small_weight_row_limit:
        return "premixed" if k > d else "structured"
    if cacheable:
        limit, per_row = settings.structured_row_limit_inference, settings.weight_per_row_inference
    elif inference:
        limit, per_row = settings.structured_row_limit_inference, settings.weight_per_row_uncached
    else:
        limit = (settings.structured_row_limit_training_large if weight >= settings.large_weight
                 else settings.structured_row_limit_training)
        per_row = settings.weight_per_row_training
    structured = rows * n <= limit and rows * per_row <= weight
    if cacheable and weight <= settings.cache_resident_weight:
        structured = False
    return "structured" if structured else "materialized"


def _cuda_path(path: str, rows: int, cacheable: bool, settings: PathSettings) -> str:
    """CUDA inference: the general rule's choice between structured (or pre-mixed) and materialized, moved by the
    CUDA settings (training: :func:`_cuda_training_path`); the CPU kernels never apply. The fused Triton kernel is
    decided before this (:func:`hyperplex.layers.triton_phm.takes_triton`)."""
    if not cacheable and path == "materialized" and rows <= settings.cuda_structured_rows_uncached:
        return "structured"
    return path


def _cuda_training_path(rows: int, settings: PathSettings) -> str:
    """CUDA training: ``H`` formed for the step, structured only up to ``cuda_structured_rows_training`` rows; with
    the default 0 the row count is not compared at all."""
    if settings.cuda_structured_rows_training and rows <= settings.cuda_structured_rows_training:
        return "structured"
    return "materialized"


def _cpu_float32_eager(dtype: torch.dtype, rule_dtype: torch.dtype) -> bool:
    """The compiled kernel and oneDNN take float32 on the CPU, outside autocast and outside anything that records
    operations (they are not PyTorch operations a graph could hold)."""
    return (dtype == torch.float32 and rule_dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
            and not recording_operations())


def _cpu_inference_path(path: str, rows: int, d: int, k: int, n: int, settings: PathSettings) -> str:
    """The compiled kernel (when it is on) at few rows on large layers, else oneDNN where it measured fastest."""
    from hyperplex.layers import functional, native  # they import this module

    weight = d * k
    if (path != "materialized" and rows <= native.STREAMED_ROW_LIMIT
            and weight // n >= native.STREAMED_MIN_FACTORS and native.native_kernels_enabled()):
        return "streamed"
    if (weight >= settings.onednn_min_weight
            and settings.onednn_min_rows_n <= rows * n <= settings.onednn_rows_per_input * d
            and rows * weight >= settings.onednn_min_work
            and path != "premixed" and functional.onednn_available()):
        return "onednn"
    return path
