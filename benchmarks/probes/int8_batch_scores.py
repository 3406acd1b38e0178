"""How much an int8 encoder's quality scores move with the encode batch: all-MiniLM-L6-v2 in float and int8
(``hyperplex.quantize``, PyTorch's dynamic int8: one activation scale per call, over the whole batch and its
padding), scored like the MiniLM plans (teacher agreement on Tatoeba dev, WikiQA dev MAP, the SST-2 probe) with
``sentence-transformers``' ``encode`` at several batch sizes. The scorers now encode an int8 model one sentence per
forward (``hyperplex.int8.layers.has_int8_layers``); this probe bypasses that to show why.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/probes/int8_batch_scores.py --data-root ../shared/data
    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/probes/int8_batch_scores.py --batches 1 64

Needs the ``pretrained`` extra and the data root's ``tatoeba_en_fr``, ``wikiqa`` and ``sst2`` folders.
"""

from __future__ import annotations

import argparse
import os

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", default=os.environ.get("HYPERPLEX_DATA", "../shared/data"),
                        help="folder with tatoeba_en_fr/, wikiqa/ and sst2/ "
                        "(default: $HYPERPLEX_DATA or ../shared/data)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 32, 64, 128],
                        help="encode batch sizes to score the int8 model at (default: 1 16 32 64 128)")
    args = parser.parse_args(argv)
    if any(b < 1 for b in args.batches):
        parser.error("--batches: every batch size must be ≥ 1")
    from hyperplex.int8 import quantize
    from hyperplex.pretrained import load_sentence_transformer
    from hyperplex.scoring.quality import score_embedder, teacher_agreement

    torch.set_num_threads(1)
    root = args.data_root
    teacher = load_sentence_transformer("minilm")
    student = quantize(load_sentence_transformer("minilm"))
    agreement = teacher_agreement(teacher, "minilm", os.path.join(root, "tatoeba_en_fr", "dev.en.gz"), 0, 64)
    wikiqa = {"path": os.path.join(root, "wikiqa", "dev.jsonl.gz")}
    sst2 = {"path": os.path.join(root, "sst2", "train.tsv.gz"), "train_size": 2000, "test_size": 1000,
            "split_seed": 0, "C": 1.0, "carve": "sentences"}

    def embedder(model, batch_size):  # sentence_transformer_embedder without its one-sentence rule for int8
        return lambda sentences: model.encode(list(sentences), batch_size=batch_size, convert_to_tensor=True,
                                              show_progress_bar=False).detach().cpu().float()

    print(f"torch {torch.__version__}, one thread; agreement = mean cosine to the float teacher")
    print("| model | encode batch | agreement | WikiQA MAP | SST-2 probe |\n|---|---:|---:|---:|---:|")
    rows = [("float", 64, teacher)] + [("int8", b, student) for b in args.batches]
    for name, batch, model in rows:
        scores, _ = score_embedder(embedder(model, batch), agreement, wikiqa, sst2, max(64, batch))
        print(f"| {name} | {batch} | {scores['agreement']:.4f} | {scores['wikiqa_map']:.4f} | "
              f"{scores['sst2_probe']:.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
