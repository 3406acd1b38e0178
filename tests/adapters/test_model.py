"""Model-level adapter API on hyperplex's own Transformers: exact identity at init, frozen base,
training changes only adapter weights, shared rule, several adapters, merge/unmerge, errors."""

import copy

import pytest
import torch
from torch import nn

from hyperplex.adapters import (
    PHMAdaptedLinear,
    PHMAdapterConfig,
    active_adapter,
    adapted_layers,
    adapter_names,
    adapter_parameter_count,
    adapter_state_dict,
    add_adapter,
    load_adapter_state_dict,
    merge,
    merge_and_unwrap,
    remove_adapter,
    set_active,
    trainable_parameters,
    unmerge,
)
from hyperplex.models.transformer import TransformerClassifier, TransformerConfig, TransformerTranslator

TARGETS = ["*.qkv_proj", "*.out_proj", "ffn.linear1", "ffn.linear2"]


def classifier(seed=0):
    torch.manual_seed(seed)
    config = TransformerConfig(d_model=16, num_heads=2, d_ff=32, encoder_layers=2, dropout=0.0)
    return TransformerClassifier(config, vocab_size=30, num_classes=4).eval()


def translator(seed=0):
    torch.manual_seed(seed)
    config = TransformerConfig(d_model=16, num_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1, dropout=0.0)
    return TransformerTranslator(config, 30, 30).eval()


def batch(seed=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, 30, (3, 6), generator=g), torch.tensor([6, 4, 2])


def randomize(model, name):
    """Give the adapter non-zero weights (at init it is exactly zero)."""
    with torch.no_grad():
        for p in adapter_state_dict(model, name).values():
            p.normal_(0, 0.3)


@pytest.mark.parametrize("rank", [None, 2])
@pytest.mark.parametrize("shared", [False, True])
def test_adapted_classifier_equals_base_and_only_adapter_is_trainable(rank, shared):
    model = classifier()
    tokens, lengths = batch()
    before = model(tokens, lengths)
    base_params = {name: p for name, p in model.named_parameters()}
    add_adapter(model, "a", PHMAdapterConfig(n=4, rank=rank, targets=TARGETS, shared_rule=shared))
    assert torch.equal(model(tokens, lengths), before)
    layers = dict(adapted_layers(model))
    assert len(layers) == 2 * 4  # 2 encoder layers × (qkv, out, linear1, linear2); the classifier is not targeted
    assert all(not p.requires_grad for p in base_params.values())
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".adapters.a." in n for n in trainable)
    expected = sum(adapter_parameter_count(layer.in_features, layer.out_features, 4, rank, rule=not shared)
                   for layer in layers.values()) + (4 ** 3 if shared else 0)
    count = trainable_parameters(model)
    assert count.trainable == expected
    assert count.total == sum(p.numel() for p in base_params.values()) + expected


def test_training_changes_only_adapter_weights_and_base_stays_bit_identical():
    model = classifier()
    base_before = {n: p.detach().clone() for n, p in model.named_parameters()}
    add_adapter(model, "a", PHMAdapterConfig(n=4, rank=2, targets=TARGETS))
    adapter_before = {k: v.clone() for k, v in adapter_state_dict(model, "a").items()}
    model.train()
    # weight_decay would move frozen weights if the optimiser saw gradients for them; it must not.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    tokens, lengths = batch()
    labels = torch.tensor([0, 1, 3])
    for _ in range(3):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(tokens, lengths), labels).backward()
        optimizer.step()
    unwrapped = {n.replace(".base_layer", ""): p for n, p in model.named_parameters() if ".adapters." not in n}
    assert unwrapped.keys() == base_before.keys()
    for name, value in base_before.items():
        assert torch.equal(unwrapped[name], value), name
    after = adapter_state_dict(model, "a")
    changed = [k for k in after if not torch.equal(after[k], adapter_before[k])]
    assert len(changed) == len(after)  # every adapter tensor moved (rules, Lᵢ and Rᵢ all get gradients)


def test_shared_rule_is_one_tensor_and_its_gradient_sums_over_layers():
    shared_model = classifier()
    add_adapter(shared_model, "a", PHMAdapterConfig(n=4, rank=2, targets=TARGETS, shared_rule=True))
    randomize(shared_model, "a")
    rules = {id(layer.adapters["a"].rule) for _, layer in adapted_layers(shared_model)}
    assert len(rules) == 1
    # The same model with a separate copy of the rule per layer: the shared gradient is their sum.
    own_model = classifier()
    add_adapter(own_model, "a", PHMAdapterConfig(n=4, rank=2, targets=TARGETS, shared_rule=False))
    state = adapter_state_dict(shared_model, "a")
    own_state = {k: v for k, v in state.items() if k != "shared_rule"}
    own_state.update({f"{path}.rule": state["shared_rule"] for path, _ in adapted_layers(own_model)})
    load_adapter_state_dict(own_model, "a", own_state)
    tokens, lengths = batch()
    shared_out, own_out = shared_model(tokens, lengths), own_model(tokens, lengths)
    assert torch.allclose(shared_out, own_out, atol=1e-6)
    shared_out.square().sum().backward()
    own_out.square().sum().backward()
    shared_grad = next(iter(adapted_layers(shared_model)))[1].adapters["a"].rule.grad
    own_grads = [layer.adapters["a"].rule.grad for _, layer in adapted_layers(own_model)]
    assert all(g.abs().sum() > 0 for g in own_grads)
    assert torch.allclose(shared_grad, torch.stack(own_grads).sum(0), rtol=1e-5, atol=1e-5)
    optimizer_params = list(shared_model.parameters())
    assert sum(p is next(iter(adapted_layers(shared_model)))[1].adapters["a"].rule for p in optimizer_params) == 1


