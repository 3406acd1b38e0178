"""Functional PHM kernels: the maths of H = Σᵢ Aᵢ ⊗ Sᵢ without module state.

Shapes (PHM eq. 3.2–3.3; ``d`` = in_features, ``k`` = out_features):

- ``rule``   ``(n, n, n)``       ``rule[i]`` is ``A_i``
- ``weight`` ``(n, k/n, d/n)``   ``weight[i]`` is ``S_i``
- ``H``      ``(k, d)``          ``H[a·k/n + q, c·d/n + j] = Σᵢ rule[i, a, c] · weight[i, q, j]``

Ways to compute ``y = x Hᵀ + b`` (``PHMLinear`` picks one per call: :mod:`hyperplex.layers.dispatch`):

- :func:`phm_linear_reference` — literally ``Σᵢ torch.kron(Aᵢ, Sᵢ)``; slow, for tests.
- :func:`materialize_weight` + ``F.linear`` — forms ``H`` with one matmul and one permute (written straight into
  its buffer, one batched product per block row, where no gradient is recorded; no ``n``-times-larger
  intermediate), then a dense matmul. Compute-bound regimes (training batches) prefer it: its cost is a dense
  layer's plus ``O(n·k·d)`` to form ``H``.
- :func:`phm_linear_structured` — never forms ``H``: one matmul over the ``n`` input blocks
  reads each ``Sᵢ`` once, then the ``n × n`` mixing by the rule. It moves ``k·d/n`` weight
  numbers instead of ``k·d``, so memory-bound regimes (few rows, decoding) prefer it.
- :func:`phm_linear_premixed` — never forms ``H`` either: the input blocks are mixed by the rule
  first, then one GEMM with the full reduction length ``d`` against the ``Sᵢ`` side by side (a
  ``k·d/n`` copy per call). One well-shaped GEMM instead of ``n²`` small products and a mixing
  pass: faster for tens of rows on small weights, where the copy is cheap.
- :func:`phm_linear_blocked` — forms ``H`` one block column at a time (``k × d/n``, one plain GEMM each, no
  permute) and accumulates ``x_c H_cᵀ``: inference only. ``H`` is never held whole, which on small layers with
  wide block columns is also faster at many rows than forming all of ``H`` first.
- :func:`phm_linear_onednn` — the structured product for inference on the CPU, its one large product run by
  PyTorch's oneDNN linear (``torch.ops.mkldnn._linear_pointwise``) instead of MKL's GEMM, and laid out so that the
  mixing by the rule is a batched matmul on a view (no copy). On this project's AMD CPU it reads the factors about
  twice as fast as MKL's skinny GEMM does at few rows (docs/performance.md). Inference only (no backward).
- :func:`phm_linear_lowrank` — the structured product for low-rank factors ``Sᵢ = Lᵢ Rᵢ`` (Compacter): forms
  neither ``H`` nor any ``Sᵢ``; reads ``r·(k + d)`` weight numbers.
"""

from __future__ import annotations

import threading
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

from hyperplex.layers.dispatch import recording_operations, structured_weight_first

__all__ = ["FORMATION_BUFFER_MAX_BYTES", "ONEDNN_BUCKETS_PER_OCTAVE", "ONEDNN_EXACT_ROWS", "formation_buffer",
           "formation_buffer_bytes", "materialize_weight", "materialize_weights",
           "mix_partial_products", "onednn_available", "onednn_padded_rows", "onednn_reason", "phm_linear",
           "phm_linear_blocked", "phm_linear_lowrank", "phm_linear_onednn", "phm_linear_premixed",
           "phm_linear_reference", "phm_linear_structured", "premix_inputs", "side_by_side",
           "refuse_off_cpu", "release_formation_buffers", "signed_permutation"]


def refuse_off_cpu(function: str, advice: str, *tensors: Tensor | None) -> None:
    """Raise :class:`ValueError` naming ``function`` (a CPU-only path) and ``advice`` (what to do instead) if any of
    ``tensors`` is on another device (CUDA, meta, ...)."""
    device = next((t.device for t in tensors if t is not None and t.device.type != "cpu"), None)
    if device is not None:
        raise ValueError(f"{function} runs on the CPU only, got a tensor on {device}: {advice}")


