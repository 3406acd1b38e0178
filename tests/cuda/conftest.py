"""The CUDA correctness tier: float32 and bf16-autocast outputs and gradients on a GPU against float64 references.

Tests that need a GPU carry the marker ``cuda`` (registered in pyproject.toml) and skip cleanly where CUDA is
absent, so CI (CPU-only) runs only their CPU variants, which check the same references on the CPU. Select the GPU
part with ``pytest tests/cuda -m cuda``; ``benchmarks/gpu/check.sh`` runs the whole folder on a lent GPU.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()


#: The devices a test runs on: the CPU always, CUDA where present (id ``cuda``, marker ``cuda``).
DEVICES = [pytest.param("cpu", id="cpu"),
           pytest.param("cuda", id="cuda", marks=[pytest.mark.cuda,
                                                  pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")])]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """Each test that takes ``device`` runs on the CPU and (where present) on CUDA."""
    return request.param


@pytest.fixture(params=DEVICES[1:])
def cuda_device(request) -> str:
    """``"cuda"``, for the tests that only mean something on a GPU (skipped without one)."""
    return request.param


@pytest.fixture(params=["fp32", "bf16"])
def precision(request) -> str:
    """``fp32``, or ``bf16`` autocast."""
    return request.param

#: ‖got − ref‖ / ‖ref‖ bounds against float64. float32 (TF32 off, PyTorch's default for matmuls): sums of at most a
#: few hundred terms, ~1e-6, bounded at 1e-4. bf16 autocast: operands rounded to bf16 (2⁻⁹ relative), outputs and
#: gradients through two or three such products: 1e-3 to 1e-2, bounded at 3e-2.
TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``‖got − want‖ / ‖want‖`` in float64 on the CPU; NaN or inf in ``got`` fails."""
    got = got.detach().double().cpu()
    assert torch.isfinite(got).all(), "non-finite values"
    want = want.detach().double().cpu()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def autocast(device: str, precision: str):
    """The context for ``precision``: ``fp32`` (none) or ``bf16`` (autocast on ``device``)."""
    if precision == "fp32":
        return torch.autocast(device, enabled=False)
    return torch.autocast(device, dtype=torch.bfloat16)


def randomize(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter drawn fresh (scaled like its fan-in), so no factor is zero and every gradient is non-trivial
    (adapters start with a zero factor)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            fan_in = p.shape[-1] if p.dim() > 1 else 1
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) / fan_in ** 0.5)
    return module


def compare_module(module: torch.nn.Module, x: torch.Tensor, device: str, precision: str, *, grads: bool = True,
                   forward=None, seed: int = 0) -> dict[str, float]:
    """Run ``module`` (float32) on ``device`` under ``precision`` and a float64 CPU copy of it; return the relative
    errors of the output and (with ``grads``) of the input's and every parameter's gradient of ``Σ out·g`` for a
    random ``g``. ``forward(module, x)`` replaces ``module(x)`` where given."""
    forward = forward or (lambda m, t: m(t))
    reference = copy.deepcopy(module).double().cpu()
    test = copy.deepcopy(module).to(device)
    x64 = x.detach().double().cpu().requires_grad_(grads)
    xt = x.detach().float().to(device).requires_grad_(grads)
    with torch.set_grad_enabled(grads):
        want = forward(reference, x64)
        with autocast(device, precision):
            got = forward(test, xt)
    errors = {"output": relative_error(got, want)}
    if grads:
        g = torch.randn(want.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
        (want * g).sum().backward()
        (got.float() * g.float().to(device)).sum().backward()
        errors["input.grad"] = relative_error(xt.grad, x64.grad)
        ref_params = dict(reference.named_parameters())
        for name, p in test.named_parameters():
            if ref_params[name].grad is not None:
                assert p.grad is not None, f"{name} got no gradient on {device}"
                errors[f"{name}.grad"] = relative_error(p.grad, ref_params[name].grad)
    return errors


def assert_within(errors: dict[str, float], precision: str) -> None:
    bad = {k: v for k, v in errors.items() if not v <= TOLERANCE[precision]}
    assert not bad, f"over the {precision} bound {TOLERANCE[precision]}: {bad}"


@pytest.fixture
def check():
    """The helpers above (fixtures, since test modules cannot import this conftest by name)."""
    return SimpleNamespace(TOLERANCE=TOLERANCE, relative_error=relative_error, autocast=autocast, randomize=randomize,
                           compare_module=compare_module, assert_within=assert_within)


@pytest.fixture(autouse=True)
def _the_fused_kernel_did_not_fall_back():
    """A CUDA test whose ``PHMLinear`` took the fused kernel in ``auto`` must not pass on PyTorch's fallback: the
    layer warns once and stays off the kernel after a failure (``triton_phm.give_up``), so the failure is made a
    failure of the test that met it."""
    from hyperplex.layers import triton_phm

    before = triton_phm.kernel_failed()
    yield
    after = triton_phm.kernel_failed()
    assert after == before, f"the fused Triton kernel failed in this test and auto fell back: {after}"
