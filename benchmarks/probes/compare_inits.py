#!/usr/bin/env python
"""How much each conversion start keeps of all-MiniLM-L6-v2 before any healing: ``init`` ∈ {svd, activation,
whitened, whitened_als} × {PHM n, low-rank at PHM n's parameters}, on the same calibration data.

Usage (from the repository root; needs ``pip install "hyperplex[pretrained]"``)::

    PYTHONPATH=src python benchmarks/probes/compare_inits.py --quick          # n = 4 only, 256 eval captions
    PYTHONPATH=src python benchmarks/probes/compare_inits.py                  # n = 2, 4, 8, every init
    PYTHONPATH=src python benchmarks/probes/compare_inits.py --n 8 --inits svd whitened

Data (``--data``, default ``../shared/data``): the Multi30k English training captions, blank lines and
captions that also occur in the val file removed (as ``hyperplex compress`` does); the first 64 are the
calibration sentences (what ``init: activation`` is fitted to in ``configs/minilm_compress.yaml``), the
next 256 are held out for the per-layer error; the 1,014 val captions score the whole model.

Per row: the layers matching ``*encoder.layer*`` (36 of them) are converted with
:func:`hyperplex.compress` (``refine_steps`` 200 for ``activation``, ``als_sweeps``
``--als-sweeps`` for ``whitened_als``); *layer error* is the mean over layers of the relative output error
``‖(W − H) Xᵀ‖_F / ‖W Xᵀ‖_F`` on the held-out captions' inputs to that layer in the dense teacher;
*weight error* is the mean over layers of ``‖W − H‖_F / ‖W‖_F`` (the conversion report's);
*cosine* is the mean cosine between the converted model's and the teacher's normalised sentence embeddings
of the val captions (no healing); *fit s* is the conversion's wall time (calibration pass included) on
one thread. Prints a markdown table (``--out PATH`` also writes the rows and the machine to a JSON file).
``--unpadded`` runs the calibration and held-out captions one at a time, so padding positions (which mean
pooling ignores) are not part of the fitted inputs.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the harness, run as a script or loaded by path

import harness  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from hyperplex import LowRankConfig, PHMConfig, compress  # noqa: E402
from hyperplex.convert.activation import capture_inputs, relative_output_error  # noqa: E402
from hyperplex.data.readers import read_lines  # noqa: E402
from hyperplex.models.pretrained_student import embed, tokenize  # noqa: E402
from hyperplex.pretrained import load_sentence_transformer  # noqa: E402

INITS = ("svd", "activation", "whitened", "whitened_als")
INCLUDE = "*encoder.layer*"
CALIBRATION, HELD_OUT = 64, 256


def captions(data: Path) -> tuple[list[str], list[str], list[str]]:
    """Calibration, held-out (both from train, val captions removed) and val captions."""
    val = [s for s in read_lines(data / "multi30k_en_de" / "val.en.gz") if s]
    held = set(val)
    train = [s for s in read_lines(data / "multi30k_en_de" / "train.en.gz") if s and s not in held]
    return train[:CALIBRATION], train[CALIBRATION:CALIBRATION + HELD_OUT], val


def encode(model: nn.Module, sentences: list[str], batch: int = 64) -> torch.Tensor:
    """``(N, E)`` normalised sentence embeddings."""
    with torch.inference_mode():
        return torch.cat([embed(model, tokenize(model, sentences[i:i + batch]))
                          for i in range(0, len(sentences), batch)])


def runner(model: nn.Module, sentences: list[str], unpadded: bool = False):
    """A ``calibrate`` callable: one forward pass over ``sentences`` as one padded batch (as ``hyperplex
    compress`` calibrates), or with ``unpadded`` one pass per sentence (no padding rows in the Gram matrices)."""
    if unpadded:
        single = [tokenize(model, [s]) for s in sentences]
        return lambda module: [module(dict(features)) for features in single]
    features = tokenize(model, sentences)
    return lambda module: module(dict(features))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--n", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--kinds", nargs="+", default=["phm", "lowrank"], choices=["phm", "lowrank"])
    parser.add_argument("--inits", nargs="+", default=list(INITS), choices=INITS)
    parser.add_argument("--als-sweeps", type=int, default=4)
    parser.add_argument("--ridge", type=float, default=None, help="λ of the whitened inits (default: the library's)")
    parser.add_argument("--eval", type=int, default=0, help="score on the first N val captions (0 = all)")
    parser.add_argument("--quick", action="store_true", help="n = 4 only and 256 val captions")
    parser.add_argument("--unpadded", action="store_true",
                        help="calibrate (and measure the layer error) one sentence at a time: no padding rows")
    harness.add_arguments(parser, device=False, threads=False)
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.eval = [4], args.eval or 256
    torch.set_num_threads(1)
    torch.manual_seed(0)

    teacher = load_sentence_transformer(args.model)
    calibration, held_out, val = captions(Path(args.data))
    if args.eval:
        val = val[:args.eval]
    layers = {name: m for name, m in teacher.named_modules() if isinstance(m, nn.Linear) and "encoder.layer." in name}
    held_factors = capture_inputs(teacher, layers, runner(teacher, held_out, args.unpadded))
    weights = {name: m.weight.detach().clone() for name, m in layers.items()}
    reference = encode(teacher, val)

    rows = []
    for n in args.n:
        for kind in args.kinds:
            for init in args.inits:
                student = copy.deepcopy(teacher)
                start = time.perf_counter()
                config: PHMConfig | LowRankConfig
                if kind == "phm":
                    config = PHMConfig(n=n, targets=INCLUDE, init=init, als_sweeps=args.als_sweeps, ridge=args.ridge)
                else:  # low-rank has no ALS sweeps
                    config = LowRankConfig(n=n, targets=INCLUDE, init=init, ridge=args.ridge)
                report = compress(student, config, calibrate=runner(student, calibration, args.unpadded))
                seconds = time.perf_counter() - start
                converted = dict(student.named_modules())
                errors = [relative_output_error(weights[name], converted[name].dense_weight(), held_factors[name])
                          for name in weights]
                cosine = float((encode(student, val) * reference).sum(-1).mean())
                rows.append({"n": n, "kind": kind, "init": init, "rank": report.converted[0].rank,
                             "weight_error": report.mean_relative_error, "layer_error": sum(errors) / len(errors),
                             "calibration_error": report.mean_output_error, "cosine": cosine, "fit_s": seconds})
                print(f"# n={n} {kind} {init}: weight error {report.mean_relative_error:.4f}, held-out layer error "
                      f"{rows[-1]['layer_error']:.4f}, cosine {cosine:.4f}, {seconds:.1f} s", file=sys.stderr,
                      flush=True)
                del student

    batching = " (one at a time)" if args.unpadded else " (one padded batch)"
    title = (f"all-MiniLM-L6-v2, {len(layers)} layers ({INCLUDE}) converted, no healing; calibration: the first "
             f"{len(calibration)} Multi30k train captions{batching}"
             f"; layer error on the next {len(held_out)}; cosine on {len(val)} val captions.")
    print(f"{title} {harness.header(harness.machine())}\n")
    print("| n | kind | init | rank | weight error | layer error (held-out) | layer error (calibration) "
          "| cosine to teacher | fit s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']} | {r['kind']} | {r['init']} | {r['rank'] or ''} | {r['weight_error']:.4f} "
              f"| {r['layer_error']:.4f} | {r['calibration_error']:.4f} | {r['cosine']:.4f} | {r['fit_s']:.1f} |")
    if args.out:
        harness.write_json(args.out, {"title": title, "rows": rows},
                           command=harness.command_line(argv, "benchmarks/probes/compare_inits.py"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
