"""save_converted / load_converted: bit-identical round trips, no pickle, one clear error per bad folder."""

import json
import os

import pytest
import torch
from safetensors import safe_open
from torch import nn

from hyperplex import LowRankLinear, PHMLinear
from hyperplex.convert import LoadError, convert_linears, load_converted, save_converted
from hyperplex.convert.serialize import SPEC_NAME, WEIGHTS_NAME

SENTENCES = ["the cat sat on the mat", "a big red dog runs fast", "blue", "the film is very good"]


def plain_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16, bias=False), nn.Linear(16, 4))


def test_plain_module_round_trip_needs_the_architecture(tmp_path):
    m = plain_model()
    convert_linears(m, "phm", n=4, min_features=16, rule="quaternion", include="0")
    convert_linears(m, "lowrank", n=2, min_features=16, include="2")
    x = torch.randn(3, 16)
    expected = m(x)
    save_converted(m, tmp_path)
    assert sorted(os.listdir(tmp_path)) == sorted([WEIGHTS_NAME, SPEC_NAME])
    spec = json.loads((tmp_path / SPEC_NAME).read_text())
    assert spec["format"] == "hyperplex-converted" and spec["version"] == 2
    assert spec["layers"] == [
        {"name": "0", "kind": "phm", "n": 4, "rule": "quaternion", "rank": None, "in_features": 16, "out_features": 32,
         "bias": True, "from_conv1d": False},
        {"name": "2", "kind": "lowrank", "n": None, "rule": None, "rank": m[2].rank, "in_features": 32,
         "out_features": 16, "bias": False, "from_conv1d": False},
    ]
    with pytest.raises(LoadError, match="pass the dense architecture"):
        load_converted(tmp_path)
    loaded = load_converted(tmp_path, model=plain_model())
    assert (isinstance(loaded[0], PHMLinear) and loaded[0].rule_name == "quaternion"
            and isinstance(loaded[2], LowRankLinear))
    assert torch.equal(loaded(x), expected)


def test_dtype_is_restored(tmp_path):
    m = plain_model().double()
    convert_linears(m, "phm", n=2, min_features=16)
    x = torch.randn(3, 16, dtype=torch.float64)
    save_converted(m, tmp_path)
    assert json.loads((tmp_path / SPEC_NAME).read_text())["dtype"] == "float64"
    loaded = load_converted(tmp_path, model=plain_model())  # built in float32, cast before loading
    assert loaded[0].phm_weight.dtype == torch.float64 and torch.equal(loaded(x), m(x))


def test_gpt2_round_trip_bit_identical_with_tied_weights(tmp_path, tiny_gpt2):
    m = tiny_gpt2()
    convert_linears(m, "phm", n=4)
    ids = torch.randint(0, 64, (2, 8))
    expected = m(ids).logits
    save_converted(m, tmp_path)
    assert {"config.json", "generation_config.json", WEIGHTS_NAME, SPEC_NAME} <= set(os.listdir(tmp_path))
    spec = json.loads((tmp_path / SPEC_NAME).read_text())
    assert spec["model"] == {"library": "transformers", "class": "GPT2LMHeadModel"}
    assert spec["aliases"] == {"lm_head.weight": "transformer.wte.weight"}
    assert all(entry["from_conv1d"] for entry in spec["layers"]) and len(spec["layers"]) == 8
    with safe_open(os.fspath(tmp_path / WEIGHTS_NAME), "pt") as f:
        assert "transformer.h.0.attn.c_attn.phm_weight" in f.keys() and "lm_head.weight" not in f.keys()
    loaded = load_converted(tmp_path)
    assert loaded.lm_head.weight is loaded.transformer.wte.weight  # still tied
    assert torch.equal(loaded(ids).logits, expected)
    greedy = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(loaded.generate(ids[:1], **greedy), m.generate(ids[:1], **greedy))


def test_sentence_transformer_round_trip_bit_identical(tmp_path, tiny_sentence_transformer):
    st = tiny_sentence_transformer()
    convert_linears(st, "phm", n=2)
    expected = st.encode(SENTENCES, convert_to_tensor=True)
    save_converted(st, tmp_path)
    files = {os.path.relpath(os.path.join(r, f), tmp_path) for r, _, fs in os.walk(tmp_path) for f in fs}
    assert {"modules.json", "config.json", "tokenizer.json", os.path.join("1_Pooling", "config.json")} <= files
    assert [f for f in files if f.endswith((".bin", ".pt", ".pth", ".safetensors"))] == [WEIGHTS_NAME]
    loaded = load_converted(tmp_path)
    assert torch.equal(loaded.encode(SENTENCES, convert_to_tensor=True), expected)


