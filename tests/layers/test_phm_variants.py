"""PHMLinear's options beside the paper's layer: a rule shared by many layers (PHMRule), a learned rule started
from an algebra's table (rule_init) and low-rank Sᵢ = Lᵢ Rᵢ (factor_rank). Each against the Kronecker reference
H = Σᵢ kron(Aᵢ, Sᵢ) on every path it takes, with gradcheck, counts, errors and save/load."""

import dataclasses
import io

import pytest
import torch
from torch import nn

from hyperplex.algebra import algebra_rule
from hyperplex.layers import PHMLinear, PHMRule, phm_linear_lowrank, phm_parameter_count
from hyperplex.layers.conversion import copy_into_like, phm_from_linear
from hyperplex.layers.diffusion import DiffusionPHMLinear
from hyperplex.layers.functional import onednn_available
from hyperplex.layers.lowrank import matching_rank
from hyperplex.models.params import parameter_breakdown


def kron_reference(layer: PHMLinear, x: torch.Tensor) -> torch.Tensor:
    """``x Hᵀ + b`` with ``H = Σᵢ torch.kron(Aᵢ, Sᵢ)``, the ``Sᵢ`` formed as ``Lᵢ Rᵢ`` for low rank."""
    S = layer.phm_weight if layer.factor_rank is None else torch.stack(
        [layer.phm_left[i] @ layer.phm_right[i] for i in range(layer.n)])
    H = sum(torch.kron(layer.phm_rule[i], S[i]) for i in range(layer.n))
    return torch.nn.functional.linear(x, H, layer.bias)


def variants(dtype=torch.float64, d=24, k=16):
    """(name, layer) for every option, each alone and combined."""
    torch.manual_seed(0)
    shared = PHMRule(4, dtype=dtype)
    fixed_shared = PHMRule(4, init="quaternion", learn=False, dtype=dtype)
    return [
        ("shared", PHMLinear(d, k, 4, rule=shared, dtype=dtype)),
        ("shared_fixed", PHMLinear(d, k, 4, rule=fixed_shared, dtype=dtype)),
        ("rule_init", PHMLinear(d, k, 4, rule_init="quaternion", dtype=dtype)),
        ("rule_init_tensor", PHMLinear(d, k, 2, rule_init=algebra_rule("complex"), dtype=dtype)),
        ("low_rank", PHMLinear(d, k, 4, factor_rank=2, dtype=dtype)),
        ("low_rank_fixed", PHMLinear(d, k, 4, rule="quaternion", factor_rank=1, dtype=dtype)),
        ("low_rank_shared", PHMLinear(d, k, 4, rule=shared, factor_rank=3, dtype=dtype)),
        ("low_rank_rule_init", PHMLinear(d, k, 8, rule_init="octonion", factor_rank=1, dtype=dtype)),
    ]


def _paths_of(layer):
    modes = ["structured", "materialized"] + (["premixed"] if layer.factor_rank is None else [])
    return modes


@pytest.mark.parametrize("name, layer", variants())
def test_every_training_path_equals_the_kron_reference_with_gradients(name, layer):
    x = torch.randn(5, 3, 24, dtype=torch.float64, requires_grad=True)
    want = kron_reference(layer, x)
    probe = torch.randn_like(want)
    params = [p for p in layer.parameters()]
    expected = torch.autograd.grad((want * probe).sum(), [x, *params])
    for mode in ["auto", *_paths_of(layer)]:
        layer.forward_mode = mode
        got = layer(x)
        torch.testing.assert_close(got, want, msg=f"{name} {mode}")
        for g, e in zip(torch.autograd.grad((got * probe).sum(), [x, *params]), expected):
            torch.testing.assert_close(g, e, msg=f"{name} {mode}")


@pytest.mark.parametrize("name, layer", variants())
def test_every_inference_path_equals_the_kron_reference(name, layer, monkeypatch):
    x = torch.randn(7, 24, dtype=torch.float64)
    with torch.no_grad():
        want = kron_reference(layer, x)
        for mode in ["auto", *_paths_of(layer)]:
            layer.forward_mode = mode
            torch.testing.assert_close(layer(x), want, msg=f"{name} {mode}")
        layer.forward_mode = "materialized"
        for columns in (10 ** 6, 1):  # H whole into the reused buffer, then one block column at a time
            monkeypatch.setattr(PHMLinear, "path_settings",
                                dataclasses.replace(PHMLinear.path_settings, blocked_min_columns=columns))
            torch.testing.assert_close(layer(x), want, msg=f"{name} buffer/blocked {columns}")
        layer.cache_dense = True
        assert layer.choose_mode(7) == "cached"
        torch.testing.assert_close(layer(x), want, msg=f"{name} cached")
        layer.cache_dense = False


