"""modules_to_save: a new head trained in full by the adapter, saved with it, reloaded into a fresh base with
identical outputs; one copy per adapter; removal and merge_and_unwrap; errors before any change."""

import copy

import pytest
import torch
from torch import nn

from hyperplex.adapters import (
    PHMAdapterConfig,
    SavedModule,
    active_adapter,
    adapter_state_dict,
    add_adapter,
    load_adapter,
    merge_and_unwrap,
    remove_adapter,
    save_adapter,
    saved_modules,
    set_active,
)
from hyperplex.adapters.io import SPEC_NAME
from hyperplex.models.transformer import TransformerClassifier, TransformerConfig

TARGETS = ["*.qkv_proj", "ffn.*"]


def base(seed=0, head_seed=10, classes=3):
    """The same pretrained body (``seed``) with a new, randomly initialised head for a 3-class task."""
    torch.manual_seed(seed)
    config = TransformerConfig(d_model=16, num_heads=2, d_ff=32, encoder_layers=2, dropout=0.0)
    model = TransformerClassifier(config, vocab_size=30, num_classes=4).eval()
    torch.manual_seed(head_seed)
    model.classifier = nn.Linear(16, classes)
    return model


def tokens():
    g = torch.Generator().manual_seed(3)
    return torch.randint(4, 30, (3, 6), generator=g), torch.tensor([6, 4, 2])


def config(**changes):
    return PHMAdapterConfig(**{"n": 4, "rank": 2, "targets": TARGETS, "modules_to_save": ["classifier"], **changes})


