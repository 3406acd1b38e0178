"""A converted-model folder is untrusted input: nothing outside it is read or written, no code from it runs,
a damaged or hostile spec is one LoadError naming the file and key, and the load never builds dense layers."""

import json
import os
import re
import threading

import pytest
import torch
from conftest import disk_state as snapshot
from torch import nn

from hyperplex.convert import LoadError, convert_linears, load_converted, save_converted
from hyperplex.convert.serialize import SPEC_NAME, WEIGHTS_NAME

SENTENCES = ["the cat sat on the mat", "a big red dog runs fast", "blue"]


def plain_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16, bias=False), nn.Linear(16, 4))


def edit_spec(folder, resign=True, **changes):
    """Change keys of the spec. ``resign``: also record the new spec's digest in the weights file and the
    new weights checksum in the spec, as a deliberate forger would, so the checks behind the digest run."""
    spec = json.loads((folder / SPEC_NAME).read_text())
    spec.update(changes)
    weights = folder / WEIGHTS_NAME
    if resign and "sha256" not in changes and isinstance(spec.get("sha256"), dict) and weights.is_file():
        from safetensors import safe_open
        from safetensors.torch import save_file

        from hyperplex.convert.serialize import spec_digest
        from hyperplex.fileio import sha256_file

        with safe_open(os.fspath(folder / WEIGHTS_NAME), framework="pt") as handle:
            metadata, tensors = handle.metadata() or {}, {k: handle.get_tensor(k) for k in handle.keys()}
        if "spec_sha256" in metadata:
            save_file(tensors, os.fspath(weights), metadata={**metadata, "spec_sha256": spec_digest(spec)})
            spec["sha256"] = {**spec["sha256"], WEIGHTS_NAME: sha256_file(folder / WEIGHTS_NAME)}
    (folder / SPEC_NAME).write_text(json.dumps(spec))
    return spec


@pytest.fixture
def saved_plain(tmp_path):
    m = plain_model()
    convert_linears(m, "phm", n=4, min_features=16, include="0")
    folder = tmp_path / "converted"
    save_converted(m, folder)
    return m, folder


@pytest.fixture
def saved_st(tmp_path, tiny_sentence_transformer):
    st = tiny_sentence_transformer()
    convert_linears(st, "phm", n=2)
    folder = tmp_path / "st"
    save_converted(st, folder)
    return st, folder


def refused_unchanged(folder, model_factory, match):
    """load_converted(folder) raises LoadError matching ``match``; the folder and the given model are unchanged."""
    before = snapshot(folder)
    model = model_factory() if model_factory else None
    state = {k: v.clone() for k, v in model.state_dict().items()} if model is not None else None
    with pytest.raises(LoadError, match=match):
        load_converted(folder, model=model)
    assert snapshot(folder) == before
    if model is not None:  # not half-changed: the same layers, the same values
        assert all(isinstance(layer, (nn.Linear, nn.GELU)) for layer in model)
        assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


# -- file names read from the spec stay inside the folder -----------------------------------------------------------
@pytest.mark.parametrize("name", ["../outside.safetensors", "/etc/passwd", "sub/../../x", 123, ""])
def test_weights_name_outside_the_folder_or_not_a_name_is_refused(saved_plain, name):
    _, folder = saved_plain
    edit_spec(folder, weights=name)
    refused_unchanged(folder, plain_model, r"hyperplex_convert.json: key 'weights'")


def test_weights_symlink_out_of_the_folder_is_refused(saved_plain, tmp_path):
    _, folder = saved_plain
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes((folder / WEIGHTS_NAME).read_bytes())
    os.symlink(outside, folder / "link.safetensors")
    edit_spec(folder, weights="link.safetensors")
    refused_unchanged(folder, plain_model, r"key 'weights'.*outside")


def test_weights_name_that_is_a_folder_is_called_a_folder(saved_plain):
    _, folder = saved_plain
    (folder / "sub").mkdir()
    edit_spec(folder, weights="sub")
    refused_unchanged(folder, plain_model, r"key 'weights' names 'sub', which is a folder")