@pytest.mark.skipif(not onednn_available(), reason="no usable oneDNN linear")
@pytest.mark.parametrize("name, layer", [v for v in variants(torch.float32) if "low_rank" not in v[0]])
def test_the_onednn_path_equals_the_kron_reference(name, layer):
    layer.forward_mode = "onednn"
    x = torch.randn(6, 24)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), kron_reference(layer, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, layer", variants())
def test_gradcheck_in_float64(name, layer):
    names = [n for n, _ in layer.named_parameters()]

    def run(x, *values):
        return torch.func.functional_call(layer, dict(zip(names, values)), (x,))

    x = torch.randn(3, 24, dtype=torch.float64, requires_grad=True)
    values = [p.detach().clone().requires_grad_() for p in layer.parameters()]
    for mode in ("structured", "materialized"):
        layer.forward_mode = mode
        assert torch.autograd.gradcheck(run, (x, *values)), f"{name} {mode}"


def test_low_rank_structured_forms_neither_h_nor_any_factor(monkeypatch):
    layer = PHMLinear(24, 16, 4, factor_rank=2, forward_mode="structured", dtype=torch.float64)
    x = torch.randn(4, 24, dtype=torch.float64)
    want = kron_reference(layer, x)

    def refuse(*args, **kwargs):
        raise AssertionError("formed")

    monkeypatch.setattr(PHMLinear, "factors", refuse)
    monkeypatch.setattr(PHMLinear, "dense_weight", refuse)
    torch.testing.assert_close(layer(x), want)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), want)
        layer.forward_mode = "auto"
        assert layer.choose_mode(4) == "structured"
        torch.testing.assert_close(layer(x), want)


def test_phm_linear_lowrank_matches_the_kron_sum_and_passes_gradcheck():
    torch.manual_seed(1)
    n, k_n, d_n, r = 3, 4, 5, 2
    args = [torch.randn(s, dtype=torch.float64, requires_grad=True)
            for s in ((2, 3, n * d_n), (n, n, n), (n, k_n, r), (n, r, d_n), (n * k_n,))]
    x, rule, left, right, bias = args
    H = sum(torch.kron(rule[i], left[i] @ right[i]) for i in range(n))
    torch.testing.assert_close(phm_linear_lowrank(x, rule, left, right, bias), x @ H.T + bias)
    assert torch.autograd.gradcheck(phm_linear_lowrank, tuple(args))


# ---------------------------------------------------------------- the shared rule
def _shared_model(rule=None):
    torch.manual_seed(2)
    rule = rule or PHMRule(4)
    return nn.Sequential(PHMLinear(16, 32, 4, rule=rule), nn.ReLU(), PHMLinear(32, 16, 4, rule=rule, factor_rank=2),
                         nn.ReLU(), PHMLinear(16, 8, 4))


def test_a_shared_rule_is_one_tensor_learned_by_every_layer():
    model = _shared_model()
    first, second = model[0], model[2]
    assert first.phm_rule is second.phm_rule and first.rule_is_shared and first.rule_is_learned
    model(torch.randn(3, 16)).square().sum().backward()
    grad = first.phm_rule.grad.clone()
    first.phm_rule.grad = None
    model[2](torch.relu(model[0](torch.randn(3, 16)))).sum().backward()  # each layer adds its share
    assert first.phm_rule.grad is not None and not torch.equal(grad, torch.zeros_like(grad))
    assert len([p for p in model.parameters() if p is first.phm_rule]) == 1  # one parameter for the optimizer


def test_parameter_counts_count_a_shared_rule_once():
    model = _shared_model()
    layers = [(16, 32, None), (32, 16, 2)]
    expected = (sum(phm_parameter_count(d, k, 4, shared_rule=True, factor_rank=r) for d, k, r in layers) + 4 ** 3
                + phm_parameter_count(16, 8, 4))
    assert sum(p.numel() for p in model.parameters()) == expected
    assert phm_parameter_count(16, 32, 4, rule=model[0].shared_rule) == 16 * 32 // 4 + 32
    breakdown = parameter_breakdown(model)
    assert breakdown["phm_rules"] == 2 * 4 ** 3  # the shared rule once, the last layer's own once
    assert breakdown["total"] == expected


