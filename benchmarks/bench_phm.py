#!/usr/bin/env python
"""Speed and memory of ``PHMLinear`` against ``nn.Linear`` and the usual broadcast-Kronecker PHM layer.

Usage (from the repository root)::

    PYTHONPATH=src python benchmarks/bench_phm.py --quick             # reduced grid, warm and cold, ~4 min on 2 cores
    PYTHONPATH=src python benchmarks/bench_phm.py                        # full grid (warm, then cold)
    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_phm.py --threads 1 --clock cpu --mode cold
    PYTHONPATH=src python benchmarks/bench_phm.py --sizes 4096 --ns 4 --rows 1 64 --csv phm.csv
    PYTHONPATH=src python benchmarks/bench_phm.py --mode cold --cold-phases infer --cold-sizes 4096 --cold-rows 1 \
        --native                                                         # auto with the compiled streamed kernel
    PYTHONPATH=src python benchmarks/bench_phm.py --device cuda --dtype bfloat16 --sizes 4096 --rows 1 64 --out g.json

For every ``d = k`` in ``--sizes``, ``n`` in ``--ns`` and ``rows`` in ``--rows`` the script times
seven layers on the same input ``x`` of shape ``(rows, d)``:

- ``dense``: ``nn.Linear(d, k)``, the baseline every other number is divided by;
- ``str``: ``PHMLinear(..., forward_mode="structured")`` (never forms ``H``);
- ``pre``: ``PHMLinear(..., forward_mode="premixed")`` (never forms ``H``; inputs mixed by the rule first), and
  ``dnn``: ``PHMLinear(..., forward_mode="onednn")`` (the structured product on PyTorch's oneDNN linear), both
  timed in inference only (``dnn`` shows ``skip`` where this PyTorch has no usable oneDNN linear);
- ``mat``: ``PHMLinear(..., forward_mode="materialized", cache_dense=True)`` (forms ``H``, one dense matmul).
  With no gradient needed (inference) it reuses the kept ``H``, so its inference column is headed ``cached``;
- ``auto``: ``PHMLinear(..., forward_mode="auto")`` — what a user gets by default (no ``H`` kept; with
  ``--native``, the compiled streamed kernel of ``hyperplex.layers.native`` where it applies);
- ``kron``: :class:`BroadcastKronPHM`, a re-implementation of the PHM layer found in public code
  (Compacter / AdapterHub / PHC-GNN / HyperNets), which rebuilds ``H`` on every forward with a
  broadcast Kronecker product (an ``n·k·d`` intermediate) and then calls ``F.linear``; checked to give
  ``PHMLinear``'s outputs and gradients at start-up.

Phases: ``fwd`` — one forward under ``torch.inference_mode()``; ``f+b`` — one training step (gradients set to
``None``, forward with ``x.requires_grad_()``, ``out.backward(g)``, no optimiser step).

Columns (ratios are time / dense time, below 1 is faster): ``dense fwd ms`` / ``dense f+b ms``, the baseline per
layer; ``str``, ``pre``, ``dnn``, ``cached``, ``auto``, ``kron`` ``fwd`` and ``str``, ``mat``, ``auto``, ``kron``
``f+b``, × dense; ``auto path``, ``layer.choose_mode(rows)`` in inference / in training; ``MiB dense``, ``MiB
auto``, ``MiB kron``, the peak memory of one training step above the level before it.

The warm table (``--mode warm``) calls one layer again and again; the cold table (``--mode cold``) times a stack of
distinct layers whose weights are ``--cold-factor`` times the last-level cache, per layer, as a model's decoder
step meets them. Timing (blocks of back-to-back calls, interleaved rounds, medians or minima, the ``--budget-s``
cut), the memory measure, the cold stack and the caveats (a loaded machine, glibc's ``mmap`` of large blocks and
``--no-mmap``) are described in ``benchmarks/README.md``. After each table a ``targets`` section reports PASS/MISS
for the project's performance targets (:func:`warm_targets`, :func:`cold_targets`, :func:`auto_checks`); a MISS is
a measurement, not an error. ``--csv`` / ``--out`` additionally write every raw number.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyperplex.layers import triton_phm
from hyperplex.layers.functional import onednn_available
from hyperplex.layers.phm import ForwardMode, PHMLinear

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the harness, run as a script or loaded by path
import harness  # noqa: E402
from harness import MiB  # noqa: E402

#: The fixed-path PHMLinear layers, sharing the parameters of the ``auto`` one.
MODES: tuple[ForwardMode, ...] = ("structured", "premixed", "onednn", "materialized")
VARIANTS = ("dense", *MODES, "auto", "kron")
#: Paths timed in inference only: oneDNN's has no backward pass, and the training table keeps to the two paths
#: ``auto`` chooses between when training.
INFERENCE_ONLY = ("premixed", "onednn")
INFERENCE_ONLY_SKIP = "timed in inference only"  # by design: not listed under the table
PHASES = ("infer", "train")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

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
        layers: dict[str, Any] = {"kron": BroadcastKronPHM(ref)}
        modes: tuple[ForwardMode, ...] = ("structured", "materialized", "auto")
        for mode in modes:
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
                    torch.testing.assert_close(got, want, msg=_prefixed(f"kron vs {name}, n={n}"))


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
        "triton": rows * k * 4,  # float32 partials of at most a few output tiles per row (inference only)
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
    """Time (and for training, profile memory of) every variant on one shape, interleaved (``harness.interleave``).

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
    calls = {}
    for name, stack in stacks.items():
        m = out[name] = Measurement(d, k, n, rows, phase, name, layers=len(stack),
                                    mode="warm" if len(stack) == 1 else "cold")
        for each in stack:
            each.train(train)
        m.skipped = skip_reason(name, stack[0], m, args, dtype, ctx)
        if not m.skipped:
            calls[name] = step_of(stack, x, g, train)
    if out["dense"].skipped:  # no baseline, nothing to compare
        for m in out.values():
            m.skipped = m.skipped or "baseline skipped"
        return out

    clock = harness.CLOCKS[args.clock]
    number, round_s = {}, 0.0
    with ctx():
        for name, call in calls.items():  # memory (training, one layer) from the warm-up call, then calibration
            if train and len(stacks[name]) == 1:
                out[name].peak_mib = harness.peak_bytes(call, device) / MiB
            number[name], once = harness.calls_per_block(call, args.block_ms / 1e3, device, clock)
            out[name].calls_per_block = number[name]
            round_s += once * number[name]
    repeats = max(args.min_repeats, min(args.repeats, int(args.budget_s / max(round_s, 1e-9))))
    timings = harness.interleave(calls, repeats, device=device, number=number, warmup=0, clock=clock, context=ctx)
    for stack in stacks.values():  # free gradients before the next shape
        for each in stack:
            each.zero_grad(set_to_none=True)
    failed = triton_phm.kernel_failed()  # set at this point's first call: auto then timed PyTorch's paths
    for m in out.values():
        if m.path == "triton" and failed:
            m.skipped = f"the fused Triton kernel failed ({failed}); auto fell back to PyTorch's paths"

    dense = [1e3 * t / out["dense"].layers for t in timings.samples["dense"]]
    for name, samples in timings.samples.items():
        m = out[name]
        m.samples_ms = [1e3 * t / m.layers for t in samples]  # per layer
    for m in out.values():
        m.dense_ms = min(dense) if args.stat == "min" else statistics.median(dense)
        if m.samples_ms:
            m.ms = min(m.samples_ms) if args.stat == "min" else statistics.median(m.samples_ms)
            # median: of the ratios paired by round, so drift between rounds cancels
            m.ratio = m.ms / m.dense_ms if args.stat == "min" else harness.paired_ratio(m.samples_ms, dense)
    return out


