"""The base model an adapter file records (name, class, signature of the adapted base weights): a wrong base is
refused, nothing changed; an explicit flag accepts other weights but never other shapes; version 1 files load."""

import hashlib
import json

import pytest
import torch

from hyperplex.adapters import (
    PHMAdapterConfig,
    adapter_names,
    adapter_state_dict,
    add_adapter,
    base_signature,
    load_adapter,
    merge,
    read_adapter_spec,
    save_adapter,
)
from hyperplex.adapters.io import SPEC_NAME
from hyperplex.models.transformer import TransformerClassifier, TransformerConfig

TARGETS = ["*.qkv_proj", "ffn.*"]
LAYERS = [f"encoder.layers.{i}.{m}" for i in range(2) for m in ("self_attn.qkv_proj", "ffn.linear1", "ffn.linear2")]


def classifier(seed=0, d_ff=32):
    torch.manual_seed(seed)
    config = TransformerConfig(d_model=16, num_heads=2, d_ff=d_ff, encoder_layers=2, dropout=0.0)
    return TransformerClassifier(config, vocab_size=30, num_classes=4).eval()


def tokens():
    g = torch.Generator().manual_seed(3)
    return torch.randint(4, 30, (3, 6), generator=g), torch.tensor([6, 4, 2])


def trained(seed=0):
    model = classifier(seed)
    add_adapter(model, "a", PHMAdapterConfig(n=4, rank=2, targets=TARGETS))
    with torch.no_grad():
        for p in adapter_state_dict(model, "a").values():
            p.normal_(0, 0.3)
    return model


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}, [type(m) for m in model.modules()]


def assert_unchanged(model, before):
    state, types = before
    assert [type(m) for m in model.modules()] == types and adapter_names(model) == []
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_the_spec_records_the_base_and_its_signature_by_hand(tmp_path):
    model = trained()
    save_adapter(model, "a", tmp_path)
    spec, _ = read_adapter_spec(tmp_path)
    assert spec["version"] == 2 and spec["modules_to_save"] == {}
    base = spec["base_model"]
    assert base["name"] == "TransformerClassifier"
    assert base["class"] == "hyperplex.models.transformer.TransformerClassifier"
    fresh = classifier()
    lines = ""
    for path in sorted(LAYERS):  # per layer: name, dtype, shape and bytes of its weight, then of its bias if any
        layer, digest = fresh.get_submodule(path), hashlib.sha256()
        for what in ("weight", "bias"):
            t = getattr(layer, what)
            if t is not None:
                digest.update(f"{what}|{t.dtype}|{tuple(t.shape)}|".encode() + t.detach().numpy().tobytes())
        lines += f"{path}\t{digest.hexdigest()}\n"
    assert base["weights_sha256"] == hashlib.sha256(lines.encode()).hexdigest() == base_signature(fresh, LAYERS)


def test_a_base_with_other_weights_is_refused_unless_allowed(tmp_path):
    model = trained()
    x = tokens()
    save_adapter(model, "a", tmp_path)
    other = classifier(seed=1)  # same architecture, other weights
    before = snapshot(other)
    with pytest.raises(ValueError, match=rf"{SPEC_NAME}: the base model's weights differ from those the adapter was "
                                         r"saved with \(SHA-256 of the 6 adapted layers' weights and biases: saved "
                                         r"[0-9a-f]{16}…, this model [0-9a-f]{16}…; saved on TransformerClassifier "
                                         r".*allow_other_base_weights=True"):
        load_adapter(other, tmp_path)
    assert_unchanged(other, before)
    with torch.no_grad():  # one changed number in one adapted layer is enough
        other_by_one = classifier()
        other_by_one.encoder.layers[1].ffn.linear2.bias[0] += 1e-6
    with pytest.raises(ValueError, match="the base model's weights differ"):
        load_adapter(other_by_one, tmp_path)
    load_adapter(other, tmp_path, allow_other_base_weights=True)  # the user accepts another base
    saved = adapter_state_dict(model, "a")
    assert all(torch.equal(v, adapter_state_dict(other, "a")[k]) for k, v in saved.items())
    fresh = classifier()
    load_adapter(fresh, tmp_path)
    assert torch.equal(fresh(*x), model(*x))


def test_other_shapes_are_refused_even_when_other_weights_are_allowed(tmp_path):
    save_adapter(trained(), "a", tmp_path)
    wider = classifier(d_ff=64)
    before = snapshot(wider)
    with pytest.raises(ValueError, match=r"encoder.layers.0.ffn.linear1: the adapter was saved for 16 → 32 features"):
        load_adapter(wider, tmp_path, allow_other_base_weights=True)
    assert_unchanged(wider, before)


def test_a_merged_adapter_records_the_unmerged_base(tmp_path):
    model = trained()
    x = tokens()
    expected = model(*x)
    save_adapter(model, "a", tmp_path / "unmerged")
    merge(model)
    save_adapter(model, "a", tmp_path / "merged")
    signature = [read_adapter_spec(tmp_path / f)[0]["base_model"]["weights_sha256"] for f in ("unmerged", "merged")]
    assert signature[0] == signature[1] == base_signature(classifier(), LAYERS)
    fresh = classifier()
    load_adapter(fresh, tmp_path / "merged")
    assert torch.equal(fresh(*x), expected)


def test_a_version_1_file_without_the_record_still_loads(tmp_path):
    model = trained()
    x = tokens()
    save_adapter(model, "a", tmp_path)
    spec = json.loads((tmp_path / SPEC_NAME).read_text())
    for key in ("base_model", "modules_to_save"):
        del spec[key]
    del spec["config"]["modules_to_save"]
    spec["version"] = 1
    (tmp_path / SPEC_NAME).write_text(json.dumps(spec))
    read, config = read_adapter_spec(tmp_path)
    assert read["base_model"] is None and read["modules_to_save"] == {} and config.modules_to_save == ()
    other = classifier(seed=1)
    load_adapter(other, tmp_path)  # nothing recorded, nothing to compare: it loads
    fresh = classifier()
    load_adapter(fresh, tmp_path)
    assert torch.equal(fresh(*x), model(*x))
    spec["version"] = 3
    (tmp_path / SPEC_NAME).write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=r"'version' 3 is not supported \(this hyperplex reads 1, 2\)"):
        read_adapter_spec(tmp_path)


def test_a_transformers_base_is_recorded_by_its_folder(tmp_path):
    transformers = pytest.importorskip("transformers")
    from conftest import write_tiny_bert

    folder = tmp_path / "bert"
    folder.mkdir()
    write_tiny_bert(folder)
    model = transformers.BertModel.from_pretrained(folder)
    add_adapter(model, "a", PHMAdapterConfig(n=4, rank=2, targets=["query", "value"]))
    save_adapter(model, "a", tmp_path / "adapter")
    base = read_adapter_spec(tmp_path / "adapter")[0]["base_model"]
    assert base["name"] == str(folder) and base["class"].endswith("BertModel")
    load_adapter(transformers.BertModel.from_pretrained(folder), tmp_path / "adapter")
    torch.manual_seed(5)
    stranger = transformers.BertModel(model.config)  # the architecture without the pretrained weights
    with pytest.raises(ValueError, match=r"weights differ.*saved on (.*) \(transformers\..*BertModel\), "
                                         r"this model is \1 "):
        load_adapter(stranger, tmp_path / "adapter")  # its config carries the same name: the weights decide