@pytest.mark.parametrize("convert_dense_module", [False, True])
def test_sentence_transformer_with_a_dense_projection_round_trips(tmp_path, bert_folder, convert_dense_module):
    """A Dense module after pooling (as in several sentence-transformers models) has weights the Transformer
    rebuild does not make; its folder keeps a (dense) weight file, and the round trip is bit-identical."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    try:
        from sentence_transformers.sentence_transformer.modules import Dense, Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Dense, Pooling, Transformer
    torch.manual_seed(0)
    st = sentence_transformers.SentenceTransformer(
        modules=[Transformer(os.fspath(bert_folder)), Pooling(32, "mean"), Dense(32, 16)], device="cpu")
    report = convert_linears(st, "phm", n=2, exclude=None if convert_dense_module else ["2.*"], min_features=8)
    assert any(layer.name.startswith("2.") for layer in report.converted) == convert_dense_module
    expected = st.encode(SENTENCES, convert_to_tensor=True)
    save_converted(st, tmp_path)
    loaded = load_converted(tmp_path)
    assert torch.equal(loaded.encode(SENTENCES, convert_to_tensor=True), expected)
    assert isinstance(loaded[2].linear, PHMLinear) == convert_dense_module


def test_tokenizer_files_saved_beside_a_transformers_model(tmp_path, tiny_gpt2, bert_folder):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(os.fspath(bert_folder))
    m = tiny_gpt2()
    convert_linears(m, "lowrank", n=2)
    save_converted(m, tmp_path, tokenizer=tokenizer)
    again = AutoTokenizer.from_pretrained(os.fspath(tmp_path))
    assert again("the cat sat")["input_ids"] == tokenizer("the cat sat")["input_ids"]
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]  # no scratch left behind


def test_folder_without_spec(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(LoadError, match=f"no {SPEC_NAME}; not a folder written by .*save_converted.*config.json"):
        load_converted(tmp_path)


def test_spec_of_another_architecture(tmp_path, tiny_gpt2):
    m = tiny_gpt2()
    convert_linears(m, "phm", n=2)
    save_converted(m, tmp_path)
    spec_path = tmp_path / SPEC_NAME
    spec = json.loads(spec_path.read_text())
    spec["layers"][0]["name"] = "encoder.layer.0.attention.self.query"
    spec_path.write_text(json.dumps(spec))
    with pytest.raises(LoadError, match=r"hyperplex_convert.json: layer 'encoder.layer.0.attention.self.query' "
                                        r"\(layers\[0\]\) does not exist in the rebuilt GPT2LMHeadModel"
                                        r".*another architecture"):
        load_converted(tmp_path)
    spec["layers"][0]["name"] = "transformer.h.0.attn.c_attn"
    spec["layers"][0]["out_features"] = 64
    spec_path.write_text(json.dumps(spec))
    with pytest.raises(LoadError, match=r"'transformer.h.0.attn.c_attn' is 96x32 \(bias=True\) in the rebuilt model "
                                        r"but 64x32"):
        load_converted(tmp_path)


def reseal(folder):
    """Record the weights file's current SHA-256 in the spec (as if save_converted had written it)."""
    from hyperplex.fileio import sha256_file

    spec = json.loads((folder / SPEC_NAME).read_text())
    spec["sha256"] = {WEIGHTS_NAME: sha256_file(folder / WEIGHTS_NAME)}
    (folder / SPEC_NAME).write_text(json.dumps(spec))


def test_tensor_shape_mismatch_and_missing_tensor_name_file_and_tensor(tmp_path):
    from safetensors.torch import load_file
    from safetensors.torch import save_file as save_only

    def save_file(tensors, path):
        save_only(tensors, path)
        reseal(tmp_path)

    m = plain_model()
    convert_linears(m, "lowrank", n=2, min_features=16)
    save_converted(m, tmp_path)
    weights = tmp_path / WEIGHTS_NAME
    tensors = load_file(os.fspath(weights))
    tensors["0.left"] = torch.zeros(32, tensors["0.left"].shape[1] + 1)
    save_file(tensors, os.fspath(weights))
    with pytest.raises(LoadError, match=r"model.safetensors: tensor '0.left' has shape \(32, \d+\) in the file but"):
        load_converted(tmp_path, model=plain_model())
    del tensors["0.left"]
    save_file(tensors, os.fspath(weights))
    with pytest.raises(LoadError, match=r"model.safetensors: tensor '0.left' of the rebuilt Sequential "
                                        r"is not in the file"):
        load_converted(tmp_path, model=plain_model())
    tensors["0.left"], tensors["extra"] = torch.zeros(32, 1), torch.zeros(1)
    save_file(tensors, os.fspath(weights))
    with pytest.raises(LoadError, match=r"model.safetensors: tensor 'extra' has no place in the rebuilt Sequential"):
        load_converted(tmp_path, model=plain_model())


def test_bad_spec_json(tmp_path):
    (tmp_path / SPEC_NAME).write_text('{"format": "something-else", "version": 1}')
    with pytest.raises(LoadError, match="hyperplex_convert.json: key 'format' is 'something-else', expected "
                                        "'hyperplex-converted'"):
        load_converted(tmp_path)
    (tmp_path / SPEC_NAME).write_text('{"format": ')
    with pytest.raises(LoadError, match="invalid JSON"):
        load_converted(tmp_path)
