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


def test_a_layer_that_cannot_be_built_converts_no_layer(monkeypatch):
    """Every new layer is built before the first is swapped in: a failure on the second layer names it and leaves
    the first one dense too."""
    import hyperplex as hp
    from hyperplex.convert import linears

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    x = torch.randn(3, 64)
    before = model(x)
    real = linears._build
    calls = []

    def failing(view, *args):
        calls.append(view)
        if len(calls) == 2:
            raise RuntimeError("shape '[4, 4, 4]' is invalid")
        return real(view, *args)

    monkeypatch.setattr(linears, "_build", failing)
    with pytest.raises(ValueError, match=r"layer '2' \(64 → 64\): cannot convert it to phm \(n=4\).*unchanged"):
        hp.compress(model, hp.PHMConfig(n=4))
    assert [type(m) for m in model] == [nn.Linear, nn.ReLU, nn.Linear]
    assert torch.equal(model(x), before)


def test_tiny_blocks_and_a_rank_above_full_convert_instead_of_failing_half_way():
    import hyperplex as hp

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 48))
    x = torch.randn(3, 64)
    before = model(x)
    report = hp.compress(model, hp.PHMConfig(n=16, min_features=0))  # 48x64 at n = 16: 12 block weights < 16 terms
    assert len(report.converted) == 2 and max(r.relative_error for r in report.converted) < 1e-6
    torch.testing.assert_close(model(x), before, rtol=1e-5, atol=1e-6)
    small = nn.Sequential(nn.Linear(128, 128), nn.Linear(128, 32), nn.Linear(32, 32))
    hp.compress(small, hp.LowRankConfig(n=16))
    assert small[2].rank == 32  # PHM n = 16's budget exceeds full rank there: full rank


def test_a_calibrate_that_is_not_callable_is_refused_by_name():
    import hyperplex as hp

    model = nn.Sequential(nn.Linear(64, 64))
    with pytest.raises(ValueError, match="calibrate must be a callable"):
        hp.compress(model, hp.PHMConfig(n=4, init="whitened"), calibrate=3)
    assert type(model[0]) is nn.Linear


def test_converting_twice_or_a_non_module_says_so():
    import hyperplex as hp

    model = nn.Sequential(nn.Linear(64, 64))
    hp.compress(model, hp.PHMConfig(n=4))
    with pytest.raises(ValueError, match=r"its 1 PHM / low-rank layer\(s\) are converted already"):
        hp.compress(model, hp.PHMConfig(n=4))
    with pytest.raises(TypeError, match="expected the model as a torch.nn.Module, got str"):
        hp.compress("model", hp.PHMConfig(n=4))
