#!/usr/bin/env python
"""Speed and memory of ``PHMLinear`` against ``nn.Linear`` and the usual broadcast-Kronecker PHM layer.

Usage (from the repository root)::

    PYTHONPATH=src python benchmarks/bench_phm.py --quick                # reduced grid, warm and cold, ~4 min on 2 cores
    PYTHONPATH=src python benchmarks/bench_phm.py                        # full grid (warm, then cold)
    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_phm.py --threads 1 --clock cpu --mode cold
    PYTHONPATH=src python benchmarks/bench_phm.py --sizes 4096 --ns 4 --rows 1 64 --csv phm.csv
    PYTHONPATH=src python benchmarks/bench_phm.py --mode cold --cold-phases infer --cold-sizes 4096 --cold-rows 1 \
        --native                                                         # auto with the compiled streamed kernel

For every ``d = k`` in ``--sizes``, ``n`` in ``--ns`` and ``rows`` in ``--rows`` the script times
seven layers on the same input ``x`` of shape ``(rows, d)``:

- ``dense``: ``nn.Linear(d, k)``, the baseline every other number is divided by;
- ``str``: ``PHMLinear(..., forward_mode="structured")`` (never forms ``H``);
- ``pre``: ``PHMLinear(..., forward_mode="premixed")`` (never forms ``H``; inputs mixed by the rule first), and
  ``dnn``: ``PHMLinear(..., forward_mode="onednn")`` (the structured product on PyTorch's oneDNN linear), both
  timed in inference only (oneDNN's path has no backward; ``dnn`` shows ``skip`` where this PyTorch has no usable
  oneDNN linear);
- ``mat``: ``PHMLinear(..., forward_mode="materialized", cache_dense=True)`` (forms ``H``, one dense matmul).
  With no gradient needed (inference) it reuses the kept ``H``, so its inference column is headed ``cached``;
- ``auto``: ``PHMLinear(..., forward_mode="auto")`` — what a user gets by default (no ``H`` kept: in
  inference it takes the structured path or forms ``H`` for the call, see ``PHMLinear.choose_mode``; with
  ``--native``, the compiled streamed kernel of ``hyperplex.layers.native`` where it applies);
- ``kron``: :class:`BroadcastKronPHM`, a re-implementation of the PHM layer found in public code
  (Compacter / AdapterHub / PHC-GNN / HyperNets), which rebuilds ``H`` on every forward with a
  broadcast Kronecker product (an ``n·k·d`` intermediate) and then calls ``F.linear``. It shares
  its parameters with the ``PHMLinear`` layers and is checked to give the same outputs and
  gradients at start-up.

Two phases are timed:

- ``fwd``: one forward call under ``torch.inference_mode()``;
- ``f+b``: one training step — gradients of the parameters and of ``x`` set to ``None`` (as
  ``optimizer.zero_grad()`` does by default, so every step allocates fresh gradients), forward with
  ``x.requires_grad_()``, then ``out.backward(g)`` with a fixed random ``g`` (no optimiser step).

Method: each (layer, phase) gets one warm-up call, then a calibration call (skipped when the
warm-up alone took over four blocks) that sets how many back-to-back calls make one timed block
of about ``--block-ms``. Blocks of the layers are then timed in interleaved rounds, the order
rotating every round, so drift on a shared machine hits all layers alike. With ``--stat median``
(default) a time is the median over rounds of the per-call time, and a ratio is the median over
rounds of (layer time / dense time in the same round); with ``--stat min`` both use minima. The
number of rounds is ``--repeats``, cut (not below ``--min-repeats``) so that one shape and phase
take about ``--budget-s``. Layers whose estimated memory exceeds ``--mem-limit-gib`` are not run
and show ``skip``. The header reports how many cores other processes kept busy at the start and
end: multi-threaded CPU timings degrade badly when they do (a descheduled OpenMP thread stalls
every parallel region); ``--threads 1``, optionally with ``--clock cpu`` (process CPU time), then
gives far steadier ratios.

Columns of the printed (markdown) table — ratios are ``time / dense time``, below 1 is faster:

- ``d=k``, ``n``, ``rows``: layer size, number of Kronecker terms, rows of ``x``;
- ``dense fwd ms`` / ``dense f+b ms``: absolute time of the baseline (the statistic above), ms;
- ``str fwd``, ``pre fwd``, ``dnn fwd``, ``cached fwd``, ``auto fwd``, ``kron fwd``: inference forward, ×dense;
- ``str f+b``, ``mat f+b``, ``auto f+b``, ``kron f+b``: training step (forward + backward), ×dense;
- ``auto path``: ``layer.choose_mode(rows)`` in inference / in training;
- ``MiB dense``, ``MiB auto``, ``MiB kron``: peak memory of one training step, defined below.

Peak memory (training step only): the highest number of bytes that PyTorch's allocator held during
one forward + backward, above the level just before the step (parameters, ``x`` and ``g`` already
allocated and excluded; gradients start as ``None``). It therefore counts the output, the tensors
saved for backward, transient intermediates (``H``, the ``n·k·d`` broadcast product of ``kron``,
the ``rows·n·k`` partial products of ``str``) and the freshly allocated gradients. On CUDA it is
``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()``; on CPU it is computed
from the allocation events of ``torch.profiler.profile(profile_memory=True)`` (running sum of
allocated minus freed bytes, maximum over the step) — exact for tensors from PyTorch's CPU
allocator, blind to scratch buffers that BLAS/oneDNN allocate themselves. The profiled call is the
training warm-up call, so it costs no extra time.

Warm and cold. The first table (``--mode warm``) repeats the same layer on the same input, so
small weights (``k·d/n`` numbers for PHM: 16 MiB at ``d = k = 4096``, ``n = 2``) stay in the CPU's
last-level cache between calls while a large dense weight (64 MiB) streams from memory: the regime
of one layer called in a loop, and it flatters PHM. A model's decoder cycles through many layers
and gets no such help, so the second table (``--mode cold``) times a *stack* of ``L`` distinct
layers per variant, called one after the other on the same ``x`` (as a batch-1 decoder step does),
and reports the time per layer (pass time / ``L``). ``L`` is the smallest depth at which the PHM
weights of the stack at the largest ``n`` are ``--cold-factor`` (2) times the last-level cache
(read from ``/sys/devices/system/cpu/cpu0/cache``, else ``lscpu``, else a 32 MiB guess;
``--llc-mib`` sets it, ``--stack-layers`` sets ``L``), so every variant's weights come from memory
on every pass; the three ``PHMLinear`` modes of a layer share its parameters. The cold table has
no memory columns and no ``kron`` column unless ``--cold-kron`` (kron writes an ``n·k·d``
intermediate per call, cold or warm, and would take minutes). Its rows default to few (1, 8, 64):
many rows are compute-bound and gain nothing from a cache. The header gives ``L`` and the stack
sizes; the cold targets section checks ``auto`` against the faster path.

Caveats. (1) Cold is the model-like figure only for models whose weights overflow the cache; a
small model whose PHM weights fit in cache while the dense ones do not gets something between the
two tables. On a machine shared with other processes use ``--threads 1 --clock cpu``.
(2) PyTorch's CPU allocator calls ``malloc``, and glibc serves blocks above its mmap threshold
(at most 32 MiB on 64-bit Linux) with ``mmap`` and unmaps them on free, so such a tensor (the
dense ``grad_W`` at ``d = k = 4096``, the ``n·k·d`` product of ``kron``) is page-faulted afresh
on every call. With few rows this dominates: at ``d = k = 4096``, 1 row, the dense training step
is ~4x slower than with memory reuse. That is what a default glibc process pays, so it is
measured by default; ``--no-mmap`` switches it off (as jemalloc/tcmalloc or a warm caching
allocator would) and the header says which was used.

After the table a ``targets`` section reports PASS/MISS, with the measured value, for the
project's performance targets: at ``d = k = 4096``, 1 row, inference ``auto`` ≤ 0.60 / 0.35 /
0.20 / 0.15 × dense for n = 2 / 4 / 8 / 16 and ≥ 10× faster than ``kron``; at 4096 rows,
training ``auto`` ≤ 1.08 × dense for every n (``--quick`` has no 4096 rows and checks this at
1024 rows, which is stricter); and at every grid point, in both phases, ``auto`` ≤ 1.10 × the
faster of ``str`` and ``mat``. The cold table's targets are the deploy issue's: at ``d = k = 4096``, 1 row,
inference ``auto`` ≤ 0.60 / 0.30 / 0.16 / 0.12 × dense for n = 2 / 4 / 8 / 16 (the path taken is printed). A MISS is a measurement, not an error: the script exits 0.
``--csv`` / ``--json`` additionally write every raw number (absolute ms, all samples, paths).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import ctypes
import ctypes.util
import datetime as _dt
import json
import math
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyperplex.layers.functional import onednn_available
from hyperplex.layers.phm import PHMLinear

#: The fixed-path PHMLinear layers, sharing the parameters of the ``auto`` one.
MODES = ("structured", "premixed", "onednn", "materialized")
VARIANTS = ("dense", *MODES, "auto", "kron")
#: Paths timed in inference only: oneDNN's has no backward pass, and the training table keeps to the two paths
#: ``auto`` chooses between when training.
INFERENCE_ONLY = ("premixed", "onednn")
INFERENCE_ONLY_SKIP = "timed in inference only"  # by design: not listed under the table
PHASES = ("infer", "train")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MiB = 2**20

FULL = {"sizes": [512, 1024, 4096], "ns": [2, 4, 8, 16], "rows": [1, 8, 64, 4096],
        "repeats": 5, "min_repeats": 3, "block_ms": 50.0, "budget_s": 20.0,
        "cold_sizes": [1024, 4096], "cold_rows": [1, 8, 64], "cold_phases": ["infer", "train"]}
# d=k=4096 with 4096 rows costs ~1.5 s per dense forward and ~4.5 s per training step on 2 cores,
# too slow for a 3-minute run; 1024 rows is already compute-bound (the 4096-row training target is then
# checked at 1024 rows, which is stricter: forming H costs the same while the matmuls shrink 4x).
QUICK = {"sizes": [1024, 4096], "ns": [2, 4, 8, 16], "rows": [1, 1024],
         "repeats": 3, "min_repeats": 2, "block_ms": 20.0, "budget_s": 4.0,
         "cold_sizes": [4096], "cold_rows": [1, 8], "cold_phases": ["infer"]}


# ----------------------------------------------------------------------------- the public approach
def kronecker_product(a: Tensor, b: Tensor) -> Tensor:
    """Batched Kronecker product by broadcasting: ``(..., p, q) ⊗ (..., r, s) → (..., p·r, q·s)``.

    The same expression as ``kronecker_product`` in Compacter's ``hypercomplex/kronecker.py``
    (rabeehk/compacter, taken from PHC-GNN and pylabyk), which AdapterHub's ``phm_layer.py``
    and later HyperNets-style PHM layers copy.
    """
    size = (a.shape[-2] * b.shape[-2], a.shape[-1] * b.shape[-1])
    res = a.unsqueeze(-1).unsqueeze(-3) * b.unsqueeze(-2).unsqueeze(-4)  # (..., p, r, q, s)
    return res.reshape(res.shape[:-4] + size)


class BroadcastKronPHM(nn.Module):
    """PHM layer as commonly implemented: ``H = Σᵢ Aᵢ ⊗ Sᵢ`` rebuilt by broadcasting every forward.

    Mirrors ``PHMLinear.forward`` / ``matvec_product`` of Compacter (and AdapterHub's
    ``PHMLayer``): ``H = kronecker_product(phm_rule, W).sum(0)``, then one matmul. Those keep ``W``
    as ``(n, d/n, k/n)`` and compute ``x @ H``; here the parameters use ``PHMLinear``'s layout
    (``phm_weight`` ``(n, k/n, d/n)``) and ``F.linear`` so the two layers can share parameters —
    the cost (an ``n·k·d`` product, a sum over ``n``, a ``(rows, d) × (d, k)`` matmul) is the same.
    """

    def __init__(self, phm: PHMLinear) -> None:
        super().__init__()
        rule = phm.phm_rule.detach().clone()
        if phm.rule_is_learned:
            self.phm_rule = nn.Parameter(rule)
        else:  # fixed algebra, or n = 1
            self.register_buffer("phm_rule", rule)
        self.phm_weight = nn.Parameter(phm.phm_weight.detach().clone())
        self.bias = nn.Parameter(phm.bias.detach().clone()) if phm.bias is not None else None

    def forward(self, x: Tensor) -> Tensor:
        H = kronecker_product(self.phm_rule, self.phm_weight).sum(0)  # (n, k, d) → (k, d)
        return F.linear(x, H, self.bias)


def verify_kron(ns: list[int]) -> None:
    """Outputs and all gradients of ``kron`` equal ``PHMLinear``'s (every mode), float64, k ≠ d."""
    gen = torch.Generator().manual_seed(0)
    for n in ns:
        d, k = 7 * n, 5 * n
        ref = PHMLinear(d, k, n, dtype=torch.float64)
        layers = {"kron": BroadcastKronPHM(ref)}
        for mode in ("structured", "materialized", "auto"):
            layers[mode] = PHMLinear(d, k, n, dtype=torch.float64, forward_mode=mode)
            layers[mode].load_state_dict(ref.state_dict())
        x0 = torch.randn(2, 3, d, dtype=torch.float64, generator=gen)
        g = torch.randn(2, 3, k, dtype=torch.float64, generator=gen)
        results = {}
        for name, layer in layers.items():
            x = x0.clone().requires_grad_()
            out = layer(x)
            out.backward(g)
            results[name] = [out, x.grad, layer.phm_rule.grad, layer.phm_weight.grad, layer.bias.grad]
        for name in ("structured", "materialized", "auto"):
            for got, want in zip(results["kron"], results[name]):
                if got is not None or want is not None:  # the rule has no gradient when it is fixed (n = 1)
                    torch.testing.assert_close(got, want, msg=lambda m: f"kron vs {name}, n={n}: {m}")


