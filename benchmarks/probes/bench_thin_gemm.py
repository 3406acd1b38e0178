#!/usr/bin/env python
"""Which GEMM form of the PHM product is fastest from memory at few rows? Cold-stack times × dense.

The structured product ``x Hᵀ`` with ``H = Σᵢ Aᵢ ⊗ Sᵢ`` does the dense layer's ``k·d`` multiply-adds while
reading ``k·d/n`` weights; at one row it is only as fast as the BLAS runs a product ``n`` columns (or rows)
wide. This script times the weight-side product alone (the rule's mixing, ``O(n·d)`` per row, is left out) in
the forms one could build it from, each on a stack of distinct layers holding as many bytes as the dense
stack (so neither is served from the last-level cache), as the best of ``--repeats`` passes, ×dense:

- ``structured`` — ``S @ Xᵀ`` with ``S`` the ``(n, k/n, d/n)`` factors viewed ``(k, d/n)``: the library's
  :func:`hyperplex.layers.functional.phm_linear_structured` (no copy);
- ``x_st`` — the same product the other way round, ``X @ Sᵀ``;
- ``bmm`` — ``n`` batched products ``Sᵢ @ Xᵀ``;
- ``premixed_stored`` — one GEMM of reduction length ``d`` against the ``Sᵢ`` side by side, as if they were
  *stored* that way (the library's ``premixed`` path copies them per call, which this form leaves out);
- ``premixed_accumulate`` — the pre-mixed inputs against each ``Sᵢ`` in turn, accumulated with ``addmm_``
  (no copy, ``n`` calls);
- ``onednn`` — ``x_st`` through oneDNN (``torch._C._nn.mkldnn_linear`` on ``to_mkldnn`` tensors), where built;
- ``mkl_packed`` — ``premixed_stored`` with the side-by-side factors packed once for MKL's GEMM
  (``torch.ops.mkl._mkl_reorder_linear_weight``, what inductor's freezing uses), where built.

With ``--compile`` two more columns compare whole forwards, the rule's mixing included:

- ``full`` — :func:`~hyperplex.layers.functional.phm_linear_structured` as the library runs it (eager);
- ``compiled`` — the same function through ``torch.compile`` (inductor; compiled once per ``n`` before timing,
  which takes tens of seconds on CPU and needs a C++ compiler).

Each line ends with ``bound``: the least ×dense any form could reach on this CPU, the larger of ``1/n`` (the
factors' share of the dense bytes, read at the dense layer's rate) and the time the dense layer's
``2·rows·d²`` flops take at the rate of a hot ``1024³`` GEMM (this CPU's practical peak, printed first).

Usage: ``OMP_NUM_THREADS=1 python benchmarks/probes/bench_thin_gemm.py --threads 1 --d 4096 --rows 1``. Run it on a
quiet machine: the ratios are of memory-bound kernels and move with other processes' memory traffic.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the harness, run as a script or loaded by path
import harness  # noqa: E402


def best_time(calls, repeats: int) -> float:
    """Seconds per call: the best of ``repeats`` passes over ``calls`` (one warm-up pass first)."""
    timings = harness.interleave({"pass": lambda: [call() for call in calls]}, repeats)
    return min(timings.samples["pass"]) / len(calls)


def peak_flops(repeats: int, size: int = 1024) -> float:
    """Flop/s of a hot ``size³`` GEMM: the practical peak of one GEMM at the current thread count."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    return 2 * size**3 / best_time([lambda: a @ b], repeats)


def flops_share(d: int, rows: int, t_dense: float, peak: float) -> float:
    """The dense layer's ``2·rows·d²`` flops at ``peak`` flop/s, as a share of its measured time ``t_dense``."""
    return 2 * rows * d * d / peak / t_dense


def bound(n: int, d: int, rows: int, t_dense: float, peak: float) -> float:
    """The least ×dense a PHM form can reach: ``max(1/n, flops_share)`` — it reads ``1/n`` of the dense bytes
    and still does the dense layer's multiply-adds."""
    return max(1.0 / n, flops_share(d, rows, t_dense, peak))


def forms(S, rows: int):
    """``({name: callable(S)}, {"X": input blocks, "Z": pre-mixed inputs})`` for factors shaped like ``S``
    ``(n, m, m)`` and ``rows`` input rows."""
    import torch

    n, m, _ = S.shape
    d = n * m
    X = torch.randn(rows * n, m)  # the n input blocks of each row
    Z = torch.randn(rows * n, n, m)  # pre-mixed inputs, row (b, a) = [z_{a,1} … z_{a,n}]
    out = torch.empty(rows * n, m)

    def accumulate(S):
        torch.mm(Z[:, 0, :], S[0].T, out=out)
        for i in range(1, n):
            out.addmm_(Z[:, i, :], S[i].T)
        return out

    table = {
        "structured": lambda S: S.reshape(n * m, m) @ X.T,
        "x_st": lambda S: X @ S.reshape(n * m, m).T,
        "bmm": lambda S: torch.bmm(S, X.T.unsqueeze(0).expand(n, m, rows * n)),
        "premixed_stored": lambda S: Z.view(rows * n, d) @ S.view(m, d).T,  # S's memory read as [S₁ … S_n]
        "premixed_accumulate": accumulate,
    }
    return table, {"X": X, "Z": Z}


