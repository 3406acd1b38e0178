#!/usr/bin/env python
"""Speed of the PHM delta adapter against peft's own LoRA and LoKr layers at matched trainable parameters.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_adapters.py --quick   # about 2 min on one core
    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_adapters.py           # more rows and repeats
    PYTHONPATH=src python benchmarks/bench_adapters.py --sizes 1024x4096 --variants 4:full 8:8 --rows 1 64

For every layer size ``d×k`` (in × out features), PHM variant ``n:rank`` (``rank`` a number, or ``full``
for full ``Sᵢ``) and number of rows, four one-layer models get the same input ``x (rows, d)``:

- ``phm``: a frozen ``nn.Linear(d, k)`` with :func:`hyperplex.adapters.add_adapter` (structured forward,
  ``ΔW`` never formed);
- ``lora``: ``peft.get_peft_model`` with ``LoraConfig(r=r_L)`` on the same kind of layer — the baseline
  every ratio is divided by;
- ``lokr``: ``peft.get_peft_model`` with ``LoKrConfig(r, decompose_factor)``, which forms ``ΔW`` (k × d) on
  every forward;
- ``base``: the frozen ``nn.Linear`` alone (what every adapter costs at least; also what any merged
  adapter costs).

The peft rows are built only through peft's API (nothing re-implemented); the script checks that the
adapted module is peft's own layer class. ``r_L`` and LoKr's ``(r, decompose_factor)`` are chosen so that
their trainable-parameter counts are as close as possible to the PHM adapter's; the counts printed are
counted on the built models.

Phases: ``fwd`` — one forward under ``torch.no_grad()`` (unmerged adapters, as during evaluation in
training); ``f+b`` — forward with ``x.requires_grad_()`` (the layer sits inside a network) and
``out.backward(g)``, gradients reset to ``None`` each step (as ``optimizer.zero_grad()``).

Method (``benchmarks/harness.py``): one warm-up call per model and phase, a calibration call sets how many
back-to-back calls make a block of about ``--block-ms``; then ``--repeats`` rounds, each timing one block of every
model in an order that rotates every round (drift on a shared machine hits all alike). A time is the median
over rounds of the per-call time; a ratio is the median over rounds of (model time / LoRA time in the
same round). Below 1 is faster than LoRA. ``peak MiB`` is the peak memory of one training step above the level
before it (CUDA: the allocator's peak; CPU: the profiler's allocation events). ``--device cuda`` times with CUDA
events; ``--bf16`` runs the models in bfloat16. ``--out FILE`` writes every row as JSON.

A caveat from docs/performance.md holds here: a single layer called in a loop keeps a small weight in
the CPU cache. The 384×1536 base weight (2.3 MB) stays cache-resident; 4096×4096 (64 MB) does not.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

from hyperplex.adapters import PHMAdapterConfig, adapter_state_dict, add_adapter, merge, trainable_parameters, unmerge

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the harness, run as a script or loaded by path
import harness  # noqa: E402


class OneLayer(nn.Module):
    """A container holding one frozen ``proj`` layer, so every library can target it by name."""

    def __init__(self, d: int, k: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, k)

    def forward(self, x):
        return self.proj(x)


def parse_size(text: str) -> tuple[int, int]:
    d, _, k = text.partition("x")
    return int(d), int(k)


def parse_variant(text: str) -> tuple[int, int | None]:
    n, _, rank = text.partition(":")
    return int(n), (None if rank in ("", "full") else int(rank))


def build_phm(d: int, k: int, n: int, rank: int | None) -> nn.Module:
    model = OneLayer(d, k)
    add_adapter(model, "a", PHMAdapterConfig(n=n, rank=rank, targets=["proj"]))
    with torch.no_grad():  # non-zero weights, and check structured ≡ merged once
        for p in adapter_state_dict(model, "a").values():
            p.normal_(0, 0.02)
        x = torch.randn(3, d)
        structured = model(x)
        merge(model)
        merged = model(x)
        unmerge(model)
    if not torch.allclose(structured, merged, rtol=1e-3, atol=1e-3):
        raise RuntimeError(f"PHM adapter {d}x{k} n={n} rank={rank}: structured and merged forwards differ")
    return model


def build_lora(d: int, k: int, rank: int) -> nn.Module:
    import peft
    from peft.tuners.lora import Linear as LoraLinear

    model = peft.get_peft_model(OneLayer(d, k), peft.LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0,
                                                                 target_modules=["proj"]))
    if not isinstance(model.get_submodule("base_model.model.proj"), LoraLinear):
        raise RuntimeError("peft did not wrap proj in its LoRA layer")
    return model


def build_lokr(d: int, k: int, rank: int, factor: int) -> nn.Module:
    import peft
    from peft.tuners.lokr import Linear as LoKrLinear

    config = peft.LoKrConfig(r=rank, alpha=rank, decompose_factor=factor, target_modules=["proj"])
    model = peft.get_peft_model(OneLayer(d, k), config)
    if not isinstance(model.get_submodule("base_model.model.proj"), LoKrLinear):
        raise RuntimeError("peft did not wrap proj in its LoKr layer")
    return model


def lokr_count(d: int, k: int, rank: int, factor: int) -> int:
    """Trainable parameters peft's LoKr gives a Linear(d, k) (its factorization and use_w2 rule)."""
    from peft.tuners.lokr.layer import factorization

    in_m, in_n = factorization(d, factor)
    out_l, out_k = factorization(k, factor)
    w2 = out_k * in_n if not rank < max(out_k, in_n) / 2 else rank * (out_k + in_n)
    return out_l * in_m + w2


