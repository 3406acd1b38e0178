"""quantize / model_bytes / save_quantized / load_quantized: int8 layers close to the float ones, exact
byte counts, clear errors that change nothing, bit-identical round trips.

Tolerances. Weights are int8 per output row (symmetric, 255 levels over ±max|w|): a uniform weight's
rounding error is step/√12 against an rms of max/√3, 0.5% relative. Inputs are quantised per call
over [min, max] with 7 bits on x86/fbgemm (reduce_range): for Gaussian inputs of a few hundred values
the range is about 6σ, so the error is (6σ/127)/√12 ≈ 1.4% of σ. Together about 1.5% on a layer's
output; the tests allow 5% per layer (measured: 0.4–2.0% over the layers below). The tiny random BERT
is allowed 1% on its last hidden state (measured: 0.02%): its weights (std 0.02) leave the residual
stream dominated by the embeddings, so that test checks the wiring; the error on a trained model
(MiniLM) is measured by benchmarks/probes/check_deploy.py and given in docs/compress.md.
"""

import json
import os

import pytest
import torch
from torch import nn

from hyperplex import LowRankConfig, PHMConfig, compress
from hyperplex.int8 import (
    QUANT_SPEC_NAME,
    QUANT_WEIGHTS_NAME,
    Int8Config,
    QuantizationError,
    QuantizedLinear,
    QuantizedLowRankLinear,
    QuantizedPHMLinear,
    load_quantized,
    model_bytes,
    quantize,
    relative_error,
    save_quantized,
)
from hyperplex.layers import LowRankLinear, PHMLinear

LAYER_TOLERANCE = 0.05
MODEL_TOLERANCE = 0.01


def plain_model():
    torch.manual_seed(0)
    return nn.Sequential(PHMLinear(64, 128, 4), nn.GELU(), LowRankLinear(128, 64, 8), nn.GELU(), nn.Linear(64, 16))


