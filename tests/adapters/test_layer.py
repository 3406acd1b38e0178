"""PHMDelta / PHMAdaptedLinear: structured ≡ merged ≡ Σ kron reference (values and gradients), exact
identity at init, merge → unmerge round trip."""

import pytest
import torch
from torch import nn

from hyperplex.adapters import PHMAdaptedLinear, PHMAdapterConfig, PHMDelta, adapter_parameter_count

RANKS = [None, 1, 3]


def random_delta(d, k, n, rank, scale=0.7, seed=0):
    """A float64 delta with every parameter random (at init ΔW = 0, which would test nothing)."""
    torch.manual_seed(seed)
    delta = PHMDelta(d, k, PHMAdapterConfig(n=n, rank=rank, scale=scale), dtype=torch.float64)
    with torch.no_grad():
        for p in delta.parameters():
            p.normal_()
    return delta


def kron_reference(delta: PHMDelta) -> torch.Tensor:
    """s · Σᵢ kron(Aᵢ, Sᵢ), with Sᵢ = Lᵢ Rᵢ (left[i] @ right[i]) written out per term for the low-rank
    case."""
    n = delta.config.n
    if delta.config.rank is None:
        blocks = [delta.weight[i] for i in range(n)]
    else:
        blocks = [delta.left[i] @ delta.right[i] for i in range(n)]
    return delta.config.scale * sum(torch.kron(delta.rule[i], blocks[i]) for i in range(n))


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("n,d,k", [(2, 8, 12), (4, 16, 8), (4, 32, 32), (8, 16, 24)])
def test_structured_equals_merged_equals_kron_reference_with_gradients(n, d, k, rank):
    rank = rank if rank is None else min(rank, min(d, k) // n)  # a block's rank at most (higher is refused)
    delta = random_delta(d, k, n, rank)
    x = torch.randn(3, 5, d, dtype=torch.float64)
    reference = kron_reference(delta)
    assert torch.allclose(delta.delta_weight(), reference, rtol=1e-12, atol=1e-12)
    g = torch.randn(3, 5, k, dtype=torch.float64)
    params = list(delta.parameters())
    outputs = {
        "structured": lambda: delta(x),
        "merged": lambda: x @ delta.delta_weight().T,
        "reference": lambda: x @ kron_reference(delta).T,
    }
    results = {}
    for key, fn in outputs.items():
        y = fn()
        results[key] = (y, torch.autograd.grad(y, params, g))
    y_ref, g_ref = results["reference"]
    for key in ("structured", "merged"):
        y, grads = results[key]
        assert torch.allclose(y, y_ref, rtol=1e-10, atol=1e-10), key
        for a, b in zip(grads, g_ref):
            assert torch.allclose(a, b, rtol=1e-10, atol=1e-10), key


@pytest.mark.parametrize("rank", RANKS)
def test_adapted_layer_equals_base_exactly_at_init_and_can_learn(rank):
    torch.manual_seed(1)
    base = nn.Linear(16, 24)
    layer = PHMAdaptedLinear(base)
    layer.adapters["a"] = PHMDelta(16, 24, PHMAdapterConfig(n=4, rank=rank))
    layer.active_adapter = "a"
    x = torch.randn(7, 16)
    assert torch.equal(layer(x), base(x))
    # ΔW = 0 exactly, yet the zeroed factor gets a non-zero gradient at the first step (as LoRA's B).
    delta = layer.adapters["a"]
    zero_factor = delta.weight if rank is None else delta.left
    assert torch.count_nonzero(zero_factor) == 0
    (grad,) = torch.autograd.grad(layer(x).square().sum(), zero_factor)
    assert grad.abs().sum() > 0


@pytest.mark.parametrize("rank", RANKS)
def test_parameter_count_formula(rank):
    delta = PHMDelta(32, 16, PHMAdapterConfig(n=4, rank=rank))
    assert sum(p.numel() for p in delta.parameters()) == adapter_parameter_count(32, 16, 4, rank)
    expected = 32 * 16 // 4 if rank is None else rank * (32 + 16)
    assert adapter_parameter_count(32, 16, 4, rank, rule=False) == expected


@pytest.mark.parametrize("rank", [None, 2])
def test_merge_folds_delta_and_unmerge_restores_weight(rank):
    torch.manual_seed(2)
    base = nn.Linear(16, 8)
    original = base.weight.detach().clone()
    layer = PHMAdaptedLinear(base)
    layer.adapters["a"] = random_delta(16, 8, 4, rank).float()
    layer.active_adapter = "a"
    x = torch.randn(4, 16)
    unmerged = layer(x)
    layer.merge()
    assert torch.allclose(base.weight, original + layer.adapters["a"].delta_weight(), atol=1e-6)
    assert torch.allclose(layer(x), unmerged, rtol=1e-5, atol=1e-5)  # the merged forward is base only
    with pytest.raises(RuntimeError, match="already merged"):
        layer.merge()
    layer.unmerge()
    assert torch.allclose(base.weight, original, rtol=0, atol=1e-6)
    assert torch.allclose(layer(x), unmerged, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="no adapter is merged"):
        layer.unmerge()


def test_wrapping_something_else_is_refused():
    with pytest.raises(TypeError, match="nn.Linear or transformers' Conv1D, got Embedding"):
        PHMAdaptedLinear(nn.Embedding(5, 4))
    with pytest.raises(ValueError, match="n=3 must divide in_features=16"):
        PHMDelta(16, 9, PHMAdapterConfig(n=3))