def test_counts_for_low_rank_factors_and_a_rule_started_from_a_table():
    assert phm_parameter_count(24, 16, 4, factor_rank=2) == 2 * (24 + 16) + 4 ** 3 + 16
    assert phm_parameter_count(24, 16, 4, "quaternion", bias=False, factor_rank=2) == 2 * (24 + 16)
    for name, layer in variants():
        rule = layer.shared_rule if layer.rule_is_shared else ("learned" if layer.rule_is_learned else layer.rule_name)
        own = sum(p.numel() for n, p in layer.named_parameters() if not n.startswith("shared_rule."))
        assert own == phm_parameter_count(24, 16, layer.n, rule, factor_rank=layer.factor_rank), name
    budget = phm_parameter_count(96, 96, 4, factor_rank=4, bias=False)
    r = matching_rank(96, 96, 4, factor_rank=4)
    assert r * 192 <= budget < (r + 1) * 192


def _state_equal(a: nn.Module, b: nn.Module) -> None:
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


def test_a_model_with_a_shared_rule_round_trips_through_torch_save_and_stays_tied():
    model = _shared_model()
    with torch.no_grad():
        model[0].phm_rule.add_(1.0)  # values a fresh model does not have
    keys = list(model.state_dict())
    assert "0.shared_rule.phm_rule" in keys and "2.shared_rule.phm_rule" in keys  # PyTorch's tied keys
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    unshared = io.BytesIO()
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, unshared)
    assert len(buffer.getvalue()) < len(unshared.getvalue())  # the shared tensor is written once
    for assign in (False, True):
        fresh = _shared_model(PHMRule(4))
        fresh.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())), assign=assign)
        assert fresh[0].phm_rule is fresh[2].phm_rule  # still one tensor
        _state_equal(fresh, model)
        x = torch.randn(2, 16)
        torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)


def test_a_model_with_a_shared_rule_round_trips_through_a_safetensors_checkpoint(tmp_path):
    from hyperplex.train.checkpoint.format import load_checkpoint, model_state, save_checkpoint

    model = _shared_model()
    with torch.no_grad():
        model[0].phm_rule.mul_(3.0)
    path = save_checkpoint(tmp_path / "last.safetensors", model_state(model))
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        stored = [key for key in f.keys() if "phm_rule" in key]
    assert len(stored) == 2  # the shared rule once, the last layer's own rule once
    fresh = _shared_model(PHMRule(4))
    fresh.load_state_dict(load_checkpoint(path).model_state)
    assert fresh[0].phm_rule is fresh[2].phm_rule
    _state_equal(fresh, model)


def test_moving_a_model_keeps_the_rule_shared():
    model = _shared_model().double()
    assert model[0].phm_rule is model[2].phm_rule and model[0].phm_rule.dtype == torch.float64
    copy = __import__("copy").deepcopy(model)
    assert copy[0].phm_rule is copy[2].phm_rule and copy[0].phm_rule is not model[0].phm_rule


def test_resetting_a_layer_leaves_the_shared_rule_alone():
    rule = PHMRule(4, init="quaternion")
    layer = PHMLinear(16, 16, 4, rule=rule)
    torch.testing.assert_close(rule.phm_rule, algebra_rule("quaternion"))
    with torch.no_grad():
        rule.phm_rule.add_(0.5)
    before = rule.phm_rule.clone()
    layer.reset_parameters()
    torch.testing.assert_close(rule.phm_rule, before, rtol=0, atol=0)
    rule.reset_parameters()
    torch.testing.assert_close(rule.phm_rule, algebra_rule("quaternion"))


# ---------------------------------------------------------------- a learned rule from a table
def test_a_rule_started_from_a_table_is_that_table_and_then_learns():
    layer = PHMLinear(16, 8, 4, rule_init="quaternion")
    fixed = PHMLinear(16, 8, 4, rule="quaternion")
    assert layer.rule_is_learned and isinstance(layer.phm_rule, nn.Parameter)
    torch.testing.assert_close(layer.phm_rule, fixed.phm_rule, rtol=0, atol=0)
    assert list(layer.state_dict()) == list(PHMLinear(16, 8, 4).state_dict())  # a learned rule's keys
    layer(torch.randn(3, 16)).sum().backward()
    assert layer.phm_rule.grad is not None and layer.phm_rule.grad.abs().sum() > 0
    assert "learned from quaternion" in repr(layer)