# -- FIFOs, devices, links out: refused before anything is read ------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifo_and_device_link_in_the_folder_are_refused_without_blocking(saved_st):
    _, folder = saved_st
    os.unlink(folder / "README.md")  # the model card sentence-transformers writes
    os.mkfifo(folder / "README.md")
    result = {}

    def run():
        try:
            load_converted(folder)
        except LoadError as err:
            result["error"] = str(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "load_converted blocked on a FIFO"
    assert "README.md: a FIFO, not a regular file" in result["error"]
    os.unlink(folder / "README.md")
    os.symlink("/dev/zero", folder / "README.md")
    with pytest.raises(LoadError, match=r"README.md: a symbolic link to /dev/zero, outside the model folder"):
        load_converted(folder)


# -- modules.json cannot reach another folder or import code --------------------------------------------------------
@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_modules_json_path_outside_the_folder_writes_nothing_there(saved_st, tmp_path, bert_folder, where):
    _, folder = saved_st
    victim = tmp_path / "other_model"
    victim.mkdir()
    for name in ("config.json", "model.safetensors"):
        (victim / name).write_bytes((bert_folder / name).read_bytes())
    before = snapshot(victim)
    modules = json.loads((folder / "modules.json").read_text())
    modules[0]["path"] = "../other_model" if where == "relative" else os.fspath(victim)
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(LoadError, match=r"modules.json: entry 0 key 'path'"):
        load_converted(folder)
    assert snapshot(victim) == before


def test_modules_json_type_outside_sentence_transformers_is_refused(saved_st, tmp_path):
    _, folder = saved_st
    marker = tmp_path / "ran"
    (folder / "custom.py").write_text(f"open({os.fspath(marker)!r}, 'w').write('ran')\nclass Module: pass\n")
    modules = json.loads((folder / "modules.json").read_text())
    modules[1]["type"] = "custom.Module"
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(LoadError, match=r"modules.json: entry 1 key 'type' is 'custom.Module'"):
        load_converted(folder)
    assert not marker.exists()


# -- integrity ---------------------------------------------------------------------------------------------------------
def test_a_flipped_byte_in_the_weights_is_detected(saved_plain):
    _, folder = saved_plain
    data = bytearray((folder / WEIGHTS_NAME).read_bytes())
    data[-3] ^= 0x01  # inside the last tensor's bytes: the header still parses
    (folder / WEIGHTS_NAME).write_bytes(bytes(data))
    refused_unchanged(folder, plain_model, r"model.safetensors: SHA-256 does not match")


# -- malformed specs: one LoadError naming the key ---------------------------------------------------------------------
@pytest.mark.parametrize("changes, match", [
    ({"layers": [1, 2]}, r"layers\[0\] is 1, expected an object"),
    ({"layers": None}, r"key 'layers' is None, expected a list"),
    ({"dtype": "int8"}, r"key 'dtype' is 'int8', expected one of float16"),
    ({"model": "x"}, r"key 'model' is 'x'"),
    ({"aliases": [1]}, r"key 'aliases' is \[1\]"),
    ({"sha256": {"model.safetensors": 5}}, r"key 'sha256'"),
])
def test_malformed_spec_keys_name_the_key(saved_plain, changes, match):
    _, folder = saved_plain
    edit_spec(folder, **changes)
    refused_unchanged(folder, plain_model, "hyperplex_convert.json: " + match)


def test_bad_layer_entries_name_the_entry_and_key(saved_plain):
    _, folder = saved_plain
    spec = json.loads((folder / SPEC_NAME).read_text())
    layer = spec["layers"][0]
    for key, value, match in [("n", "4", r"layers\[0\] \('0'\): key 'n' is '4'"),
                              ("rule", "nonsense", r"key 'rule' is 'nonsense'"),
                              ("in_features", -1, r"key 'in_features' is -1"),
                              ("bias", "yes", r"key 'bias' is 'yes', expected true or false")]:
        edit_spec(folder, layers=[{**layer, key: value}])
        refused_unchanged(folder, plain_model, match)


def test_duplicate_layer_entries_are_refused(saved_plain):
    _, folder = saved_plain
    spec = json.loads((folder / SPEC_NAME).read_text())
    edit_spec(folder, layers=spec["layers"] * 1000)
    refused_unchanged(folder, plain_model, r"layers\[1\] names layer '0' again \(layers\[0\] already does\)")


def test_deeply_nested_and_non_utf8_specs(saved_plain):
    _, folder = saved_plain
    (folder / SPEC_NAME).write_text("[" * 200_000 + "]" * 200_000)
    refused_unchanged(folder, plain_model, r"hyperplex_convert.json: (JSON nested too deeply|key 'format')")
    (folder / SPEC_NAME).write_bytes(b'{"format": "\xff"}')
    refused_unchanged(folder, plain_model, r"hyperplex_convert.json: not UTF-8 text \(byte 12")


def test_a_learned_rule_relabelled_as_a_fixed_algebra_is_refused(tmp_path):
    m = plain_model()
    convert_linears(m, "phm", n=4, min_features=16, include="0")  # learned rule
    save_converted(m, tmp_path)
    spec = json.loads((tmp_path / SPEC_NAME).read_text())
    spec["layers"][0]["rule"] = "quaternion"
    (tmp_path / SPEC_NAME).write_text(json.dumps(spec))
    refused_unchanged(tmp_path, plain_model, r"the spec hyperplex_convert.json was changed after saving")
    edit_spec(tmp_path, layers=spec["layers"])  # the digest forged too: the rule's values still give it away
    refused_unchanged(tmp_path, plain_model, r"tensor '0.phm_rule' does not hold the quaternion table")


def test_a_refused_folder_leaves_the_given_model_unchanged_on_a_late_error(saved_plain):
    """The missing-tensor error comes after the spec was applied; the caller's model is still dense."""
    from safetensors.torch import load_file, save_file

    from hyperplex.fileio import sha256_file
    _, folder = saved_plain
    tensors = load_file(os.fspath(folder / WEIGHTS_NAME))
    del tensors["0.phm_weight"]
    save_file(tensors, os.fspath(folder / WEIGHTS_NAME))
    edit_spec(folder, sha256={WEIGHTS_NAME: sha256_file(folder / WEIGHTS_NAME)})
    refused_unchanged(folder, plain_model, r"tensor '0.phm_weight' of the rebuilt Sequential is not in the file")


# -- saving over the source --------------------------------------------------------------------------------------------
def test_save_converted_refuses_the_folder_the_model_came_from(tmp_path, bert_folder):
    transformers = pytest.importorskip("transformers")
    source = tmp_path / "bert"
    source.mkdir()
    for name in os.listdir(bert_folder):
        (source / name).write_bytes((bert_folder / name).read_bytes())
    before = snapshot(source)
    model = transformers.BertModel.from_pretrained(os.fspath(source))
    convert_linears(model, "phm", n=2)
    with pytest.raises(ValueError, match="is the folder this model was loaded from"):
        save_converted(model, source)
    assert snapshot(source) == before
    model.config._name_or_path = ""  # the record lost: the foreign weights file still protects the folder
    with pytest.raises(ValueError, match=r"save_converted .*: holds a Hugging Face model \(config.json\), not one "
                                         r"this command writes"):
        save_converted(model, source)
    assert snapshot(source) == before
    save_converted(model, source, overwrite=True)  # explicit: allowed
    assert torch.equal(load_converted(source).embeddings.word_embeddings.weight,
                       model.embeddings.word_embeddings.weight)


def test_a_loaded_converted_model_is_not_saved_back_over_its_folder_by_default(saved_plain):
    m, folder = saved_plain
    loaded = load_converted(folder, model=plain_model())
    before = snapshot(folder)
    with pytest.raises(ValueError, match="is the folder this model was loaded from"):
        save_converted(loaded, folder)
    assert snapshot(folder) == before


# -- the load builds no dense layer it replaces ------------------------------------------------------------------------
def test_load_allocates_no_dense_weight_of_a_converted_layer_and_is_bit_identical(saved_st, monkeypatch):
    from torch.utils._python_dispatch import TorchDispatchMode

    st, folder = saved_st
    expected = st.encode(SENTENCES, convert_to_tensor=True)
    dense_shapes = {(64, 32), (32, 64)}  # the FFN layers (every Linear was converted; no other tensor has these)
    real_shapes, linear_devices = [], []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (list, tuple)) else [out]:
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    real_shapes.append(tuple(t.shape))
            return out

    original = nn.Linear.__init__

    def spy_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        linear_devices.append(self.weight.device.type)

    monkeypatch.setattr(nn.Linear, "__init__", spy_init)
    with Spy():
        loaded = load_converted(folder)
    monkeypatch.undo()
    assert linear_devices and set(linear_devices) == {"meta"}
    assert not dense_shapes & set(real_shapes)
    assert all(t.device.type == "cpu" for t in loaded.state_dict().values())
    assert torch.equal(loaded.encode(SENTENCES, convert_to_tensor=True), expected)