def skip_reason(name: str, layer: nn.Module, m: Measurement, args, dtype: torch.dtype, ctx) -> str:
    """Why ``name`` is not timed at this point ("" when it is); sets ``m.path``, the path the layer takes."""
    if m.phase == "train" and name in INFERENCE_ONLY:
        return INFERENCE_ONLY_SKIP
    device = next(layer.parameters()).device
    on_cpu = device.type == "cpu"
    if name == "onednn" and not on_cpu:
        return "oneDNN's path runs on the CPU only"
    if name == "onednn" and not onednn_available():
        return "this PyTorch has no usable oneDNN linear"
    if isinstance(layer, PHMLinear):
        with ctx():
            probe = torch.empty(m.rows, m.d, device=device, dtype=dtype)
            # the path forward() takes: on CUDA the fused kernel comes before choose_mode (PHMLinear.forward)
            m.path = "triton" if triton_phm.takes_triton(probe, layer) else layer.choose_mode(m.rows)
    else:
        m.path = name
    itemsize = torch.empty((), dtype=dtype).element_size()
    est = estimate_bytes("materialized" if m.path == "cached" else m.path, m.phase, m.d, m.k, m.n, m.rows, itemsize)
    if est > args.mem_limit_gib * 2**30:
        return f"estimated {est / 2**30:.1f} GiB > --mem-limit-gib {args.mem_limit_gib:g}"
    return ""


