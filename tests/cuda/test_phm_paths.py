"""Every PHMLinear forward path, LowRankLinear and the PHM adapters on the CPU and on CUDA, float32 and bf16
autocast, outputs and gradients against float64 references (bounds: ``TOLERANCE`` in this folder's conftest)."""

from __future__ import annotations

import pytest
import torch

from hyperplex.adapters import PHMAdapterConfig, add_adapter
from hyperplex.layers import LowRankLinear, PHMLinear, triton_phm
from hyperplex.layers.functional import materialize_weight, phm_linear_blocked, phm_linear_reference

NS = [2, 3, 4, 8, 16]
FIXED = {2: "complex", 4: "quaternion", 8: "octonion", 16: "sedenion"}
D, K = 96, 48  # divisible by every n above; a narrowing layer


def _layer(n: int, rule: str, seed: int, **kwargs) -> PHMLinear:
    torch.manual_seed(seed)
    if rule == "fixed":
        spec = FIXED.get(n)
        if spec is None:  # n = 3 has no algebra: a fixed custom rule tensor
            spec = torch.randn(n, n, n, generator=torch.Generator().manual_seed(seed))
    else:
        spec = "learned"
    return PHMLinear(D, K, n, rule=spec, **kwargs)


def _reference(layer: PHMLinear, x: torch.Tensor) -> torch.Tensor:
    bias = None if layer.bias is None else layer.bias.detach().double().cpu()
    return phm_linear_reference(x.double().cpu(), layer.phm_rule.detach().double().cpu(),
                                layer.phm_weight.detach().double().cpu(), bias)


@pytest.mark.parametrize("rule", ["learned", "fixed"])
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("mode", ["structured", "premixed", "materialized"])
def test_training_paths_outputs_and_gradients(device, precision, check, mode, n, rule):
    """The differentiable paths, as a training step runs them: output, and gradients of x, Sᵢ, Aᵢ (learned) and b."""
    layer = _layer(n, rule, seed=n, forward_mode=mode)
    x = torch.randn(2, 7, D, generator=torch.Generator().manual_seed(10 + n))
    errors = check.compare_module(layer, x, device, precision, seed=n)
    assert ("phm_rule.grad" in errors) == (rule == "learned") and "phm_weight.grad" in errors
    check.assert_within(errors, precision)


@pytest.mark.parametrize("rule", ["learned", "fixed"])
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("mode", ["structured", "premixed", "materialized", "cached", "auto"])
@pytest.mark.parametrize("rows", [1, 64, 300])
def test_inference_paths_outputs(device, precision, check, mode, n, rule, rows):
    """Inference (no gradient): the same paths, the cached ``H`` and ``auto`` (which on CUDA takes the fused Triton
    kernel only for half-precision factors, so here, in float32 and under autocast, PyTorch's paths)."""
    layer = _layer(n, rule, seed=100 + n, forward_mode="materialized" if mode == "cached" else mode,
                   cache_dense=mode == "cached").eval().to(device)
    x = torch.randn(rows, D, generator=torch.Generator().manual_seed(rows + n)).to(device)
    with torch.no_grad(), check.autocast(device, precision):
        got = layer(x)
        if mode == "cached":
            assert layer.cached_bytes == K * D * 4
            got = layer(x)  # the second call reads the kept H
    check.assert_within({"output": check.relative_error(got, _reference(layer, x))}, precision)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("n", NS)
def test_auto_takes_the_triton_kernel_on_cuda_in_half_precision_at_few_rows(cuda_device, check, monkeypatch, n,
                                                                             dtype):
    """On CUDA in inference with ``rows·n`` ≤ 64 and half-precision factors ``auto`` hands the call to the fused
    kernel (when Triton is installed), and the result matches float64; float32, more rows, or a gradient to record
    keep it on PyTorch's paths, with the same result."""
    pytest.importorskip("triton")
    calls = []
    real = triton_phm.triton_phm_linear
    monkeypatch.setattr(triton_phm, "triton_phm_linear", lambda *a, **k: calls.append(1) or real(*a, **k))
    layer = _layer(n, "learned", seed=n).to(cuda_device, dtype)
    precision = "fp32" if dtype == torch.float32 else "bf16"
    rows = triton_phm.TRITON_MAX_ROWS_N // n
    x = torch.randn(rows, D, device=cuda_device, dtype=dtype)
    with torch.no_grad():
        got = layer(x)
        assert calls == ([] if dtype == torch.float32 else [1]) and got.dtype == dtype
        check.assert_within({"output": check.relative_error(got, _reference(layer, x))}, precision)
        more = torch.randn(rows + 1, D, device=cuda_device, dtype=dtype)
        taken = len(calls)
        check.assert_within({"output": check.relative_error(layer(more), _reference(layer, more))}, precision)
        assert len(calls) == taken
    layer(x)  # with weight gradients: the differentiable paths, not the kernel
    assert len(calls) == taken


@pytest.mark.parametrize("n", NS)
def test_blocked_path_on_the_cpu_and_refused_on_cuda(device, check, n):
    """``phm_linear_blocked`` is a CPU path: exact there, refused by name for a CUDA tensor; a PHMLinear on CUDA
    forms ``H`` whole instead (checked by the inference test above)."""
    layer = _layer(n, "learned", seed=200 + n).to(device)
    x = torch.randn(5, D, device=device)
    with torch.no_grad():
        if device == "cpu":
            got = phm_linear_blocked(x, layer.phm_rule, layer.phm_weight, layer.bias)
            check.assert_within({"output": check.relative_error(got, _reference(layer, x))}, "fp32")
        else:
            with pytest.raises(ValueError, match="phm_linear_blocked runs on the CPU only, got a tensor on cuda"):
                phm_linear_blocked(x, layer.phm_rule, layer.phm_weight, layer.bias)


def test_lowrank_outputs_and_gradients(device, precision, check):
    torch.manual_seed(3)
    layer = LowRankLinear(D, K, rank=12)
    x = torch.randn(4, 5, D, generator=torch.Generator().manual_seed(3))
    errors = check.compare_module(layer, x, device, precision)
    assert {"left.grad", "right.grad", "bias.grad"} <= set(errors)
    check.assert_within(errors, precision)


@pytest.mark.parametrize("rank", [None, 4], ids=["full", "rank4"])
@pytest.mark.parametrize("shared_rule", [False, True], ids=["own_rule", "shared_rule"])
def test_adapters_outputs_and_gradients(device, precision, check, rank, shared_rule):
    """A frozen two-layer model with PHM delta adapters (full and low-rank Sᵢ, own and shared rules): outputs and
    the adapters' gradients (every factor drawn fresh, so no gradient is trivially zero)."""
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(D, K), torch.nn.GELU(), torch.nn.Linear(K, D))
    add_adapter(model, "a", PHMAdapterConfig(n=4, rank=rank, targets=["0", "2"], scale=0.5, shared_rule=shared_rule))
    check.randomize(model, seed=4)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable
    x = torch.randn(6, D, generator=torch.Generator().manual_seed(4))
    errors = check.compare_module(model, x, device, precision)
    assert {f"{name}.grad" for name in trainable} <= set(errors)
    check.assert_within(errors, precision)


def test_materialized_weight_on_device_equals_the_kronecker_sum(device, check):
    layer = _layer(4, "learned", seed=9).to(device)
    want = sum(torch.kron(layer.phm_rule[i].double().cpu(), layer.phm_weight[i].double().cpu()) for i in range(4))
    assert check.relative_error(materialize_weight(layer.phm_rule, layer.phm_weight), want) < 1e-6
