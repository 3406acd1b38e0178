"""save_adapter / load_adapter: adapter-only files that reproduce outputs on a fresh base; clear
errors (naming the file) before anything changes when the files do not fit the model."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from hyperplex.adapters import (
    PHMAdapterConfig,
    active_adapter,
    adapted_layers,
    adapter_names,
    adapter_state_dict,
    add_adapter,
    load_adapter,
    merge,
    read_adapter_spec,
    save_adapter,
    set_active,
)
from hyperplex.adapters.io import SPEC_NAME, WEIGHTS_NAME
from hyperplex.models.transformer import TransformerClassifier, TransformerConfig

TARGETS = ["*.qkv_proj", "ffn.*"]


def classifier(seed=0, d_ff=32, layers=2):
    torch.manual_seed(seed)
    config = TransformerConfig(d_model=16, num_heads=2, d_ff=d_ff, encoder_layers=layers, dropout=0.0)
    return TransformerClassifier(config, vocab_size=30, num_classes=4).eval()


def tokens():
    g = torch.Generator().manual_seed(3)
    return torch.randint(4, 30, (3, 6), generator=g), torch.tensor([6, 4, 2])


def trained(rank=2, shared=False, name="sst2"):
    model = classifier()
    add_adapter(model, name, PHMAdapterConfig(n=4, rank=rank, targets=TARGETS, shared_rule=shared, scale=0.5))
    with torch.no_grad():
        for p in adapter_state_dict(model, name).values():
            p.normal_(0, 0.3)
    return model


@pytest.mark.parametrize("rank,shared", [(None, False), (2, False), (2, True)])
def test_saved_adapter_on_a_fresh_base_reproduces_outputs(tmp_path, rank, shared):
    model = trained(rank, shared)
    x = tokens()
    expected = model(*x)
    save_adapter(model, "sst2", tmp_path)
    assert sorted(os.listdir(tmp_path)) == [SPEC_NAME, WEIGHTS_NAME]  # no temporary files left
    saved = load_file(str(tmp_path / WEIGHTS_NAME))
    state = adapter_state_dict(model, "sst2")
    assert saved.keys() == state.keys()  # adapter weights only: no base weight in the file
    assert not any("base_layer" in k or k.endswith(".bias") for k in saved)
    fresh = classifier()  # same seed: the same base weights, as a pretrained model would give
    assert not torch.allclose(fresh(*x), expected)
    assert load_adapter(fresh, tmp_path) == "sst2"
    assert active_adapter(fresh) == "sst2"
    assert torch.equal(fresh(*x), expected)
    loaded = adapter_state_dict(fresh, "sst2")
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
    if shared:
        assert len({id(layer.adapters["sst2"].rule) for _, layer in adapted_layers(fresh)}) == 1


def test_load_under_another_name_beside_an_existing_adapter(tmp_path):
    model = trained()
    save_adapter(model, "sst2", tmp_path)
    x = tokens()
    expected = model(*x)
    load_adapter(model, tmp_path, name="copy", activate=False)
    assert adapter_names(model) == ["sst2", "copy"] and active_adapter(model) == "sst2"
    set_active(model, "copy")
    assert torch.equal(model(*x), expected)
    with pytest.raises(ValueError, match="already has an adapter named 'copy'"):
        load_adapter(model, tmp_path, name="copy")


def test_save_while_merged_writes_the_adapter_not_the_merged_base(tmp_path):
    model = trained()
    expected = {k: v.clone() for k, v in adapter_state_dict(model, "sst2").items()}
    merge(model)
    save_adapter(model, "sst2", tmp_path)
    saved = load_file(str(tmp_path / WEIGHTS_NAME))
    assert all(torch.equal(saved[k], v) for k, v in expected.items())


def test_load_errors_name_the_file_and_leave_the_model_untouched(tmp_path):
    model = trained()
    save_adapter(model, "sst2", tmp_path)
    spec_path = str(tmp_path / SPEC_NAME)

    smaller = classifier(layers=1)  # encoder.layers.1.* do not exist
    with pytest.raises(ValueError, match=r"adapter.json: the adapter does not fit this model: "
                                         r"encoder.layers.1.self_attn.qkv_proj: no such module"):
        load_adapter(smaller, tmp_path)
    wider = classifier(d_ff=64)
    with pytest.raises(ValueError, match=r"encoder.layers.0.ffn.linear1: the adapter was saved for 16 → 32 features, "
                                         r"the model's layer has 16 → 64"):
        load_adapter(wider, tmp_path)
    for fresh in (smaller, wider):
        assert not list(adapted_layers(fresh)) and all(p.requires_grad for p in fresh.parameters())

    spec = json.loads(open(spec_path).read())
    spec["layers"]["embed.token"] = {"in_features": 16, "out_features": 32}
    (tmp_path / SPEC_NAME).write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=r"embed.token: is a Embedding, not an nn.Linear/Conv1D"):
        load_adapter(classifier(), tmp_path)

    spec["layers"].pop("embed.token")
    spec["config"]["alpha"] = 16
    (tmp_path / SPEC_NAME).write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=r"adapter.json: 'config': unknown PHMAdapterConfig key\(s\) \['alpha'\]"):
        load_adapter(classifier(), tmp_path)

    spec["config"].pop("alpha")
    spec["config"]["n"] = 0
    (tmp_path / SPEC_NAME).write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="'config': PHMAdapterConfig.n must be a positive integer"):
        load_adapter(classifier(), tmp_path)

    spec["config"]["n"] = 3  # divides neither 16 nor 32: the layer's sizes are named, not a shape mismatch
    (tmp_path / SPEC_NAME).write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=r"adapter.json: the adapter does not fit this model: "
                                         r"encoder.layers.0.self_attn.qkv_proj: n=3 does not divide its 16 → 48"):
        load_adapter(classifier(), tmp_path)

    (tmp_path / SPEC_NAME).write_text('{"format": "hyperplex-phm-adapter",\n  "version": 1,,\n}')
    with pytest.raises(ValueError, match=r"adapter.json: line 2, column 16: not valid JSON"):
        load_adapter(classifier(), tmp_path)


def test_weights_that_do_not_match_the_spec_are_refused(tmp_path):
    model = trained()
    save_adapter(model, "sst2", tmp_path)
    other = trained(rank=3, name="other")
    save_adapter(other, "other", tmp_path / "other")
    # Weights of another save next to this spec: the checksum tells.
    (tmp_path / WEIGHTS_NAME).write_bytes((tmp_path / "other" / WEIGHTS_NAME).read_bytes())
    fresh = classifier()
    with pytest.raises(ValueError, match=r"adapter.safetensors: SHA-256 differs from the one in .*adapter.json"):
        load_adapter(fresh, tmp_path)
    # Same file with the checksum updated (a hand-edited spec): the shapes tell.
    spec = json.loads((tmp_path / SPEC_NAME).read_text())
    spec["weights_sha256"] = json.loads((tmp_path / "other" / SPEC_NAME).read_text())["weights_sha256"]
    (tmp_path / SPEC_NAME).write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=r"does not match .*wrong shapes \['encoder.layers.0.self_attn.qkv_proj.left: "
                                         r"expected \(4, 12, 2\), found \(4, 12, 3\)'"):
        load_adapter(fresh, tmp_path)
    assert not list(adapted_layers(fresh))
    with pytest.raises(FileNotFoundError, match="no adapter spec here"):
        read_adapter_spec(tmp_path / "missing")