def mkl_packed_ratio(stack, Z, repeats: int) -> float:
    """Seconds per layer of ``Z @ [S₁ … S_n]ᵀ`` with the side-by-side factors packed once for MKL."""
    import torch

    rows = Z.shape[0]
    views = [S.view(S.shape[1], -1) for S in stack]  # S's memory read as [S₁ … S_n], as in premixed_stored
    packed = [torch.ops.mkl._mkl_reorder_linear_weight(V, rows) for V in views]
    return best_time([lambda V=V, P=P: torch.ops.mkl._mkl_linear(Z, P, V, None, rows) for V, P in zip(views, packed)],
                     repeats)


def whole_forwards(stack, rows: int, repeats: int, t_dense: float) -> dict[str, float]:
    """×dense of the library's whole structured forward (mixing included), eager and compiled, on ``stack``."""
    import torch

    from hyperplex.layers.functional import phm_linear_structured

    n, m, _ = stack[0].shape
    rule = torch.randn(n, n, n)
    x = torch.randn(rows, n * m)
    compiled = torch.compile(phm_linear_structured, dynamic=False)
    with torch.inference_mode():
        error = (compiled(x, rule, stack[0]) - phm_linear_structured(x, rule, stack[0])).abs().max().item()
        if error > 1e-3:
            raise AssertionError(f"compiled forward differs from eager by {error:.2e} at n = {n}")
        return {name: best_time([lambda S=S, f=f: f(x, rule, S) for S in stack], repeats) / t_dense
                for name, f in (("full", phm_linear_structured), ("compiled", compiled))}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d", type=int, default=4096, help="in = out features (default 4096)")
    parser.add_argument("--rows", type=int, default=1, help="input rows (default 1)")
    parser.add_argument("--ns", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--layers", type=int, default=6, help="dense layers in the stack (PHM: n× as many)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--compile", action="store_true",
                        help="also time the whole structured forward, eager and through torch.compile")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    d = args.d
    bad = [n for n in args.ns if d % n]
    if bad:
        parser.error(f"--d {d} is not divisible by n = {bad}")
    dense = [torch.randn(d, d) for _ in range(args.layers)]
    x = torch.randn(args.rows, d)
    t_dense = best_time([lambda W=W: x @ W.T for W in dense], args.repeats)
    del dense
    print(f"# bench_thin_gemm: d = {d}, {args.rows} row(s), stack of {args.layers} dense layers "
          f"({args.layers * d * d * 4 / 2**20:.0f} MiB); dense {t_dense * 1e3:.2f} ms a layer")
    print(f"# {harness.header(harness.machine())}")
    peak = peak_flops(max(args.repeats, 10))
    print(f"# peak: a hot 1024³ GEMM at {peak / 1e9:.1f} GFLOP/s; the dense layer's flops at that rate take "
          f"{flops_share(d, args.rows, t_dense, peak):.2f}× its time")
    results = {}
    for n in args.ns:
        m = d // n
        stack = [torch.randn(n, m, m) for _ in range(args.layers * n)]
        table, _ = forms(stack[0], args.rows)
        if torch.backends.mkldnn.is_available():
            X = torch.randn(args.rows * n, m)
            packed = [S.reshape(n * m, m).to_mkldnn() for S in stack]
            table["onednn"] = None
        if hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight") and torch.backends.mkl.is_available():
            Z = torch.randn(args.rows * n, d)
            table["mkl_packed"] = None
        row = {}
        for name, form in table.items():
            if name == "onednn":
                row[name] = best_time([lambda P=P, X=X: torch._C._nn.mkldnn_linear(X.to_mkldnn(), P, None).to_dense()
                                       for P in packed], args.repeats) / t_dense
            elif name == "mkl_packed":
                row[name] = mkl_packed_ratio(stack, Z, args.repeats) / t_dense
            else:
                row[name] = best_time([lambda S=S, form=form: form(S) for S in stack], args.repeats) / t_dense
        if args.compile:
            row.update(whole_forwards(stack, args.rows, args.repeats, t_dense))
        row["bound"] = bound(n, d, args.rows, t_dense, peak)
        results[n] = row
        print(f"n = {n:2d}: " + "  ".join(f"{name} {ratio:.2f}" for name, ratio in row.items()), flush=True)
    return results


if __name__ == "__main__":
    main()
