"""Adapters from other people: a bad name or a non-finite value is refused before the model changes."""

import hashlib
import json
import os

import pytest
import torch
from torch import nn

from hyperplex.adapters import PHMAdapterConfig, adapter_names, add_adapter, load_adapter, merge, save_adapter, unmerge
from hyperplex.adapters.io import SPEC_NAME, WEIGHTS_NAME


def base(dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)).to(dtype)


def state_of(model):
    """Everything a refusal must leave as it was: values, requires_grad, the module types."""
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {k: p.requires_grad for k, p in model.named_parameters()},
            [type(m).__name__ for m in model.modules()])


def assert_same(model, before):
    values, flags, types = before
    now = state_of(model)
    assert now[2] == types and now[1] == flags
    assert set(now[0]) == set(values) and all(torch.equal(now[0][k], v) for k, v in values.items())


@pytest.mark.parametrize("name", ["training", "forward", "_modules", "keys", "", "a.b", 5])
def test_adapter_names_that_clash_are_refused_before_anything_is_frozen(name):
    model = base()
    before = state_of(model)
    with pytest.raises(ValueError, match="adapter name"):
        add_adapter(model, name, PHMAdapterConfig(n=2, rank=1, targets=["0", "2"]))
    assert_same(model, before)


@pytest.mark.parametrize("name", ["training", "forward"])
def test_a_saved_adapter_named_like_an_attribute_is_refused(tmp_path, name):
    model = base()
    add_adapter(model, "good", PHMAdapterConfig(n=2, rank=1, targets=["0", "2"]))
    save_adapter(model, "good", tmp_path)
    spec = json.loads((tmp_path / SPEC_NAME).read_text())
    spec["name"] = name
    (tmp_path / SPEC_NAME).write_text(json.dumps(spec))
    fresh = base()
    before = state_of(fresh)
    with pytest.raises(ValueError, match=rf"adapter.json: key 'name' {name!r} is an attribute of nn.Module"):
        load_adapter(fresh, tmp_path)
    assert_same(fresh, before)
    with pytest.raises(ValueError, match="is an attribute of nn.Module"):
        load_adapter(fresh, tmp_path.parent / tmp_path.name, name="forward")
    assert_same(fresh, before)


def _resave(folder, state):
    from safetensors.torch import save_file

    save_file(state, os.fspath(folder / WEIGHTS_NAME))
    spec = json.loads((folder / SPEC_NAME).read_text())
    spec["weights_sha256"] = hashlib.sha256((folder / WEIGHTS_NAME).read_bytes()).hexdigest()
    (folder / SPEC_NAME).write_text(json.dumps(spec))


def test_a_nan_adapter_file_is_refused_on_load(tmp_path):
    from safetensors.torch import load_file

    model = base()
    add_adapter(model, "a", PHMAdapterConfig(n=2, rank=1, targets=["0", "2"]))
    save_adapter(model, "a", tmp_path)
    state = load_file(os.fspath(tmp_path / WEIGHTS_NAME))
    key = sorted(state)[0]
    state[key] = state[key].clone()
    state[key].view(-1)[0] = float("nan")
    _resave(tmp_path, state)
    fresh = base()
    before = state_of(fresh)
    with pytest.raises(ValueError, match=rf"adapter.safetensors: tensor {key!r} holds NaN or infinite values"):
        load_adapter(fresh, tmp_path)
    assert_same(fresh, before)
    assert adapter_names(fresh) == []


def test_a_merge_that_would_write_nan_or_overflow_changes_no_weight():
    model = base()
    add_adapter(model, "a", PHMAdapterConfig(n=2, rank=1, targets=["0", "2"]))
    layer = model[2]
    with torch.no_grad():
        next(layer.adapters["a"].parameters()).fill_(float("nan"))
    weights = [model[0].base_layer.weight.clone(), model[2].base_layer.weight.clone()]
    with pytest.raises(RuntimeError, match=r"cannot merge adapter 'a' into layer '2'.*unchanged"):
        merge(model)
    assert torch.equal(model[0].base_layer.weight, weights[0]) and torch.equal(model[2].base_layer.weight, weights[1])
    assert model[0].merged_adapter is None and model[2].merged_adapter is None

    # finite in the adapter, but the sum overflows float16 (max 65504)
    half = base(torch.float16)
    add_adapter(half, "big", PHMAdapterConfig(n=2, rank=1, targets=["0"]))
    with torch.no_grad():
        for p in half[0].adapters["big"].parameters():
            p.fill_(200.0)
    assert all(bool(torch.isfinite(p).all()) for p in half[0].adapters["big"].parameters())
    before = half[0].base_layer.weight.clone()
    with pytest.raises(RuntimeError, match=r"NaN or infinite in torch.float16"):
        merge(half)
    assert torch.equal(half[0].base_layer.weight, before)
    assert unmerge(half) == 0  # nothing was merged


def test_save_adapter_onto_a_file_is_a_clear_error(tmp_path):
    model = base()
    add_adapter(model, "a", PHMAdapterConfig(n=2, rank=1, targets=["0"]))
    target = tmp_path / "file"
    target.write_text("keep")
    with pytest.raises(ValueError, match=r"file: exists and is a file; save_adapter writes a folder"):
        save_adapter(model, "a", target)
    assert target.read_text() == "keep"



@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("name,kind", [(SPEC_NAME, "fifo"), (WEIGHTS_NAME, "fifo"), (SPEC_NAME, "folder"),
                                       (WEIGHTS_NAME, "folder")])
def test_adapter_files_that_are_fifos_or_folders_are_named_as_such(tmp_path, name, kind):
    model = base()
    add_adapter(model, "a", PHMAdapterConfig(n=2, rank=1, targets=["0", "2"]))
    save_adapter(model, "a", tmp_path)
    (tmp_path / name).unlink()
    os.mkfifo(tmp_path / name) if kind == "fifo" else (tmp_path / name).mkdir()
    fresh = base()
    before = state_of(fresh)
    what = "a FIFO" if kind == "fifo" else "a folder"
    with pytest.raises(ValueError, match=rf"{name}.* is {what}, not a regular file"):
        load_adapter(fresh, tmp_path)
    assert_same(fresh, before)
    assert adapter_names(fresh) == []
