import math

import pytest
import torch
from torch import nn

from hyperplex.algebra import hamilton, split_components
from hyperplex.layers import PHMLinear
from hyperplex.nn import LinearSpec
from hyperplex.nn.attention import (
    ATTENTION_TYPES,
    HamiltonAttention,
    MultiHeadAttention,
    causal_mask,
    component_softmax,
    split_fused,
)

D64 = torch.float64


def copy_to_torch_mha(mine: MultiHeadAttention) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(mine.d_model, mine.num_heads, bias=True, batch_first=True, dtype=D64)
    with torch.no_grad():
        if mine.self_attention:
            ref.in_proj_weight.copy_(mine.qkv_proj.weight)
            ref.in_proj_bias.copy_(mine.qkv_proj.bias)
        else:
            ref.in_proj_weight.copy_(torch.cat([mine.q_proj.weight, mine.kv_proj.weight]))
            ref.in_proj_bias.copy_(torch.cat([mine.q_proj.bias, mine.kv_proj.bias]))
        ref.out_proj.weight.copy_(mine.out_proj.weight)
        ref.out_proj.bias.copy_(mine.out_proj.bias)
    return ref.eval()


@pytest.mark.parametrize("self_attention", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_dense_equals_torch_multihead_attention(self_attention, need_weights):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, self_attention=self_attention, bias=True, dtype=D64).eval()
    ref = copy_to_torch_mha(mha)
    x, mem = torch.randn(3, 5, 16, dtype=D64), torch.randn(3, 7, 16, dtype=D64)
    pad = torch.zeros(3, 5 if self_attention else 7, dtype=torch.bool)
    pad[1, -2:] = True
    kv = x if self_attention else mem
    out, w, _ = mha(x, None if self_attention else mem, key_padding_mask=pad, causal=self_attention,
                    need_weights=need_weights)
    attn_mask = ~causal_mask(5, 5) if self_attention else None  # torch: True = masked
    expected, expected_w = ref(x, kv, kv, key_padding_mask=pad, attn_mask=attn_mask, need_weights=True)
    torch.testing.assert_close(out, expected)
    if need_weights:
        torch.testing.assert_close(w, expected_w)
        assert w[1, :, -2:].abs().max() == 0
    else:
        assert w is None


def test_causal_mask_offsets_by_cache():
    m = causal_mask(2, 5)
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    with pytest.raises(ValueError, match="at least as many keys"):
        causal_mask(3, 2)


@pytest.mark.parametrize("cls", [MultiHeadAttention, HamiltonAttention])
def test_incremental_cache_equals_full(cls):
    torch.manual_seed(1)
    attn = cls(16, 2, linear=LinearSpec("phm", n=2), dtype=D64).eval()
    x = torch.randn(2, 6, 16, dtype=D64)
    full, _, _ = attn(x, causal=True)
    cache = (torch.zeros(2, 2, 0, 8, dtype=D64), torch.zeros(2, 2, 0, 8, dtype=D64))
    steps = []
    for t in range(6):
        out, _, cache = attn(x[:, t:t + 1], causal=True, past_key_value=cache)
        steps.append(out)
    assert cache[0].shape == (2, 2, 6, 8)  # batch first, so beam search can index_select(0, ...)
    torch.testing.assert_close(torch.cat(steps, 1), full)


def test_split_fused_gives_per_part_hypercomplex_transforms():
    """Φ splits each component, so Q is exactly a PHM layer with the shared rule and Q's rows of every Sᵢ."""
    torch.manual_seed(2)
    n, d = 4, 8
    fused = PHMLinear(d, 3 * d, n, bias=False, dtype=D64)
    x = torch.randn(5, d, dtype=D64)
    parts = split_fused(fused(x), 3, n)
    for p in range(3):
        single = PHMLinear(d, d, n, bias=False, dtype=D64)
        with torch.no_grad():
            single.phm_rule.copy_(fused.phm_rule)
            single.phm_weight.copy_(fused.phm_weight.view(n, 3, d // n, d // n)[:, p])
        torch.testing.assert_close(parts[p], single(x))
    assert [t.tolist() for t in split_fused(torch.arange(6.0), 3, 1)] == [[0, 1], [2, 3], [4, 5]]


def test_component_softmax_sums_to_one_and_masks():
    scores = torch.randn(2, 4, 3, 5)
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    mask[0, :, 3:] = False
    w = component_softmax(scores, mask)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 3))
    assert w[0, :, :, 3:].abs().max() == 0
    torch.testing.assert_close(w[1], torch.softmax(scores[1], -1))