def test_a_converted_folder_is_not_taken_as_a_plain_model(saved_st):
    from hyperplex.pretrained import resolve_model_path

    _, folder = saved_st
    with pytest.raises(ValueError, match=r"model.path: .* is a converted model .*save_converted"):
        resolve_model_path(os.fspath(folder))


def test_a_version_1_folder_without_stored_buffers_still_loads_bit_identically(saved_st):
    """A version 1 folder stores no buffers: the position ids are recomputed as transformers does."""
    from safetensors.torch import load_file, save_file

    from hyperplex.fileio import sha256_file
    st, folder = saved_st
    spec = json.loads((folder / SPEC_NAME).read_text())
    assert spec["buffers"] == ["0.model.embeddings.position_ids", "0.model.embeddings.token_type_ids"]
    tensors = load_file(os.fspath(folder / WEIGHTS_NAME))
    for key in spec.pop("buffers"):
        del tensors[key]
    save_file(tensors, os.fspath(folder / WEIGHTS_NAME))
    spec["version"], spec["sha256"] = 1, {WEIGHTS_NAME: sha256_file(folder / WEIGHTS_NAME)}
    (folder / SPEC_NAME).write_text(json.dumps(spec))
    loaded = load_converted(folder)
    assert torch.equal(loaded.encode(SENTENCES, convert_to_tensor=True), st.encode(SENTENCES, convert_to_tensor=True))
    assert torch.equal(loaded[0].model.embeddings.position_ids, st[0].model.embeddings.position_ids)


