"""convert_linears checks every selected layer before replacing any: one bad layer leaves the model as it was."""

import re

import pytest
import torch
from torch import nn

from hyperplex.convert import convert_linears


def stack(layers: int = 13):
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(32, 32) for _ in range(layers)])


def snapshot(model):
    return [type(m) for m in model], {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("value, shown", [(float("nan"), "NaN"), (float("inf"), "+inf"), (float("-inf"), "-inf")])
@pytest.mark.parametrize("what", ["weight", "bias"])
@pytest.mark.parametrize("kind", ["phm", "lowrank"])
def test_a_non_finite_value_in_the_seventh_layer_converts_nothing(value, shown, what, kind):
    model = stack()
    with torch.no_grad():
        getattr(model[6], what).view(-1)[3] = value
    types, state = snapshot(model)
    with pytest.raises(ValueError, match=rf"layer '6': its {what} holds 1 non-finite value\(s\) "
                                         rf"\({re.escape(shown)}\); no layer"):
        convert_linears(model, kind, n=4)
    assert [type(m) for m in model] == types == [nn.Linear] * 13
    now = model.state_dict()
    assert set(now) == set(state)
    for key, value in state.items():
        torch.testing.assert_close(now[key], value, rtol=0, atol=0, equal_nan=True)


def test_an_excluded_bad_layer_does_not_stop_the_others():
    model = stack(3)
    with torch.no_grad():
        model[1].weight[0, 0] = float("nan")
    report = convert_linears(model, "phm", n=4, exclude="1")
    assert [r.name for r in report.converted] == ["0", "2"]


def test_meta_tensors_are_refused_by_name():
    with torch.device("meta"):
        model = stack(2)
    with pytest.raises(ValueError, match=r"layer '0': its weight is on the meta device"):
        convert_linears(model, "phm", n=4)
    assert [type(m) for m in model] == [nn.Linear, nn.Linear]