def step_of(stack: list[nn.Module], x: Tensor, g: Tensor, train: bool):
    """One timed call: a pass of ``x (rows, d)`` through the stack (inference), or forward and ``backward(g)``
    through each layer with the gradients cleared first (training)."""
    tensors = (x, *(p for each in stack for p in each.parameters()))

    def train_step():
        for t in tensors:
            t.grad = None
        for each in stack:
            each(x).backward(g)
            if len(stack) > 1:  # free this layer's gradients now: one layer's worth alive, as in warm
                each.zero_grad(set_to_none=True)
                x.grad = None

    def infer():
        for each in stack:
            each(x)
    return train_step if train else infer


def _prefixed(where: str) -> Callable[[str], str]:
    """An ``assert_close`` message: torch's own, after ``where``."""
    return lambda message: f"{where}: {message}"


def build_layers(d: int, k: int, n: int, device: torch.device, dtype: torch.dtype) -> dict[str, nn.Module]:
    """Dense baseline, the PHMLinear layers of :data:`MODES` and ``auto`` sharing one set of parameters, and the
    kron layer."""
    auto = PHMLinear(d, k, n, device=device, dtype=dtype)
    layers: dict[str, nn.Module] = {"dense": nn.Linear(d, k, device=device, dtype=dtype)}
    for mode in MODES:
        layers[mode] = PHMLinear(d, k, n, device=device, dtype=dtype, forward_mode=mode,
                                 cache_dense=mode == "materialized")
        layers[mode].load_state_dict(auto.state_dict())
    layers["auto"] = auto
    layers["kron"] = BroadcastKronPHM(auto)
    return {name: layers[name] for name in VARIANTS}


# ----------------------------------------------------------------------------- the cold-cache stack
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
            for name in ("phm_rule", "phm_weight", "bias"):  # Module.__setattr__ registers the shared tensors
                setattr(view, name, getattr(src, name))
            stacks[mode].append(view)
    stacks["auto"] = list(autos)
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


def _ratio(results: dict, d: int, n: int, rows: int, phase: str, variant: str) -> float | None:
    m = results.get((d, n, rows), {}).get(phase, {}).get(variant)
    return None if m is None or m.skipped or math.isnan(m.ratio) else m.ratio


def check(target: str, value: float | None, ok: bool | None, detail: str = "") -> dict:
    """One line of a targets section: ``verdict`` PASS, MISS or n/a (``value`` None: skipped or not in the grid)."""
    verdict = "n/a" if value is None or ok is None else _verdict(ok)
    return {"target": target, "value": value, "verdict": verdict, "detail": detail}