@pytest.mark.parametrize("path", ["int8", "premixed", "dequantized", "auto"])
@pytest.mark.parametrize("n, rule", [(2, "learned"), (4, "learned"), (4, "quaternion"), (8, "learned"), (1, "learned")])
def test_phm_layer_matches_float(n, rule, path):
    torch.manual_seed(n)
    layer = PHMLinear(64, 96, n, rule=rule).eval()
    x = torch.randn(5, 7, 64)
    q = QuantizedPHMLinear.from_float(layer, path).eval()
    with torch.no_grad():
        expected = layer(x)
        got = q(x)
    assert got.shape == expected.shape == (5, 7, 96) and got.dtype == torch.float32
    assert relative_error(expected, got) < LAYER_TOLERANCE
    assert q.blocks.weight().dtype == torch.qint8
    if q.path != "premixed":
        assert q.blocks.weight().q_per_channel_scales().shape == (96,)  # one scale per output row of each Sᵢ
    else:
        assert q.blocks.weight().shape == (96 // n, 64)  # [S₁ … S_n] side by side
    assert torch.allclose(q.dequantized_phm_weight(), layer.phm_weight,
                          atol=float(layer.phm_weight.detach().abs().max()) / 127)
    assert q.path == (("premixed" if 64 <= 96 else "int8") if path == "auto" else path)


def test_phm_paths_agree_with_dequantized_structure():
    torch.manual_seed(1)
    layer = PHMLinear(48, 32, 4).eval()
    a, b = (QuantizedPHMLinear.from_float(layer, "auto").eval(),
            QuantizedPHMLinear.from_float(layer, "dequantized").eval())
    assert a.path == "int8"  # d > k
    x = torch.randn(9, 48)
    # same int8 weights; the paths differ only by the int8 path's activation quantisation
    assert torch.equal(a.blocks.weight().int_repr(), b.blocks.weight().int_repr())
    assert relative_error(b(x), a(x)) < LAYER_TOLERANCE


def test_lowrank_and_dense_layers_match_float():
    torch.manual_seed(2)
    low = LowRankLinear(64, 48, 12).eval()
    dense = nn.Linear(64, 48).eval()
    x = torch.randn(20, 64)
    q_low, q_dense = (QuantizedLowRankLinear.from_float(low).eval(),
                      QuantizedLinear.from_weight(dense.weight, dense.bias))
    with torch.no_grad():
        assert relative_error(low(x), q_low(x)) < LAYER_TOLERANCE
        assert relative_error(dense(x), q_dense(x)) < LAYER_TOLERANCE
    assert q_low.right.weight().shape == (12, 64) and q_low.left.weight().shape == (48, 12)


def test_quantize_replaces_every_kind_and_counts_bytes():
    m = plain_model()
    float_bytes = sum(p.numel() * 4 for p in m.parameters()) + sum(b.numel() * b.element_size() for b in m.buffers())
    assert model_bytes(m) == float_bytes
    x = torch.randn(6, 64)
    with torch.no_grad():
        expected = m(x)
    assert quantize(m) is m and not m.training
    assert [type(m[i]) for i in (0, 2, 4)] == [QuantizedPHMLinear, QuantizedLowRankLinear, QuantizedLinear]
    assert relative_error(expected, m(x)) < LAYER_TOLERANCE * 2
    # PHM (d ≤ k: premixed, [S₁ … S₄] is 32 × 64): int8 S (128·64/4) + scales and zero points (32 rows ×
    # 16 bytes) + float rule (4³) and bias (128)
    assert m[0].path == "premixed"
    phm = 128 * 16 + 32 * 16 + (64 + 128) * 4
    # low-rank: V 8×128 and U 64×8 int8, one scale + zero point per row, float bias (64)
    low = 8 * 128 + 8 * 16 + 64 * 8 + 64 * 16 + 64 * 4
    dense = 16 * 64 + 16 * 16 + 16 * 4
    assert model_bytes(m) == phm + low + dense


def test_quantize_twice_is_an_error_and_changes_nothing():
    m = quantize(plain_model())
    x = torch.randn(3, 64)
    before, state = m(x), [type(s) for s in m]
    with pytest.raises(QuantizationError, match="already quantised.*layer '0'"):
        quantize(m)
    assert [type(s) for s in m] == state and torch.equal(m(x), before)


def test_a_model_off_the_cpu_is_refused_and_unchanged():
    """int8 kernels are CPU-only: a model with a parameter elsewhere (here the meta device, standing in for a
    GPU) gets one error naming the tensor and the fix, before any layer is replaced."""
    m = plain_model()
    m[2].to("meta")
    with pytest.raises(QuantizationError, match=r"holds '2\.[a-z_]+' on meta; .*CPU only.*model\.cpu\(\)"):
        quantize(m)
    assert [type(s) for s in m] == [PHMLinear, nn.GELU, LowRankLinear, nn.GELU, nn.Linear]


def test_training_a_quantized_model_is_an_error():
    m = quantize(plain_model())
    m.train()
    x = torch.randn(3, 64, requires_grad=True)
    with pytest.raises(QuantizationError, match="layer '0' is int8-quantised for inference.*model.eval"):
        m(x)
    m.eval()
    assert m(x).shape == (3, 16)  # back in eval mode it runs


def test_training_a_quantized_model_with_the_trainer_is_refused():
    """The trainer puts the model in training mode before its first step: the first forward raises."""
    m = quantize(plain_model())
    optimizer = torch.optim.SGD([p for p in m.parameters()] or [nn.Parameter(torch.zeros(1))], lr=0.1)
    m.train()
    with pytest.raises(QuantizationError, match="cannot be trained"):
        m(torch.randn(2, 64)).sum().backward()
    optimizer.zero_grad()


def test_bad_arguments_change_nothing():
    m = plain_model()
    with pytest.warns(DeprecationWarning, match=r"Int8Config"), pytest.raises(ValueError, match="qint8"):
        quantize(m, dtype=torch.float16)
    with pytest.raises(ValueError, match="phm_path"):
        quantize(m, Int8Config(phm_path="fast"))
    with pytest.raises(QuantizationError, match="no nn.Linear"):
        quantize(nn.Sequential(nn.ReLU()))
    assert isinstance(m[0], PHMLinear)


def test_missing_engine_is_a_clear_error(monkeypatch, tmp_path):
    import importlib

    qmod = importlib.import_module("hyperplex.int8.layers")  # where quantized_engine looks up the engines

    m = quantize(plain_model())
    save_quantized(m, tmp_path / "q")
    listing = sorted(os.listdir(tmp_path / "q"))
    monkeypatch.setattr(qmod, "_supported_engines", lambda: ["none"])
    with pytest.raises(QuantizationError, match=r"no quantised engine .*\['none'\]"):
        load_quantized(tmp_path / "q", model=plain_model())
    fresh = plain_model()
    with pytest.raises(QuantizationError, match="no quantised engine"):
        quantize(fresh)
    assert isinstance(fresh[0], PHMLinear) and sorted(os.listdir(tmp_path / "q")) == listing


def test_plain_model_round_trip_is_bit_identical(tmp_path):
    m = quantize(plain_model())
    x = torch.randn(4, 64)
    expected = m(x)
    save_quantized(m, tmp_path)
    assert {QUANT_SPEC_NAME, QUANT_WEIGHTS_NAME} <= set(os.listdir(tmp_path))
    assert "model.safetensors" not in os.listdir(tmp_path)  # no float weights are written
    spec = json.loads((tmp_path / QUANT_SPEC_NAME).read_text())
    assert [(e["name"], e["kind"]) for e in spec["layers"]] == [("0", "phm"), ("2", "lowrank"), ("4", "linear")]
    from safetensors import safe_open
    with safe_open(tmp_path / QUANT_WEIGHTS_NAME, framework="pt") as handle:
        assert handle.get_tensor("0.blocks.weight_int8").dtype == torch.int8
        assert handle.get_tensor("2.left.weight_scales").shape == (64,)
    loaded = load_quantized(tmp_path, model=plain_model())
    assert torch.equal(loaded(x), expected)
    assert model_bytes(loaded) == model_bytes(m)


def test_save_refuses_a_float_model(tmp_path):
    with pytest.raises(QuantizationError, match="no int8 layer"):
        save_quantized(plain_model(), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_changed_weights_file_is_refused(tmp_path):
    from hyperplex.convert import LoadError

    save_quantized(quantize(plain_model()), tmp_path)
    data = bytearray((tmp_path / QUANT_WEIGHTS_NAME).read_bytes())
    data[-1] ^= 1
    (tmp_path / QUANT_WEIGHTS_NAME).write_bytes(bytes(data))
    fresh = plain_model()
    with pytest.raises(LoadError, match="SHA-256 does not match"):
        load_quantized(tmp_path, model=fresh)
    assert isinstance(fresh[0], PHMLinear)  # refused before the model changed


def test_load_into_another_architecture_is_an_error(tmp_path):
    from hyperplex.convert import LoadError

    save_quantized(quantize(plain_model()), tmp_path)
    other = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64), nn.GELU(), nn.Linear(64, 16))
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(LoadError, match="int8 layer '0'.*another architecture"):
        load_quantized(tmp_path, model=other)
    assert [type(m) for m in other] == [nn.Linear, nn.GELU, nn.Linear, nn.GELU, nn.Linear]  # unchanged
    assert all(torch.equal(v, before[k]) for k, v in other.state_dict().items())