def test_bad_options_are_refused_by_name():
    with pytest.raises(ValueError, match="rule_init .* needs rule='learned'"):
        PHMLinear(16, 8, 4, rule="quaternion", rule_init="quaternion")
    with pytest.raises(ValueError, match="rule_init 'quaternion' needs n=4, got n=2"):
        PHMLinear(16, 8, 2, rule_init="quaternion")
    with pytest.raises(ValueError, match="unknown rule_init 'quat'"):
        PHMLinear(16, 8, 4, rule_init="quat")
    with pytest.raises(ValueError, match="shared PHMRule has n=2, this layer n=4"):
        PHMLinear(16, 8, 4, rule=PHMRule(2))
    with pytest.raises(ValueError, match="rule_init .* PHMRule"):
        PHMLinear(16, 8, 4, rule=PHMRule(4), rule_init="quaternion")
    with pytest.raises(ValueError, match="factor_rank=3 exceeds the rank of an Sᵢ, min\\(k/n, d/n\\) = 2"):
        PHMLinear(16, 8, 4, factor_rank=3)
    with pytest.raises(ValueError, match="factor_rank must be a positive integer"):
        PHMLinear(16, 8, 4, factor_rank=0)
    with pytest.raises(ValueError, match="forward_mode 'premixed' reads full Sᵢ"):
        PHMLinear(16, 8, 4, factor_rank=1, forward_mode="premixed")
    with pytest.raises(ValueError, match="a fixed PHMRule"):
        PHMRule(4, learn=False)
    with pytest.raises(ValueError, match="shared PHMRule"):
        phm_from_linear(nn.Linear(16, 8), 4, rule=PHMRule(4))
    with pytest.raises(ValueError, match="factor_rank is not supported"):
        phm_from_linear(nn.Linear(16, 8), 4, factor_rank=1)
    with pytest.raises(TypeError, match="shared rule or factor_rank"):
        copy_into_like(PHMLinear(16, 8, 4, factor_rank=1), torch.randn(8, 16), None)


def test_the_appendix_a_form_expresses_a_low_rank_or_shared_layer():
    for name, layer in variants():
        twin = DiffusionPHMLinear.from_phm(layer)
        x = torch.randn(3, 24, dtype=torch.float64)
        torch.testing.assert_close(twin(x), kron_reference(layer, x), msg=name)


def test_init_keeps_the_dense_variance_for_every_option():
    d, k, seeds = 64, 64, 60
    target = 1.0 / (3 * d)
    for make in (lambda: PHMLinear(d, k, 4, rule_init="quaternion"), lambda: PHMLinear(d, k, 4, factor_rank=4),
                 lambda: PHMLinear(d, k, 4, rule=PHMRule(4, init="quaternion"))):
        var = torch.stack([make().dense_weight().detach().var() for _ in range(seeds)]).mean()
        assert abs(float(var) / target - 1) < 0.15


def test_code_that_needs_full_factors_is_told_why_a_low_rank_layer_has_none():
    layer = PHMLinear(16, 8, 4, factor_rank=1)
    with pytest.raises(AttributeError, match="low-rank factors \\(factor_rank=1\\) and no phm_weight"):
        _ = layer.phm_weight
    assert layer.factors().shape == (4, 2, 4)
    with pytest.raises(AttributeError, match="has no attribute 'phm_left'"):
        _ = PHMLinear(16, 8, 4).phm_left


def test_model_level_helpers_take_low_rank_and_shared_layers():
    from hyperplex.layers import cache_dense_weights, cached_bytes, release_dense_caches, shared_weights

    model = _shared_model()
    x = torch.randn(6, 16)
    want = model(x).detach()
    assert cache_dense_weights(model) == (16 * 32 + 32 * 16 + 16 * 8) * 4
    with torch.no_grad():
        torch.testing.assert_close(model(x), want)
        assert cached_bytes(model) == (16 * 32 + 32 * 16 + 16 * 8) * 4
    assert release_dense_caches(model) > 0 and cached_bytes(model) == 0
    with shared_weights(model, rows=4096):  # H formed once for many rows
        torch.testing.assert_close(model(x), want)
