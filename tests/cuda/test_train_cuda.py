"""The trainer's GPU-only paths, which the convergence runs take on a lent GPU: a run resumed on CUDA (its
checkpoint read on the CPU, the fused optimiser's moments and step counters moved onto the parameters' device)
continues the uninterrupted run; compiled training follows eager training without recompiling; bf16 autocast
training with greedy validation runs and follows the float32 curve; the best checkpoint is scored on CUDA with beam
search."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch


def _curve(model_dir, split="train", name="loss"):
    with open(model_dir / "metrics.csv", newline="") as f:
        rows = [row for row in csv.DictReader(f) if row["split"] == split and row["name"] == name]
    return [float(row["value"]) for row in sorted(rows, key=lambda row: int(row["step"]))]


def test_a_run_resumed_on_cuda_continues_the_uninterrupted_one(cuda_device, tmp_path):
    """12 steps, then a resume with the budget raised to 24, against 24 steps at once, dropout off: the same losses
    at every step and the same weights, to rounding (CUDA's backward kernels are not bitwise deterministic)."""
    from conftest import write_tiny_config

    from hyperplex.train.checkpoint import load_model_weights
    from hyperplex.train.run import train

    config = write_tiny_config(tmp_path)
    common = [f"--training.device={cuda_device}", "--model.dropout=0.0"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(str(config), overrides=common, model_dir=str(straight))
    train(str(config), overrides=[*common, "--training.max_steps=12"], model_dir=str(resumed))
    train(str(config), overrides=[*common, "--training.max_steps=24"], model_dir=str(resumed), resume=True)
    a, b = _curve(straight), _curve(resumed)
    assert len(a) == len(b) == 24
    assert max(abs(x - y) / abs(x) for x, y in zip(a, b)) <= 1e-4, (a, b)
    wa, wb = load_model_weights(straight / "last.safetensors"), load_model_weights(resumed / "last.safetensors")
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wb[key], wa[key], rtol=1e-4, atol=1e-5, msg=key)


def test_optimizer_state_after_a_cuda_resume_is_where_the_fused_update_reads_it(cuda_device, tmp_path):
    """On CUDA the trainer's Adam is torch's fused one (one kernel per update); after ``_restore`` its moments and
    its step counters are on the GPU with their parameters, where that kernel reads them (no host sync)."""
    from conftest import write_tiny_config

    from hyperplex.train.run import train

    config = write_tiny_config(tmp_path, max_steps=4, validation_every=4)
    folder = tmp_path / "run"
    overrides = [f"--training.device={cuda_device}"]
    train(str(config), overrides=overrides, model_dir=str(folder))
    captured = {}
    original = torch.optim.Optimizer.load_state_dict

    def spy(self, state_dict):
        original(self, state_dict)
        captured["optimizer"] = self

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.optim.Optimizer, "load_state_dict", spy)
        train(str(config), overrides=[*overrides, "--training.max_steps=6"], model_dir=str(folder), resume=True)
    optimizer = captured["optimizer"]
    assert optimizer.defaults["fused"] is True
    states = list(optimizer.state.values())
    assert states and all(s["exp_avg"].is_cuda and s["exp_avg_sq"].is_cuda and s["step"].is_cuda for s in states)
    assert all(float(s["step"]) == 6 for s in states)


def test_compiled_bf16_training_follows_the_eager_curve_without_recompiling(cuda_device, tmp_path):
    """``training.compile`` on CUDA under bf16 autocast, as ``converge.sh`` trains the plans' models on a GPU: token
    batches of varying rows and lengths through a PHM n = 4 Transformer compile once (dynamic shapes). On the CPU the
    same run recompiles, because the CPU's path rule compares the row count with limits these batches cross; on CUDA
    training takes one path at every row count, so nothing guards on a size. The losses follow the eager run's
    within 5% (dropout off; the compiled kernels' bf16 sums round differently)."""
    from hyperplex.train.run import train

    config = Path(__file__).resolve().parents[2] / "configs" / "arithmetic_transformer.yaml"
    common = [f"--training.device={cuda_device}", "--model.dropout=0.0", "--training.precision=bf16",
              "--model.linear.kind=phm", "--model.linear.n=4", "--training.max_steps=30", "--training.log_every=1",
              "--training.validation_every=30", "--training.batch_type=token", "--training.batch_size=600",
              "--training.progress_bar=false", "--training.plots=false"]
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    train(str(config), overrides=common, model_dir=str(eager))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):  # a guard that fails raises instead of recompiling
        train(str(config), overrides=[*common, "--training.compile=true"], model_dir=str(compiled))
    a, b = _curve(eager), _curve(compiled)
    assert len(a) == len(b) == 30 and all(math.isfinite(x) for x in b)
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    assert worst <= 0.05, f"compiled loss curve differs by up to {worst:.1%}: {a} vs {b}"


