#!/usr/bin/env python
"""Training and greedy-decoding speed of the Transformer family, as ratios to the Transformer (PHM Table 3).

Usage (from the repository root)::

    PYTHONPATH=src python benchmarks/bench_transformer.py --quick              # seconds, smoke test
    PYTHONPATH=src python benchmarks/bench_transformer.py                      # CPU-sized default
    PYTHONPATH=src python benchmarks/bench_transformer.py --device cuda --d-model 512 --heads 8 \\
        --d-ff 2048 --layers 6 --batch 64 --vocab 32000                        # the paper's Base shape

Models (same config except ``linear``): ``transformer`` (dense, the baseline), ``quaternion`` (full,
fixed Hamilton rule; attention ``--quaternion-attention``, default ``hamilton`` = Tay et al. eq. 4),
``phm4`` and ``phm8`` (learned rules, dot-product attention).

Measured, on random token batches (speed does not depend on the data):

- ``train s/100``: seconds per 100 training steps (forward, label-smoothed cross-entropy, backward,
  Adam step; batch ``--batch`` × ``--src-len``/``--tgt-len`` tokens), extrapolated from ``--steps``.
- ``decode s``: seconds to greedily decode ``--sentences`` fixed sentences at batch 1 through the
  KV-cached ``decode_step``, always ``--decode-len`` steps (no EOS stop, so every model emits the same
  number of tokens whatever its random weights say); ``tok/s`` = tokens / time.

Method: one warm-up of each measurement per model, then ``--repeats`` rounds; in every round the
models run one after another in rotating order, and a ratio is the median over rounds of (model time
/ Transformer time in the same round). Times are medians over rounds. Ratios below 1 are faster;
the decoding column ``× tok/s`` is the inverse (above 1 is faster). Targets: PHM n=4 and
n=8 training ≤ 1.10× the Transformer; batch-1 greedy decoding ≥ 1.2× its tokens/s at d_model 512.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from hyperplex.models.params import parameter_breakdown
from hyperplex.models.transformer import TransformerConfig, TransformerTranslator
from hyperplex.nn import LinearSpec

BOS, PAD = 2, 0


def build_models(args) -> dict[str, TransformerTranslator]:
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
        models[name] = TransformerTranslator(config, args.vocab, args.vocab).to(args.device)
    return models


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def make_train_step(model, args):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, args.vocab, (args.batch, args.src_len), generator=g).to(args.device)
    tgt = torch.randint(4, args.vocab, (args.batch, args.tgt_len + 1), generator=g).to(args.device)
    tgt[:, 0] = BOS
    lengths = torch.full((args.batch,), args.src_len, device=args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def run(steps: int) -> float:
        model.train()
        sync(args.device)
        start = time.perf_counter()
        for _ in range(steps):
            logits = model(src, lengths, tgt[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD, label_smoothing=0.1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        sync(args.device)
        return (time.perf_counter() - start) * 100 / steps  # seconds per 100 steps
    return run


def make_decode(model, args):
    g = torch.Generator().manual_seed(2)
    sentences = [torch.randint(4, args.vocab, (1, args.src_len), generator=g).to(args.device)
                 for _ in range(args.sentences)]
    lengths = torch.full((1,), args.src_len, device=args.device)

    @torch.inference_mode()
    def run() -> float:
        model.eval()
        sync(args.device)
        start = time.perf_counter()
        for src in sentences:
            state = model.encode(src, lengths)
            prev = torch.full((1,), BOS, device=args.device)
            for step in range(args.decode_len):
                log_probs, state, _ = model.decode_step(prev, state, step)
                prev = log_probs.argmax(-1)
        sync(args.device)
        return time.perf_counter() - start
    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes and few repeats (a smoke test, seconds)")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--layers", type=int, default=2, help="encoder and decoder layers each")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--src-len", type=int, default=24)
    p.add_argument("--tgt-len", type=int, default=24)
    p.add_argument("--steps", type=int, default=20, help="training steps timed per round (reported per 100)")
    p.add_argument("--sentences", type=int, default=10, help="sentences decoded per round (batch 1)")
    p.add_argument("--decode-len", type=int, default=24, help="greedy steps per sentence")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds; medians are taken over them")
    p.add_argument("--quaternion-attention", choices=["hamilton", "dot"], default="hamilton")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave PyTorch's default)")
    args = p.parse_args(argv)
    if args.quick:
        args.d_model, args.heads, args.d_ff, args.layers, args.vocab = 64, 4, 256, 1, 1000
        args.batch, args.src_len, args.tgt_len, args.steps = 8, 12, 12, 5
        args.sentences, args.decode_len, args.repeats = 3, 8, 3
    if args.threads:
        torch.set_num_threads(args.threads)

    models = build_models(args)
    names = list(models)
    train = {name: make_train_step(m, args) for name, m in models.items()}
    decode = {name: make_decode(m, args) for name, m in models.items()}
    for name in names:  # warm-up
        train[name](1)
        decode[name]()
    times = {(name, kind): [] for name in names for kind in ("train", "decode")}
    for round_ in range(args.repeats):
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        for name in order:
            times[name, "train"].append(train[name](args.steps))
            times[name, "decode"].append(decode[name]())

    def ratio(name, kind):
        base = times["transformer", kind]
        return statistics.median(t / b for t, b in zip(times[name, kind], base))

    tokens = args.sentences * args.decode_len
    print(f"# bench_transformer: d_model={args.d_model} heads={args.heads} d_ff={args.d_ff} layers={args.layers}+"
          f"{args.layers} vocab={args.vocab} batch={args.batch} len={args.src_len}/{args.tgt_len} device={args.device} "
          f"threads={torch.get_num_threads()} repeats={args.repeats} torch={torch.__version__}")
    print(f"# decoding: {args.sentences} sentences × {args.decode_len} greedy steps at batch 1 (KV cache)\n")
    print("| model | params (no emb.) | train s/100 | × train | decode s | tok/s | × tok/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        params = parameter_breakdown(models[name])["total_without_embeddings"]
        t_train = statistics.median(times[name, "train"])
        t_dec = statistics.median(times[name, "decode"])
        print(f"| {name} | {params:,} | {t_train:.3f} | {ratio(name, 'train'):.3f} | {t_dec:.3f} | "
              f"{tokens / t_dec:.1f} | {1 / ratio(name, 'decode'):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