def match_lokr(d: int, k: int, target: int) -> tuple[int, int]:
    """``(rank, decompose_factor)`` whose LoKr count is closest to ``target``."""
    best = None
    for factor in (2, 4, 8, 16, 32):
        if d % factor or k % factor:
            continue
        top = max(k // factor, d // factor)
        for rank in sorted({1, *range(1, top + 1, max(1, top // 256)), top}):
            count = lokr_count(d, k, rank, factor)
            key = (abs(count - target), rank)
            if best is None or key < best[0]:
                best = (key, (rank, factor))
    if best is None:
        raise ValueError(f"no LoKr factor in (2, 4, 8, 16, 32) divides {d} and {k}")
    return best[1]


def trainable(model: nn.Module) -> int:
    return trainable_parameters(model).trainable


def phase_call(model: nn.Module, x: torch.Tensor, g: torch.Tensor, phase: str):
    """One call of ``phase`` on ``x (rows, d)``: ``fwd`` under ``no_grad``; ``f+b`` forward and ``backward(g)``
    with ``g (rows, k)``, the gradients reset to ``None`` first."""
    params = [p for p in model.parameters() if p.requires_grad]

    def fwd():
        with torch.no_grad():
            model(x)

    def train():
        for p in params:
            p.grad = None
        x.grad = None
        model(x).backward(g)
    return fwd if phase == "fwd" else train


def measure(models: dict[str, nn.Module], rows: int, d: int, k: int, phase: str, repeats: int, block_ms: float,
            device: torch.device, dtype: torch.dtype) -> dict[str, dict]:
    """name → {ms (median per call), ratio (median to lora), spread, peak_mib (``f+b`` only)}."""
    x = torch.randn(rows, d, device=device, dtype=dtype, requires_grad=(phase == "f+b"))
    g = torch.randn(rows, k, device=device, dtype=dtype)
    calls = {name: phase_call(model, x, g, phase) for name, model in models.items()}
    number = {name: harness.calls_per_block(call, block_ms / 1e3, device)[0] for name, call in calls.items()}
    peaks = {name: harness.peak_bytes(call, device) / harness.MiB for name, call in calls.items()} \
        if phase == "f+b" else {}
    timings = harness.interleave(calls, repeats, device=device, number=number, warmup=0)
    return {name: {"ms": timings.median(name) * 1e3, "ratio": timings.ratio(name, "lora"),
                   "spread": timings.spread(name), "peak_mib": peaks.get(name)} for name in calls}


def main(argv=None) -> dict:
    """Run the grid; returns ``{"args", "rows": [{d, k, n, rank, rows, params, fwd: {model: {ms, ratio, spread}},
    "f+b": {...}}]}`` (also written to ``--out``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="rows 1 and 32, 5 repeats, 30 ms blocks")
    parser.add_argument("--sizes", nargs="+", default=["384x1536", "1024x4096", "4096x4096"], help="d x k (in x out)")
    parser.add_argument("--variants", nargs="+", default=["4:full", "4:8", "8:full", "8:8"],
                        help="n:rank, rank a number or full")
    parser.add_argument("--rows", nargs="+", type=int, default=None, help="rows of x; default 1 32 256 (quick: 1 32)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds; default 15 (quick: 5)")
    parser.add_argument("--block-ms", type=float, default=None,
                        help="length of one timed block; default 100 (quick: 30)")
    parser.add_argument("--bf16", action="store_true", help="models and inputs in bfloat16 (default float32)")
    harness.add_arguments(parser)
    args = parser.parse_args(argv)
    rows_list = args.rows or ([1, 32] if args.quick else [1, 32, 256])
    repeats = args.repeats or (5 if args.quick else 15)
    block_ms = args.block_ms or (30.0 if args.quick else 100.0)
    device = harness.setup(args)
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    import peft

    torch.manual_seed(0)
    print(f"# bench_adapters — peft {peft.__version__}, device {device}, {str(dtype).removeprefix('torch.')}")
    print(f"# {harness.header(harness.machine(device))}")
    print(f"# repeats {repeats}, block {block_ms:.0f} ms; times are medians in ms, ratios are medians of time / LoRA "
          f"time in the same round (below 1 = faster than LoRA)\n")
    header = ("| d×k | PHM n, rank | params PHM / LoRA (r) / LoKr (r, f) | rows | LoRA fwd ms | PHM fwd | LoKr fwd | "
              "base fwd | LoRA f+b ms | PHM f+b | LoKr f+b | base f+b | peak MiB LoRA / PHM / LoKr |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    results = []
    for size in args.sizes:
        d, k = parse_size(size)
        for variant in args.variants:
            n, rank = parse_variant(variant)
            phm = build_phm(d, k, n, rank)
            target = trainable(phm)
            lora_rank = max(1, round(target / (k + d)))
            lokr_rank, factor = match_lokr(d, k, target)
            lora, lokr = build_lora(d, k, lora_rank), build_lokr(d, k, lokr_rank, factor)
            if trainable(lokr) != lokr_count(d, k, lokr_rank, factor):
                raise RuntimeError("peft's LoKr parameter count differs from the formula used to match it")
            base = OneLayer(d, k).requires_grad_(False)
            models = {name: m.to(device, dtype) for name, m in
                      {"lora": lora, "phm": phm, "lokr": lokr, "base": base}.items()}
            params = {"phm": target, "lora": trainable(lora), "lora_rank": lora_rank, "lokr": trainable(lokr),
                      "lokr_rank": lokr_rank, "lokr_factor": factor}
            counts = f"{target:,} / {trainable(lora):,} ({lora_rank}) / {trainable(lokr):,} ({lokr_rank}, {factor})"
            for rows in rows_list:
                fwd = measure(models, rows, d, k, "fwd", repeats, block_ms, device, dtype)
                fb = measure(models, rows, d, k, "f+b", repeats, block_ms, device, dtype)
                results.append({"d": d, "k": k, "n": n, "rank": rank, "rows": rows, "params": params,
                                "fwd": fwd, "f+b": fb})
                print(f"| {d}×{k} | {n}, {'full' if rank is None else rank} | {counts} | {rows} | "
                      f"{fwd['lora']['ms']:.3f} | {fwd['phm']['ratio']:.2f} | {fwd['lokr']['ratio']:.2f} | "
                      f"{fwd['base']['ratio']:.2f} | {fb['lora']['ms']:.3f} | {fb['phm']['ratio']:.2f} | "
                      f"{fb['lokr']['ratio']:.2f} | {fb['base']['ratio']:.2f} | " + " / ".join(
                          f"{fb[m]['peak_mib']:.1f}" for m in ("lora", "phm", "lokr")) + " |", flush=True)
            del models, phm, lora, lokr, base
    result = {"args": vars(args), "rows": results}
    if args.out:
        harness.write_json(args.out, result, device, command=harness.command_line(argv, "benchmarks/bench_adapters.py"))
    return result


if __name__ == "__main__":
    main()