def _sizes(rule: Tensor, weight: Tensor) -> tuple[int, int, int]:
    n, k_n, d_n = weight.shape
    return n, k_n, d_n


def signed_permutation(rule: Tensor) -> tuple[Tensor, Tensor] | None:
    """``(index, sign)`` of shape ``(n, n)`` if every ``rule[:, a, c]`` has exactly one non-zero
    entry equal to ±1 (true of all Cayley–Dickson algebras), else ``None``.

    Then block ``(a, c)`` of ``H`` is ``sign[a, c] · S[index[a, c]]`` and forming ``H`` needs
    no arithmetic beyond a gather and a sign flip.
    """
    nonzero = rule != 0
    if not bool((nonzero.sum(0) == 1).all()) or not bool((rule.abs()[nonzero] == 1).all()):
        return None
    index = nonzero.to(torch.uint8).argmax(0)  # (n, n): which i feeds block (a, c)
    sign = rule.gather(0, index.unsqueeze(0)).squeeze(0)
    return index, sign


def materialize_weight(rule: Tensor, weight: Tensor, permutation: tuple[Tensor, Tensor] | None = None,
                       out: Tensor | None = None) -> Tensor:
    """Form ``H = Σᵢ rule[i] ⊗ weight[i]`` as a ``(k, d)`` matrix, differentiably.

    One ``(n², n) @ (n, k·d/n²)`` matmul produces the ``n²`` blocks, one permute lays them
    out; the largest intermediate has ``k·d`` entries. If ``permutation`` (from
    :func:`signed_permutation`) is given, the blocks are gathered instead of multiplied.
    ``out``: a ``(k, d)`` contiguous tensor of the factors' dtype and device to write ``H`` into (only where no
    gradient is recorded and nothing records operations, ``n > 1``); returned.
    """
    n, k_n, d_n = _sizes(rule, weight)
    if out is not None:
        if n == 1 or not _form_in_place(rule, weight):
            raise ValueError("materialize_weight(out=...) needs n > 1, no gradient to record and no tracing")
        if (out.shape != (n * k_n, n * d_n) or not out.is_contiguous() or out.dtype != weight.dtype
                or out.device != weight.device):
            raise ValueError(f"out must be a contiguous {n * k_n}x{n * d_n} {weight.dtype} tensor on {weight.device}, "
                             f"got {tuple(out.shape)} {out.dtype} on {out.device}")
        return _materialize_in_place(rule, weight, permutation, out.view(n, k_n, n, d_n))
    if n == 1:
        return weight.reshape(k_n, d_n) * rule.reshape(())
    if _form_in_place(rule, weight):
        return _materialize_in_place(rule, weight, permutation)
    if permutation is not None:
        index, sign = permutation
        blocks = weight[index.reshape(-1)] * sign.reshape(-1, 1, 1).to(weight.dtype)  # (n·n, k/n, d/n)
        blocks = blocks.view(n, n, k_n, d_n)
    else:
        mix = rule.reshape(n, n * n).t()  # [(a, c), i], a transposed view: the product reads it, no copy launched
        blocks = (mix.to(weight.dtype) @ weight.reshape(n, k_n * d_n)).view(n, n, k_n, d_n)  # (a, c, q, j)
    return blocks.permute(0, 2, 1, 3).reshape(n * k_n, n * d_n)  # (a, q, c, j) → (k, d)