#: The warm table's targets at d = k = 4096, one row, inference: ``auto`` ×dense per n.
WARM_ONE_ROW_TARGETS = {2: 0.60, 4: 0.35, 8: 0.20, 16: 0.15}


def warm_targets(results: dict, sizes: list[int], ns: list[int], rows_grid: list[int]) -> list[dict]:
    """The warm table's targets (:data:`WARM_ONE_ROW_TARGETS`; ≥ 10× faster than kron at one row; training ``auto``
    ≤ 1.08× dense at 4096 rows, or the most rows ≥ 1024 of the grid), as :func:`check` records."""
    big, checks = 4096, []
    if big not in sizes:
        return [check(f"d=k={big} targets (d=k={big} not in the grid)", None, None)]
    if 1 not in rows_grid:
        checks.append(check("1-row targets (rows=1 not in the grid)", None, None))
    else:
        for n, limit in WARM_ONE_ROW_TARGETS.items():
            if n in ns:
                r = _ratio(results, big, n, 1, "infer", "auto")
                checks.append(check(f"d=k={big}, 1 row, inference fwd, auto <= {limit:.2f}x dense, n={n}", r,
                                    r is not None and r <= limit))
        for n in ns:
            a, kr = _ratio(results, big, n, 1, "infer", "auto"), _ratio(results, big, n, 1, "infer", "kron")
            speedup = None if a is None or kr is None else kr / a
            checks.append(check(f"d=k={big}, 1 row, inference fwd, auto >= 10x faster than kron, n={n}", speedup,
                                speedup is not None and speedup >= 10))
    big_rows = [r for r in rows_grid if r >= 1024]
    if not big_rows:
        return checks + [check("4096-row training target (no rows >= 1024 in the grid)", None, None)]
    rows = 4096 if 4096 in big_rows else max(big_rows)
    note = "" if rows == 4096 else f"rows=4096 not in the grid; at {rows} rows it is stricter"
    for n in ns:
        r = _ratio(results, big, n, rows, "train", "auto")
        checks.append(check(f"d=k={big}, {rows} rows, training fwd+bwd, auto <= 1.08x dense, n={n}", r,
                            r is not None and r <= 1.08, note))
    return checks


#: The column that times each path ``auto`` can take (inference's materialised column keeps its ``H``, as
#: ``cached`` does; in training it forms ``H`` per call, as ``auto``'s materialised path does). The fused CUDA
#: kernel has no fixed-path layer: ``auto``'s own column times it.
PATH_COLUMNS = {"structured": "structured", "premixed": "premixed", "onednn": "onednn",
                "materialized": "materialized", "cached": "materialized", "triton": "auto"}


#: The deploy issue's targets for the cold stack at d = k = 4096, one row, inference: ``auto`` ×dense per n.
COLD_ONE_ROW_TARGETS = {2: 0.60, 4: 0.30, 8: 0.16, 16: 0.12}


def cold_targets(results: dict) -> list[dict]:
    """The cold one-row targets at d = k = 4096 (:data:`COLD_ONE_ROW_TARGETS`) for every ``n`` of the grid that has
    them, the path ``auto`` took in ``detail``; one n/a record where the grid has none."""
    points = [(n, results[(4096, n, 1)]["infer"]["auto"]) for n in COLD_ONE_ROW_TARGETS
              if "infer" in results.get((4096, n, 1), {})]
    if not points:
        return [check("d=k=4096, 1 row, inference (not in the cold grid)", None, None)]
    return [check(f"d=k=4096, 1 row, inference fwd, auto <= {COLD_ONE_ROW_TARGETS[n]:.2f}x dense, n={n}",
                  None if m.skipped or math.isnan(m.ratio) else m.ratio,
                  not m.skipped and m.ratio <= COLD_ONE_ROW_TARGETS[n], m.path) for n, m in points]


