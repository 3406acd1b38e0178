"""The distillation student's layer machinery (models/pretrained_student.py): layer dropping, the layer map, recorded
hidden states and attention distributions, balanced PHM factor scales and block-wise reconstruction — on a
tiny random 4-layer BERT SentenceTransformer built from a config (no download)."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")

from conftest import write_tiny_bert, write_tiny_sentence_transformer

from hyperplex.convert import load_converted, save_converted
from hyperplex.layers.conversion import phm_from_linear
from hyperplex.layers.phm import PHMLinear
from hyperplex.models.pretrained_student import (
    PretrainedStudent,
    PretrainedStudentConfig,
    balance_factor_scales,
    capture_block_io,
    embed,
    record_internals,
    tokenize,
    transformer_layers,
)
from hyperplex.pretrained import load_sentence_transformer

SENTENCES = ["the cat sat on the mat", "a dog runs", "the big red dog is very good and fast",
             "small blue cat", "the film is bad", "a very slow dog sat on a big mat"]


@pytest.fixture(scope="module")
def teacher4(tmp_path_factory):
    """A SentenceTransformer folder: random BERT (hidden 32, 4 layers, 2 heads, seed 0) + mean pooling + Normalize."""
    bert = tmp_path_factory.mktemp("bert4")
    write_tiny_bert(bert, layers=4)
    folder = tmp_path_factory.mktemp("teacher4")
    write_tiny_sentence_transformer(folder, bert)
    return folder


def student(teacher, **keys) -> PretrainedStudent:
    calibration = keys.pop("cal", None)
    keys.setdefault("min_features", 8)
    return PretrainedStudent(PretrainedStudentConfig(path=os.fspath(teacher), **keys), calibration=calibration)


@pytest.mark.parametrize("kind", ["none", "phm", "lowrank"])
def test_kept_layers_are_the_teachers_and_the_student_reloads(tmp_path, teacher4, kind):
    teacher = load_sentence_transformer(os.fspath(teacher4))
    model = student(teacher4, kind=kind, n=2, keep_layers=[0, 2, 3], targets=["*encoder.layer*"])
    layers = transformer_layers(model.encoder)
    assert len(layers) == 3 and model.encoder[0].auto_model.config.num_hidden_layers == 3
    assert model.layer_map == [0, 2, 3]
    features = tokenize(teacher, SENTENCES)
    # each kept layer computes what its teacher layer computes on the same input (exactly when not converted)
    inputs, outputs, args, kwargs = capture_block_io(teacher, features)
    with torch.no_grad():
        for j, t in enumerate([0, 2, 3]):
            got = layers[j](inputs[t], *args, **kwargs)
            got = got[0] if isinstance(got, tuple) else got
            if kind == "none":
                assert torch.equal(got, outputs[t])
            else:
                assert not torch.allclose(got, outputs[t], atol=1e-3)
    if kind != "none":
        assert len(model.report.converted) == 3 * 6  # only the kept layers were converted
    save_converted(model.encoder, tmp_path / "s")
    reloaded = load_converted(tmp_path / "s")
    assert len(transformer_layers(reloaded)) == 3
    with torch.no_grad():
        assert torch.equal(embed(reloaded, features), embed(model.encoder, features))


def test_a_keep_list_that_does_not_fit_is_one_error(teacher4):
    for bad in ([2, 1], [1, 1], [-1, 2]):
        with pytest.raises(ValueError, match=r"model\.keep_layers: expected distinct .* increasing"):
            PretrainedStudentConfig(path=os.fspath(teacher4), keep_layers=bad)
    with pytest.raises(ValueError, match=r"model\.keep_layers: the teacher has 4 transformer layers "
                                         r".*\[4\] out of range"):
        student(teacher4, kind="none", keep_layers=[0, 4])


def test_a_layer_map_that_does_not_fit_the_student_is_one_error(teacher4):
    with pytest.raises(ValueError, match=r"model\.layer_map: the student has 2 layers .* needs 2 entries"):
        PretrainedStudentConfig(path=os.fspath(teacher4), keep_layers=[0, 2], layer_map=[0, 1, 2])
    with pytest.raises(ValueError, match=r"model\.layer_map: the student has 4 transformer layers"):
        student(teacher4, kind="none", layer_map=[0, 1], distill_hidden=1.0)
    with pytest.raises(ValueError, match=r"model\.layer_map: the teacher has 4 .*\[5\] out of range"):
        student(teacher4, kind="none", keep_layers=[0, 1], layer_map=[1, 5], distill_hidden=1.0)
    assert student(teacher4, kind="none", keep_layers=[1, 3], layer_map=[0, 3], distill_hidden=1.0).layer_map == [0, 3]
    assert student(teacher4, kind="none", distill_hidden=1.0).layer_map == [0, 1, 2, 3]


def test_recorded_states_are_the_models_hidden_states_and_attentions(teacher4):
    """The hooks see what ``output_hidden_states`` / eager ``output_attentions`` give, with sdpa left on."""
    model = load_sentence_transformer(os.fspath(teacher4))
    backbone = model[0].auto_model
    features = tokenize(model, SENTENCES)
    mask = features["attention_mask"]
    assert backbone.config._attn_implementation == "sdpa"
    with torch.no_grad(), record_internals(model, attention=True) as rec:
        embed(model, features)
        log_probs = rec.attention_log_probs(mask)
    assert backbone.config._attn_implementation == "sdpa"  # the recorder switched nothing
    eager = transformers.BertModel.from_pretrained(model[0].auto_model.name_or_path, attn_implementation="eager") \
        if os.path.isdir(str(backbone.name_or_path)) else None
    if eager is None:  # the backbone's own weights, eager attention
        eager = transformers.BertModel(backbone.config)
        eager.load_state_dict(backbone.state_dict())
        eager.set_attn_implementation("eager")
    eager.eval()
    with torch.no_grad():
        reference = eager(**features, output_hidden_states=True, output_attentions=True)
    assert len(rec.hidden) == 4 and len(log_probs) == 4
    for j in range(4):
        torch.testing.assert_close(rec.hidden[j], reference.hidden_states[j + 1], atol=1e-5, rtol=1e-5)
        real = mask.bool()[:, None, :, None] & mask.bool()[:, None, None, :]  # (B, 1, S, S)
        expected = reference.attentions[j].masked_fill(~real, 0)
        torch.testing.assert_close(log_probs[j].exp().masked_fill(~real, 0), expected, atol=1e-5, rtol=1e-5)
        assert torch.all(log_probs[j].exp().masked_fill(mask.bool()[:, None, None, :], 0) == 0)  # padded keys: p = 0
    assert not transformer_layers(model)[0]._forward_hooks  # hooks removed on exit


@pytest.mark.parametrize("n", [2, 4, 8])
def test_balanced_factor_scales_keep_h_bit_for_bit(n):
    torch.manual_seed(n)
    dense = torch.nn.Linear(256, 192)
    dense.weight.data.mul_(3.0)
    layer, _ = phm_from_linear(dense, n)
    before = layer.dense_weight().detach().clone()
    rule_rms = layer.phm_rule.detach().square().mean((1, 2)).sqrt()
    weight_rms = layer.phm_weight.detach().square().mean((1, 2)).sqrt()
    assert torch.all(rule_rms / weight_rms > 2)  # the SVD split: Aᵢ's entries much larger than Sᵢ's
    container = torch.nn.Sequential(layer, torch.nn.Linear(192, 8))
    assert balance_factor_scales(container) == 1
    assert torch.equal(layer.dense_weight(), before)  # H identical, bit for bit
    x = torch.randn(5, 256)
    layer.eval()
    torch.testing.assert_close(layer(x), x @ before.T + layer.bias, atol=1e-5, rtol=1e-5)
    ratio = (layer.phm_rule.detach().square().mean((1, 2)).sqrt()
             / layer.phm_weight.detach().square().mean((1, 2)).sqrt())
    assert torch.all((ratio > 0.5) & (ratio < 2.0)), ratio  # within √2 of balanced (powers of two)
    # fixed rules are left alone
    fixed = PHMLinear(64, 48, 4, rule="quaternion")
    assert balance_factor_scales(fixed) == 0


def test_the_student_balances_its_phm_factors_unless_told_not_to(teacher4):
    balanced = student(teacher4, kind="phm", n=2, targets=["*encoder.layer*"])
    plain = student(teacher4, kind="phm", n=2, targets=["*encoder.layer*"], balance_factors=False)
    pairs = [(a, b) for a, b in zip(balanced.modules(), plain.modules()) if isinstance(a, PHMLinear)]
    assert len(pairs) == 24
    for a, b in pairs:
        assert torch.equal(a.dense_weight(), b.dense_weight()) and not torch.equal(a.phm_rule, b.phm_rule)


def test_blockwise_fitting_lowers_each_blocks_error_on_the_calibration_inputs(teacher4):
    teacher = load_sentence_transformer(os.fspath(teacher4))
    features = tokenize(teacher, SENTENCES)
    inputs, outputs, args, kwargs = capture_block_io(teacher, features)
    mask = features["attention_mask"].to(torch.float32)[..., None]

    def errors(model):
        with torch.no_grad():
            result = []
            for j, t in enumerate(model.layer_map or range(4)):
                out = transformer_layers(model.encoder)[j](inputs[t], *args, **kwargs)
                out = out[0] if isinstance(out, tuple) else out
                result.append(float(((out - outputs[t]) * mask).square().sum() / (outputs[t] * mask).square().sum()))
            return result

    keys = dict(kind="phm", n=4, targets=["*encoder.layer*"], keep_layers=[0, 1, 3])
    torch.manual_seed(0)
    start = student(teacher4, **keys)
    torch.manual_seed(0)
    fitted = student(teacher4, blockwise_steps=30, blockwise_lr=3e-3, cal=SENTENCES, **keys)
    before, after = errors(start), errors(fitted)
    assert [b for _, b, _ in fitted.blockwise] == pytest.approx(before, rel=1e-4)  # the recorded start errors
    assert [a for _, _, a in fitted.blockwise] == pytest.approx(after, rel=1e-4)
    assert all(a < 0.9 * b for a, b in zip(after, before)), (before, after)
    # only the transformer layers moved: embeddings and pooling are the teacher's
    ours, theirs = fitted.encoder.state_dict(), teacher.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours if ".embeddings." in k)
    with pytest.raises(ValueError, match=r"model\.blockwise_steps needs calibration sentences"):
        student(teacher4, blockwise_steps=5, **keys)
    # rebuilding for a checkpoint's weights (structure_only) fits nothing: the same layers as a plain build
    config = PretrainedStudentConfig(path=os.fspath(teacher4), min_features=8, blockwise_steps=5, **keys)
    torch.manual_seed(0)
    rebuilt = PretrainedStudent(config, structure_only=True)
    assert rebuilt.blockwise == [] and errors(rebuilt) == pytest.approx(before, rel=1e-5)


def test_blockwise_fit_refuses_a_layer_whose_error_is_not_finite_before_fitting():
    from hyperplex.models.pretrained_student import fit_blocks

    layers = torch.nn.ModuleList([torch.nn.Linear(4, 4)])
    x = torch.randn(2, 3, 4)
    x[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="student layer 0: the reconstruction error before fitting is nan"):
        fit_blocks(layers, [x], [torch.randn(2, 3, 4)], [0], torch.ones(2, 3), (), {}, steps=2, lr=1e-3)
