import math

import pytest
import torch
from torch import nn

from hyperplex.layers import PHMLinear
from hyperplex.nn import LinearSpec
from hyperplex.nn.attention import HamiltonAttention, causal_mask
from hyperplex.nn.transformer_blocks import (
    FeedForward,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEmbedding,
    TransformerEncoder,
    TransformerEncoderLayer,
    scoped_specs,
    sinusoidal_positions,
)

D64 = torch.float64


def test_sinusoidal_positions_hand_values():
    pe = sinusoidal_positions(5, 4)
    assert pe[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    torch.testing.assert_close(pe[3], torch.tensor([math.sin(3), math.cos(3), math.sin(3 / 100), math.cos(3 / 100)]))
    with pytest.raises(ValueError, match="even"):
        sinusoidal_positions(4, 5)


def test_embedding_scales_and_offsets():
    emb = TransformerEmbedding(10, 8, max_positions=6).eval()
    tokens = torch.tensor([[4, 5, 0]])
    out = emb(tokens, offset=2)
    expected = emb.weight[tokens] * math.sqrt(8) + sinusoidal_positions(6, 8)[2:5]
    torch.testing.assert_close(out, expected)
    assert emb.weight[0].abs().max() == 0  # pad row
    with pytest.raises(ValueError, match="max_positions"):
        emb(tokens, offset=4)


def test_scoped_specs_full_and_partial():
    q = LinearSpec("quaternion")
    assert scoped_specs(q, "all") == (q, q)
    assert scoped_specs(q, "attention") == (q, LinearSpec("dense"))
    with pytest.raises(ValueError, match="linear_scope"):
        scoped_specs(q, "ffn")
    layer = TransformerEncoderLayer(16, 2, 32, attention_spec=q, ffn_spec=LinearSpec("dense"))
    assert isinstance(layer.self_attn.qkv_proj, PHMLinear) and isinstance(layer.ffn.linear1, nn.Linear)


def test_feed_forward_is_linear_relu_linear():
    ffn = FeedForward(8, 16, linear=LinearSpec("phm", n=2)).eval()
    x = torch.randn(3, 8)
    torch.testing.assert_close(ffn(x), ffn.linear2(torch.relu(ffn.linear1(x))))


def copy_attention(mine, ref):
    proj = [mine.qkv_proj] if mine.self_attention else [mine.q_proj, mine.kv_proj]
    ref.in_proj_weight.copy_(torch.cat([p.weight for p in proj]))
    ref.in_proj_bias.copy_(torch.cat([p.bias for p in proj]))
    ref.out_proj.weight.copy_(mine.out_proj.weight)
    ref.out_proj.bias.copy_(mine.out_proj.bias)


def copy_common(mine, ref, norms):
    for a, b in [(mine.ffn.linear1, ref.linear1), (mine.ffn.linear2, ref.linear2)] + norms:
        b.load_state_dict(a.state_dict())


@pytest.mark.parametrize("pre_norm", [True, False])
def test_encoder_layer_equals_torch(pre_norm):
    torch.manual_seed(0)
    mine = TransformerEncoderLayer(16, 4, 32, dropout=0.0, pre_norm=pre_norm, attention_bias=True, dtype=D64).eval()
    ref = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=pre_norm, dtype=D64).eval()
    with torch.no_grad():
        copy_attention(mine.self_attn, ref.self_attn)
        copy_common(mine, ref, [(mine.norm1, ref.norm1), (mine.norm2, ref.norm2)])
    x = torch.randn(2, 5, 16, dtype=D64)
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])
    torch.testing.assert_close(mine(x, pad), ref(x, src_key_padding_mask=pad))


@pytest.mark.parametrize("pre_norm", [True, False])
def test_decoder_layer_equals_torch(pre_norm):
    torch.manual_seed(1)
    mine = TransformerDecoderLayer(16, 4, 32, dropout=0.0, pre_norm=pre_norm, attention_bias=True, dtype=D64).eval()
    ref = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=pre_norm, dtype=D64).eval()
    with torch.no_grad():
        copy_attention(mine.self_attn, ref.self_attn)
        copy_attention(mine.cross_attn, ref.multihead_attn)
        copy_common(mine, ref, [(mine.norm1, ref.norm1), (mine.norm2, ref.norm2), (mine.norm3, ref.norm3)])
    x, mem = torch.randn(2, 4, 16, dtype=D64), torch.randn(2, 6, 16, dtype=D64)
    pad = torch.tensor([[False] * 6, [False] * 3 + [True] * 3])
    out, _, _ = mine(x, mem, pad)
    expected = ref(x, mem, tgt_mask=~causal_mask(4, 4), memory_key_padding_mask=pad)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("attention_type,spec", [("dot", LinearSpec("phm", n=2)),
                                                 ("hamilton", LinearSpec("quaternion"))])
def test_decoder_stack_incremental_equals_full(attention_type, spec):
    torch.manual_seed(2)
    dec = TransformerDecoder(2, 16, num_heads=2, d_ff=32, dropout=0.0, attention_spec=spec, ffn_spec=spec,
                             attention_type=attention_type, dtype=D64).eval()
    assert isinstance(dec.layers[0].self_attn, HamiltonAttention) == (attention_type == "hamilton")
    x, mem = torch.randn(2, 5, 16, dtype=D64), torch.randn(2, 3, 16, dtype=D64)
    pad = torch.tensor([[False] * 3, [False, False, True]])
    full, _, full_w = dec(x, mem, pad, need_weights=True)
    caches, cross = dec.empty_caches(2, dtype=D64), dec.project_memory(mem)
    for t in range(5):
        out, caches, w = dec(x[:, t:t + 1], None, pad, caches, cross, need_weights=True)
        torch.testing.assert_close(out[:, 0], full[:, t])
        torch.testing.assert_close(w[:, 0], full_w[:, t])
    assert w[1, 0, 2] == 0


def test_encoder_ignores_padding_content():
    torch.manual_seed(3)
    enc = TransformerEncoder(2, 16, num_heads=2, d_ff=32, dropout=0.0, dtype=D64).eval()
    x = torch.randn(1, 5, 16, dtype=D64)
    pad = torch.tensor([[False, False, False, True, True]])
    y = x.clone()
    y[:, 3:] = torch.randn(1, 2, 16, dtype=D64)
    torch.testing.assert_close(enc(x, pad)[:, :3], enc(y, pad)[:, :3])
    torch.testing.assert_close(enc(x, pad)[:, :3], enc(x[:, :3])[:, :3])