@pytest.mark.parametrize("rank", [None, 3])
def test_merge_unmerge_round_trip_on_translator(rank):
    model = translator()
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    add_adapter(model, "a", PHMAdapterConfig(n=2, rank=rank, targets=["encoder.*", "decoder.*"]))
    randomize(model, "a")
    src, lengths = batch()
    tgt = src[:, :4]
    unmerged = model(src, lengths, tgt)
    assert merge(model) == len(dict(adapted_layers(model)))
    assert not torch.equal(model.encoder.layers[0].ffn.linear1.base_layer.weight,
                           original["encoder.layers.0.ffn.linear1.weight"])
    assert torch.allclose(model(src, lengths, tgt), unmerged, rtol=1e-4, atol=1e-5)
    unmerge(model)
    restored = {n.replace(".base_layer", ""): p for n, p in model.named_parameters() if ".adapters." not in n}
    for name, value in original.items():
        assert torch.allclose(restored[name], value, rtol=0, atol=1e-6), name
    assert torch.allclose(model(src, lengths, tgt), unmerged, rtol=1e-5, atol=1e-6)


def test_merge_refuses_a_weight_tied_to_the_embedding():
    model = translator()  # tie_embeddings: output_projection.weight is the target embedding matrix
    add_adapter(model, "a", PHMAdapterConfig(n=2, targets=["output_projection"]))
    with pytest.raises(RuntimeError, match=r"output_projection \(weight also used as tgt_embed.token.weight\)"):
        merge(model)


def test_several_adapters_switching_and_removal():
    model = classifier()
    tokens, lengths = batch()
    base_out = model(tokens, lengths)
    add_adapter(model, "a", PHMAdapterConfig(n=4, rank=2, targets=["*.qkv_proj"]))
    randomize(model, "a")
    a_out = model(tokens, lengths)
    add_adapter(model, "b", PHMAdapterConfig(n=2, targets=["*.qkv_proj", "ffn.linear2"]))  # the newest becomes active
    randomize(model, "b")
    b_out = model(tokens, lengths)
    assert adapter_names(model) == ["a", "b"] and active_adapter(model) == "b"
    assert not torch.allclose(a_out, b_out) and not torch.allclose(a_out, base_out)
    set_active(model, "a")
    assert torch.equal(model(tokens, lengths), a_out)
    assert all(p.requires_grad == (".adapters.a." in n) for n, p in model.named_parameters())
    set_active(model, None)
    assert torch.equal(model(tokens, lengths), base_out)
    assert trainable_parameters(model).trainable == 0
    set_active(model, "b")
    assert torch.equal(model(tokens, lengths), b_out)
    merge(model)
    with pytest.raises(RuntimeError, match="'b' is merged.*unmerge"):
        set_active(model, "a")
    with pytest.raises(RuntimeError, match="unmerge"):
        remove_adapter(model, "b")
    unmerge(model)
    remove_adapter(model, "b")
    assert adapter_names(model) == ["a"] and active_adapter(model) is None
    assert isinstance(model.encoder.layers[0].ffn.linear2, nn.Linear)  # unwrapped: no adapter left there
    remove_adapter(model, "a")
    assert not list(adapted_layers(model))
    # b was merged and unmerged: the base weights are back up to float rounding, not bit for bit.
    assert torch.allclose(model(tokens, lengths), base_out, rtol=0, atol=1e-6)


def test_merge_and_unwrap_gives_a_plain_model_computing_the_adapted_function():
    model = classifier()
    add_adapter(model, "a", PHMAdapterConfig(n=4, targets=TARGETS))
    randomize(model, "a")
    tokens, lengths = batch()
    adapted = model(tokens, lengths)
    plain = merge_and_unwrap(copy.deepcopy(model))
    assert not any(isinstance(m, PHMAdaptedLinear) for m in plain.modules())
    assert torch.allclose(plain(tokens, lengths), adapted, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kwargs,message", [
    (dict(n=0), "PHMAdapterConfig.n must be a positive integer"),
    (dict(n=2.0), "PHMAdapterConfig.n must be a positive integer"),
    (dict(rank=0), "PHMAdapterConfig.rank must be None"),
    (dict(targets=[]), "PHMAdapterConfig.targets must be a non-empty list"),
    (dict(targets=[""]), "PHMAdapterConfig.targets must be a non-empty list"),
    (dict(scale=float("nan")), "PHMAdapterConfig.scale must be a finite number"),
    (dict(dropout=1.0), r"PHMAdapterConfig.dropout must be a number in \[0, 1\)"),
    (dict(shared_rule="yes"), "PHMAdapterConfig.shared_rule must be true or false"),
])
def test_bad_config_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PHMAdapterConfig(**kwargs)