def test_tiny_bert_close_to_float_and_round_trip(tmp_path, bert_folder):
    transformers = pytest.importorskip("transformers")
    from hyperplex.convert import save_converted

    model = transformers.BertModel.from_pretrained(bert_folder).eval()
    compress(model, PHMConfig(n=4, targets="*encoder.layer.0.*", min_features=8))
    compress(model, LowRankConfig(n=4, targets="*encoder.layer.1.attention*", min_features=8))
    ids = torch.randint(5, 20, (3, 10))
    with torch.no_grad():
        expected = model(ids).last_hidden_state
    float_bytes = model_bytes(model)
    save_converted(model, tmp_path / "float")
    quantize(model)
    kinds = {type(m).__name__ for m in model.modules()}
    assert {"QuantizedPHMLinear", "QuantizedLowRankLinear", "QuantizedLinear"} <= kinds
    with torch.no_grad():
        got = model(ids).last_hidden_state
    assert relative_error(expected, got) < MODEL_TOLERANCE
    assert model_bytes(model) < float_bytes
    save_quantized(model, tmp_path / "int8")
    loaded = load_quantized(tmp_path / "int8")  # rebuilt from config.json
    with torch.no_grad():
        assert torch.equal(loaded(ids).last_hidden_state, got)
    int8_file = os.path.getsize(tmp_path / "int8" / QUANT_WEIGHTS_NAME)
    assert int8_file < os.path.getsize(tmp_path / "float" / "model.safetensors")
    with open(tmp_path / "int8" / QUANT_WEIGHTS_NAME, "rb") as handle:
        header = 8 + int.from_bytes(handle.read(8), "little")
    assert int8_file - header == model_bytes(model)  # the file holds exactly the bytes model_bytes counts


def test_sentence_transformer_round_trip(tmp_path, tiny_sentence_transformer):
    model = tiny_sentence_transformer()
    compress(model, PHMConfig(n=4, targets="*encoder.layer*", min_features=8))
    quantize(model)
    sentences = ["the cat sat on the mat", "blue"]
    expected = model.encode(sentences, convert_to_tensor=True)
    save_quantized(model, tmp_path)
    loaded = load_quantized(tmp_path)
    assert torch.equal(loaded.encode(sentences, convert_to_tensor=True), expected)


def test_torch_ao_deprecation_notice_is_not_hidden(monkeypatch):
    """PyTorch's notice that quantised tensors are deprecated reaches the user (PyTorch shows it once per
    process): quantize does not filter it. Stood in for by a warning raised where PyTorch raises it."""
    import warnings

    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    original = DynamicLinear.set_weight_bias

    def noisy(self, *args):
        warnings.warn("quantized tensor creation functions ... are deprecated", UserWarning, stacklevel=2)
        return original(self, *args)

    monkeypatch.setattr(DynamicLinear, "set_weight_bias", noisy)
    with pytest.warns(UserWarning, match="quantized tensor creation functions"):
        quantize(plain_model())