def auto_checks(results: dict, where: str = "every grid point") -> list[dict]:
    """Per phase, two records: ``auto <= 1.10 x min(str, mat)`` at every point (value: the worst quotient), and
    whether auto's *choice* is right — the time of the path it takes within 1.10x of the fastest other path it could
    have taken (value: the share of points right; immune to the noise between two timings of one path). Each
    record's ``misses`` lists the points that failed."""
    checks = []
    for phase, label in (("infer", "inference fwd"), ("train", "training fwd+bwd")):
        quotients = {}
        for (d, n, rows) in results:
            a = _ratio(results, d, n, rows, phase, "auto")
            best = [r for r in (_ratio(results, d, n, rows, phase, v) for v in ("structured", "materialized"))
                    if r is not None]
            if a is not None and best:
                quotients[(d, n, rows)] = a / min(best)
        if not quotients:
            checks.append(check(f"{where}, {label}, auto <= 1.10x min(str, mat)", None, None))
            continue
        worst = max(quotients, key=lambda point: quotients[point])
        misses = [f"d=k={d}, n={n}, rows={rows}: auto = {q:.3f}x min(str, mat)"
                  for (d, n, rows), q in quotients.items() if q > 1.10]
        checks.append({**check(f"{where}, {label}, auto <= 1.10x min(str, mat)", quotients[worst], not misses,
                               f"{len(quotients) - len(misses)}/{len(quotients)} within; worst at "
                               "d=k={}, n={}, rows={}".format(*worst)), "misses": misses})
        wrong = wrong_choices(results, phase)
        checks.append({**check(f"{where}, {label}, auto's path within 1.10x of the faster path",
                               (len(quotients) - len(wrong)) / len(quotients), not wrong,
                               f"{len(quotients) - len(wrong)}/{len(quotients)} right"), "misses": wrong})
    return checks


def wrong_choices(results: dict, phase: str) -> list[str]:
    """The points where the path ``auto`` took is over 1.10x the fastest other path it could have taken."""
    wrong = []
    for (d, n, rows), phases in results.items():
        m = phases.get(phase, {}).get("auto")
        if m is None or m.skipped or m.path not in PATH_COLUMNS:
            continue
        own = PATH_COLUMNS[m.path]
        # In inference the materialised column keeps its H (cached), which auto has only with cache_dense:
        # an uncached auto's materialised path forms H per call and is timed by the auto column alone, and
        # the cached column is no alternative to the paths that never form H.
        took = _ratio(results, d, n, rows, phase, "auto" if phase == "infer" and m.path == "materialized" else own)
        rivals = [c for c in ("structured", "premixed", "onednn") if c != own]
        if phase == "train" or m.path == "cached":
            rivals.append("materialized")
        timed = {c: r for c in rivals if (r := _ratio(results, d, n, rows, phase, c)) is not None}
        if took is not None and timed:
            best = min(timed, key=lambda c: timed[c])
            if took > 1.10 * timed[best]:
                wrong.append(f"d=k={d}, n={n}, rows={rows}: auto took {m.path}, {took / timed[best]:.3f}x {best}")
    return wrong


def print_checks(title: str, checks: list[dict]) -> None:
    print(f"\n{title}")
    for c in checks:
        value = "" if c["value"] is None else f"  {c['value']:.3f}"
        detail = f" ({c['detail']})" if c["detail"] else ""
        print(f"  {c['target']}: {c['verdict']}{value}{detail}")
        for miss in c.get("misses", ()):
            print(f"    MISS  {miss}")


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
            w.writerow([m.mode, m.layers, m.d, m.k, m.n, m.rows, m.phase, m.variant, m.path, num(m.ms), num(m.ratio),
                        num(m.dense_ms),
                        m.calls_per_block, len(m.samples_ms), num(m.peak_mib), m.skipped])