def materialize_weights(rules: Tensor, weights: Tensor) -> Tensor:
    """Form the ``H`` of ``L`` layers of one shape at once, differentiably: ``rules`` ``(L, n, n, n)``, ``weights``
    ``(L, n, k/n, d/n)`` → ``(L, k, d)``, ``H[l] = Σᵢ rules[l, i] ⊗ weights[l, i]``.

    :func:`materialize_weight`'s one product and one permute, batched: for ``L`` layers the same kernels run once
    instead of ``L`` times, and so does their backward (where a step is bound by kernel launches, as a model's
    training step on a GPU is, that is most of what forming ``H`` costs). Values equal the per-layer form's up to
    float rounding."""
    if rules.dim() != 4 or weights.dim() != 4 or rules.shape[0] != weights.shape[0]:
        raise ValueError(f"materialize_weights: expected rules (L, n, n, n) and weights (L, n, k/n, d/n), got "
                         f"{tuple(rules.shape)} and {tuple(weights.shape)}")
    count, n, k_n, d_n = weights.shape
    if tuple(rules.shape[1:]) != (n, n, n):
        raise ValueError(f"materialize_weights: rules must be ({count}, {n}, {n}, {n}) for weights "
                         f"{tuple(weights.shape)}, got {tuple(rules.shape)}")
    mix = rules.reshape(count, n, n * n).transpose(1, 2)  # [l, (a, c), i]
    blocks = torch.bmm(mix.to(weights.dtype), weights.reshape(count, n, k_n * d_n))  # [l, (a, c), (q, j)]
    return blocks.view(count, n, n, k_n, d_n).permute(0, 1, 3, 2, 4).reshape(count, n * k_n, n * d_n)


def _form_in_place(rule: Tensor, weight: Tensor) -> bool:
    """Whether ``H`` may be written straight into its buffer: no gradient to record, and nothing recording
    operations, which keep the one-matmul graph."""
    return (not (torch.is_grad_enabled() and (rule.requires_grad or weight.requires_grad))
            and not recording_operations())


def _materialize_in_place(rule: Tensor, weight: Tensor, permutation: tuple[Tensor, Tensor] | None,
                          out: Tensor | None = None) -> Tensor:
    """``H`` written straight into one ``(k, d)`` buffer, with no intermediate of its size: for each block row
    ``a``, one batched product over the ``k/n`` rows ``q`` of the factors, ``H[a, q, c, :] = Σᵢ rule[i, a, c]
    Sᵢ[q, :]``, whose output ``(q, c, j)`` is exactly block row ``a`` of ``H``. The one-matmul form computes the
    blocks in ``(a, c, q, j)`` order and then copies them into place, so it holds ``2·k·d`` numbers while it runs.
    This matters where ``H`` is formed in inference on every call (many rows): half the memory while it forms, and
    faster on large shapes (docs/performance.md). Values equal the one-matmul form's up to float rounding."""
    n, k_n, d_n = _sizes(rule, weight)
    dtype = weight.dtype  # as the one-matmul form: the rule is cast to the factors' dtype
    if out is None:
        out = torch.empty(n, k_n, n, d_n, dtype=dtype, device=weight.device)  # (a, q, c, j)
    if permutation is not None:  # a gather: each block is ±one Sᵢ (no products with the rule's zeros)
        index, sign = permutation
        for a in range(n):
            out[a].copy_(weight[index[a]].transpose(0, 1)).mul_(sign[a].to(dtype).reshape(1, n, 1))
    else:
        factors = weight.permute(1, 0, 2)  # (q, i, j): a view
        for a in range(n):
            mix = rule[:, a, :].T.to(dtype).expand(k_n, n, n)  # (q, c, i): the same rule block for every q
            torch.bmm(mix, factors, out=out[a])
    return out.view(n * k_n, n * d_n)


#: The largest ``H`` (in bytes) that :func:`formation_buffer` keeps a reused buffer for; ``0`` switches the buffer off.
FORMATION_BUFFER_MAX_BYTES = 2 ** 23
_FORMATION = threading.local()


def formation_buffer(numel: int, dtype: torch.dtype, device: torch.device | str) -> Tensor | None:
    """A reused CPU buffer of ``numel`` elements for an ``H`` formed for one call, or ``None`` (not the CPU, or more
    than :data:`FORMATION_BUFFER_MAX_BYTES`).

    Without it every call that forms ``H`` allocates ``k·d`` fresh numbers and frees them; glibc hands blocks of this
    size back to the system and takes them again, so each call page-faults its ``H`` in anew, which made a PHM MiniLM
    page-fault far more than its dense teacher and cost it speed at batch 32 (docs/performance.md, "Page faults").
    The buffer is per thread (two threads never share one) and per dtype,
    grows to the largest ``H`` its thread has formed, and is kept until :func:`release_formation_buffers`. It holds
    whatever ``H`` was formed last, so only a caller that uses ``H`` at once, records no gradient and keeps no
    reference to it may take it (``PHMLinear.forward`` under ``torch.no_grad()`` or ``torch.inference_mode()``)."""
    device = torch.device(device)
    size = numel * dtype.itemsize
    if device.type != "cpu" or size > FORMATION_BUFFER_MAX_BYTES:
        return None
    buffers = _FORMATION.__dict__.setdefault("buffers", {})
    buffer = buffers.get(dtype)
    if buffer is None or buffer.numel() < numel:
        buffers.pop(dtype, None)  # free the smaller one first
        with torch.inference_mode(False):  # a normal tensor, writable in and out of inference mode
            buffer = buffers[dtype] = torch.empty(numel, dtype=dtype)
    return buffer[:numel]


