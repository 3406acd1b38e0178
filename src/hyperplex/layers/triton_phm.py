"""A fused Triton kernel for the PHM product at few rows on a GPU (decoding: ``rows·n`` ≤ 64). Forward only.

``y = x Hᵀ + b`` with ``H = Σᵢ Aᵢ ⊗ Sᵢ`` (layout of :mod:`hyperplex.layers.functional`: ``rule[i] = Aᵢ``
``(n, n)``, ``weight[i] = Sᵢ`` ``(k/n, d/n)``, ``H[a·k/n + q, c·d/n + j] = Σᵢ rule[i, a, c] Sᵢ[q, j]``), without
forming ``H``. At few rows a layer is bound by reading its weights; ``H`` has ``k·d`` of them, the ``Sᵢ`` ``k·d/n``.
Each program of the kernel owns a tile of output columns ``q`` (of every block row ``a``), a block of rows and a
share of the reduction (a group of terms ``i`` and a chunk of ``j``), and for each ``i`` in its share

1. reads its tile of ``Sᵢ`` once and multiplies it by the input blocks: ``P[(b, c), q] = Σ_j x[b, c·d/n + j]
   Sᵢ[q, j]`` (one ``tl.dot`` per ``j`` tile, the ``n`` input blocks of each row stacked as rows);
2. mixes by the rule in registers: ``Y[(b, a), q] += Σ_c rule[i, a, c] P[(b, c), q]``, one ``tl.dot`` with the
   block-diagonal ``(rows·n)²`` matrix ``I ⊗ Aᵢ`` built from the ``n × n`` rule.

With one share the program adds the bias and writes ``y`` in the input's dtype; with several, the shares' float32
partials ``Y`` are summed, the bias added and the sum cast by one of three ``reduction`` modes: ``"one-kernel"``
(the default: the last program of each output tile to arrive does it, counted by an atomic per tile, which saves a
launch), ``"two-kernel"`` (a second small kernel does it; on an H200 it was as fast or slower at every measured
size) or ``"atomic"`` (each program adds its partial into a zeroed float32 accumulator with atomic adds; the last to
arrive reads the one sum, re-zeroes it and writes ``y``, so the tail is one read instead of one per share). The
first two sum in split order, so they give the same bits and neither depends on the order the programs run in;
``"atomic"`` sums in arrival order, so its low float32 bits (and, rarely, a bf16 output's last bit) vary from call
to call, and it refuses to run under ``torch.use_deterministic_algorithms(True)``.
The shares exist to give the GPU enough programs at one row (a 4096² layer at ``n = 16`` has only 256 output
columns per block row); :func:`plan` picks them.

Precision: float32 inputs are multiplied in full float32 (``input_precision="ieee"``, as ``F.linear`` does unless
TF32 is switched on); bfloat16 / float16 inputs on the tensor cores with float32 accumulation, the mixing in TF32.

Forward only: :func:`triton_phm_linear` raises :class:`ValueError` where a gradient would be recorded, and
:func:`takes_triton` (the one place that decides whether ``PHMLinear``'s ``auto`` uses the kernel) keeps it to
inference on CUDA. Triton comes from the ``triton`` extra (``pip install 'hyperplex[triton]'``); without it the
module imports and :func:`takes_triton` is false.

Under Triton's interpreter (``TRITON_INTERPRET=1`` in the environment before the kernel is first used) the kernel
runs on CPU tensors, for tests. The interpreter multiplies bfloat16 tiles wrongly (it reads them as integers), so
there the tiles are widened to float32 before each product; on a GPU they are not.
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from hyperplex.layers.functional import recording_operations

__all__ = ["AUTO_REDUCTION", "ENV_VAR", "REDUCTIONS", "TRITON_AUTO_DTYPES", "TRITON_DTYPES", "TRITON_MAX_ROWS_N",
           "Plan", "auto_reduction", "give_up", "interpreting", "kernel_failed", "launch_constexprs", "plan",
           "takes_triton", "triton_available", "triton_phm_linear", "triton_reason"]

#: ``auto`` takes the kernel while ``rows·n`` (the stacked block rows of each product: rows are tokens × batch) is at
#: most this. Measured on an H200 in bf16 (docs/performance.md, "On a GPU"): it beat the structured path at every
#: ``n`` at one row and at 8 rows up to ``n = 8``, and lost at 8 rows with ``n = 16`` and at 64 rows for every ``n``.
TRITON_MAX_ROWS_N = 64
#: Input dtypes the kernel takes (input and factors in the same dtype).
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: The dtypes ``auto`` hands to the kernel: the half-precision ones, whose products run on the tensor cores. In
#: float32 the products are exact FMA, and the kernel beat PyTorch's best path at none of eight measured points.
TRITON_AUTO_DTYPES = (torch.bfloat16, torch.float16)
#: ``HYPERPLEX_TRITON=0`` keeps ``auto`` off the kernel (``triton_phm_linear`` still runs when called).
ENV_VAR = "HYPERPLEX_TRITON"
#: The largest ``n`` the kernel takes: the mixing tile is ``(rows·n)²`` with at least one row of ``n`` blocks.
MAX_N = 64
#: How a reduction shared over several programs is finished (see the module's docstring).
REDUCTIONS = ("two-kernel", "one-kernel", "atomic")
#: The reduction ``PHMLinear``'s ``auto`` asks for (:func:`auto_reduction`): the fastest measured that gives the
#: same bits at every call (docs/performance.md, "On a GPU"; ``"atomic"`` is timed beside it by
#: ``benchmarks/gpu/bench_kernel.py`` as ``fused-atomic``).
AUTO_REDUCTION = "one-kernel"
#: The one-kernel and atomic reductions' arrival counters, one zeroed int32 buffer per (device, stream), kept
#: between calls.
_COUNTERS: dict[tuple, Tensor] = {}
#: The atomic reduction's float32 accumulators, one zeroed buffer per (device, stream), kept between calls.
_ACCUMULATORS: dict[tuple, Tensor] = {}
#: Buffers of the two caches above that a larger one replaced: kept alive, because a CUDA graph captured while they
#: were current still reads and re-zeroes them on every replay.
_RETIRED: list[Tensor] = []
#: Why ``auto`` stopped taking the kernel in this process (the first failure of a call it made), else ``None``.
_FAILED: str | None = None


def interpreting() -> bool:
    """Whether Triton's interpreter is asked for (``TRITON_INTERPRET=1``): kernels then run on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