def reference_hamilton_attention(q, k, v, mask, num_heads):
    """Loop implementation of Tay et al. eq. 4 with hyperplex.algebra.hamilton.

    q (B, T, d), k/v (B, S, d) in the [r; x; y; z] layout, heads inside each component; mask (B, T, S)."""
    B, T, d = q.shape
    S, m = k.shape[1], d // (4 * num_heads)

    def head(x, b, i, h):  # quaternion vector of head h at position i: [r; x; y; z] each of m
        comps = split_components(x[b, i], 4)  # (4, d/4)
        return comps[:, h * m:(h + 1) * m].reshape(-1)

    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(num_heads):
            E = torch.zeros(4, T, S, dtype=q.dtype)
            for t in range(T):
                for s in range(S):
                    prod = split_components(hamilton(head(q, b, t, h), head(k, b, s, h)), 4)  # (4, m)
                    E[:, t, s] = prod.sum(-1) / math.sqrt(4 * m)
            E = E.masked_fill(~mask[b], float("-inf"))
            G = torch.softmax(E, dim=-1)  # ComponentSoftmax
            for t in range(T):
                for a in range(4):
                    val = sum(G[a, t, s] * split_components(head(v, b, s, h), 4)[a] for s in range(S))
                    out[b, t, a * d // 4 + h * m: a * d // 4 + (h + 1) * m] = val
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_hamilton_attention_matches_loop_reference(causal):
    torch.manual_seed(3)
    attn = HamiltonAttention(16, 2, linear=LinearSpec("quaternion"), dtype=D64).eval()
    x = torch.randn(2, 4, 16, dtype=D64)
    pad = torch.tensor([[False] * 4, [False, False, True, True]])
    out, w, _ = attn(x, key_padding_mask=pad, causal=causal, need_weights=True)
    q, k, v = split_fused(attn.qkv_proj(x), 3, 4)
    mask = (~pad)[:, None, :].expand(2, 4, 4)
    if causal:
        mask = mask & causal_mask(4, 4)
    expected = attn.out_proj(reference_hamilton_attention(q, k, v, mask, 2))
    torch.testing.assert_close(out, expected)
    assert w[1, :, 2:].abs().max() == 0
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, dtype=D64))


def test_hamilton_cross_attention_matches_reference():
    torch.manual_seed(4)
    attn = HamiltonAttention(8, 1, self_attention=False, linear=LinearSpec("quaternion"), dtype=D64).eval()
    x, mem = torch.randn(1, 3, 8, dtype=D64), torch.randn(1, 5, 8, dtype=D64)
    pad = torch.tensor([[False, False, False, True, True]])
    out, _, _ = attn(x, mem, key_padding_mask=pad)
    k, v = split_fused(attn.kv_proj(mem), 2, 4)
    expected = attn.out_proj(reference_hamilton_attention(attn.q_proj(x), k, v, (~pad)[:, None].expand(1, 3, 5), 1))
    torch.testing.assert_close(out, expected)


def test_hamilton_attention_gradcheck():
    torch.manual_seed(5)
    attn = HamiltonAttention(8, 2, linear=LinearSpec("quaternion"), dtype=D64).eval()
    x = torch.randn(1, 3, 8, dtype=D64, requires_grad=True)
    pad = torch.tensor([[False, False, True]])
    assert torch.autograd.gradcheck(lambda inp: attn(inp, key_padding_mask=pad, causal=True)[0], (x,))
    attn(x, key_padding_mask=pad)[0].sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in attn.parameters())


def test_registry_and_errors():
    assert ATTENTION_TYPES == {"dot": MultiHeadAttention, "hamilton": HamiltonAttention}
    with pytest.raises(ValueError, match="multiple of num_heads"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="4 \\* num_heads"):
        HamiltonAttention(8, 4)
    with pytest.raises(ValueError, match="does not divide"):
        MultiHeadAttention(12, 2, linear=LinearSpec("phm", n=8))
    with pytest.raises(ValueError, match="key_padding_mask"):
        MultiHeadAttention(8, 2)(torch.randn(2, 3, 8), key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