def formation_buffer_bytes() -> int:
    """Bytes held by this thread's :func:`formation_buffer` buffers."""
    return sum(b.numel() * b.element_size() for b in getattr(_FORMATION, "buffers", {}).values())


def release_formation_buffers() -> int:
    """Free this thread's :func:`formation_buffer` buffers; returns the bytes freed."""
    freed = formation_buffer_bytes()
    getattr(_FORMATION, "buffers", {}).clear()
    return freed


def phm_linear_blocked(x: Tensor, rule: Tensor, weight: Tensor, bias: Tensor | None = None,
                       buffer: Tensor | None = None) -> Tensor:
    """``x Hᵀ + b`` forming ``H`` one block column at a time; inference only (no gradient recorded, no tracing).

    Block column ``c`` of ``H``, ``H_c = H[:, c·d/n : (c+1)·d/n]`` (``k × d/n``), has row ``(a, q)`` equal to
    ``Σᵢ rule[i, a, c] Sᵢ[q, :]``: one ``(n, n) @ (n, k·d/n²)`` GEMM writes it contiguous, with no permute (forming
    all of ``H`` needs one, or a batched product of ``n × n`` matrices). Then ``y += x_c H_cᵀ`` (``addmm``; the bias
    enters with the first block). So ``H`` is never held whole: ``k·d/n`` numbers at a time, in ``buffer`` if one is
    given (a contiguous tensor of at least ``k·d/n`` elements of the factors' dtype and device, e.g. from
    :func:`formation_buffer`), else in one tensor for the call. The same sums as ``F.linear(x, H, b)`` in another
    order (equal up to float rounding). Raises :class:`ValueError` where a gradient would be recorded or operations
    are being recorded (the block is overwritten from one column to the next), under autocast, and for tensors off
    the CPU (its block sizes were measured on the CPU; PHMLinear forms ``H`` whole on a GPU)."""
    refuse_off_cpu("phm_linear_blocked", "on a GPU use F.linear(x, materialize_weight(rule, weight), bias), which "
                   "PHMLinear takes there", x, rule, weight, bias, buffer)
    n, k_n, d_n = _sizes(rule, weight)
    k, d = n * k_n, n * d_n
    if ((torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, rule, weight, bias)))
            or recording_operations()):
        raise ValueError("phm_linear_blocked runs where no gradient is recorded and nothing is traced "
                         "(torch.no_grad() or torch.inference_mode(), outside torch.compile, tracing and ONNX export)")
    if x.shape[-1] != d:
        raise ValueError(f"expected input with last dimension {d}, got shape {tuple(x.shape)}")
    if torch.is_autocast_enabled(x.device.type):
        raise ValueError("phm_linear_blocked does not run under autocast (its products write into float buffers); "
                         "PHMLinear forms H whole there and lets F.linear cast")
    if buffer is None:
        block = torch.empty(k, d_n, dtype=weight.dtype, device=weight.device)
    elif (not buffer.is_contiguous() or buffer.numel() < k * d_n or buffer.dtype != weight.dtype
          or buffer.device != weight.device):
        raise ValueError(f"buffer must be a contiguous {weight.dtype} tensor on {weight.device} of at least "
                         f"{k * d_n} elements, got {tuple(buffer.shape)} {buffer.dtype} on {buffer.device}")
    else:
        block = buffer.reshape(-1)[:k * d_n].view(k, d_n)
    flat = x.reshape(-1, d)
    factors = weight.reshape(n, k_n * d_n)  # [i, (q, j)]
    mix = rule.to(weight.dtype)
    out: Tensor | None = None
    for c in range(n):
        torch.mm(mix[:, :, c].T, factors, out=block.view(n, k_n * d_n))  # [a, (q, j)] = H_c
        part = flat[:, c * d_n:(c + 1) * d_n]
        if out is not None:
            out.addmm_(part, block.T)
        elif bias is not None:
            out = torch.addmm(bias.to(block.dtype), part, block.T)
        else:
            out = part @ block.T
    assert out is not None  # a PHM weight has n ≥ 1 blocks
    return out.view(*x.shape[:-1], k)