# ----------------------------------------------------------------------------- measurement helpers
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def _block_time(fn, number: int, device: torch.device, clock=time.perf_counter) -> float:
    """Seconds per call of ``fn`` over a block of ``number`` back-to-back calls."""
    _sync(device)
    start = clock()
    for _ in range(number):
        fn()
    _sync(device)
    return (clock() - start) / number


def busy_cores_elsewhere(seconds: float = 0.5) -> float | None:
    """Cores kept busy by other processes while this one sleeps (Linux ``/proc/stat``), else ``None``."""
    def busy_idle():
        with open("/proc/stat") as fh:
            v = [int(x) for x in fh.readline().split()[1:]]
        idle = v[3] + v[4]  # idle + iowait
        return sum(v[:8]) - idle, idle
    try:
        b0, i0 = busy_idle()
        time.sleep(seconds)
        b1, i1 = busy_idle()
    except (OSError, ValueError, IndexError):
        return None
    total = (b1 - b0) + (i1 - i0)
    return (os.cpu_count() or 1) * (b1 - b0) / total if total > 0 else None


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (the profiler backend prints start/stop lines there)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def disable_malloc_mmap() -> bool:
    """Make glibc serve every allocation from its heap and keep freed memory (``mallopt``), so large
    tensors are not ``mmap``-ed and page-faulted afresh on each call. True on success."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_max = -1, -4  # from <malloc.h>
        return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))
    except (OSError, AttributeError):
        return False


def peak_step_bytes(step, device: torch.device) -> float:
    """Peak bytes allocated during ``step()`` above the level before it (see module docstring)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return float(torch.cuda.max_memory_allocated(device) - base)
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        with _quiet_stderr():
            prof.export_chrome_trace(path)
        with open(path) as fh:
            events = json.load(fh).get("traceEvents", [])
    allocs = sorted((e["ts"], e["args"]["Bytes"]) for e in events
                    if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0)
    level = peak = 0
    for _, nbytes in allocs:
        level += nbytes
        peak = max(peak, level)
    return float(peak)


