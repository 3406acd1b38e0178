"""convert_linears / to_dense: values of the converted layers, the exact inverse, selection, errors."""

import json

import pytest
import torch
from torch import nn

from hyperplex import LowRankLinear, PHMLinear, matching_rank, phm_parameter_count
from hyperplex.convert import CONVERTED_FROM, convert_linears, to_dense
from hyperplex.layers import kronecker_decompose, lowrank_parameter_count

SENTENCES = ["the cat sat on the mat", "a big red dog runs fast", "blue", "the film is very good",
             "a bad film and a slow dog"]


class Block(nn.Module):
    def __init__(self, d=32, k=64, dtype=None):
        super().__init__()
        self.up = nn.Linear(d, k, dtype=dtype)
        self.down = nn.Linear(k, d, bias=False, dtype=dtype)
        self.head = nn.Linear(d, 6, dtype=dtype)  # 6 outputs: n=4 does not divide it

    def forward(self, x):
        h = self.down(torch.tanh(self.up(x)))
        return h + self.head(h).sum(-1, keepdim=True)  # (*, d): blocks chain


def model(dtype=torch.float64):
    torch.manual_seed(0)
    return nn.Sequential(Block(dtype=dtype), Block(dtype=dtype)).eval()


def test_phm_layers_hold_the_kronecker_svd_and_report_counts_independently():
    m = model()
    weights = {name: mod.weight.detach().clone() for name, mod in m.named_modules() if isinstance(mod, nn.Linear)}
    report = convert_linears(m, "phm", n=4, min_features=1)
    assert [r.name for r in report.converted] == ["0.up", "0.down", "1.up", "1.down"]
    assert {r.name: r.reason for r in report.skipped} == {"0.head": "n=4 does not divide 6x32",
                                                          "1.head": "n=4 does not divide 6x32"}
    for row in report.converted:
        layer = m.get_submodule(row.name)
        assert isinstance(layer, PHMLinear) and getattr(layer, CONVERTED_FROM) == "linear"
        W = weights[row.name]
        rule, weight, error = kronecker_decompose(W, 4)
        H = sum(torch.kron(rule[i], weight[i]) for i in range(4))
        torch.testing.assert_close(layer.dense_weight(), H)
        assert row.relative_error == pytest.approx(error, rel=1e-9)
        assert row.relative_error == pytest.approx(float(torch.linalg.norm(W - H) / torch.linalg.norm(W)), rel=1e-9)
        bias = layer.bias is not None
        assert row.params_before == W.numel() + (W.shape[0] if bias else 0)
        assert row.params_after == phm_parameter_count(W.shape[1], W.shape[0], 4, bias=bias)
    # totals against a count written out by hand: up 32->64 (bias), down 64->32 (no bias), head 32->6
    dense_block = (32 * 64 + 64) + 64 * 32 + (32 * 6 + 6)
    phm_block = (32 * 64 // 4 + 64 + 64) + (64 * 32 // 4 + 64) + (32 * 6 + 6)
    assert report.model_params_before == 2 * dense_block == sum(p.numel() for p in model().parameters())
    assert report.model_params_after == 2 * phm_block == sum(p.numel() for p in m.parameters())
    totals = report.to_dict()["totals"]
    assert totals["converted_params_before"] == 2 * (32 * 64 + 64 + 64 * 32)
    assert totals["converted_layers"] == 4 and totals["skipped_layers"] == 2
    json.dumps(report.to_dict())
    text = str(report)
    assert "0.up" in text and "skipped: n=4 does not divide 6x32" in text and f"{2 * dense_block:,}" in text


def test_lowrank_uses_matching_rank_or_explicit_rank():
    m = model()
    W = m[0].up.weight.detach().clone()
    report = convert_linears(m, "lowrank", n=4, min_features=1, include="*.up")
    layer = m[0].up
    r = matching_rank(32, 64, 4)
    assert isinstance(layer, LowRankLinear) and layer.rank == r == report.converted[0].rank
    assert lowrank_parameter_count(32, 64, r) <= phm_parameter_count(32, 64, 4)
    s = torch.linalg.svdvals(W)
    assert report.converted[0].relative_error == pytest.approx(float((s[r:].square().sum() / s.square().sum()).sqrt()),
                                                               rel=1e-9)
    m2 = model()
    report2 = convert_linears(m2, "lowrank", rank=3, min_features=1)
    assert all(m2.get_submodule(row.name).rank == 3 for row in report2.converted)
    assert len(report2.converted) == 6  # an explicit rank needs no divisibility: the 6-output heads convert too


@pytest.mark.parametrize("kind", ["phm", "lowrank"])
def test_to_dense_is_the_exact_inverse(kind):
    m = model()
    x = torch.randn(5, 32, dtype=torch.float64)
    convert_linears(m, kind, n=2, min_features=1)
    converted_out = m(x)
    H = {name: mod.dense_weight().detach().clone() for name, mod in m.named_modules() if hasattr(mod, "dense_weight")}
    report = to_dense(m)
    assert {r.name for r in report.layers} == set(H)
    for name, weight in H.items():
        layer = m.get_submodule(name)
        assert type(layer) is nn.Linear and torch.equal(layer.weight, weight)
    torch.testing.assert_close(m(x), converted_out, rtol=1e-12, atol=1e-12)
    assert report.model_params_after == sum(p.numel() for p in model().parameters())


def test_n1_phm_reproduces_the_model_bit_for_bit():
    m, reference = model(torch.float32), model(torch.float32)
    x = torch.randn(7, 32)
    report = convert_linears(m, "phm", n=1, min_features=1)
    assert len(report.converted) == 6 and report.mean_relative_error == 0.0
    assert torch.equal(m(x), reference(x))
    to_dense(m)
    assert torch.equal(m(x), reference(x))


def test_keeps_dtype_device_bias_mode_and_requires_grad():
    m = model(torch.float64)
    m[0].up.weight.requires_grad_(False)  # frozen weight, trainable bias
    m[1].train()
    convert_linears(m, "phm", n=2, min_features=1)
    up = m[0].up
    assert up.phm_weight.dtype == torch.float64 and up.phm_weight.device.type == "cpu"
    assert not up.phm_weight.requires_grad and not up.phm_rule.requires_grad and up.bias.requires_grad
    assert m[0].down.bias is None and m[1].up.training and not m[0].up.training
    to_dense(m)
    assert not m[0].up.weight.requires_grad and m[0].up.bias.requires_grad and m[0].down.bias is None
    assert m[0].up.weight.dtype == torch.float64


def test_include_exclude_min_features_and_random_init():
    m = model()
    report = convert_linears(m, "phm", n=2, include=["0.*"], exclude="*.down", min_features=8)
    assert [r.name for r in report.converted] == ["0.up"]
    reasons = {r.name: r.reason for r in report.skipped}
    assert reasons["0.down"] == "excluded by '*.down'" and reasons["1.up"] == "not matched by include"
    assert reasons["0.head"] == "min(in, out) = 6 < min_features=8"
    m2 = model()
    bias = m2[0].up.bias.detach().clone()
    report2 = convert_linears(m2, "phm", n=2, include="0.up", init="random", min_features=1)
    assert torch.equal(m2[0].up.bias, bias)  # the bias is kept; only H is random
    assert report2.converted[0].relative_error > 0.9  # a random H is not a fit of W


def test_tied_and_shared_layers_stay_dense():
    torch.manual_seed(0)
    emb, head, shared = nn.Embedding(10, 16), nn.Linear(16, 10, bias=False), nn.Linear(16, 16)
    head.weight = emb.weight  # tied, as GPT-2's lm_head
    m = nn.ModuleDict({"emb": emb, "head": head, "a": shared, "b": shared, "c": nn.Linear(16, 16)})
    report = convert_linears(m, "phm", n=2, min_features=1)
    reasons = {r.name: r.reason for r in report.skipped}
    assert reasons == {"head": "weight tied to emb.weight", "a": "the same module is also registered as b"}
    assert [r.name for r in report.converted] == ["c"]


def test_multihead_attention_out_proj_stays_dense():
    m = nn.Sequential(nn.MultiheadAttention(16, 2))
    with pytest.raises(ValueError, match="no layer selected.*MultiheadAttention"):
        convert_linears(m, "phm", n=2, min_features=1)


def test_errors_are_clear_and_raised_before_any_change():
    m = model()
    before = [type(mod) for mod in m.modules()]
    with pytest.raises(ValueError, match=r"include pattern '\*\.query' matches no nn.Linear/Conv1D layer.*0\.up, "
                                         r"0\.down"):
        convert_linears(m, include=["*.up", "*.query"])
    with pytest.raises(ValueError, match=r"n=5 divides none of the 6 selected layers \(sizes 32x64, 64x32, 6x32\)"):
        convert_linears(m, "phm", n=5, min_features=1)
    with pytest.raises(ValueError, match="unknown kind 'svd'; valid: 'phm', 'lowrank'"):
        convert_linears(m, "svd")
    with pytest.raises(ValueError, match="unknown init"):
        convert_linears(m, init="pca")
    with pytest.raises(ValueError, match="rank=3 applies to kind='lowrank' only"):
        convert_linears(m, "phm", rank=3)
    with pytest.raises(ValueError, match="rule 'quaternion' needs n=4"):
        convert_linears(m, "phm", n=2, rule="quaternion")
    with pytest.raises(ValueError, match="holds no nn.Linear or Conv1D"):
        convert_linears(nn.Sequential(nn.ReLU()))
    with pytest.raises(ValueError, match="calibrate"):
        convert_linears(m, init="activation")
    assert [type(mod) for mod in m.modules()] == before


def test_gpt2_conv1d_converted_forward_generate_and_back(tiny_gpt2):
    from transformers.pytorch_utils import Conv1D

    m, reference = tiny_gpt2(), tiny_gpt2()
    ids = torch.randint(0, 64, (2, 9))
    expected = reference(ids).logits
    report = convert_linears(m, "phm", n=1)
    assert sum(r.source == "conv1d" for r in report.converted) == 8  # c_attn, c_proj, c_fc, mlp.c_proj x 2 blocks
    assert {r.name: r.reason for r in report.skipped} == {"lm_head": "weight tied to transformer.wte.weight"}
    torch.testing.assert_close(m(ids).logits, expected, rtol=1e-5, atol=1e-5)
    greedy = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(m.generate(ids[:1], **greedy), reference.generate(ids[:1], **greedy))

    m2 = tiny_gpt2()
    convert_linears(m2, "phm", n=4)
    attn = m2.transformer.h[0].attn.c_attn
    W = reference.transformer.h[0].attn.c_attn.weight.detach()  # (in, out): Conv1D stores Wᵀ
    assert (attn.in_features, attn.out_features) == (32, 96)
    _, _, error = kronecker_decompose(W.t(), 4)
    assert error == pytest.approx(float(torch.linalg.norm(W.t() - attn.dense_weight().detach()) / torch.linalg.norm(W)),
                                  rel=1e-5)
    out = m2(ids).logits
    assert m2.generate(ids[:1], **greedy).shape == (1, 15)
    to_dense(m2)
    back = m2.transformer.h[0].attn.c_attn
    assert (type(back) is Conv1D and back.weight.shape == (32, 96)
            and torch.equal(back.weight, attn.dense_weight().detach().t()))
    torch.testing.assert_close(m2(ids).logits, out, rtol=1e-5, atol=1e-5)


def test_sentence_transformer_encode_after_conversion(tiny_sentence_transformer):
    st, reference = tiny_sentence_transformer(), tiny_sentence_transformer()
    expected = reference.encode(SENTENCES, convert_to_tensor=True)
    report = convert_linears(st, "phm", n=1, include="*encoder*")
    assert len(report.converted) == 12  # 6 per layer: query, key, value, attention out, intermediate, output
    assert torch.equal(st.encode(SENTENCES, convert_to_tensor=True), expected)
    to_dense(st)
    convert_linears(st, "lowrank", n=2)
    student = st.encode(SENTENCES, convert_to_tensor=True)
    assert student.shape == expected.shape and not torch.allclose(student, expected, atol=1e-3)
    to_dense(st)
    torch.testing.assert_close(st.encode(SENTENCES, convert_to_tensor=True), student, rtol=1e-5, atol=1e-6)


def test_to_dense_refuses_a_marked_layer_it_cannot_form_by_name():
    m = model()
    layer = m.get_submodule("0.up")
    setattr(layer, CONVERTED_FROM, "linear")  # a mark on a layer that is still dense
    with pytest.raises(TypeError, match=r"'0.up' is marked .* a Linear, not a PHMLinear or LowRankLinear"):
        to_dense(m)
    assert m.get_submodule("0.up") is layer  # nothing replaced