def phm_linear_structured(x: Tensor, rule: Tensor, weight: Tensor, bias: Tensor | None = None,
                          weight_first: bool | None = None) -> Tensor:
    """``x Hᵀ + b`` without forming ``H``. ``x``: ``(..., d)`` → ``(..., k)``.

    One matmul of the ``rows·n`` input blocks ``X_c`` against the factors viewed as ``(k, d/n)`` (no copy) reads
    every ``Sᵢ`` once and gives the ``n²`` partial products ``X_c Sᵢᵀ``; then ``y_a = Σ_{c,i} rule[i, a, c]
    (X_c Sᵢᵀ)`` mixes them. Two orientations, ``weight_first`` (``None``: chosen by
    :func:`~hyperplex.layers.dispatch.structured_weight_first` with the default settings):

    - input-first, ``P = X Sᵀ`` with rows ``(b, c)`` and columns ``(i, q)``: the mixing is one batched
      ``(n, n²) @ (n², k/n)`` matmul per row on a view of ``P`` whose output is already ``y``'s layout;
    - weight-first, ``Pᵀ = S Xᵀ``: for a few block rows on a large weight, BLAS then runs a matrix–vector-like
      kernel that streams ``S`` once, where the input-first form packs ``S`` first; the mixing needs a permute copy.

    Input-first is the faster form except at one or two block rows on a large weight (docs/performance.md, "The
    structured product input-first"). Both are exact up to float rounding.
    """
    n, k_n, d_n = _sizes(rule, weight)
    lead = x.shape[:-1]
    blocks = x.reshape(-1, d_n)  # (B·n_c, d/n), rows ordered (b, c)
    rows = blocks.shape[0] // n
    if weight_first is None:
        weight_first = structured_weight_first(rows, n, n * k_n, n * d_n)
    if weight_first:
        partial_t = weight.reshape(n * k_n, d_n) @ blocks.T  # (n_i·k/n, B·n_c)
        partial = partial_t.view(n, k_n, rows, n).permute(2, 1, 3, 0).reshape(rows * k_n, n * n)  # [(b, q), (c, i)]
        mix = rule.permute(2, 0, 1).reshape(n * n, n).to(partial.dtype)  # [(c, i), a] = rule[i, a, c]
        out = (partial @ mix).view(rows, k_n, n).transpose(1, 2).reshape(*lead, n * k_n)  # (B, a, q) → (..., k)
    else:
        partial = F.linear(blocks, weight.reshape(n * k_n, d_n))  # [(b, c), (i, q)]
        return mix_partial_products(partial, rule, rows, bias).reshape(*lead, n * k_n)  # (B, a, q) → (..., k)
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out


def mix_partial_products(partial: Tensor, rule: Tensor, rows: int, bias: Tensor | None = None) -> Tensor:
    """``y`` as ``(rows, n, k/n)`` from the partial products ``P[(b, c), (i, q)] = (X_c Sᵢᵀ)[b, q]`` (``partial``:
    ``(rows·n, k)``, contiguous): ``y[b, a, :] = Σ_{c,i} rule[i, a, c] P[b, (c, i), :]``, one batched
    ``(n, n²) @ (n², k/n)`` matmul on a view of ``P`` whose output is already ``y``'s layout (no permute copy);
    ``bias`` ``(k,)``, if given, added. One row (a decoding step) takes one 2-D product with the bias inside it:
    at that size a call's fixed cost is most of its time, and the batched form with a separate addition is three."""
    n = rule.shape[0]
    k_n = partial.shape[-1] // n
    mix = rule.permute(1, 2, 0).reshape(n, n * n).to(partial.dtype)  # [a, (c, i)] = rule[i, a, c]
    if rows == 1:
        flat = partial.view(n * n, k_n)
        out = torch.mm(mix, flat) if bias is None else torch.addmm(bias.to(partial.dtype).view(n, k_n), mix, flat)
        return out.view(1, n, k_n)
    out = torch.matmul(mix, partial.view(rows, n * n, k_n))
    return out if bias is None else out + bias.to(out.dtype).view(n, k_n)