def test_a_phm_layer_with_low_rank_factors_quantises_through_its_formed_factors():
    from torch import nn

    from hyperplex import Int8Config, PHMLinear, quantize

    torch.manual_seed(0)
    model = nn.Sequential(PHMLinear(64, 32, 4, factor_rank=3), nn.ReLU()).eval()
    x = torch.randn(5, 64)
    expected = model(x)
    quantize(model, Int8Config())
    got = model(x)
    assert type(model[0]).__name__ == "QuantizedPHMLinear"
    assert (got - expected).norm() / expected.norm() < 0.05  # int8 rounding of the formed Sᵢ, not a wrong layer


def test_nan_is_refused_at_save_and_at_load_of_an_int8_folder(tmp_path):
    """The rule of save_converted and save_adapter: a NaN or infinite weight is never written, nor read."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from hyperplex.convert import LoadError
    from hyperplex.fileio import sha256_file
    from hyperplex.guards import NonFiniteError

    m = quantize(plain_model())
    save_quantized(m, tmp_path / "q")
    before = {p.name: p.read_bytes() for p in (tmp_path / "q").iterdir()}
    with torch.no_grad():
        m[0].bias[0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"save_quantized .*: tensor '0.bias' holds NaN or infinite values"):
        save_quantized(m, tmp_path / "q")
    assert {p.name: p.read_bytes() for p in (tmp_path / "q").iterdir()} == before
    path = tmp_path / "q" / QUANT_WEIGHTS_NAME
    with safe_open(path, framework="pt") as handle:
        metadata, tensors = handle.metadata(), {k: handle.get_tensor(k) for k in handle.keys()}
    tensors["2.left.weight_scales"][0] = float("inf")
    save_file(tensors, path, metadata=metadata)
    spec = json.loads((tmp_path / "q" / QUANT_SPEC_NAME).read_text())
    spec["sha256"] = {QUANT_WEIGHTS_NAME: sha256_file(path)}
    (tmp_path / "q" / QUANT_SPEC_NAME).write_text(json.dumps(spec))
    fresh = plain_model()
    with pytest.raises(LoadError, match=r"tensor '2.left.weight_scales' holds NaN or infinite values"):
        load_quantized(tmp_path / "q", model=fresh)
    assert type(fresh[2]) is LowRankLinear  # the caller's model is unchanged


def test_load_quantized_of_a_file_says_a_folder_is_expected(tmp_path):
    from hyperplex.convert.serialize import LoadError

    afile = tmp_path / "model.bin"
    afile.write_bytes(b"x")
    with pytest.raises(LoadError, match="is a file; expected a folder written by hyperplex.save_quantized"):
        load_quantized(afile, model=plain_model())


def test_an_int8_model_takes_the_inputs_its_float_model_takes_and_names_a_wrong_width():
    """One vector, as nn.Linear takes it (the int8 GEMM itself wants rows); a wrong last dimension is named."""
    torch.manual_seed(0)
    for layer in (nn.Linear(64, 32), LowRankLinear(64, 32, 8)):
        model = nn.Sequential(layer)
        x = torch.randn(64)
        expected = model(x)
        quantize(model, Int8Config())
        got = model(x)
        assert got.shape == expected.shape == (32,)
        torch.testing.assert_close(got, model(x.unsqueeze(0)).squeeze(0))  # the same as one row
        with pytest.raises(ValueError, match=r"expected input with last dimension 64, got shape \(2, 63\)"):
            model(torch.randn(2, 63))


def test_an_int8_layers_output_depends_on_its_batch_so_scorers_run_it_a_sentence_at_a_time():
    """PyTorch's dynamic int8 quantises each input with one scale for the whole tensor: a row's output changes when a
    row of larger values shares its call. ``has_int8_layers`` is what the scorers check before batching."""
    from hyperplex.int8.layers import has_int8_layers

    model = plain_model().eval()
    int8 = quantize(plain_model().eval())
    assert has_int8_layers(int8) and not has_int8_layers(model)
    weight = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    layer = QuantizedLinear.from_weight(weight, None)
    row = torch.randn(1, 32, generator=torch.Generator().manual_seed(2))
    alone, beside = layer(row), layer(torch.cat([row, 5 * row.abs()]))[:1]
    exact = row @ weight.T
    assert (beside - exact).abs().max() > 2 * (alone - exact).abs().max()  # the larger row coarsened its step
