#!/usr/bin/env python
"""Training and decoding speed of the Transformer family, as ratios to the Transformer (the PHM paper's Table 3).

Usage (from the repository root)::

    PYTHONPATH=src python benchmarks/bench_transformer.py --quick              # seconds, smoke test
    PYTHONPATH=src python benchmarks/bench_transformer.py                      # the small shape: 2+2, d 256
    PYTHONPATH=src python benchmarks/bench_transformer.py --shape base --device cuda --bf16 --out t3.json
                                                                               # the base shape: 6+6 layers, d 512
    PYTHONPATH=src python benchmarks/bench_transformer.py --shape base --device cuda --batch 256 --vocab 8000 \
        --src-len 15 --tgt-len 16 --decode-len 16 --set-sentences 1014         # + a validation set's decoding time

Models (same config except ``linear``): ``transformer`` (dense, the baseline), ``quaternion`` (full,
fixed Hamilton rule; attention ``--quaternion-attention``, default ``hamilton`` = Tay et al. eq. 4),
``phm4`` and ``phm8`` (learned rules, dot-product attention). Shapes (explicit size options override them):
``cpu``, the default, is the small shape, 2 encoder and 2 decoder layers, d_model 256, 4 heads, d_ff 1024: the shape
the paper's App. B.2 gives for IWSLT'14 De-En, the corpus its Table 3 was timed on; ``base`` is Transformer Base,
6 + 6 layers, d_model 512, 8 heads, d_ff 2048, the size of the paper's Table 2 parameter column (44M) and of the
``base_*`` rows of ``experiments/multi30k_converged.yaml`` (``table3``, its earlier name, is accepted).

Measured, on random token batches (speed does not depend on the data):

- ``train s/100``: seconds per 100 training steps (forward, label-smoothed cross-entropy, backward,
  Adam step, the trainer's: fused on CUDA; batch ``--batch`` × ``--src-len``/``--tgt-len`` tokens), from
  ``--steps`` steps per round.
- ``decode s``: seconds to decode ``--sentences`` fixed sentences one at a time with the library's search
  (:func:`hyperplex.models.search.decode`: beam ``--beam``, default 4, length penalty α ``--alpha``, default 0.6;
  ``--beam 1`` is greedy), always ``--decode-len`` steps (end-of-sentence is masked, so every model emits the same
  number of tokens whatever its random weights say); ``tok/s`` = tokens / time.
- ``set s`` (with ``--set-sentences N``): seconds to decode ``N`` sentences ``--set-batch`` at a time, each
  batch with the same search and ``--decode-len`` steps: the paper's "seconds to decode the test set", on an input of
  a set's size (Multi30k's validation split: 1,014 sentences of 14.5 source and 15.3 target BPE tokens on average
  with the plans' joint 8k BPE, so ``--set-sentences 1014 --src-len 15 --decode-len 16``); ``× set`` is the
  Transformer's time over the model's (above 1 is faster).
- ``--formation``: how a training step forms the PHM layers' ``H`` (default ``auto``, the trainer's; ``per-layer``
  and ``together`` compare the two forms on any device).
- ``--compile``: each model's training step also through ``torch.compile`` (``training.compile`` of the
  trainer), timed in the same rounds as the eager steps; a second table gives its time per 100 steps and its ratio
  to the same model's eager step (below 1: compilation pays). The compilation itself happens in the untimed
  warm-up and is reported as ``compile s``.
- ``peak MiB``: peak memory of one training step above what the step before it left held (the model, the
  optimizer state, the gradients; CUDA: the allocator's peak; CPU: the profiler's allocation events), measured on
  the second step, after an untimed one that creates the optimizer state and the BLAS workspaces.

Method (``benchmarks/harness.py``): one warm-up of each measurement per model, then ``--repeats`` interleaved
rounds, the order rotating; a ratio is the median over rounds of (model time / Transformer time in the same round).
Times are medians over rounds; ``spread`` is (max − min) / median of the training rounds. Ratios below 1 are
faster; the decoding column ``× tok/s`` is the inverse (above 1 is faster). On CUDA the times come from CUDA events;
``--bf16`` runs training and decoding under bf16 autocast. Targets: PHM n=4 and n=8 training ≤ 1.10× the
Transformer; batch-1 decoding ≥ 1.2× its tokens/s at d_model 512.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from hyperplex.layers import shared_weights, training_step_weights
from hyperplex.models.params import parameter_breakdown
from hyperplex.models.search import decode
from hyperplex.models.transformer import TransformerConfig, TransformerTranslator
from hyperplex.nn import LinearSpec
from hyperplex.train.optim import build_optimizer

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the harness, run as a script or loaded by path
import harness  # noqa: E402

BOS, PAD = 2, 0
#: Size presets: the small shape (the default; App. B.2's De-En shape), Transformer Base and the smoke test.
SHAPES = {"cpu": dict(d_model=256, heads=4, d_ff=1024, layers=2),
          "base": dict(d_model=512, heads=8, d_ff=2048, layers=6),
          "quick": dict(d_model=64, heads=4, d_ff=256, layers=1)}
QUICK_RUN = dict(vocab=1000, batch=8, src_len=12, tgt_len=12, steps=5, sentences=3, decode_len=8, repeats=3)
RUN = dict(vocab=8000, batch=32, src_len=24, tgt_len=24, steps=20, sentences=10, decode_len=24, repeats=5)


def build_models(args, device) -> dict[str, TransformerTranslator]:
    """The four models of the table, seeded alike, on ``device`` (EOS masked in decoding: every model runs
    ``--decode-len`` steps)."""
    variants = {
        "transformer": dict(linear=LinearSpec("dense")),
        "quaternion": dict(linear=LinearSpec("quaternion"), attention_type=args.quaternion_attention),
        "phm4": dict(linear=LinearSpec("phm", n=4)),
        "phm8": dict(linear=LinearSpec("phm", n=8)),
    }
    models = {}
    for name, kw in variants.items():
        config = TransformerConfig(d_model=args.d_model, num_heads=args.heads, d_ff=args.d_ff,
                                   encoder_layers=args.layers, decoder_layers=args.layers, dropout=0.1,
                                   max_positions=max(args.src_len, args.tgt_len, args.decode_len) + 1, **kw)
        torch.manual_seed(0)
        models[name] = mask_eos(TransformerTranslator(config, args.vocab, args.vocab).to(device))
    return models


def mask_eos(model: TransformerTranslator) -> TransformerTranslator:
    """``model`` whose ``decode_step`` never lets EOS win (its log-probability ``-inf``), so that a search runs to
    its step limit whatever the random weights say."""
    step = model.decode_step

    def decode_step(prev, state, t):
        log_probs, state, attention = step(prev, state, t)  # log_probs (N, V)
        return log_probs.index_fill(-1, torch.tensor([model.eos_index], device=log_probs.device),
                                    float("-inf")), state, attention

    model.__dict__["decode_step"] = decode_step  # an instance attribute, read before the class's method
    return model


def autocast(args, device):
    """bf16 autocast where ``--bf16`` asks for it, else nothing."""
    if args.bf16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train_step(model, args, device, compiled: bool = False):
    """One training step of ``model`` on a fixed random batch ``src (batch, src_len)``, ``tgt (batch, tgt_len + 1)``;
    ``compiled``: the forward (and so the backward) pass through ``torch.compile``, the optimizer step eager."""
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, args.vocab, (args.batch, args.src_len), generator=g).to(device)
    tgt = torch.randint(4, args.vocab, (args.batch, args.tgt_len + 1), generator=g).to(device)
    tgt[:, 0] = BOS
    lengths = torch.full((args.batch,), args.src_len, device=device)
    # the trainer's optimiser: torch's fused Adam on CUDA, its default on the CPU
    optimizer = build_optimizer(model.parameters(), "adam", lr=1e-4, fused=device.type == "cuda")
    forward = torch.compile(model) if compiled else model

    def step() -> None:
        model.train()
        optimizer.zero_grad(set_to_none=True)
        with contextlib.ExitStack() as weights:  # as the trainer: H formed under autocast, held through backward
            with autocast(args, device):
                if not compiled:
                    weights.enter_context(step_weights(model, args.formation))
                logits = forward(src, lengths, tgt[:, :-1])
                loss = F.cross_entropy(logits.float().flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD,
                                       label_smoothing=0.1)
            loss.backward()
        optimizer.step()
    return step


def step_weights(model, formation: str) -> contextlib.AbstractContextManager:
    """How a training step's PHM layers form ``H``: ``auto``, what the trainer does
    (:func:`hyperplex.layers.training_step_weights`: batched per group of same-shaped layers on CUDA, each layer its
    own path on the CPU); ``per-layer``; ``together`` (batched on any device, to compare on the CPU)."""
    if formation == "auto":
        return training_step_weights(model)
    if formation == "together":
        return shared_weights(model, 0, always=True, together=True)
    return contextlib.nullcontext()


def decoder(model, args, device):
    """Decoding of ``--sentences`` fixed random sentences ``(1, src_len)`` one at a time (beam ``--beam``)."""
    return batched_decoder(model, args, device, args.sentences, 1, seed=2)


def set_batches(sentences: int, batch: int) -> list[int]:
    """Sizes of the batches that decode ``sentences`` sentences ``batch`` at a time (the last one smaller)."""
    return [min(batch, sentences - start) for start in range(0, sentences, batch)]


def set_decoder(model, args, device):
    """Decoding of ``--set-sentences`` fixed random sentences ``(B, src_len)``, ``--set-batch`` at a time."""
    return batched_decoder(model, args, device, args.set_sentences, args.set_batch, seed=3)


def batched_decoder(model, args, device, sentences: int, batch: int, seed: int):
    """A function that decodes ``sentences`` fixed random sentences of ``--src-len`` tokens, ``batch`` at a time,
    with the library's search for ``--decode-len`` steps."""
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randint(4, args.vocab, (size, args.src_len), generator=g).to(device)
               for size in set_batches(sentences, batch)]
    lengths = [torch.full((src.shape[0],), args.src_len, device=device) for src in batches]

    @torch.inference_mode()
    def run() -> None:
        model.eval()
        with autocast(args, device):
            for src, length in zip(batches, lengths):
                decode(model, src, length, beam_size=args.beam, beam_alpha=args.alpha,
                       max_output_length=args.decode_len)
    return run


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes and few repeats (a smoke test, seconds)")
    p.add_argument("--shape", choices=[*SHAPES, "table3"],
                   help="size preset: cpu (default; 2+2 layers, d 256), base (6+6, d 512; table3 is its earlier name), "
                        "quick")
    p.add_argument("--d-model", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--d-ff", type=int)
    p.add_argument("--layers", type=int, help="encoder and decoder layers each")
    p.add_argument("--vocab", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--src-len", type=int)
    p.add_argument("--tgt-len", type=int)
    p.add_argument("--steps", type=int, help="training steps timed per round (reported per 100)")
    p.add_argument("--sentences", type=int, help="sentences decoded per round, one at a time")
    p.add_argument("--decode-len", type=int, help="decoding steps per sentence")
    p.add_argument("--beam", type=int, default=4, help="beam size (1: greedy; default 4)")
    p.add_argument("--alpha", type=float, default=0.6, help="length penalty α of the beam (default 0.6)")
    p.add_argument("--set-sentences", type=int, default=0,
                   help="also time decoding this many sentences in batches (a test set's size; default 0: not run)")
    p.add_argument("--set-batch", type=int, default=64, help="sentences per batch of --set-sentences (default 64)")
    p.add_argument("--repeats", type=int, help="interleaved rounds; medians are taken over them")
    p.add_argument("--quaternion-attention", choices=["hamilton", "dot"], default="hamilton")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast for training and decoding")
    p.add_argument("--formation", choices=["auto", "per-layer", "together"], default="auto",
                   help="how a training step forms the PHM layers' H: auto (the trainer's: batched per group of "
                        "same-shaped layers on CUDA, per layer on the CPU), per-layer, or together (batched anywhere)")
    p.add_argument("--compile", action="store_true",
                   help="also time each model's training step through torch.compile (a second table)")
    harness.add_arguments(p)
    args = p.parse_args(argv)
    shape = SHAPES[{"table3": "base"}.get(args.shape, args.shape) or ("quick" if args.quick else "cpu")]
    for key, value in {**shape, **(QUICK_RUN if args.quick else RUN)}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in ("d_model", "heads", "d_ff", "layers", "vocab", "batch", "src_len", "tgt_len", "steps", "sentences",
                "decode_len", "beam", "repeats", "set_batch"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be positive, not {getattr(args, key)}")
    if not 0 <= args.set_sentences <= 100_000:
        p.error(f"--set-sentences must be between 0 and 100000, not {args.set_sentences}")
    return args


def _progress(what: str, medians: dict[str, float]) -> None:
    print(f"# {what}: " + ", ".join(f"{name} {value:.3f}" for name, value in medians.items()), flush=True)


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns ``{"args", "rows": [{name, params, train_s_per_100, train_ratio, train_spread,
    decode_s, tokens_per_s, decode_speedup, peak_mib[, set_decode_s, set_speedup]}]}`` (also written to ``--out``)."""
    args = parse_args(argv)
    device = harness.setup(args)
    models = build_models(args, device)
    names = list(models)
    train = {name: train_step(m, args, device) for name, m in models.items()}
    if args.compile:  # the same weights, a second optimizer: each call is one whole training step all the same
        train.update({f"{name} compiled": train_step(m, args, device, compiled=True) for name, m in models.items()})
    # untimed in the rounds: the optimiser's state, the BLAS workspaces and any compilation are made here, so the
    # peak below is one step's own; this first step's time is reported as the compiled steps' `compile s`
    first_step_s = {name: harness.time_per_call(step, 1, device) for name, step in train.items()}
    peaks = {name: harness.peak_bytes(train[name], device) / harness.MiB for name in names}
    trained = harness.interleave(train, args.repeats, device=device, number=args.steps)
    # each phase's medians as soon as it ends: a run stopped by a time budget keeps the phases it finished
    _progress("training s/100 steps", {name: trained.median(name) * 100 for name in names})
    decoded = harness.interleave({name: decoder(m, args, device) for name, m in models.items()}, args.repeats,
                                 device=device)
    _progress("one-at-a-time decode s", {name: decoded.median(name) for name in names})
    whole_set = None
    if args.set_sentences:
        whole_set = harness.interleave({name: set_decoder(m, args, device) for name, m in models.items()},
                                       args.repeats, device=device)
    tokens = args.sentences * args.decode_len
    compiled = [{"name": name, "train_s_per_100": trained.median(f"{name} compiled") * 100,
                 "eager_s_per_100": trained.median(name) * 100,
                 "ratio_to_eager": trained.ratio(f"{name} compiled", name),
                 "train_ratio": trained.ratio(f"{name} compiled", "transformer"),
                 "spread": trained.spread(f"{name} compiled"), "compile_s": first_step_s[f"{name} compiled"]}
                for name in names] if args.compile else []
    rows = [{"name": name, "params": parameter_breakdown(models[name])["total_without_embeddings"],
             "train_s_per_100": trained.median(name) * 100, "train_ratio": trained.ratio(name, "transformer"),
             "train_spread": trained.spread(name), "decode_s": decoded.median(name),
             "tokens_per_s": tokens / decoded.median(name),
             "decode_speedup": 1 / decoded.ratio(name, "transformer"), "peak_mib": peaks[name],
             **({"set_decode_s": whole_set.median(name), "set_speedup": 1 / whole_set.ratio(name, "transformer")}
                if whole_set else {})} for name in names]
    info = harness.machine(device)
    print(f"# bench_transformer: d_model={args.d_model} heads={args.heads} d_ff={args.d_ff} layers={args.layers}+"
          f"{args.layers} vocab={args.vocab} batch={args.batch} len={args.src_len}/{args.tgt_len} device={device}"
          f"{' bf16' if args.bf16 else ''} repeats={args.repeats} formation={args.formation}")
    print(f"# {harness.header(info)}")
    print(f"# decoding: {args.sentences} sentences × {args.decode_len} steps one at a time, beam {args.beam}, "
          f"α {args.alpha:g} (KV cache)"
          + (f"; set: {args.set_sentences} sentences {args.set_batch} at a time" if whole_set else "") + "\n")
    extra = " set s | × set |" if whole_set else ""
    print("| model | params (no emb.) | train s/100 | × train | spread | decode s | tok/s | × tok/s | peak MiB |"
          + extra)
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if whole_set else ""))
    for r in rows:
        print(f"| {r['name']} | {r['params']:,} | {r['train_s_per_100']:.3f} | {r['train_ratio']:.3f} | "
              f"{r['train_spread']:.2f} | {r['decode_s']:.3f} | {r['tokens_per_s']:.1f} | {r['decode_speedup']:.3f} | "
              f"{r['peak_mib']:.1f} |" + (f" {r['set_decode_s']:.3f} | {r['set_speedup']:.3f} |" if whole_set else ""))
    if compiled:
        print("\nTraining through torch.compile (the same rounds; × eager: the model's compiled step over its eager "
              "one)\n")
        print("| model | train s/100 compiled | train s/100 eager | × eager | × transformer (eager) | spread "
              "| compile s |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in compiled:
            print(f"| {r['name']} | {r['train_s_per_100']:.3f} | {r['eager_s_per_100']:.3f} | "
                  f"{r['ratio_to_eager']:.3f} | {r['train_ratio']:.3f} | {r['spread']:.2f} | {r['compile_s']:.1f} |")
    result = {"args": vars(args), "rows": rows, **({"compiled": compiled} if compiled else {})}
    if args.out:
        command = harness.command_line(argv, "benchmarks/bench_transformer.py")
        harness.write_json(args.out, result, device, command=command)
    return result


if __name__ == "__main__":
    main()