@functools.cache
def triton_available() -> bool:
    """Whether ``triton`` imports (the ``triton`` extra)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class Plan:
    """How one call is cut into programs: ``block_rows`` input rows and ``block_q`` output columns per program
    (``block_m = next_pow2(block_rows·n)`` ≥ 16 stacked block rows), ``block_j`` reduction elements per product,
    and the reduction shared over ``splits = i_groups · j_chunks`` programs (``i_per`` terms ``i`` and ``j_chunk``
    elements of ``j`` each); ``grid = (q tiles, row blocks, splits)``."""

    block_rows: int
    block_m: int
    block_q: int
    block_j: int
    i_per: int
    j_chunk: int
    i_groups: int
    j_chunks: int
    grid: tuple[int, int, int]
    num_warps: int = 4

    @property
    def splits(self) -> int:
        return self.i_groups * self.j_chunks


def _pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


@functools.lru_cache(maxsize=1024)
def plan(rows: int, n: int, k_n: int, d_n: int, dtype: torch.dtype, programs: int) -> Plan:
    """The :class:`Plan` for ``rows`` rows through factors ``(n, k_n, d_n)``, aiming at about ``programs``
    programs: the reduction is shared out (terms ``i`` first, then chunks of ``j``) until there are that many, but
    never so far that the float32 partials (``splits·rows·k``, written and read once more) exceed a quarter of the
    factors' bytes."""
    block_rows = max(1, min(rows, 64 // n))
    block_m = max(16, _pow2(block_rows * n))
    # 64 output columns a program while that leaves at least 16 tiles of them, else 32 (more programs at one row)
    block_q = 64 if block_m <= 32 and k_n >= 1024 else 32
    block_j = 32 if dtype == torch.float32 else 64
    q_tiles, row_blocks = -(-k_n // block_q), -(-rows // block_rows)
    j_tiles = -(-d_n // block_j)
    factor_bytes = n * k_n * d_n * torch.empty((), dtype=dtype).element_size()
    partial_bytes = rows * n * k_n * 4
    wanted = max(1, min(-(-programs // (q_tiles * row_blocks)), n * j_tiles, factor_bytes // (4 * partial_bytes)))
    i_groups = min(n, wanted)
    i_per = -(-n // i_groups)
    i_groups = -(-n // i_per)
    tiles_per_chunk = -(-j_tiles // max(1, min(j_tiles, wanted // i_groups)))  # splits never exceed `wanted`
    j_chunk = tiles_per_chunk * block_j
    j_chunks = -(-d_n // j_chunk)
    # two (block_m × block_q) float32 accumulators: at 64 × 32 four warps would hold 32 of them each and run out of
    # registers (255, with spills in float32), so larger tiles get eight warps
    num_warps = 8 if block_m * block_q >= 2048 else 4
    return Plan(block_rows, block_m, block_q, block_j, i_per, j_chunk, i_groups, j_chunks,
                (q_tiles, row_blocks, i_groups * j_chunks), num_warps)


@functools.cache
def _programs(device: torch.device) -> int:
    """Programs to aim at on ``device``: four per multiprocessor on a GPU; eight under the interpreter (each program
    is run one after another there, so fewer keep the tests fast)."""
    if device.type != "cuda":
        return 8
    return 4 * torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def _kernels():
    """The two Triton kernels, defined at first use (so that ``TRITON_INTERPRET`` is read then, not at import)."""
    import triton
    import triton.language as tl

    @triton.jit
    def phm_fused(x_ptr, w_ptr, rule_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr, rows, k_n, d_n, stride_x, i_per,
                  j_chunk, j_chunks, splits, N: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_Q: tl.constexpr, BLOCK_J: tl.constexpr, SPLIT: tl.constexpr, ONE_KERNEL: tl.constexpr,
                  HAS_BIAS: tl.constexpr, FP32: tl.constexpr, UPCAST: tl.constexpr, EVEN_J: tl.constexpr,
                  UNROLL_TAIL: tl.constexpr, SPLITS: tl.constexpr, ATOMIC: tl.constexpr):
        pid_q, pid_b, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        i0 = (pid_s // j_chunks) * i_per
        j0 = (pid_s % j_chunks) * j_chunk
        j_end = tl.minimum(d_n, j0 + j_chunk)
        m = tl.arange(0, BLOCK_M)  # stacked block rows: (b, c) on the input side, (b, a) on the output side
        b = pid_b * BLOCK_ROWS + m // N
        m_ok = (m < BLOCK_ROWS * N) & (b < rows)
        part = m % N
        q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
        q_ok = q < k_n
        jj = tl.arange(0, BLOCK_J)
        # I ⊗ Aᵢ: entry [(b, a), (b', c)] is rule[i, a, c] where b = b'
        mix_ok = ((m[:, None] // N) == (m[None, :] // N)) & m_ok[:, None] & m_ok[None, :]
        mix_offsets = part[:, None] * N + part[None, :]
        acc_y = tl.zeros((BLOCK_M, BLOCK_Q), dtype=tl.float32)
        for i in range(i0, tl.minimum(i0 + i_per, N)):
            acc_p = tl.zeros((BLOCK_M, BLOCK_Q), dtype=tl.float32)
            for j in range(j0, j_end, BLOCK_J):
                j_idx = j + jj
                x_ptrs = x_ptr + b[:, None] * stride_x + part[:, None] * d_n + j_idx[None, :]
                s_ptrs = w_ptr + (i * k_n + q[None, :]) * d_n + j_idx[:, None]  # Sᵢ[q, j] as (j, q)
                if EVEN_J:  # no mask along j, the contiguous axis: the loads can be 16 bytes wide
                    xt = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
                    st = tl.load(s_ptrs, mask=q_ok[None, :], other=0.0)
                else:
                    j_ok = j_idx < j_end
                    xt = tl.load(x_ptrs, mask=m_ok[:, None] & j_ok[None, :], other=0.0)
                    st = tl.load(s_ptrs, mask=q_ok[None, :] & j_ok[:, None], other=0.0)
                if UPCAST:
                    xt, st = xt.to(tl.float32), st.to(tl.float32)
                if FP32:
                    acc_p = tl.dot(xt, st, acc_p, input_precision="ieee")
                else:
                    acc_p = tl.dot(xt, st, acc_p)
            mix = tl.load(rule_ptr + i * N * N + mix_offsets, mask=mix_ok, other=0.0).to(tl.float32)
            if FP32:
                acc_y = tl.dot(mix, acc_p, acc_y, input_precision="ieee")
            else:
                acc_y = tl.dot(mix, acc_p, acc_y, input_precision="tf32")
        columns = part[:, None] * k_n + q[None, :]  # (a, q) → output column a·k/n + q
        ok = m_ok[:, None] & q_ok[None, :]
        if SPLIT:
            if ATOMIC:  # into the zeroed (rows, k) accumulator: no result is read back, so no round trip waits here
                total_ptrs = ws_ptr + b[:, None] * (N * k_n) + columns
                tl.atomic_add(total_ptrs, acc_y, mask=ok, sem="relaxed", scope="gpu")
            else:
                tl.store(ws_ptr + (pid_s * rows + b[:, None]) * (N * k_n) + columns, acc_y, mask=ok)
            if ONE_KERNEL:
                # The last of the tile's `splits` programs to arrive sums every partial, in split order (the same
                # sums as sum_splits, so the result does not depend on who arrives last), or reads the atomic sum,
                # then re-arms the counter for the next call on this stream. The barrier puts every thread's partial
                # (or add) before the arrival; acq_rel at GPU scope makes them visible to the last program, whose
                # loads bypass L1 (.cg).
                tl.debug_barrier()
                counter = count_ptr + pid_b * tl.num_programs(0) + pid_q
                arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
                if arrived == splits - 1:
                    acc_y = tl.zeros((BLOCK_M, BLOCK_Q), dtype=tl.float32)
                    if ATOMIC:  # every share's adds are in (they preceded each arrival): one read, then re-zeroed
                        acc_y = tl.load(total_ptrs, mask=ok, other=0.0, cache_modifier=".cg")
                        tl.store(total_ptrs, tl.zeros((BLOCK_M, BLOCK_Q), dtype=tl.float32), mask=ok)
                    elif UNROLL_TAIL:  # SPLITS == splits, known when compiling: the loads can all be issued at once
                        for s in tl.static_range(SPLITS):
                            acc_y += tl.load(ws_ptr + (s * rows + b[:, None]) * (N * k_n) + columns, mask=ok,
                                             other=0.0, cache_modifier=".cg")
                    else:
                        for s in range(0, splits):
                            acc_y += tl.load(ws_ptr + (s * rows + b[:, None]) * (N * k_n) + columns, mask=ok,
                                             other=0.0, cache_modifier=".cg")
                    if HAS_BIAS:
                        acc_y += tl.load(bias_ptr + columns, mask=ok, other=0.0).to(tl.float32)
                    tl.store(out_ptr + b[:, None] * (N * k_n) + columns, acc_y.to(out_ptr.dtype.element_ty), mask=ok)
                    tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
        else:
            if HAS_BIAS:
                acc_y += tl.load(bias_ptr + columns, mask=ok, other=0.0).to(tl.float32)
            tl.store(out_ptr + b[:, None] * (N * k_n) + columns, acc_y.to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def sum_splits(ws_ptr, bias_ptr, out_ptr, total, k, splits, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = offsets < total
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in range(0, splits):
            acc += tl.load(ws_ptr + s * total + offsets, mask=ok, other=0.0)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offsets % k, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=ok)

    return phm_fused, sum_splits


def _zeroed(cache: dict[tuple, Tensor], device: torch.device, numel: int, dtype: torch.dtype, least: int) -> Tensor:
    """A zeroed buffer of at least ``numel`` elements from ``cache``, one per (device, stream). The kernel leaves every
    element it uses zero again (counters re-armed, accumulators re-zeroed), so the calls on one stream, which run in
    order, share one buffer with no zeroing launch; another stream gets its own. A buffer that is too small is
    replaced by one of the next power of two (at least ``least``) and kept alive in :data:`_RETIRED`: a graph captured
    while it was current goes on using it. While a CUDA graph is being captured, a buffer the capturing stream does
    not have yet is made for that call alone (its zeroing is captured with it) rather than kept: memory allocated in
    a capture belongs to the graph."""
    key: tuple[int | str, int]
    if device.type == "cuda":
        key = (device.index if device.index is not None else torch.cuda.current_device(),
               torch.cuda.current_stream(device).cuda_stream)
        capturing = torch.cuda.is_current_stream_capturing()
    else:
        key, capturing = (device.type, 0), False
    buffer = cache.get(key)
    if buffer is not None and buffer.numel() >= numel:
        return buffer
    fresh = torch.zeros(max(_pow2(numel), least), dtype=dtype, device=device)
    if not capturing:
        if buffer is not None:
            _RETIRED.append(buffer)
        cache[key] = fresh
    return fresh


def _counters(device: torch.device, tiles: int) -> Tensor:
    """Zeroed int32 arrival counters for ``tiles`` output tiles (:func:`_zeroed`)."""
    return _zeroed(_COUNTERS, device, tiles, torch.int32, 1024)


def _accumulator(device: torch.device, numel: int) -> Tensor:
    """A zeroed float32 accumulator of at least ``numel`` elements for the atomic reduction (:func:`_zeroed`)."""
    return _zeroed(_ACCUMULATORS, device, numel, torch.float32, 4096)


def auto_reduction() -> str:
    """The reduction for ``auto``: :data:`AUTO_REDUCTION`, or ``"one-kernel"`` (the same function in a fixed order)
    in place of ``"atomic"`` while ``torch.use_deterministic_algorithms(True)`` is set, so that a layer's forward
    neither fails nor turns the kernel off for the process under it."""
    if AUTO_REDUCTION == "atomic" and torch.are_deterministic_algorithms_enabled():
        return "one-kernel"
    return AUTO_REDUCTION


def _check_deterministic() -> None:
    """The atomic reduction under ``torch.use_deterministic_algorithms(True)``: refused (or, with ``warn_only``,
    warned about), as PyTorch does for its own operations without a deterministic implementation."""
    if not torch.are_deterministic_algorithms_enabled():
        return
    message = ("triton_phm_linear(reduction='atomic') adds float32 partial sums in the order the programs arrive, "
               "which varies from call to call, and torch.use_deterministic_algorithms(True) is set; "
               "reduction='one-kernel' computes the same function in a fixed order")
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(message, UserWarning, stacklevel=3)
        return
    raise RuntimeError(message)


def launch_constexprs(p: Plan, n: int, d_n: int, dtype: torch.dtype, reduction: str, has_bias: bool,
                      unroll_tail: bool = False) -> dict:
    """The fused kernel's compile-time arguments for plan ``p``: how :func:`triton_phm_linear` specialises a launch,
    and what ``benchmarks/gpu/inspect_kernel.py`` compiles ahead of time, from one place."""
    split = p.splits > 1
    atomic = split and reduction == "atomic"
    one_kernel = split and reduction in ("one-kernel", "atomic")
    unrolled = one_kernel and not atomic and unroll_tail
    return dict(N=n, BLOCK_ROWS=p.block_rows, BLOCK_M=p.block_m, BLOCK_Q=p.block_q, BLOCK_J=p.block_j, SPLIT=split,
                ONE_KERNEL=one_kernel, HAS_BIAS=has_bias, FP32=dtype == torch.float32,
                UPCAST=interpreting() and dtype != torch.float32, EVEN_J=d_n % p.block_j == 0, UNROLL_TAIL=unrolled,
                SPLITS=p.splits if unrolled else 1, ATOMIC=atomic)


def triton_reason(x: Tensor, rule: Tensor, weight: Tensor, bias: Tensor | None = None) -> str | None:
    """``None`` if :func:`triton_phm_linear` can run on these tensors, else why it cannot."""
    if not triton_available():
        return "Triton is not installed (pip install 'hyperplex[triton]')"
    tensors = [t for t in (x, rule, weight, bias) if t is not None]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return ("it is forward-only (no backward pass): call it under torch.no_grad() or torch.inference_mode(), or "
                "use phm_linear_structured where a gradient is needed")
    if recording_operations():
        return "torch.compile, tracing and ONNX export record PyTorch operations, not this kernel"
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        return f"its tensors are on different devices ({', '.join(sorted(map(str, devices)))})"
    device = devices.pop()
    if device.type != "cuda" and not (interpreting() and device.type == "cpu"):
        return f"it runs on CUDA tensors (or CPU tensors under TRITON_INTERPRET=1), got {device}"
    if x.dtype not in TRITON_DTYPES or weight.dtype != x.dtype:
        return (f"input and factors must share one of {', '.join(map(str, TRITON_DTYPES))}, got {x.dtype} and "
                f"{weight.dtype}")
    n = weight.shape[0]
    if not 1 < n <= MAX_N or tuple(rule.shape) != (n, n, n):
        return (f"it takes 1 < n ≤ {MAX_N} and a rule of shape (n, n, n), got factors {tuple(weight.shape)}, "
                f"rule {tuple(rule.shape)}")
    return None


def triton_phm_linear(x: Tensor, rule: Tensor, weight: Tensor, bias: Tensor | None = None, *,
                      out: Tensor | None = None, programs: int | None = None, reduction: str = "one-kernel",
                      _workspace: Tensor | None = None, _unroll_tail: bool = False) -> Tensor:
    """``x Hᵀ + b`` through the fused kernel. ``x`` ``(..., d)``, ``rule`` ``(n, n, n)``, ``weight`` ``(n, k/n, d/n)``,
    ``bias`` ``(k,)`` or ``None`` → ``(..., k)`` in ``x``'s dtype. Forward only.

    ``out``: a contiguous ``(rows, k)`` tensor (``rows`` = ``x.numel() / d``) of ``x``'s dtype and device to write
    into (returned, reshaped). ``programs``: the number of programs to aim at (default: four per multiprocessor).
    Any row count runs; :func:`takes_triton` keeps ``auto`` to ``rows·n`` ≤ :data:`TRITON_MAX_ROWS_N`.
    ``reduction``: one of :data:`REDUCTIONS`, how partial sums are finished where the reduction is shared out (the
    same function; ``"atomic"`` in a varying order, refused under ``torch.use_deterministic_algorithms(True)``).
    Raises :class:`ValueError` naming what stops it (no Triton, a gradient to record, a CPU tensor, a dtype), and
    :class:`RuntimeError` for ``"atomic"`` under deterministic algorithms.
    ``_unroll_tail`` (for ``benchmarks/gpu/bench_kernel.py``): the one-kernel reduction's last program reads the
    partials in a loop unrolled at compile time (one compilation per number of splits; the same sums in the same
    order, so the same bits), to be measured against the runtime loop before it becomes the default.
    """
    reason = triton_reason(x, rule, weight, bias)
    if reason is not None:
        raise ValueError(f"triton_phm_linear cannot run here: {reason}")
    n, k_n, d_n = weight.shape
    d, k = n * d_n, n * k_n
    if reduction not in REDUCTIONS:
        raise ValueError(f"triton_phm_linear: reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    if x.shape[-1] != d:
        raise ValueError(f"triton_phm_linear: expected input with last dimension {d}, got shape {tuple(x.shape)}")
    if bias is not None and tuple(bias.shape) != (k,):
        raise ValueError(f"triton_phm_linear: bias must have shape ({k},), got {tuple(bias.shape)}")
    flat = x.reshape(-1, d)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    rows = flat.shape[0]
    if out is None:
        out = torch.empty(rows, k, dtype=x.dtype, device=x.device)
    elif tuple(out.shape) != (rows, k) or not out.is_contiguous() or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"triton_phm_linear: out must be a contiguous ({rows}, {k}) {x.dtype} tensor on {x.device}, "
                         f"got {tuple(out.shape)} {out.dtype} on {out.device}")
    if rows == 0:
        return out.view(*x.shape[:-1], k)
    if programs is None:
        programs = _programs(x.device)
    p = plan(rows, n, k_n, d_n, x.dtype, programs)
    weight, rule = weight.contiguous(), rule.contiguous()
    bias_arg = bias.contiguous() if bias is not None else weight  # never read without HAS_BIAS
    fused, reduce = _kernels()
    flags = launch_constexprs(p, n, d_n, x.dtype, reduction, bias is not None, _unroll_tail)
    split, one_kernel = flags["SPLIT"], flags["ONE_KERNEL"]
    if flags["ATOMIC"]:
        _check_deterministic()
        workspace = _accumulator(x.device, rows * k)
    elif split:
        workspace = _workspace if _workspace is not None else torch.empty(p.splits, rows, k, dtype=torch.float32,
                                                                          device=x.device)
        if tuple(workspace.shape) != (p.splits, rows, k) or workspace.dtype != torch.float32:
            raise ValueError(f"triton_phm_linear: _workspace must be a float32 ({p.splits}, {rows}, {k}) tensor")
    else:
        workspace = out  # never read without SPLIT
    counters = _counters(x.device, p.grid[0] * p.grid[1]) if one_kernel else out  # never read without ONE_KERNEL
    fused[p.grid](flat, weight, rule, bias_arg, out, workspace, counters, rows, k_n, d_n, flat.stride(0), p.i_per,
                  p.j_chunk, p.j_chunks, p.splits, **flags, num_warps=p.num_warps)
    if split and not one_kernel:
        block = 1024
        reduce[(-(-rows * k // block),)](workspace, bias_arg, out, rows * k, k, p.splits,
                                         HAS_BIAS=bias is not None, BLOCK=block, num_warps=4)
    return out.view(*x.shape[:-1], k)


def kernel_failed() -> str | None:
    """Why ``auto`` no longer takes the kernel in this process (see :func:`give_up`), or ``None``."""
    return _FAILED


def give_up(error: BaseException) -> None:
    """After the kernel failed in a call ``auto`` made (it did not compile for this card, the card lacked the
    resources of its plan, ...): warn once, naming the error, and keep ``auto`` on PyTorch's paths in this process,
    whose results are the same to rounding. Direct calls of :func:`triton_phm_linear` still raise."""
    global _FAILED
    import warnings

    if _FAILED is None:
        _FAILED = f"{type(error).__name__}: {error}".strip()[:2000]
        warnings.warn(f"hyperplex: the fused Triton PHM kernel failed ({_FAILED}); PHMLinear's forward_mode='auto' "
                      f"uses PyTorch's paths from now on in this process (same results to rounding). Set "
                      f"{ENV_VAR}=0 to skip the kernel from the start; benchmarks/gpu/check.sh checks it on a GPU.",
                      RuntimeWarning, stacklevel=3)


def takes_triton(x: Tensor, layer) -> bool:
    """Whether ``layer`` (a :class:`~hyperplex.layers.PHMLinear`) in ``forward_mode="auto"`` hands input ``x`` to
    the fused kernel: a CUDA input with ``rows·n`` ≤ :data:`TRITON_MAX_ROWS_N` in the factors' dtype, that dtype one
    of :data:`TRITON_AUTO_DTYPES` (bfloat16, float16), ``n > 1``, no gradient to record, not under autocast (the
    factors would be cast on every call, which costs more than the kernel saves), nothing recording operations,
    Triton importable and ``HYPERPLEX_TRITON`` not ``0``, and the kernel has not failed in this process
    (:func:`give_up`). The one place this decision is made."""
    if x.device.type != "cuda" or layer.forward_mode != "auto" or layer.n == 1 or _FAILED is not None:
        return False
    if os.environ.get(ENV_VAR, "1").lower() in ("0", "false", "no", "off"):
        return False
    # the conditions without a size first: under torch.compile a comparison of the row count becomes a guard
    if torch.is_autocast_enabled("cuda") or x.dtype not in TRITON_AUTO_DTYPES or recording_operations():
        return False
    rows = x.numel() // layer.in_features
    if not 1 <= rows * layer.n <= TRITON_MAX_ROWS_N:
        return False
    return triton_reason(x, layer.phm_rule, layer.phm_weight, layer.bias) is None