def estimate_bytes(variant: str, phase: str, d: int, k: int, n: int, rows: int, itemsize: int) -> int:
    """Rough upper bound of the memory a call needs beyond the parameters (for ``skip``)."""
    io = rows * (d + k) * (2 if phase == "train" else 1)
    extra = {
        "dense": k * d if phase == "train" else 0,
        "structured": rows * n * k * (3 if phase == "train" else 1),
        "materialized": k * d * (4 if phase == "train" else 1),
        "premixed": rows * n * d + k * d // n,  # the pre-mixed rows and the Sᵢ side by side
        "streamed": rows * n * d,  # the pre-mixed rows
        "onednn": rows * n * k,  # the partial products (inference only)
        "auto": k * d * (4 if phase == "train" else 1) + rows * n * k * (3 if phase == "train" else 1),
        "kron": n * k * d * (2 if phase == "train" else 1) + 2 * k * d,
    }[variant]
    return (io + extra) * itemsize


@dataclass
class Measurement:
    d: int
    k: int
    n: int
    rows: int
    phase: str
    variant: str
    path: str = ""
    ms: float = math.nan
    ratio: float = math.nan
    dense_ms: float = math.nan
    samples_ms: list = field(default_factory=list)
    calls_per_block: int = 0
    peak_mib: float = math.nan
    skipped: str = ""
    mode: str = "warm"  # "warm": one layer called again and again; "cold": a stack of `layers` layers
    layers: int = 1  # layers per timed call; `ms` and `samples_ms` are per layer