def test_config_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match=r"spec.json: unknown PHMAdapterConfig key\(s\) \['alpha'\]"):
        PHMAdapterConfig.from_dict({"n": 4, "alpha": 8}, where="spec.json")
    assert (PHMAdapterConfig.from_dict(PHMAdapterConfig(n=2, targets=("q",)).to_dict())
            == PHMAdapterConfig(n=2, targets=("q",)))


def test_bad_add_adapter_calls_are_clear_and_leave_the_model_untouched():
    model = classifier()
    reference = copy.deepcopy(model)
    with pytest.raises(ValueError, match="pattern 'query' matches no nn.Linear/Conv1D module; linear layers in the "
                                         "model: encoder.layers.0.self_attn.qkv_proj"):
        add_adapter(model, "a", PHMAdapterConfig(n=4, targets=["*.qkv_proj", "query"]))
    with pytest.raises(ValueError, match=r"'embed.token' .*matches only modules that are not linear layers: "
                                         r"embed.token \(Embedding\)"):
        add_adapter(model, "a", PHMAdapterConfig(n=4, targets=["embed.token"]))
    with pytest.raises(ValueError, match=r"n=3 must divide .*self_attn.qkv_proj \(16 → 48\)"):
        add_adapter(model, "a", PHMAdapterConfig(n=3, targets=["*.qkv_proj"]))
    with pytest.raises(ValueError, match="adapter name must be a non-empty string without '.'"):
        add_adapter(model, "a.b", PHMAdapterConfig(n=4))
    with pytest.raises(TypeError, match="unexpected keyword argument 'n'"):  # one way to configure: the config
        add_adapter(model, "a", n=4)
    with pytest.raises(TypeError, match=r"add_adapter takes a PHMAdapterConfig .*got dict"):
        add_adapter(model, "a", {"n": 4})
    assert [type(m) for m in model.modules()] == [type(m) for m in reference.modules()]
    assert all(p.requires_grad for p in model.parameters())  # nothing was frozen by a refused call
    add_adapter(model, "a", PHMAdapterConfig(n=4, targets=["classifier"]))
    with pytest.raises(ValueError, match="already has an adapter named 'a'"):
        add_adapter(model, "a", PHMAdapterConfig(n=4, targets=["classifier"]))
    with pytest.raises(KeyError, match=r"no adapter named 'x' in the model; attached: \['a'\]"):
        set_active(model, "x")
    set_active(model, None)
    with pytest.raises(RuntimeError, match="no active adapter to merge"):
        merge(model)
    assert unmerge(model) == 0


@pytest.mark.parametrize("finish", ["remove", "merge_and_unwrap"])
def test_base_parameters_get_their_trainability_back_when_no_adapter_is_left(finish):
    from hyperplex.adapters import merge_and_unwrap, remove_adapter

    model = classifier()
    frozen_by_user = next(iter(model.parameters()))
    frozen_by_user.requires_grad_(False)  # the user froze this one before adding adapters
    before = [p.requires_grad for p in model.parameters()]
    add_adapter(model, "a", PHMAdapterConfig(n=2, targets=["*"]))
    add_adapter(model, "b", PHMAdapterConfig(n=2, targets=["*"]))
    assert not any(p.requires_grad for n, p in model.named_parameters() if "base_layer" in n)
    if finish == "remove":
        remove_adapter(model, "a")
        assert not any(p.requires_grad for n, p in model.named_parameters() if "base_layer" in n)  # "b" is left
        remove_adapter(model, "b")
    else:
        merge_and_unwrap(model)
    assert [p.requires_grad for p in model.parameters()] == before


def test_a_rank_above_a_blocks_rank_is_refused_by_layer_and_adapts_nothing():
    """rank 8 on 16 → 16 at n = 4 (blocks 4 × 4) would hold more than the full blocks and add no capacity."""
    import hyperplex as hp

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.value = nn.Linear(64, 64), nn.Linear(16, 16)

    model = Two()
    with pytest.raises(ValueError, match=r"layer 'value': rank=8 exceeds the rank of an Sᵢ, min\(k/n, d/n\) = 4"):
        hp.add_adapter(model, "a", hp.PHMAdapterConfig(n=4, rank=8, targets=["query", "value"]))
    assert type(model.query) is nn.Linear and type(model.value) is nn.Linear
    assert all(p.requires_grad for p in model.parameters())  # nothing frozen either
