import pytest
import torch
from torch import nn

from hyperplex.layers import LowRankLinear, PHMLinear, lowrank_parameter_count, phm_parameter_count
from hyperplex.nn import LinearSpec, make_linear


def count(m):
    return sum(p.numel() for p in m.parameters())


def test_dense_is_nn_linear():
    layer = make_linear(8, 12, LinearSpec("dense"))
    assert type(layer) is nn.Linear and count(layer) == 8 * 12 + 12


@pytest.mark.parametrize("n", [1, 2, 4])
def test_phm_counts(n):
    layer = make_linear(8, 12, LinearSpec("phm", n=n))
    assert isinstance(layer, PHMLinear) and count(layer) == phm_parameter_count(8, 12, n)


def test_quaternion_uses_fixed_hamilton_rule():
    layer = make_linear(8, 12, LinearSpec("quaternion", n=7))  # n ignored for quaternion
    assert layer.n == 4 and not layer.rule_is_learned
    x = torch.randn(3, 8)
    torch.testing.assert_close(layer(x), x @ layer.dense_weight().T + layer.bias)


def test_lowrank_budget_not_above_phm():
    layer = make_linear(16, 16, LinearSpec("lowrank", n=4))
    assert isinstance(layer, LowRankLinear)
    assert count(layer) == lowrank_parameter_count(16, 16, layer.rank) <= phm_parameter_count(16, 16, 4)


def test_bad_spec_errors():
    with pytest.raises(ValueError, match="unknown linear kind 'conv'"):
        LinearSpec("conv")
    with pytest.raises(ValueError, match="positive integer"):
        LinearSpec("phm", n=0)
    with pytest.raises(ValueError, match="n=4 does not divide size 10 in encoder"):
        LinearSpec("phm", n=4).check_divides(8, 10, where="encoder")
    LinearSpec("dense", n=4).check_divides(10)  # dense never complains


# ---------------------------------------------------------------- rule_init, shared_rule, factor_rank
def test_rule_init_starts_a_learned_rule_from_a_table():
    from hyperplex.algebra import algebra_rule

    layer = make_linear(8, 12, LinearSpec("phm", n=4, rule_init="quaternion"))
    assert layer.rule_is_learned and torch.equal(layer.phm_rule.detach(), algebra_rule("quaternion"))
    assert count(layer) == phm_parameter_count(8, 12, 4)


def test_factor_rank_builds_low_rank_factors_for_phm_and_quaternion():
    for spec in (LinearSpec("phm", n=4, factor_rank=2), LinearSpec("quaternion", factor_rank=2)):
        layer = make_linear(16, 32, spec)
        rule = "learned" if spec.kind == "phm" else "quaternion"
        assert layer.factor_rank == 2 and count(layer) == phm_parameter_count(16, 32, 4, rule, factor_rank=2)
    lowrank = make_linear(64, 64, LinearSpec("lowrank", n=4, factor_rank=2))
    assert count(lowrank) <= phm_parameter_count(64, 64, 4, factor_rank=2)  # the budget of that PHM layer


def test_shared_rule_is_one_rule_for_the_layers_one_spec_builds_and_counted_once():
    from hyperplex.nn.transformer import TransformerEncoderLayer

    from hyperplex.models.params import parameter_breakdown

    spec = LinearSpec("phm", n=4, shared_rule=True, rule_init="quaternion")
    block = TransformerEncoderLayer(16, 2, 32, attention_spec=spec, ffn_spec=spec)
    layers = [m for m in block.modules() if isinstance(m, PHMLinear)]
    assert len(layers) >= 3 and all(m.phm_rule is layers[0].phm_rule for m in layers)
    assert parameter_breakdown(block)["phm_rules"] == 4 ** 3
    other = TransformerEncoderLayer(16, 2, 32, ffn_spec=LinearSpec("phm", n=4, shared_rule=True))
    assert next(m for m in other.modules() if isinstance(m, PHMLinear)).phm_rule is not layers[0].phm_rule
    assert "_shared_rules" not in __import__("pickle").loads(__import__("pickle").dumps(spec)).__dict__


def test_bad_rule_options_are_refused_by_key():
    with pytest.raises(ValueError, match="unknown linear rule_init 'quat'"):
        LinearSpec("phm", rule_init="quat")
    with pytest.raises(ValueError, match="rule_init and shared_rule apply to a learned rule; rule is 'quaternion'"):
        LinearSpec("phm", rule="quaternion", shared_rule=True)
    with pytest.raises(ValueError, match="linear factor_rank must be a positive integer or null"):
        LinearSpec("phm", factor_rank=0)
    with pytest.raises(ValueError, match="linear shared_rule must be true or false"):
        LinearSpec("phm", shared_rule="yes")


def test_the_yaml_keys_reach_the_layers_and_the_parameter_table():
    from pathlib import Path

    from hyperplex.inference.parameters import params_report

    config = str(Path(__file__).resolve().parents[2] / "configs" / "multi30k_transformer.yaml")
    base = ["--model.linear.kind=phm", "--model.linear.n=4"]
    _, own = params_report(config, base, vocab_size=100)
    _, shared = params_report(config, base + ["--model.linear.shared_rule=true"], vocab_size=100)
    _, low = params_report(config, base + ["--model.linear.factor_rank=2", "--model.linear.rule_init=quaternion"],
                           vocab_size=100)
    assert own["phm_rules"] > 4 ** 3 and shared["phm_rules"] == 4 ** 3  # one rule, counted once
    assert shared["total"] == own["total"] - own["phm_rules"] + 4 ** 3
    assert low["total"] < own["total"] and low["phm_rules"] == own["phm_rules"]


def test_a_spec_that_is_not_a_linear_spec_is_refused():
    import pytest

    from hyperplex.nn import make_linear

    for spec in ("phm", {"kind": "phm"}):
        with pytest.raises(TypeError, match="spec must be a LinearSpec"):
            make_linear(8, 8, spec)