def test_a_version_2_spec_without_the_checksum_is_refused(saved_plain):
    _, folder = saved_plain
    spec = json.loads((folder / SPEC_NAME).read_text())
    del spec["sha256"]
    (folder / SPEC_NAME).write_text(json.dumps(spec))
    refused_unchanged(folder, plain_model, r"key 'sha256' records no checksum for the weights file 'model.safetensors'")


# -- the folder checked as a whole: aliases, the spec's digest, finite weights -----------------------------------------
def tied_model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16), nn.Linear(16, 16))
    m[3].weight = m[0].weight  # tied: saved once, the spec's aliases name the other key
    return m


def test_an_edited_alias_that_reties_another_layer_is_refused(tmp_path):
    m = tied_model()
    save_converted(m, tmp_path)
    spec = json.loads((tmp_path / SPEC_NAME).read_text())
    assert spec["aliases"] == {"3.weight": "0.weight"}
    x = torch.randn(2, 16)
    assert torch.equal(load_converted(tmp_path, model=tied_model())(x), m(x))
    edit_spec(tmp_path, resign=False, aliases={"3.weight": "2.weight"})  # the layers re-tied to another one
    refused_unchanged(tmp_path, tied_model, "the spec hyperplex_convert.json was changed after saving")
    edit_spec(tmp_path, aliases={"2.weight": "0.weight", "3.weight": "0.weight"})  # digest forged too
    refused_unchanged(tmp_path, tied_model, r"key 'aliases' of hyperplex_convert.json: '2.weight' -> '0.weight': the "
                                            r"file stores '2.weight' itself")
    for aliases, match in (({"9.weight": "0.weight"}, r"'9.weight' is no tensor of the rebuilt model"),
                           ({"3.weight": "nope.weight"}, r"the file stores no tensor 'nope.weight'"),
                           ({"3.weight": "0.weight", "x": "0.weight"}, r"'x' is no tensor of the rebuilt model")):
        edit_spec(tmp_path, aliases=aliases)
        refused_unchanged(tmp_path, tied_model, match)