def measure_config(layers: dict[str, nn.Module | list[nn.Module]], d: int, k: int, n: int, rows: int, phase: str,
                   args, device: torch.device, dtype: torch.dtype) -> dict[str, Measurement]:
    """Time (and for training, profile memory of) every variant on one shape, interleaved.

    A variant given as a list of ``L`` layers (the cold-cache stack) is timed as one pass through
    all of them on the same ``x``; its times are reported per layer (pass time / ``L``) and its
    memory is not profiled (it is that of one layer, measured in the warm table).
    """
    stacks = {name: layer if isinstance(layer, list) else [layer] for name, layer in layers.items()}
    gen = torch.Generator(device=device).manual_seed(1000 * rows + n)
    x = torch.randn(rows, d, device=device, dtype=dtype, generator=gen)
    g = torch.randn(rows, k, device=device, dtype=dtype, generator=gen)
    train = phase == "train"
    if train:
        x.requires_grad_()
    ctx = contextlib.nullcontext if train else torch.inference_mode
    out: dict[str, Measurement] = {}
    calls, clears = {}, {}
    itemsize = torch.empty((), dtype=dtype).element_size()
    for name, stack in stacks.items():
        layer = stack[0]
        for each in stack:
            each.train(train)
        m = out[name] = Measurement(d, k, n, rows, phase, name, layers=len(stack),
                                    mode="warm" if len(stack) == 1 else "cold")
        if train and name in INFERENCE_ONLY:
            m.skipped = INFERENCE_ONLY_SKIP
            continue
        if name == "onednn" and not onednn_available():
            m.skipped = "this PyTorch has no usable oneDNN linear"
            continue
        if isinstance(layer, PHMLinear):
            with ctx():
                m.path = layer.choose_mode(rows)
        else:
            m.path = name
        est = estimate_bytes("materialized" if m.path == "cached" else m.path, phase, d, k, n, rows, itemsize)
        if est > args.mem_limit_gib * 2**30:
            m.skipped = f"estimated {est / 2**30:.1f} GiB > --mem-limit-gib {args.mem_limit_gib:g}"
            continue

        def clear(tensors=(x, *(p for each in stack for p in each.parameters()))):
            for t in tensors:
                t.grad = None

        def train_step(stack=stack, clear=clear):
            clear()
            for each in stack:
                each(x).backward(g)
                if len(stack) > 1:  # free this layer's gradients now: one layer's worth alive, as in warm
                    each.zero_grad(set_to_none=True)
                    x.grad = None

        def infer(stack=stack):
            for each in stack:
                each(x)

        calls[name], clears[name] = (train_step if train else infer), clear

    if out["dense"].skipped:  # no baseline, nothing to compare
        for m in out.values():
            m.skipped = m.skipped or "baseline skipped"
        return out

    clock = CLOCKS[args.clock]
    target = args.block_ms / 1e3
    per_call = {}
    for name, call in calls.items():  # warm-up (profiled for memory when training), then calibration
        with ctx():
            t0 = clock()
            if train and len(stacks[name]) == 1:
                clears[name]()  # gradients freed before the profiler starts, so the peak starts from 0
                out[name].peak_mib = peak_step_bytes(call, device) / MiB
            else:
                call()
                _sync(device)
            warm = clock() - t0
            # a call clearly longer than a block needs no calibration: one call per block
            per_call[name] = warm if warm > 4 * target else _block_time(call, 1, device, clock)
        out[name].calls_per_block = max(1, min(100_000, round(target / max(per_call[name], 1e-7))))

    round_s = sum(per_call[nm] * out[nm].calls_per_block for nm in calls)
    repeats = max(args.min_repeats, min(args.repeats, int(args.budget_s / max(round_s, 1e-9))))
    names = list(calls)
    for r in range(repeats):  # interleaved rounds, the order rotating
        for name in names[r % len(names):] + names[:r % len(names)]:
            with ctx():
                out[name].samples_ms.append(1e3 * _block_time(calls[name], out[name].calls_per_block, device, clock))
    for stack in stacks.values():  # free gradients before the next shape
        for each in stack:
            each.zero_grad(set_to_none=True)

    for m in out.values():  # per layer
        m.samples_ms = [t / m.layers for t in m.samples_ms]
    dense = out["dense"].samples_ms
    for m in out.values():
        m.dense_ms = min(dense) if args.stat == "min" else statistics.median(dense)
        if m.samples_ms:
            if args.stat == "min":
                m.ms = min(m.samples_ms)
                m.ratio = m.ms / m.dense_ms
            else:  # median of the ratios paired by round: drift between rounds cancels
                m.ms = statistics.median(m.samples_ms)
                m.ratio = statistics.median(t / b for t, b in zip(m.samples_ms, dense))
    return out


def build_layers(d: int, k: int, n: int, device: torch.device, dtype: torch.dtype) -> dict[str, nn.Module]:
    """Dense baseline, the PHMLinear layers of :data:`MODES` and ``auto`` sharing one set of parameters, and the
    kron layer."""
    auto = PHMLinear(d, k, n, device=device, dtype=dtype)
    layers = {"dense": nn.Linear(d, k, device=device, dtype=dtype)}
    for mode in MODES:
        layers[mode] = PHMLinear(d, k, n, device=device, dtype=dtype, forward_mode=mode,
                                 cache_dense=mode == "materialized")
        layers[mode].load_state_dict(auto.state_dict())
    layers["auto"] = auto
    layers["kron"] = BroadcastKronPHM(auto)
    return {name: layers[name] for name in VARIANTS}


# ----------------------------------------------------------------------------- the cold-cache stack
FALLBACK_LLC_MIB = 32  # when neither sysfs nor lscpu says (a common server L3 per CCX/socket)


def _parse_size(text: str) -> int:
    """``"32768K"`` / ``"32 MiB"`` / ``"33554432"`` → bytes."""
    text = text.strip().replace("iB", "").replace("B", "").replace(" ", "")
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def last_level_cache() -> tuple[int, str]:
    """Bytes of the largest data/unified CPU cache, and where that number came from."""
    sizes = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (index / "type").read_text().strip() != "Instruction":
                sizes.append(_parse_size((index / "size").read_text()))
        except (OSError, ValueError):
            continue
    if sizes:
        return max(sizes), "sysfs"
    try:
        import subprocess

        text = subprocess.run(["lscpu", "-B", "-C=NAME,ONE-SIZE,TYPE"], capture_output=True, text=True,
                              timeout=10).stdout
        sizes = [int(f[1]) for f in (ln.split() for ln in text.splitlines()[1:])
                 if len(f) >= 3 and f[1].isdigit() and f[2] != "Instruction"]
        if sizes:
            return max(sizes), "lscpu"
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    return FALLBACK_LLC_MIB * MiB, f"fallback guess, {FALLBACK_LLC_MIB} MiB (set --llc-mib)"