def phm_linear_premixed(x: Tensor, rule: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x Hᵀ + b`` without forming ``H``, as one GEMM against the ``Sᵢ`` side by side. ``x``: ``(..., d)`` →
    ``(..., k)``; ``rule`` ``(n, n, n)``, ``weight`` ``(n, k/n, d/n)``.

    ``y_a = Σ_c Σᵢ Aᵢ[a, c] Sᵢ x_c = Σᵢ Sᵢ z_{a,i}`` with ``z_{a,i} = Σ_c Aᵢ[a, c] x_c``: the input blocks are
    mixed by the rule first (``n²·d`` multiply-adds per row), then ``[z_{a,1} … z_{a,n}]`` ``(rows·n, d)``
    meets ``[S₁ … S_n]`` ``(k/n, d)`` in one GEMM of the dense layer's multiply-adds that reads ``k·d/n``
    weights. Exact up to rounding (same sums, other order).
    """
    n, k_n, d_n = weight.shape
    out = F.linear(premix_inputs(x, rule), side_by_side(weight)).reshape(*x.shape[:-1], n * k_n)  # (B, a, q) → (..., k)
    return out if bias is None else out + bias


def phm_linear_lowrank(x: Tensor, rule: Tensor, left: Tensor, right: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x Hᵀ + b`` for ``H = Σᵢ Aᵢ ⊗ (Lᵢ Rᵢ)`` without forming ``H`` or any ``Sᵢ``. ``x``: ``(..., d)`` →
    ``(..., k)``.

    ``rule`` ``(n, n, n)``, ``left`` ``(n, k/n, r)`` (the ``Lᵢ``), ``right`` ``(n, r, d/n)`` (the ``Rᵢ``).
    ``y_a = Σᵢ Lᵢ (Σ_c Aᵢ[a, c] Rᵢ x_c)``: project every input block on every ``Rᵢ`` (one matmul,
    ``B·n·r·d`` multiply-adds), mix the blocks by the rule (``B·n³·r``), expand with every ``Lᵢ`` (one matmul,
    ``B·n·r·k``). Weights read: ``r·(k + d)``.
    """
    n, k_n, r = left.shape
    d_n = right.shape[2]
    lead = x.shape[:-1]
    blocks = x.reshape(-1, d_n)  # (B·n_c, d/n)
    rows = blocks.shape[0] // n
    projected = blocks @ right.reshape(n * r, d_n).T  # (B·n_c, n_i·r): Rᵢ x_c
    projected = projected.view(rows, n, n, r).permute(2, 0, 3, 1).reshape(n, rows * r, n)  # (i, (b, r), c)
    mixed = torch.bmm(projected, rule.transpose(1, 2).to(projected.dtype))  # (i, (b, r), a): Σ_c Aᵢ[a, c] Rᵢ x_c
    mixed = mixed.view(n, rows, r, n).permute(1, 3, 0, 2).reshape(rows * n, n * r)  # ((b, a), (i, r))
    out = (mixed @ left.permute(0, 2, 1).reshape(n * r, k_n)).reshape(*lead, n * k_n)  # ((b, a), q): Σᵢ Lᵢ (...)
    return out if bias is None else out + bias.to(out.dtype)


def premix_inputs(x: Tensor, rule: Tensor) -> Tensor:
    """``z`` of :func:`phm_linear_premixed`: ``x`` ``(..., d)`` → ``(rows·n, d)``, row ``(b, a)`` holding
    ``[z_{a,1} … z_{a,n}]`` with ``z_{a,i} = Σ_c rule[i, a, c] x_c`` (``x_c``: the ``c``-th of ``n`` blocks)."""
    n = rule.shape[0]
    d_n = x.shape[-1] // n
    blocks = x.reshape(-1, n, d_n)  # (B, c, j)
    mix = rule.permute(1, 0, 2).reshape(n * n, n).to(x.dtype)  # [(a, i), c] = rule[i, a, c]
    # The rule on the left: the batched product's output (B, (a, i), j) is already z's layout, so no permute copy
    # (the mix-on-the-right form and its copy took 2-3x as long at MiniLM's shapes, 12-48 rows).
    return torch.matmul(mix, blocks).reshape(-1, n * d_n)  # (B·a, (i, j))


def side_by_side(weight: Tensor) -> Tensor:
    """``[S₁ … S_n]`` ``(k/n, d)`` from ``weight`` ``(n, k/n, d/n)``: row ``q`` is every ``Sᵢ``'s row ``q``."""
    n, k_n, d_n = weight.shape
    return weight.permute(1, 0, 2).reshape(k_n, n * d_n)  # [q, (i, j)]


_ONEDNN: dict[str, str | None] = {}  # "reason": None once the self-check passed, else why oneDNN is not used


def _onednn_linear(x: Tensor, weight: Tensor) -> Tensor:
    """``x @ weight.T`` on oneDNN (no bias, no fused activation)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")


def _onednn_process_reason() -> str | None:
    """Why this process cannot use oneDNN's linear (checked once: the operation exists and agrees with
    ``F.linear`` on shapes like the PHM layers'), or ``None``."""
    if "reason" not in _ONEDNN:
        reason = None
        if not torch.backends.mkldnn.is_available():
            reason = "this PyTorch was built without oneDNN (MKL-DNN)"
        elif not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
            reason = "this PyTorch has no torch.ops.mkldnn._linear_pointwise"
        else:
            try:
                gen = torch.Generator().manual_seed(0)
                for rows, d, k in ((1, 96, 384), (7, 33, 12), (64, 256, 4096)):
                    x, w = torch.randn(rows, d, generator=gen), torch.randn(k, d, generator=gen)
                    want = (x.double() @ w.double().T)
                    err = (_onednn_linear(x, w).double() - want).abs().max().item()
                    if not err <= 1e-5 * max(1.0, want.abs().max().item()):
                        reason = f"oneDNN's linear failed its self-check (error {err:.3g} at {rows}x{d} @ {k}x{d})"
                        break
            except RuntimeError as exc:  # an operation PyTorch lists but cannot run on this CPU
                reason = f"oneDNN's linear failed its self-check: {exc}".splitlines()[0]
        if reason is not None:
            warnings.warn(f"hyperplex: the oneDNN PHM path is off in this process: {reason}", RuntimeWarning,
                          stacklevel=3)
        _ONEDNN["reason"] = reason
    return _ONEDNN["reason"]


def cpu_inference_reason(*tensors: Tensor | None) -> str | None:
    """Why an inference-only CPU float32 product (the oneDNN path, the compiled kernel) cannot take these tensors,
    or ``None``."""
    present = [t for t in tensors if t is not None]
    if any(t.device.type != "cpu" for t in present):
        return "it runs on the CPU only"
    if any(t.dtype != torch.float32 for t in present):
        return "it runs in float32 only"
    if torch.is_grad_enabled() and any(t.requires_grad for t in present):
        return "it has no backward pass (use it under torch.no_grad() or torch.inference_mode(), or on frozen weights)"
    return None


def onednn_reason(x: Tensor, rule: Tensor, weight: Tensor, bias: Tensor | None = None) -> str | None:
    """``None`` if :func:`phm_linear_onednn` can run on these tensors, else the reason it cannot."""
    reason = cpu_inference_reason(x, rule, weight, bias)
    if reason is not None:
        return reason
    if recording_operations():
        return "torch.compile, tracing and ONNX export record PyTorch's public operations, not this one"
    if not torch.backends.mkldnn.enabled:
        return "oneDNN is switched off (torch.backends.mkldnn.enabled is False)"
    return _onednn_process_reason()


def onednn_available() -> bool:
    """Whether this process can run :func:`phm_linear_onednn` at all (PyTorch has oneDNN, it is switched on, and
    its linear passed a self-check, run once per process)."""
    return bool(torch.backends.mkldnn.enabled) and _onednn_process_reason() is None


#: oneDNN builds (and keeps, in PyTorch's primitive caches of up to 1,024 entries) a kernel for every distinct input
#: shape, about 0.6 MB each on this project's CPU: a server that met every row count from 1 to 1,000 would hold
#: hundreds of MB of them. :func:`phm_linear_onednn` therefore pads the row count up to a bucket: exact up to
#: ``ONEDNN_EXACT_ROWS`` rows, then ``ONEDNN_BUCKETS_PER_OCTAVE`` buckets between each power of two and the next
#: (at most 1/8 extra rows computed and discarded), so a layer shape meets at most 16 + 8 per octave of shapes.
ONEDNN_EXACT_ROWS = 16
ONEDNN_BUCKETS_PER_OCTAVE = 8


def onednn_padded_rows(rows: int) -> int:
    """The row count :func:`phm_linear_onednn` computes for ``rows`` rows (see :data:`ONEDNN_EXACT_ROWS`)."""
    if rows <= ONEDNN_EXACT_ROWS:
        return rows
    step = max(1, (1 << (rows.bit_length() - 1)) // ONEDNN_BUCKETS_PER_OCTAVE)
    return -(-rows // step) * step


def phm_linear_onednn(x: Tensor, rule: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x Hᵀ + b`` without forming ``H``, on oneDNN; inference only (CPU, float32, no gradient).

    ``P[(b, c), (i, q)] = (X_c Sᵢᵀ)[b, q]``: one oneDNN linear of the ``rows·n`` input blocks against the
    factors viewed as ``(k, d/n)`` (no copy) reads every ``Sᵢ`` once; then ``y[b, a, :] = Σ_{c,i} rule[i, a, c]
    P[b, (c, i), :]``, one batched ``(n, n²) @ (n², k/n)`` matmul per row on a view of ``P``, whose output is already
    in ``y``'s layout. The row count is padded with zero rows to :func:`onednn_padded_rows` (a bounded set of shapes
    for oneDNN to build kernels for). Exact up to float rounding; raises :class:`RuntimeError` naming what stops it
    otherwise."""
    reason = onednn_reason(x, rule, weight, bias)
    if reason is not None:
        raise RuntimeError(f"the oneDNN PHM path cannot run here: {reason}")
    n, k_n, d_n = _sizes(rule, weight)
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    padded = onednn_padded_rows(rows)
    if padded != rows:
        flat = F.pad(flat, (0, 0, 0, padded - rows))
    blocks = flat.reshape(padded * n, d_n)  # rows ordered (b, c); a view unless x is strided
    partial = _onednn_linear(blocks, weight.reshape(n * k_n, d_n))  # [(b, c), (i, q)]
    out = mix_partial_products(partial, rule, padded)[:rows]  # (b, a, q): a view of the first rows
    if bias is not None:
        out += bias.view(n, k_n)
    return out.reshape(*x.shape[:-1], n * k_n)


def phm_linear(x: Tensor, rule: Tensor, weight: Tensor, bias: Tensor | None = None,
               mode: str = "materialized") -> Tensor:
    """Functional PHM layer: ``mode`` is ``"materialized"``, ``"structured"``, ``"premixed"`` or ``"onednn"``
    (inference only); all are exact."""
    if mode == "structured":
        return phm_linear_structured(x, rule, weight, bias)
    if mode == "premixed":
        return phm_linear_premixed(x, rule, weight, bias)
    if mode == "onednn":
        return phm_linear_onednn(x, rule, weight, bias)
    if mode == "materialized":
        return F.linear(x, materialize_weight(rule, weight), bias)
    raise ValueError(f"unknown mode {mode!r}; valid: 'materialized', 'structured', 'premixed', 'onednn'")


def phm_linear_reference(x: Tensor, rule: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """Reference ``x (Σᵢ kron(Aᵢ, Sᵢ))ᵀ + b`` with ``torch.kron``, as in the paper's eq. 3.3."""
    H = torch.kron(rule[0], weight[0])
    for i in range(1, rule.shape[0]):
        H = H + torch.kron(rule[i], weight[i])
    return F.linear(x, H, bias)