def train(model, steps=3):
    """A few SGD steps on whatever is trainable; returns the trainable parameters' names."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=0.5)
    x, labels = tokens(), torch.tensor([0, 2, 1])
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(*x), labels).backward()
        optimizer.step()
    return {name for name, p in model.named_parameters() if p.requires_grad}


def test_a_new_head_trains_saves_and_reloads_into_a_fresh_base(tmp_path):
    model = base()
    x = tokens()
    original_head = model.classifier
    head_before = copy.deepcopy(original_head.state_dict())
    before = model(*x)
    add_adapter(model, "task", config())
    assert isinstance(model.classifier, SavedModule) and model.classifier.base_layer is original_head
    assert torch.equal(model(*x), before)  # the copy starts equal to the head, the delta at zero
    trainable = train(model)
    assert trainable == {n for n, _ in model.named_parameters() if ".adapters.task." in n}
    assert {"classifier.adapters.task.weight", "classifier.adapters.task.bias"} <= trainable
    assert all(torch.equal(original_head.state_dict()[k], v) for k, v in head_before.items())  # original untouched
    trained_head = model.classifier.adapters["task"]
    assert not torch.equal(trained_head.weight, head_before["weight"])  # the copy did learn
    expected = model(*x)
    assert not torch.allclose(expected, before)

    save_adapter(model, "task", tmp_path)
    state = adapter_state_dict(model, "task")
    assert torch.equal(state["classifier.weight"], trained_head.weight) and "classifier.bias" in state
    fresh = base(head_seed=99)  # the same body, another random head
    assert not torch.allclose(fresh(*x), expected)
    load_adapter(fresh, tmp_path)
    assert torch.equal(fresh(*x), expected)
    assert fresh.classifier.out_features == 3  # attributes are read through the wrapper


def test_each_adapter_has_its_own_head_and_switching_selects_it():
    model = base()
    x = tokens()
    plain = model(*x)
    add_adapter(model, "a", config())
    train(model)
    out_a = model(*x)
    add_adapter(model, "b", config(rank=None))
    assert [name for name, _ in saved_modules(model)] == ["classifier"]
    assert set(model.classifier.adapters) == {"a", "b"}
    assert torch.equal(model.classifier.adapters["b"].weight,
                       model.classifier.base_layer.weight)  # copied from the original
    train(model)
    assert (not model.classifier.adapters["a"].weight.requires_grad
            and model.classifier.adapters["b"].weight.requires_grad)
    set_active(model, "a")
    assert torch.equal(model(*x), out_a)
    set_active(model, None)
    assert torch.equal(model(*x), plain)


@pytest.mark.parametrize("finish", ["remove", "merge_and_unwrap"])
def test_removing_or_baking_puts_a_plain_head_back(finish):
    model = base()
    x = tokens()
    original_head = model.classifier
    flags = [p.requires_grad for p in model.parameters()]
    add_adapter(model, "a", config())
    train(model)
    expected = model(*x)
    if finish == "remove":
        remove_adapter(model, "a")
        assert model.classifier is original_head
        assert [p.requires_grad for p in model.parameters()] == flags
    else:
        trained = model.classifier.adapters["a"]
        merge_and_unwrap(model)
        assert model.classifier is trained and not any(isinstance(m, SavedModule) for m in model.modules())
        assert torch.allclose(model(*x), expected, rtol=1e-5, atol=1e-6)
    assert active_adapter(model) is None


def test_modules_to_save_errors_name_the_key_and_change_nothing():
    model = base()
    reference = copy.deepcopy(model)
    with pytest.raises(ValueError, match=r"PHMAdapterConfig.modules_to_save: pattern 'head' matches no module"):
        add_adapter(model, "a", config(modules_to_save=["head"]))
    with pytest.raises(ValueError, match=r"layer 'encoder.layers.0.ffn.linear1': inside 'encoder.layers.0.ffn', "
                                         r"a module trained in full"):
        add_adapter(model, "a", config(modules_to_save=[]), layers=["encoder.layers.0.ffn.linear1"],
                    saved=["encoder.layers.0.ffn"])
    with pytest.raises(ValueError, match=r"modules_to_save must be a list of non-empty glob patterns"):
        config(modules_to_save=[""])
    assert [type(m) for m in model.modules()] == [type(m) for m in reference.modules()]
    assert all(p.requires_grad for p in model.parameters())
    # targets never select what is saved: the head and the second ffn are trained in full, not adapted
    add_adapter(model, "a", config(targets=["*"], modules_to_save=["classifier", "encoder.layers.1.ffn"]))
    adapted = {n for n, m in model.named_modules() if type(m).__name__ == "PHMAdaptedLinear"}
    assert "encoder.layers.0.ffn.linear1" in adapted and not any(n.startswith("encoder.layers.1.ffn") for n in adapted)
    with pytest.raises(ValueError, match=r"module to save 'encoder.layers.0.ffn': it holds "
                                         r"'encoder.layers.0.ffn.linear1', a layer with a PHM adapter"):
        add_adapter(model, "b", config(targets=["*.qkv_proj"], modules_to_save=["encoder.layers.0.ffn"]))


def test_a_head_of_another_shape_is_refused_by_name(tmp_path):
    model = base()
    add_adapter(model, "a", config())
    save_adapter(model, "a", tmp_path)
    other = base(classes=5)
    state = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(ValueError, match=rf"{SPEC_NAME}: the adapter does not fit this model: classifier: "
                                         r"the module to save differs: bias saved \[3\], model \[5\], "
                                         r"weight saved \[3, 16\], model \[5, 16\]"):
        load_adapter(other, tmp_path, allow_other_base_weights=True)  # a shape is never allowed to differ
    assert state.keys() == other.state_dict().keys()
    assert all(torch.equal(v, other.state_dict()[k]) for k, v in state.items())


def test_a_target_that_is_also_a_module_to_save_is_named_as_such(tmp_path):
    model = base()
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"pattern 'classifier' matches only layers inside modules_to_save "
                                         r"\(classifier\), which are trained in full and cannot also hold an adapter"):
        add_adapter(model, "task", config(targets=["classifier"]))
    assert isinstance(model.classifier, nn.Linear) and all(torch.equal(v, model.state_dict()[k])
                                                           for k, v in state.items())


def test_a_nan_adapter_is_refused_at_save_as_at_load(tmp_path):
    """The one rule for NaN and infinite weights: save_adapter refuses what load_adapter would refuse."""
    from hyperplex.guards import NonFiniteError

    model = base()
    add_adapter(model, "task", config())
    save_adapter(model, "task", tmp_path / "good")
    before = {p.name: p.read_bytes() for p in (tmp_path / "good").iterdir()}
    with torch.no_grad():
        model.classifier.adapters["task"].weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"save_adapter 'task': tensor 'classifier.weight' holds "
                                             r"NaN or infinite values \(1 of 48\)"):
        save_adapter(model, "task", tmp_path / "good")
    assert {p.name: p.read_bytes() for p in (tmp_path / "good").iterdir()} == before  # the old adapter is kept
    assert load_adapter(base(), tmp_path / "good") == "task"


def test_save_adapter_never_writes_into_another_models_folder(tmp_path):
    from hyperplex.guards import OutputError

    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    model = base()
    add_adapter(model, "task", config())
    with pytest.raises(OutputError, match=r"holds a Hugging Face model \(config.json\)"):
        save_adapter(model, "task", folder)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]
