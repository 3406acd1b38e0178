#!/usr/bin/env python
"""Speed and memory of ``PHMLinear`` against ``nn.Linear`` and the usual broadcast-Kronecker PHM layer.

Usage (from the repository root)::

    PYTHONPATH=src python benchmarks/bench_phm.py --quick                # reduced grid, < 3 min on 2 CPU cores
    PYTHONPATH=src python benchmarks/bench_phm.py                        # full grid
    PYTHONPATH=src python benchmarks/bench_phm.py --sizes 4096 --ns 4 --rows 1 64 --csv phm.csv

For every ``d = k`` in ``--sizes``, ``n`` in ``--ns`` and ``rows`` in ``--rows`` the script times
five layers on the same input ``x`` of shape ``(rows, d)``:

- ``dense``: ``nn.Linear(d, k)``, the baseline every other number is divided by;
- ``str``: ``PHMLinear(..., forward_mode="structured")`` (never forms ``H``);
- ``mat``: ``PHMLinear(..., forward_mode="materialized")`` (forms ``H``, one dense matmul). With no
  gradient needed (inference) it reuses a cached ``H``, so its inference column is headed ``cached``;
- ``auto``: ``PHMLinear(..., forward_mode="auto")`` — what a user gets by default;
- ``kron``: :class:`BroadcastKronPHM`, a re-implementation of the PHM layer found in public code
  (Compacter / AdapterHub / PHC-GNN / HyperNets), which rebuilds ``H`` on every forward with a
  broadcast Kronecker product (an ``n·k·d`` intermediate) and then calls ``F.linear``. It shares
  its parameters with the ``PHMLinear`` layers and is checked to give the same outputs and
  gradients at start-up.

Two phases are timed:

- ``fwd``: one forward call under ``torch.inference_mode()``;
- ``f+b``: one training step — parameter and input gradients set to ``None``, forward with
  ``x.requires_grad_()``, then ``out.backward(g)`` with a fixed random ``g`` (no optimiser step).

Method: each (layer, phase) gets one warm-up call, then a calibration call that sets how many calls
make one timed block (about ``--block-ms``). Blocks of the five layers are then timed in
interleaved rounds (the order rotates every round) so drift of a shared machine hits all layers
alike; the reported time is the median over rounds of the per-call time, and every ratio is that
median divided by the dense layer's median from the same rounds. The number of rounds is
``--repeats``, cut (not below ``--min-repeats``) so one (config, phase) takes about ``--budget-s``.
Combinations whose estimated memory exceeds ``--mem-limit-gib`` are not run and show ``skip``.

Columns of the printed (markdown) table — ratios are ``time / dense time``, below 1 is faster:

- ``d=k``, ``n``, ``rows``: layer size, number of Kronecker terms, rows of ``x``;
- ``dense fwd ms`` / ``dense f+b ms``: absolute median time of the baseline, milliseconds;
- ``str fwd``, ``cached fwd``, ``auto fwd``, ``kron fwd``: inference forward, ×dense;
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

Caveat: timings repeat the same layer on the same input, so small weights (``k·d/n`` numbers for
PHM) stay in the CPU cache between calls while a large dense weight does not. That is the regime
of one layer called in a loop; inside a deep model the caches are shared between layers.

After the table a ``targets`` section reports PASS/MISS for the project's performance targets
(measured at ``d = k = 4096`` where the grid has it). A MISS is a measurement, not an error: the
script exits 0. ``--csv`` / ``--json`` additionally write every raw number.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
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

try:
    from hyperplex.layers.phm import PHMLinear
except ImportError:  # run from a checkout without PYTHONPATH=src
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from hyperplex.layers.phm import PHMLinear

VARIANTS = ("dense", "structured", "materialized", "auto", "kron")
PHASES = ("infer", "train")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MiB = 2**20

FULL = {"sizes": [512, 1024, 4096], "ns": [2, 4, 8, 16], "rows": [1, 8, 64, 4096],
        "repeats": 5, "min_repeats": 3, "block_ms": 50.0, "budget_s": 20.0}
# d=k=4096 with 4096 rows costs ~1.5 s per dense forward and ~4.5 s per training step on 2 cores,
# too slow for a 3-minute run; 1024 rows is already the compute-bound regime.
QUICK = {"sizes": [1024, 4096], "ns": [2, 4, 8, 16], "rows": [1, 1024],
         "repeats": 3, "min_repeats": 2, "block_ms": 20.0, "budget_s": 4.0}


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
        self.phm_rule = nn.Parameter(phm.phm_rule.detach().clone())
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
                torch.testing.assert_close(got, want, msg=lambda m: f"kron vs {name}, n={n}: {m}")


# ----------------------------------------------------------------------------- measurement helpers
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _block_time(fn, number: int, device: torch.device) -> float:
    """Seconds per call of ``fn`` over a block of ``number`` back-to-back calls."""
    _sync(device)
    start = time.perf_counter()
    for _ in range(number):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / number


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
    median_ms: float = math.nan
    ratio: float = math.nan
    dense_ms: float = math.nan
    samples_ms: list = field(default_factory=list)
    calls_per_block: int = 0
    peak_mib: float = math.nan
    skipped: str = ""


def measure_config(layers: dict[str, nn.Module], d: int, k: int, n: int, rows: int, phase: str,
                   args, device: torch.device, dtype: torch.dtype) -> dict[str, Measurement]:
    """Time (and for training, profile memory of) every variant on one shape, interleaved."""
    gen = torch.Generator(device=device).manual_seed(1000 * rows + n)
    x = torch.randn(rows, d, device=device, dtype=dtype, generator=gen)
    g = torch.randn(rows, k, device=device, dtype=dtype, generator=gen)
    train = phase == "train"
    if train:
        x.requires_grad_()
    ctx = contextlib.nullcontext if train else torch.inference_mode
    out: dict[str, Measurement] = {}
    calls = {}
    limit = args.mem_limit_gib * 2**30
    for name, layer in layers.items():
        layer.train(train)
        m = Measurement(d, k, n, rows, phase, name)
        if isinstance(layer, PHMLinear):
            with ctx():
                m.path = layer.choose_mode(rows)
        else:
            m.path = name
        est = estimate_bytes(name, phase, d, k, n, rows, torch.empty((), dtype=dtype).element_size())
        if est > limit:
            m.skipped = f"estimated {est / 2**30:.1f} GiB > --mem-limit-gib {args.mem_limit_gib:g}"
        out[name] = m
        if m.skipped:
            continue
        grads = [x, *layer.parameters()]

        def clear(grads=grads):
            for t in grads:
                t.grad = None

        if train:
            def call(layer=layer, clear=clear):
                clear()
                layer(x).backward(g)
        else:
            def call(layer=layer):
                layer(x)
        calls[name] = call

    if out["dense"].skipped:  # no baseline, nothing to compare
        for m in out.values():
            m.skipped = m.skipped or "baseline skipped"
        return out

    target = args.block_ms / 1e3
    per_call = {}
    for name, call in calls.items():  # warm-up (+ memory), then calibration
        with ctx():
            if train:
                for t in [x, *layers[name].parameters()]:
                    t.grad = None
                t0 = time.perf_counter()
                out[name].peak_mib = peak_step_bytes(call, device) / MiB
            else:
                t0 = time.perf_counter()
                call()
                _sync(device)
            warm = time.perf_counter() - t0
            # a call that is clearly longer than a block needs no calibration: one call per block
            per_call[name] = warm if warm > 4 * target else _block_time(call, 1, device)
        out[name].calls_per_block = max(1, min(100_000, round(target / max(per_call[name], 1e-7))))

    round_s = sum(per_call[nm] * out[nm].calls_per_block for nm in calls)
    repeats = max(args.min_repeats, min(args.repeats, int(args.budget_s / max(round_s, 1e-9))))
    names = list(calls)
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            with ctx():
                out[name].samples_ms.append(1e3 * _block_time(calls[name], out[name].calls_per_block, device))
    for layer in layers.values():  # free gradients before the next shape
        for p in layer.parameters():
            p.grad = None

    dense_ms = statistics.median(out["dense"].samples_ms)
    for m in out.values():
        m.dense_ms = dense_ms
        if m.samples_ms:
            m.median_ms = statistics.median(m.samples_ms)
            m.ratio = m.median_ms / dense_ms
    return out


def build_layers(d: int, k: int, n: int, device: torch.device, dtype: torch.dtype) -> dict[str, nn.Module]:
    """Dense baseline, three PHMLinear modes sharing one set of parameters, and the kron layer."""
    auto = PHMLinear(d, k, n, device=device, dtype=dtype)
    layers = {"dense": nn.Linear(d, k, device=device, dtype=dtype)}
    for mode in ("structured", "materialized"):
        layers[mode] = PHMLinear(d, k, n, device=device, dtype=dtype, forward_mode=mode)
        layers[mode].load_state_dict(auto.state_dict())
    layers["auto"] = auto
    layers["kron"] = BroadcastKronPHM(auto)
    for layer in layers.values():
        layer.requires_grad_(True)
    return layers


# ----------------------------------------------------------------------------- reporting
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
    if m is None or m.skipped or math.isnan(m.median_ms):
        return "skip"
    return f"{m.median_ms:.3g}"


def _fmt_mib(m: Measurement | None) -> str:
    if m is None or m.skipped or math.isnan(m.peak_mib):
        return "skip"
    return f"{m.peak_mib:.1f}"


def print_table(results: dict) -> None:
    head = ["d=k", "n", "rows", "dense fwd ms", "str fwd", "cached fwd", "auto fwd", "kron fwd",
            "dense f+b ms", "str f+b", "mat f+b", "auto f+b", "kron f+b", "auto path (inf / train)",
            "MiB dense", "MiB auto", "MiB kron"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---:" if i not in (13,) else ":---" for i in range(len(head))) + "|")
    for (d, n, rows), phases in results.items():
        inf, trn = phases.get("infer", {}), phases.get("train", {})
        cells = [str(d), str(n), str(rows), _fmt_ms(inf.get("dense"))]
        cells += [_fmt_ratio(inf.get(v)) for v in ("structured", "materialized", "auto", "kron")]
        cells += [_fmt_ms(trn.get("dense"))]
        cells += [_fmt_ratio(trn.get(v)) for v in ("structured", "materialized", "auto", "kron")]
        paths = [phases[p]["auto"].path if p in phases and not phases[p]["auto"].skipped else "skip" for p in PHASES]
        cells += [" / ".join(paths)]
        cells += [_fmt_mib(trn.get(v)) for v in ("dense", "auto", "kron")]
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
            note = "" if rows == 4096 else f" (evaluated at rows={rows}; 4096 not in grid)"
            for n in ns:
                r = ratio(big, n, rows, "train", "auto")
                text = "n/a (skipped)" if r is None else f"{_verdict(r <= 1.08)}  {r:.3f}x"
                print(f"  d=k={big}, {rows} rows, training fwd+bwd, auto <= 1.08x dense, n={n}: {text}{note}")
        else:
            print("  (no rows >= 1024 in the grid: the 4096-row training target is not evaluated)")

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
            print(f"  every grid point, {label}, auto <= 1.10x min(str, mat): n/a")
            continue
        q, d, n, rows = worst
        print(f"  every grid point, {label}, auto <= 1.10x min(str, mat): {_verdict(not misses)}  "
              f"{checked - len(misses)}/{checked} within; worst {q:.3f}x at d=k={d}, n={n}, rows={rows}")
        for line in misses:
            print(line)


def write_csv(path: str, records: list[Measurement]) -> None:
    cols = ["d", "k", "n", "rows", "phase", "variant", "path", "median_ms", "ratio", "dense_ms",
            "calls_per_block", "n_samples", "peak_mib", "skipped"]
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for m in records:
            w.writerow([m.d, m.k, m.n, m.rows, m.phase, m.variant, m.path, f"{m.median_ms:.6g}", f"{m.ratio:.6g}",
                        f"{m.dense_ms:.6g}", m.calls_per_block, len(m.samples_ms), f"{m.peak_mib:.6g}", m.skipped])


# ----------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Time PHMLinear (structured / materialized / auto) and the broadcast-Kronecker PHM layer of "
                    "public code against nn.Linear, in inference (forward) and training (forward+backward); "
                    "print a markdown table of ratios to nn.Linear, training peak memory, and a targets check.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"reduced grid and repetitions (under 3 min on 2 CPU cores): sizes {QUICK['sizes']}, "
                        f"ns {QUICK['ns']}, rows {QUICK['rows']}; explicit flags still override")
    p.add_argument("--sizes", type=int, nargs="+", help=f"layer sizes d = k (default {FULL['sizes']})")
    p.add_argument("--ns", type=int, nargs="+", help=f"numbers of Kronecker terms n (default {FULL['ns']})")
    p.add_argument("--rows", type=int, nargs="+", help=f"rows of the input x (default {FULL['rows']})")
    p.add_argument("--repeats", type=int, help=f"max interleaved timing rounds (default {FULL['repeats']}, "
                                                f"quick {QUICK['repeats']})")
    p.add_argument("--min-repeats", type=int, help=f"min rounds when --budget-s cuts them (default "
                                                    f"{FULL['min_repeats']}, quick {QUICK['min_repeats']})")
    p.add_argument("--block-ms", type=float, help=f"target length of one timed block of calls, ms (default "
                                                   f"{FULL['block_ms']:g}, quick {QUICK['block_ms']:g})")
    p.add_argument("--budget-s", type=float, help=f"target seconds of timing rounds per shape and phase (default "
                                                   f"{FULL['budget_s']:g}, quick {QUICK['budget_s']:g})")
    p.add_argument("--mem-limit-gib", type=float, default=4.0,
                   help="skip a layer/shape whose estimated extra memory exceeds this")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's own choice)")
    p.add_argument("--seed", type=int, default=0, help="seed for the layer parameters")
    p.add_argument("--csv", metavar="PATH", help="also write every measurement (absolute ms included) as CSV")
    p.add_argument("--json", metavar="PATH", help="also write metadata and every measurement as JSON")
    args = p.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.min_repeats > args.repeats:
        args.min_repeats = args.repeats
    if min(args.sizes + args.ns + args.rows) < 1 or args.repeats < 1:
        p.error("--sizes, --ns, --rows and --repeats must be positive")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    started = time.perf_counter()
    command = " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0]) if argv is None else "bench_phm.py",
                                                 *(sys.argv[1:] if argv is None else argv)])

    verify_kron(sorted(set(args.ns)))
    print("kron re-implementation matches PHMLinear (outputs and gradients, float64): ok", file=sys.stderr)

    results: dict[tuple[int, int, int], dict[str, dict[str, Measurement]]] = {}
    records: list[Measurement] = []
    skipped_shapes = []
    configs = [(d, n) for d in args.sizes for n in args.ns]
    for i, (d, n) in enumerate(configs, 1):
        k = d
        if d % n:
            skipped_shapes.append(f"d=k={d}, n={n}: n does not divide d")
            print(f"skip d=k={d} n={n}: n does not divide d", file=sys.stderr)
            continue
        torch.manual_seed(args.seed)
        layers = build_layers(d, k, n, device, dtype)
        for rows in args.rows:
            t0 = time.perf_counter()
            entry = results.setdefault((d, n, rows), {})
            for phase in PHASES:
                entry[phase] = measure_config(layers, d, k, n, rows, phase, args, device, dtype)
                records += entry[phase].values()
            print(f"[{i}/{len(configs)}] d=k={d} n={n} rows={rows}: {time.perf_counter() - t0:.1f} s "
                  f"(total {time.perf_counter() - started:.0f} s)", file=sys.stderr)
        del layers

    print(f"# PHMLinear benchmark — {_dt.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(machine_line(device, args.dtype))
    print(f"command: {command}")
    print("ratios are time / nn.Linear time on the same input (below 1 = faster); fwd = inference forward, "
          "f+b = training forward+backward; MiB = peak extra memory of one training step\n")
    print_table(results)
    skips = [f"{m.variant} {m.phase} d=k={m.d} n={m.n} rows={m.rows}: {m.skipped}" for m in records if m.skipped]
    for line in skipped_shapes + skips:
        print(f"skip: {line}")
    print_targets(results, args.sizes, args.ns, args.rows)
    print(f"\nwall time {time.perf_counter() - started:.0f} s")

    if args.csv:
        write_csv(args.csv, records)
    if args.json:
        meta = {"date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"), "command": command,
                "machine": machine_line(device, args.dtype), "args": vars(args)}
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "measurements": [asdict(m) for m in records]}, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