def test_nan_weights_are_refused_at_save_and_at_load(tmp_path):
    from safetensors.torch import load_file, save_file

    from hyperplex.fileio import sha256_file
    from hyperplex.guards import NonFiniteError

    m = plain_model()
    with torch.no_grad():
        m[0].weight[1, 2] = float("inf")
    with pytest.raises(NonFiniteError, match=r"save_converted .*: tensor '0.weight' holds NaN or infinite values"):
        save_converted(m, tmp_path / "bad")
    assert not (tmp_path / "bad").exists() or os.listdir(tmp_path / "bad") == []
    good = plain_model()
    save_converted(good, tmp_path / "good")
    path = tmp_path / "good" / WEIGHTS_NAME
    from safetensors import safe_open
    with safe_open(os.fspath(path), framework="pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(os.fspath(path))
    tensors["2.weight"][0, 0] = float("nan")
    save_file(tensors, os.fspath(path), metadata=metadata)
    edit_spec(tmp_path / "good", resign=False, sha256={WEIGHTS_NAME: sha256_file(path)})
    refused_unchanged(tmp_path / "good", plain_model, r"model.safetensors: tensor '2.weight' holds NaN or infinite "
                                                      r"values \(1 of 512\)")


def test_save_converted_of_an_int8_model_says_where_it_goes(tmp_path):
    from hyperplex.int8 import quantize

    m = quantize(plain_model())
    with pytest.raises(ValueError, match=r"Sequential holds int8 layers .*save it with "
                                         r"hyperplex.save_quantized"):
        save_converted(m, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_nan_weights_are_refused_before_quantising(tmp_path):
    from hyperplex.guards import NonFiniteError
    from hyperplex.int8 import quantize

    m = plain_model()
    with torch.no_grad():
        m[2].weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"quantize Sequential: tensor '2.weight' holds NaN or infinite values"):
        quantize(m)
    assert type(m[2]) is nn.Linear and torch.isnan(m[2].weight[0, 0])  # unchanged, still float


@pytest.mark.parametrize("file,content,match", [
    ("1_Pooling/config.json", "{broken", r"1_Pooling/config.json: invalid JSON"),
    ("tokenizer_config.json", "[1,", r"tokenizer_config.json: invalid JSON"),
    ("1_Pooling/config.json", '{"word_embedding_dimension": 32, "no_such_option": 1}',
     r"sentence-transformers cannot rebuild the model from its module files .*TypeError"),
])
def test_a_damaged_module_config_names_the_file(saved_st, file, content, match):
    _, folder = saved_st
    assert (folder / file).is_file()
    (folder / file).write_text(content)
    refused_unchanged(folder, None, match)


def test_a_spec_layer_its_sizes_cannot_build_names_the_entry_and_leaves_a_meta_model_unchanged(tmp_path):
    """n that does not divide the layer, a fixed rule of another n, a rank above full: each names the spec file and
    the entry; a caller's meta skeleton is checked on a copy first, like any other model, so it stays dense."""
    m = plain_model()
    convert_linears(m, "phm", n=4, min_features=16, include=["0", "2"])
    folder = tmp_path / "two"
    save_converted(m, folder)
    layer = json.loads((folder / SPEC_NAME).read_text())["layers"]
    for change, match in [({"n": 3}, r"layers\[1\] \('2'\): n=3 must divide"),
                          ({"rule": "quaternion", "n": 2}, r"layers\[1\] \('2'\): rule 'quaternion' needs n=4"),
                          ({"kind": "lowrank", "rank": 1000}, r"layers\[1\] \('2'\): rank=1000 exceeds")]:
        edit_spec(folder, layers=[layer[0], {**layer[1], **change}])
        with pytest.raises(LoadError, match=re.escape(str(folder / SPEC_NAME)) + ".*" + match):
            load_converted(folder, model=plain_model())
        skeleton = plain_model().to("meta")
        with pytest.raises(LoadError, match=match):
            load_converted(folder, model=skeleton)
        assert all(isinstance(module, (nn.Linear, nn.GELU)) for module in skeleton)