def stack_depth(d: int, k: int, ns: list[int], itemsize: int, llc_bytes: int, args) -> tuple[int, str]:
    """Layers ``L`` in the cold stack of size ``d = k``, and a note when it had to be capped.

    ``L`` is the smallest depth at which the PHM weights of the stack at the largest ``n`` (``L·k·d/n``
    numbers) are ``--cold-factor`` times the last-level cache, so that every variant's weights (dense
    ones ``n`` times larger) overflow it and each layer's weights come from memory, as in a model
    whose weights do not fit in cache. Capped so that the dense stack plus two cached ``H`` per layer
    (the ``materialized`` and ``auto`` layers each keep one in inference) stay within ``--mem-limit-gib``.
    (At ``d = 512`` this means ~1,000 layers: slow to build on a small machine, hence not in the default grid.)
    """
    if args.stack_layers:
        phm = args.stack_layers * k * d // max(ns) * itemsize
        return args.stack_layers, ("" if phm > llc_bytes else
                                   f"the PHM weights at n={max(ns)} ({phm / MiB:g} MiB) fit in the last-level "
                                   "cache: not a cold measurement for them")
    want = math.ceil(args.cold_factor * llc_bytes * max(ns) / (k * d * itemsize))
    cap = max(1, int(args.mem_limit_gib * 2**30 // (3 * k * d * itemsize)))
    depth = max(2, min(want, cap))
    note = "" if want <= cap else (f"d=k={d}: stack capped at {cap} layers by --mem-limit-gib (wanted {want}); "
                                   "the PHM weights of large n may partly stay in cache")
    return depth, note


def build_stack(d: int, k: int, n: int, depth: int, device: torch.device, dtype: torch.dtype,
                kron: bool, dense: list[nn.Module] | None = None) -> dict[str, list[nn.Module]]:
    """``depth`` distinct layers per variant. The ``PHMLinear`` layers of one depth (:data:`MODES` and ``auto``)
    share its parameters (no copies: the stack's memory is one dense stack plus one PHM stack). ``dense``:
    a dense stack to reuse (it does not depend on ``n``; building 1 GiB of layers takes seconds)."""
    dense = dense or [nn.Linear(d, k, device=device, dtype=dtype) for _ in range(depth)]
    autos = [PHMLinear(d, k, n, device=device, dtype=dtype) for _ in range(depth)]
    stacks: dict[str, list[nn.Module]] = {"dense": dense}
    for mode in MODES:
        stacks[mode] = []
        for src in autos:
            view = PHMLinear(d, k, n, bias=src.bias is not None, device="meta", forward_mode=mode,
                             cache_dense=mode == "materialized")
            view.phm_rule, view.phm_weight, view.bias = src.phm_rule, src.phm_weight, src.bias
            stacks[mode].append(view)
    stacks["auto"] = autos
    if kron:
        stacks["kron"] = [BroadcastKronPHM(src) for src in autos]
    return stacks


# ----------------------------------------------------------------------------- reporting
def native_line(asked: bool) -> str:
    """Whether ``auto`` may take hyperplex's compiled streamed kernel in this run, and why (it changes the ``auto``
    column at few rows on large layers)."""
    from hyperplex.layers import native

    value = os.environ.get(native.ENV_VAR)
    if asked:
        return "native PHM kernel: on (--native)"
    if native.native_kernels_enabled():
        return ("native PHM kernel: on (installed by `hyperplex native`)" if native._installed
                else f"native PHM kernel: on ({native.ENV_VAR}={value})")
    return (f"native PHM kernel: off ({native.ENV_VAR}={value})" if value
            else "native PHM kernel: off (not installed; `hyperplex native` installs it, --native turns it on)")


def machine_line(device: torch.device, dtype_name: str) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "")
        cpu = f"{cpu} ({model})" if model else cpu
    except OSError:
        pass
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {os.cpu_count()} logical cores"
    return (f"machine: {cpu}; torch {torch.__version__}; threads {torch.get_num_threads()}; "
            f"device {device} ({dev}); dtype {dtype_name}")


def _fmt_ratio(m: Measurement | None) -> str:
    if m is None:
        return "-"
    if m.skipped:
        return "skip"
    return f"{m.ratio:.0f}" if m.ratio >= 100 else f"{m.ratio:.2f}"


def _fmt_ms(m: Measurement | None) -> str:
    if m is None or m.skipped or math.isnan(m.ms):
        return "skip"
    return f"{m.ms:.3g}"


def _fmt_mib(m: Measurement | None) -> str:
    if m is None or m.skipped or math.isnan(m.peak_mib):
        return "skip"
    return f"{m.peak_mib:.1f}"


def print_table(results: dict, cold: bool = False) -> None:
    """Markdown table of ``results[(d, n, rows)][phase][variant]``; the cold table has a ``layers``
    column and no memory columns (a stack's memory per layer is the warm one)."""
    head = ["d=k", "n", "rows"] + (["layers"] if cold else []) + [
        "dense fwd ms", "str fwd", "pre fwd", "dnn fwd", "cached fwd", "auto fwd", "kron fwd",
        "dense f+b ms", "str f+b", "mat f+b", "auto f+b", "kron f+b", "auto path (inf / train)"]
    head += [] if cold else ["MiB dense", "MiB auto", "MiB kron"]
    path_col = head.index("auto path (inf / train)")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---:" if i != path_col else ":---" for i in range(len(head))) + "|")
    for (d, n, rows), phases in results.items():
        inf, trn = phases.get("infer", {}), phases.get("train", {})
        cells = [str(d), str(n), str(rows)]
        if cold:
            cells += [str(next(iter((inf or trn).values())).layers)]
        cells += [_fmt_ms(inf.get("dense")) if inf else "-"]
        cells += [_fmt_ratio(inf.get(v)) for v in (*MODES, "auto", "kron")]
        cells += [_fmt_ms(trn.get("dense")) if trn else "-"]
        cells += [_fmt_ratio(trn.get(v)) for v in ("structured", "materialized", "auto", "kron")]
        paths = [("-" if p not in phases else "skip" if phases[p]["auto"].skipped else phases[p]["auto"].path)
                 for p in PHASES]
        cells += [" / ".join(paths)]
        if not cold:
            cells += [_fmt_mib(trn.get(v)) if trn else "-" for v in ("dense", "auto", "kron")]
        print("| " + " | ".join(cells) + " |")


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def print_targets(results: dict, sizes: list[int], ns: list[int], rows_grid: list[int]) -> None:
    print("\ntargets")

    def ratio(d, n, rows, phase, variant):
        m = results.get((d, n, rows), {}).get(phase, {}).get(variant)
        return None if m is None or m.skipped or math.isnan(m.ratio) else m.ratio

    big = 4096
    if big not in sizes:
        print(f"  (d=k={big} not in the grid: the d=k={big} targets are not evaluated)")
    else:
        limits = {2: 0.60, 4: 0.35, 8: 0.20, 16: 0.15}
        if 1 in rows_grid:
            for n, lim in limits.items():
                if n in ns:
                    r = ratio(big, n, 1, "infer", "auto")
                    text = "n/a (skipped)" if r is None else f"{_verdict(r <= lim)}  {r:.3f}x"
                    print(f"  d=k={big}, 1 row, inference fwd, auto <= {lim:.2f}x dense, n={n}: {text}")
            for n in ns:
                a, kr = ratio(big, n, 1, "infer", "auto"), ratio(big, n, 1, "infer", "kron")
                text = "n/a (skipped)" if a is None or kr is None else f"{_verdict(kr / a >= 10)}  {kr / a:.1f}x faster"
                print(f"  d=k={big}, 1 row, inference fwd, auto >= 10x faster than kron, n={n}: {text}")
        else:
            print("  (rows=1 not in the grid: the 1-row targets are not evaluated)")
        big_rows = [r for r in rows_grid if r >= 1024]
        if big_rows:
            rows = 4096 if 4096 in big_rows else max(big_rows)
            note = "" if rows == 4096 else (f" (rows=4096 not in grid, evaluated at rows={rows}: stricter, the fixed "
                                            f"cost of forming H weighs {4096 / rows:g}x more)")
            for n in ns:
                r = ratio(big, n, rows, "train", "auto")
                text = "n/a (skipped)" if r is None else f"{_verdict(r <= 1.08)}  {r:.3f}x"
                print(f"  d=k={big}, {rows} rows, training fwd+bwd, auto <= 1.08x dense, n={n}: {text}{note}")
        else:
            print("  (no rows >= 1024 in the grid: the 4096-row training target is not evaluated)")
    print_auto_check(results)


#: The column that times each path ``auto`` can take (inference's materialised column keeps its ``H``, as
#: ``cached`` does; in training it forms ``H`` per call, as ``auto``'s materialised path does).
PATH_COLUMNS = {"structured": "structured", "premixed": "premixed", "onednn": "onednn",
                "materialized": "materialized", "cached": "materialized"}


#: The deploy issue's targets for the cold stack at d = k = 4096, one row, inference: ``auto`` ×dense per n.
COLD_ONE_ROW_TARGETS = {2: 0.60, 4: 0.30, 8: 0.16, 16: 0.12}


def print_cold_targets(results: dict) -> None:
    """PASS/MISS of the cold one-row targets at d = k = 4096 (:data:`COLD_ONE_ROW_TARGETS`), with the path
    ``auto`` took, for every ``n`` of the grid that has them; a line saying why where the grid has none."""
    points = [(n, results[(4096, n, 1)]["infer"]["auto"]) for n in COLD_ONE_ROW_TARGETS
              if "infer" in results.get((4096, n, 1), {})]
    if not points:
        print("  (d=k=4096, 1 row, inference not in the cold grid: its targets are not evaluated)")
    for n, m in points:
        limit = COLD_ONE_ROW_TARGETS[n]
        text = "n/a (skipped)" if m.skipped or math.isnan(m.ratio) else f"{_verdict(m.ratio <= limit)}  {m.ratio:.3f}x"
        print(f"  d=k=4096, 1 row, inference fwd, auto <= {limit:.2f}x dense, n={n}: {text} ({m.path})")


def print_auto_check(results: dict, where: str = "every grid point") -> None:
    """PASS/MISS of ``auto <= 1.10 x min(str, mat)`` at every point of ``results``, per phase; then
    whether auto's *choice* is right: the time of the path it takes (the column of that path) within 1.10x
    of the fastest other path it could have taken (``str``, ``pre``, ``dnn``; ``mat`` in training, or where
    auto itself keeps ``H``). The second check is immune to the noise between two timings of the same path
    (auto and the column of its path run the same code)."""

    def ratio(d, n, rows, phase, variant):
        m = results.get((d, n, rows), {}).get(phase, {}).get(variant)
        return None if m is None or m.skipped or math.isnan(m.ratio) else m.ratio

    for phase, label in (("infer", "inference fwd"), ("train", "training fwd+bwd")):
        worst, checked, misses = None, 0, []
        for (d, n, rows) in results:
            a = ratio(d, n, rows, phase, "auto")
            best = [r for r in (ratio(d, n, rows, phase, "structured"), ratio(d, n, rows, phase, "materialized"))
                    if r is not None]
            if a is None or not best:
                continue
            q = a / min(best)
            checked += 1
            if worst is None or q > worst[0]:
                worst = (q, d, n, rows)
            if q > 1.10:
                misses.append(f"    MISS  d=k={d}, n={n}, rows={rows}: auto = {q:.3f}x min(str, mat)")
        if worst is None:
            print(f"  {where}, {label}, auto <= 1.10x min(str, mat): n/a")
            continue
        q, d, n, rows = worst
        print(f"  {where}, {label}, auto <= 1.10x min(str, mat): {_verdict(not misses)}  "
              f"{checked - len(misses)}/{checked} within; worst {q:.3f}x at d=k={d}, n={n}, rows={rows}")
        for line in misses:
            print(line)
        wrong = []
        for (d, n, rows), phases in results.items():
            m = phases.get(phase, {}).get("auto")
            if m is None or m.skipped or m.path not in PATH_COLUMNS:
                continue
            own = PATH_COLUMNS[m.path]
            # In inference the materialised column keeps its H (cached), which auto has only with cache_dense:
            # an uncached auto's materialised path forms H per call and is timed by the auto column alone, and
            # the cached column is no alternative to the paths that never form H.
            took = ratio(d, n, rows, phase, "auto" if phase == "infer" and m.path == "materialized" else own)
            rivals = [c for c in ("structured", "premixed", "onednn") if c != own]
            if phase == "train" or m.path == "cached":
                rivals.append("materialized")
            timed = {c: r for c in rivals if (r := ratio(d, n, rows, phase, c)) is not None}
            if took is not None and timed:
                best = min(timed, key=timed.get)
                if took > 1.10 * timed[best]:
                    wrong.append(f"    MISS  d=k={d}, n={n}, rows={rows}: auto took {m.path}, "
                                 f"{took / timed[best]:.3f}x {best}")
        print(f"  {where}, {label}, auto's path within 1.10x of the faster path: {_verdict(not wrong)}  "
              f"{checked - len(wrong)}/{checked} right")
        for line in wrong:
            print(line)


def write_csv(path: str, records: list[Measurement]) -> None:
    """One row per (shape, phase, variant); times in ms (``ms`` is the chosen statistic), NaN as empty."""
    cols = ["mode", "layers", "d", "k", "n", "rows", "phase", "variant", "path", "ms", "ratio", "dense_ms",
            "calls_per_block", "n_samples", "peak_mib", "skipped"]

    def num(v: float) -> str:
        return "" if math.isnan(v) else f"{v:.6g}"

    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for m in records:
            w.writerow([m.mode, m.layers, m.d, m.k, m.n, m.rows, m.phase, m.variant, m.path, num(m.ms), num(m.ratio), num(m.dense_ms),
                        m.calls_per_block, len(m.samples_ms), num(m.peak_mib), m.skipped])


# ----------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Time PHMLinear (structured / materialized / auto) and the broadcast-Kronecker PHM layer of "
                    "public code against nn.Linear, in inference (forward) and training (forward+backward); "
                    "print a markdown table of ratios to nn.Linear, training peak memory, and a targets check.",
        epilog="The docstring at the top of this file explains the method, every column and the memory measure.")
    p.add_argument("--quick", action="store_true",
                   help=f"reduced grid and repetitions, a few minutes on 2 CPU cores: sizes {QUICK['sizes']}, "
                        f"ns {QUICK['ns']}, rows {QUICK['rows']}, repeats {QUICK['repeats']}, "
                        f"min-repeats {QUICK['min_repeats']}, block-ms {QUICK['block_ms']:g}, "
                        f"budget-s {QUICK['budget_s']:g}; cold: sizes {QUICK['cold_sizes']}, rows "
                        f"{QUICK['cold_rows']}, phases {QUICK['cold_phases']}; explicit flags override these")
    p.add_argument("--sizes", type=int, nargs="+", metavar="D", help=f"layer sizes d = k (default {FULL['sizes']})")
    p.add_argument("--ns", type=int, nargs="+", metavar="N",
                   help=f"numbers of Kronecker terms n; each must divide d (default {FULL['ns']})")
    p.add_argument("--rows", type=int, nargs="+", metavar="R", help=f"rows of the input x (default {FULL['rows']})")
    p.add_argument("--repeats", type=int, help=f"interleaved timing rounds (default {FULL['repeats']})")
    p.add_argument("--min-repeats", type=int, help="fewest rounds when --budget-s cuts --repeats "
                                                    f"(default {FULL['min_repeats']})")
    p.add_argument("--block-ms", type=float, help="target length of one timed block of back-to-back calls, ms "
                                                   f"(default {FULL['block_ms']:g})")
    p.add_argument("--budget-s", type=float, help="target seconds of timing rounds per shape and phase "
                                                   f"(default {FULL['budget_s']:g})")
    p.add_argument("--stat", choices=["median", "min"], default="median",
                   help="statistic over rounds: median (ratio = median of the per-round ratios to dense) "
                        "or min (ratio of the minima) (default median)")
    p.add_argument("--clock", choices=list(CLOCKS), default="wall",
                   help="wall: time.perf_counter; cpu: time.process_time, the CPU time of this process, immune to "
                        "time-slicing by other processes but meaningful only on CPU with --threads 1 (default wall)")
    p.add_argument("--no-mmap", action="store_true",
                   help="CPU/glibc: stop malloc from mmap-ing large blocks (mallopt), so tensors over 32 MiB "
                        "reuse freed memory instead of being page-faulted on every call (see the docstring)")
    p.add_argument("--mem-limit-gib", type=float, default=4.0,
                   help="skip a layer/shape whose estimated memory beyond the parameters exceeds this (default 4)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu",
                   help="default cuda if available, else cpu")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32", help="default float32")
    p.add_argument("--threads", type=int, metavar="N", help="torch.set_num_threads(N) (default: torch's choice)")
    p.add_argument("--native", action="store_true",
                   help="build hyperplex's compiled PHM kernel first (hyperplex.layers.native, about a minute the first "
                        "time), so that `auto` takes its streamed path in inference at few rows on large weights")
    p.add_argument("--mode", choices=["both", "warm", "cold"], default="both",
                   help="warm: one layer called again and again (its weights may stay in cache); cold: a stack of "
                        "distinct layers called in sequence, whose weights overflow the last-level cache as a "
                        "model's do; both: warm table then cold table (default both)")
    p.add_argument("--phases", nargs="+", choices=list(PHASES), default=list(PHASES),
                   help="phases of the warm table (default infer train)")
    p.add_argument("--cold-sizes", type=int, nargs="+", metavar="D",
                   help=f"layer sizes of the cold table (default {FULL['cold_sizes']}; --quick {QUICK['cold_sizes']})")
    p.add_argument("--cold-rows", type=int, nargs="+", metavar="R",
                   help=f"rows of the cold table (default {FULL['cold_rows']}; --quick {QUICK['cold_rows']}); "
                        "many rows are compute-bound and gain nothing from a cache")
    p.add_argument("--cold-phases", nargs="+", choices=list(PHASES),
                   help=f"phases of the cold table (default {FULL['cold_phases']}; --quick {QUICK['cold_phases']})")
    p.add_argument("--cold-kron", action="store_true",
                   help="also time the kron layer in the cold stack (off by default: it forms an n*k*d "
                        "intermediate on every call, far beyond any cache either way, and costs minutes)")
    p.add_argument("--stack-layers", type=int, metavar="L",
                   help="layers in the cold stack (default: the smallest L whose PHM weights at the largest n "
                        "are --cold-factor times the last-level cache, capped by --mem-limit-gib)")
    p.add_argument("--cold-factor", type=float, default=2.0,
                   help="cold stack: PHM weights at the largest n / last-level cache (default 2)")
    p.add_argument("--llc-mib", type=float, metavar="MIB",
                   help="last-level cache size in MiB (default: read from /sys/devices/system/cpu/cpu0/cache, "
                        f"else lscpu, else {FALLBACK_LLC_MIB})")
    p.add_argument("--seed", type=int, default=0, help="seed for the layer parameters (default 0)")
    p.add_argument("--csv", metavar="PATH", help="also write every measurement (absolute ms included) as CSV")
    p.add_argument("--json", metavar="PATH", help="also write metadata and every measurement (with all samples) "
                                                  "as JSON")
    args = p.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.min_repeats > args.repeats:
        args.min_repeats = args.repeats
    if min(args.sizes + args.ns + args.rows + args.cold_sizes + args.cold_rows) < 1 or args.repeats < 1:
        p.error("--sizes, --cold-sizes, --ns, --rows, --cold-rows and --repeats must be positive")
    if (args.stack_layers is not None and args.stack_layers < 1) or args.cold_factor <= 0 \
            or (args.llc_mib is not None and args.llc_mib <= 0):
        p.error("--stack-layers, --cold-factor and --llc-mib must be positive")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.native:
        from hyperplex.layers.native import enable_native_kernels

        enable_native_kernels()
    native_state = native_line(args.native)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    if args.clock == "cpu" and device.type == "cuda":
        raise SystemExit("--clock cpu measures host CPU time; use --clock wall with --device cuda")
    malloc = "glibc default"
    if args.no_mmap and device.type == "cpu":
        malloc = "no mmap (mallopt)" if disable_malloc_mmap() else "glibc default (--no-mmap failed)"
    started, stamp = time.perf_counter(), _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    load_before = busy_cores_elsewhere() if device.type == "cpu" else None
    script = os.path.relpath(sys.argv[0]) if argv is None else "benchmarks/bench_phm.py"
    command = " ".join(["python", *(shlex.quote(a) for a in [script, *(sys.argv[1:] if argv is None else argv)])])

    verify_kron(sorted(set(args.ns)))
    print("kron re-implementation matches PHMLinear (outputs and gradients, float64): ok", file=sys.stderr)

    records: list[Measurement] = []
    skipped_shapes: list[str] = []

    def divides(d: int, n: int) -> bool:
        if d % n:
            skipped_shapes.append(f"d=k={d}, n={n}: n does not divide d")
            print(f"skip d=k={d} n={n}: n does not divide d", file=sys.stderr)
        return d % n == 0

    def run_grid(build, sizes, rows_grid, phases, label):
        """``results[(d, n, rows)][phase][variant]`` for layers from ``build(d, n)``."""
        results: dict[tuple[int, int, int], dict[str, dict[str, Measurement]]] = {}
        configs = [(d, n) for d in sizes for n in args.ns if divides(d, n)]
        for i, (d, n) in enumerate(configs, 1):
            torch.manual_seed(args.seed)
            layers = build(d, n)
            for rows in rows_grid:
                t0 = time.perf_counter()
                entry = results.setdefault((d, n, rows), {})
                for phase in phases:
                    entry[phase] = measure_config(layers, d, d, n, rows, phase, args, device, dtype)
                    records.extend(entry[phase].values())
                print(f"{label} [{i}/{len(configs)}] d=k={d} n={n} rows={rows}: {time.perf_counter() - t0:.1f} s "
                      f"(total {time.perf_counter() - started:.0f} s)", file=sys.stderr)
            del layers
        return results

    warm = cold = None
    if args.mode in ("both", "warm"):
        warm = run_grid(lambda d, n: build_layers(d, d, n, device, dtype), args.sizes, args.rows, args.phases, "warm")
    llc, llc_source = (int(args.llc_mib * MiB), "--llc-mib") if args.llc_mib else last_level_cache()
    itemsize = torch.empty((), dtype=dtype).element_size()
    depths = {d: stack_depth(d, d, args.ns, itemsize, llc, args) for d in args.cold_sizes}
    if args.mode in ("both", "cold"):
        dense_stacks: dict[int, list[nn.Module]] = {}  # per d, shared by every n

        def cold_stack(d: int, n: int) -> dict[str, list[nn.Module]]:
            if d not in dense_stacks:  # a new size: drop the previous one's dense stack first
                dense_stacks.clear()
            stacks = build_stack(d, d, n, depths[d][0], device, dtype, args.cold_kron, dense_stacks.get(d))
            dense_stacks[d] = stacks["dense"]
            return stacks

        cold = run_grid(cold_stack, args.cold_sizes, args.cold_rows, args.cold_phases, "cold")

    print(f"# PHMLinear benchmark — {stamp}")
    print(machine_line(device, args.dtype) + f"; clock {args.clock}, statistic {args.stat}"
          + (f"; malloc {malloc}" if device.type == "cpu" else ""))
    print(native_state)
    load_after = busy_cores_elsewhere() if load_before is not None else None
    if load_before is not None:
        print(f"other processes kept {load_before:.1f} (start) / {load_after:.1f} (end) of {os.cpu_count()} "
              f"cores busy" + (" -- contended machine, timings are noisy" if max(load_before, load_after or 0) > 0.3
                               else ""))
    print(f"command: {command}")
    print("ratios are time / nn.Linear time on the same input (below 1 = faster); fwd = inference forward, "
          "f+b = training forward+backward; ms are per layer; MiB = peak extra memory of one training step")
    for line in skipped_shapes:
        print(f"skip: {line}")
    if warm is not None:
        print("\n## warm: one layer called again and again (weights that fit stay in cache between calls)\n")
        print_table(warm)
        for m in records:
            if m.skipped and m.mode == "warm" and m.skipped != INFERENCE_ONLY_SKIP:
                print(f"skip: {m.variant} {m.phase} d=k={m.d} n={m.n} rows={m.rows}: {m.skipped}")
        print_targets(warm, args.sizes, args.ns, args.rows)
    if cold is not None:
        print(f"\n## cold: a stack of distinct layers called in sequence (last-level cache {llc / MiB:g} MiB, "
              f"{llc_source})\n")
        for d, (depth, note) in depths.items():
            print(f"d=k={d}: {depth} layers = {depth * d * d * itemsize / MiB:g} MiB of dense weights, "
                  + ", ".join(f"{depth * d * d // n * itemsize / MiB:g}" for n in args.ns)
                  + f" MiB of PHM weights for n = {', '.join(map(str, args.ns))}" + (f"; {note}" if note else ""))
        print()
        print_table(cold, cold=True)
        for m in records:
            if m.skipped and m.mode == "cold" and m.skipped != INFERENCE_ONLY_SKIP:
                print(f"skip: {m.variant} {m.phase} d=k={m.d} n={m.n} rows={m.rows}: {m.skipped}")
        print("\ntargets (cold)")
        print_cold_targets(cold)
        print_auto_check(cold, "every cold point")
    print(f"\nwall time {time.perf_counter() - started:.0f} s")

    if args.csv:
        write_csv(args.csv, records)
    if args.json:
        meta = {"date": stamp, "command": command, "machine": machine_line(device, args.dtype), "args": vars(args),
                "llc_bytes": llc, "llc_source": llc_source, "stack_layers": {d: v[0] for d, v in depths.items()},
                "busy_cores_elsewhere": [load_before, load_after],
                "malloc": malloc, "native": native_state, "wall_s": time.perf_counter() - started}
        with open(args.json, "w") as fh:
            rows = [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(m).items()}
                    for m in records]  # NaN is not JSON
            json.dump({"meta": meta, "measurements": rows}, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