# ----------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Time PHMLinear (structured / materialized / auto) and the broadcast-Kronecker PHM layer of "
                    "public code against nn.Linear, in inference (forward) and training (forward+backward); "
                    "print a markdown table of ratios to nn.Linear, training peak memory, and a targets check.",
        epilog="The docstring at the top of this file explains every column; benchmarks/README.md the method and the "
               "memory measure.")
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
    p.add_argument("--clock", choices=list(harness.CLOCKS), default="wall",
                   help="wall: time.perf_counter; cpu: time.process_time, the CPU time of this process, immune to "
                        "time-slicing by other processes but meaningful only on CPU with --threads 1 (default wall)")
    p.add_argument("--no-mmap", action="store_true",
                   help="CPU/glibc: stop malloc from mmap-ing large blocks (mallopt), so tensors over 32 MiB "
                        "reuse freed memory instead of being page-faulted on every call (see the docstring)")
    p.add_argument("--mem-limit-gib", type=float, default=4.0,
                   help="skip a layer/shape whose estimated memory beyond the parameters exceeds this (default 4)")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32", help="default float32")
    p.add_argument("--native", action="store_true",
                   help="build hyperplex's compiled PHM kernel first (hyperplex.layers.native, about a minute the "
                        "first time), so that `auto` takes its streamed path in inference at few rows on large weights")
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
                        f"else lscpu, else {harness.FALLBACK_LLC_MIB})")
    p.add_argument("--seed", type=int, default=0, help="seed for the layer parameters (default 0)")
    p.add_argument("--csv", metavar="PATH", help="also write every measurement (absolute ms included) as CSV")
    harness.add_arguments(p)  # --device, --threads, --out (alias --json: metadata and every measurement)
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


def run_grid(build, sizes, rows_grid, phases, label, args, device, dtype, records, started) -> dict:
    """``results[(d, n, rows)][phase][variant]`` for layers from ``build(d, n)``; every measurement also appended
    to ``records``."""
    results: dict[tuple[int, int, int], dict[str, dict[str, Measurement]]] = {}
    configs = [(d, n) for d in sizes for n in args.ns if d % n == 0]
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


def cold_builder(depths: dict, device, dtype, kron: bool):
    """``build(d, n)`` of the cold stacks; the dense stack of a size is built once and shared by every n."""
    dense_stacks: dict[int, list[nn.Module]] = {}

    def build(d: int, n: int) -> dict[str, list[nn.Module]]:
        if d not in dense_stacks:  # a new size: drop the previous one's dense stack first
            dense_stacks.clear()
        stacks = build_stack(d, d, n, depths[d][0], device, dtype, kron, dense_stacks.get(d))
        dense_stacks[d] = stacks["dense"]
        return stacks
    return build


def print_skips(records: list[Measurement], mode: str) -> None:
    for m in records:
        if m.skipped and m.mode == mode and m.skipped != INFERENCE_ONLY_SKIP:
            print(f"skip: {m.variant} {m.phase} d=k={m.d} n={m.n} rows={m.rows}: {m.skipped}")