def test_bf16_training_with_greedy_validation_follows_the_float32_curve(cuda_device, tmp_path):
    """``training.precision=bf16`` (the base rows of the convergence plan): 24 steps with two greedy validations
    run, every loss finite and within 10% of the float32 run's (bf16 rounds the products to 8 bits)."""
    from conftest import write_tiny_config

    from hyperplex.train.run import train

    config = write_tiny_config(tmp_path)
    curves = {}
    for precision in ("fp32", "bf16"):
        folder = tmp_path / precision
        train(str(config), model_dir=str(folder), overrides=[f"--training.device={cuda_device}",
                                                             "--model.dropout=0.0",
                                                             f"--training.precision={precision}"])
        curves[precision] = _curve(folder)
        assert len(_curve(folder, "dev", "bleu")) == 2
    fp32, bf16 = curves["fp32"], curves["bf16"]
    assert len(fp32) == len(bf16) == 24 and all(math.isfinite(x) for x in bf16)
    worst = max(abs(a - b) / abs(a) for a, b in zip(fp32, bf16))
    assert worst <= 0.10, f"bf16 loss curve differs by up to {worst:.1%}: {fp32} vs {bf16}"


def test_best_checkpoint_scored_with_beam_search_on_cuda_as_on_the_cpu(cuda_device, tmp_path):
    """A model trained on CUDA, its best checkpoint loaded there and scored with beam 4, then on the CPU: the same
    BLEU to rounding (the GPU's float32 sums may reorder a near tie between two beams, hence one point)."""
    from conftest import write_tiny_config

    from hyperplex.inference.load import load_model
    from hyperplex.train.run import train

    config = write_tiny_config(tmp_path)
    folder = tmp_path / "run"
    train(str(config), overrides=[f"--training.device={cuda_device}"], model_dir=str(folder))
    cfg, task, model = load_model(str(folder))  # where it was trained: the GPU
    assert next(model.parameters()).device.type == "cuda"
    on_gpu = task.validate(model, beam_size=4)["bleu"]
    on_cpu = task.validate(model.to("cpu"), beam_size=4)["bleu"]
    assert abs(on_gpu - on_cpu) <= 1.0, (on_gpu, on_cpu)


def test_an_fp16_resume_goes_on_with_the_saved_loss_scale(cuda_device, tmp_path):
    """fp16's GradScaler is resumable state: 6 steps then a resume to 12 end with the uninterrupted run's scaler
    state (its scale and growth tracker, which a fresh scaler would restart at 65536 and 0)."""
    from conftest import write_tiny_config

    from hyperplex.train.checkpoint import load_checkpoint
    from hyperplex.train.run import train

    config = write_tiny_config(tmp_path, max_steps=12, validation_every=6)
    common = [f"--training.device={cuda_device}", "--training.precision=fp16", "--model.dropout=0.0"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(str(config), overrides=common, model_dir=str(straight))
    train(str(config), overrides=[*common, "--training.max_steps=6"], model_dir=str(resumed))
    halfway = load_checkpoint(resumed / "last.safetensors").extra["grad_scaler"]
    assert halfway["_growth_tracker"] > 0 or halfway["scale"] != 65536.0
    train(str(config), overrides=[*common, "--training.max_steps=12"], model_dir=str(resumed), resume=True)
    a = load_checkpoint(straight / "last.safetensors").extra["grad_scaler"]
    b = load_checkpoint(resumed / "last.safetensors").extra["grad_scaler"]
    assert a == b, (a, b)