def main(argv=None) -> dict:
    """Run the grid; returns ``{"warm", "cold"}`` (``results[(d, n, rows)][phase][variant]`` → :class:`Measurement`,
    or None where not run), ``"targets"`` (:func:`check` records), ``"records"`` (every Measurement) and ``"meta"``."""
    args = parse_args(argv)
    device, dtype = harness.setup(args), DTYPES[args.dtype]
    if args.native:
        from hyperplex.layers.native import enable_native_kernels

        enable_native_kernels()
    native_state = native_line(args.native)
    if args.clock == "cpu" and device.type == "cuda":
        raise SystemExit("--clock cpu measures host CPU time; use --clock wall with --device cuda")
    malloc = "glibc default"
    if args.no_mmap and device.type == "cpu":
        malloc = "no mmap (mallopt)" if harness.disable_malloc_mmap() else "glibc default (--no-mmap failed)"
    started = time.perf_counter()
    load_before = harness.busy_cores_elsewhere() if device.type == "cpu" else None
    script = "benchmarks/bench_phm.py" if argv is not None else os.path.relpath(sys.argv[0])
    command = harness.command_line(argv, script)
    skipped_shapes = [f"d=k={d}, n={n}: n does not divide d" for d in sorted({*args.sizes, *args.cold_sizes})
                      for n in args.ns if d % n]
    verify_kron(sorted(set(args.ns)))
    print("kron re-implementation matches PHMLinear (outputs and gradients, float64): ok", file=sys.stderr)

    records: list[Measurement] = []
    grid = dict(args=args, device=device, dtype=dtype, records=records, started=started)
    warm = cold = None
    if args.mode in ("both", "warm"):
        warm = run_grid(lambda d, n: build_layers(d, d, n, device, dtype), args.sizes, args.rows, args.phases, "warm",
                        **grid)
    llc, llc_source = (int(args.llc_mib * MiB), "--llc-mib") if args.llc_mib else harness.last_level_cache()
    itemsize = torch.empty((), dtype=dtype).element_size()
    depths = {d: stack_depth(d, d, args.ns, itemsize, llc, args) for d in args.cold_sizes}
    if args.mode in ("both", "cold"):
        cold = run_grid(cold_builder(depths, device, dtype, args.cold_kron), args.cold_sizes, args.cold_rows,
                        args.cold_phases, "cold", **grid)

    info = harness.machine(device)
    print(f"# PHMLinear benchmark — device {device}, dtype {args.dtype}; clock {args.clock}, statistic {args.stat}"
          + (f"; malloc {malloc}" if device.type == "cpu" else ""))
    print(harness.header(info))
    print(native_state)
    load_after = harness.busy_cores_elsewhere() if load_before is not None else None
    if load_before is not None:
        print(f"other processes kept {load_before:.1f} (start) / {load_after:.1f} (end) of {os.cpu_count()} "
              f"cores busy" + (" -- contended machine, timings are noisy" if max(load_before, load_after or 0) > 0.3
                               else ""))
    print(f"command: {command}")
    print("ratios are time / nn.Linear time on the same input (below 1 = faster); fwd = inference forward, "
          "f+b = training forward+backward; ms are per layer; MiB = peak extra memory of one training step")
    for line in skipped_shapes:
        print(f"skip: {line}")
    targets = {}
    if warm is not None:
        print("\n## warm: one layer called again and again (weights that fit stay in cache between calls)\n")
        print_table(warm)
        print_skips(records, "warm")
        targets["warm"] = warm_targets(warm, args.sizes, args.ns, args.rows) + auto_checks(warm)
        print_checks("targets", targets["warm"])
    if cold is not None:
        print(f"\n## cold: a stack of distinct layers called in sequence (last-level cache {llc / MiB:g} MiB, "
              f"{llc_source})\n")
        for d, (depth, note) in depths.items():
            print(f"d=k={d}: {depth} layers = {depth * d * d * itemsize / MiB:g} MiB of dense weights, "
                  + ", ".join(f"{depth * d * d // n * itemsize / MiB:g}" for n in args.ns)
                  + f" MiB of PHM weights for n = {', '.join(map(str, args.ns))}" + (f"; {note}" if note else ""))
        print()
        print_table(cold, cold=True)
        print_skips(records, "cold")
        targets["cold"] = cold_targets(cold) + auto_checks(cold, "every cold point")
        print_checks("targets (cold)", targets["cold"])
    print(f"\nwall time {time.perf_counter() - started:.0f} s")

    meta = {"command": command, "args": vars(args), "llc_bytes": llc, "llc_source": llc_source,
            "stack_layers": {d: v[0] for d, v in depths.items()}, "busy_cores_elsewhere": [load_before, load_after],
            "malloc": malloc, "native": native_state, "wall_s": time.perf_counter() - started}
    if args.csv:
        write_csv(args.csv, records)
    if args.out:
        harness.write_json(args.out, {"measurements": [asdict(m) for m in records], "targets": targets}, device,
                           **meta)
    return {"warm": warm, "cold": cold, "targets": targets, "records": records, "meta": meta}


if __name__ == "__main__":
    main()
