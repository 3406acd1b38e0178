import pytest
import torch
from torch import nn

from hyperplex.layers import PHMLinear
from hyperplex.models.rnn_translator import RNNTranslator, RNNTranslatorConfig
from hyperplex.models.search import greedy_search
from hyperplex.nn import LinearSpec
from hyperplex.nn.luong import ATTENTIONS
from hyperplex.nn.rnn import reverse_padded


def _batch(seed=0, B=3, S=6, T=5, V=13):
    g = torch.Generator().manual_seed(seed)
    src_lengths = torch.tensor([6, 2, 4])[:B]
    src = torch.randint(4, 11, (B, S), generator=g)
    src[torch.arange(S)[None] >= src_lengths[:, None]] = 0
    tgt_in = torch.randint(4, V, (B, T), generator=g)
    tgt_in[:, 0] = 2
    return src, src_lengths, tgt_in


def _model(seed=0, tgt_vocab=13, **overrides):
    torch.manual_seed(seed)
    config = RNNTranslatorConfig(**{"embedding_dim": 8, "hidden_size": 8, "encoder_layers": 2, "decoder_layers": 2,
                                    "dropout": 0.1, "window": 2, **overrides})
    return RNNTranslator(config, 11, tgt_vocab).double().eval()


@pytest.mark.parametrize("attention", list(ATTENTIONS))
@pytest.mark.parametrize("input_feeding", [True, False])
def test_decode_step_equals_teacher_forcing(attention, input_feeding):
    model = _model(attention=attention, input_feeding=input_feeding)
    src, src_lengths, tgt_in = _batch()
    expected = torch.log_softmax(model(src, src_lengths, tgt_in), dim=-1)
    state = model.encode(src, src_lengths)
    for t in range(tgt_in.shape[1]):
        log_probs, state, weights = model.decode_step(tgt_in[:, t], state, t)
        torch.testing.assert_close(log_probs, expected[:, t].float(), rtol=1e-5, atol=1e-5)
        if attention == "none":
            assert weights is None
        else:
            torch.testing.assert_close(weights.sum(-1), torch.ones(3, dtype=torch.double))
            assert (weights[1, 2:] == 0).all()


@pytest.mark.parametrize("overrides", [
    {"bidirectional_encoder": False, "encoder_layers": 1, "decoder_layers": 3, "reverse_source": True},
    {"encoder_layers": 3, "decoder_layers": 1, "attention": "local-p", "linear": LinearSpec("phm", n=2),
     "dense_output_layer": True},
])
def test_decode_step_equals_teacher_forcing_other_shapes(overrides):
    model = _model(**overrides)
    src, src_lengths, tgt_in = _batch(seed=1)
    expected = torch.log_softmax(model(src, src_lengths, tgt_in), dim=-1)
    state = model.encode(src, src_lengths)
    for t in range(tgt_in.shape[1]):
        log_probs, state, _ = model.decode_step(tgt_in[:, t], state, t)
        torch.testing.assert_close(log_probs, expected[:, t].float(), rtol=1e-5, atol=1e-5)


def test_rows_are_independent_of_batch_padding():
    model = _model(attention="local-p", reverse_source=True)
    src, src_lengths, tgt_in = _batch()
    logits = model(src, src_lengths, tgt_in)
    for b in range(3):
        n = int(src_lengths[b])
        alone = model(src[b:b + 1, :n], src_lengths[b:b + 1], tgt_in[b:b + 1])
        torch.testing.assert_close(alone[0], logits[b])


def test_bridge_concatenates_final_directions():
    model = _model(encoder_layers=1, decoder_layers=1, attention="dot")
    src, src_lengths, _ = _batch()
    state = model.encode(src, src_lengths)
    memory = state["memory"]
    for b, n in enumerate(src_lengths.tolist()):
        expected = torch.cat([memory[b, n - 1, :4], memory[b, 0, 4:]])  # forward ends at n-1, backward at 0
        torch.testing.assert_close(state["hidden"][b, 0], expected)


def test_reverse_source_keeps_memory_in_source_order():
    plain = _model(bidirectional_encoder=False, encoder_layers=1)
    reversed_ = _model(bidirectional_encoder=False, encoder_layers=1, reverse_source=True)
    src, src_lengths, _ = _batch()
    expected = reverse_padded(plain.encode(reverse_padded(src, src_lengths), src_lengths)["memory"], src_lengths)
    torch.testing.assert_close(reversed_.encode(src, src_lengths)["memory"], expected)


def test_reverse_source_reverses_the_words_and_keeps_a_closing_eos_last():
    model = _model(reverse_source=True)
    src = torch.tensor([[5, 6, 7, 3, 0], [8, 9, 10, 4, 3], [6, 3, 0, 0, 0], [7, 8, 9, 0, 0]])  # the last has no </s>
    lengths = torch.tensor([4, 5, 2, 3])
    seen = []
    model.src_embed.register_forward_hook(lambda module, args, out: seen.append(args[0].clone()))
    memory = model.encode(src, lengths)["memory"]
    assert seen[0].tolist() == [[7, 6, 5, 3, 0], [4, 10, 9, 8, 3], [6, 3, 0, 0, 0], [9, 8, 7, 0, 0]]
    # memory comes back in source order: a sentence's state for a word is where the word is in the source
    alone = model.encode(torch.tensor([[5, 6, 7, 3]]), torch.tensor([4]))["memory"]
    torch.testing.assert_close(memory[:1, :4], alone)


def test_phm_switch_makes_every_linear_map_phm():
    dense = _model(attention="local-p", tgt_vocab=16)
    phm = _model(attention="local-p", linear=LinearSpec("phm", n=4), tgt_vocab=16)
    with pytest.raises(ValueError, match="does not divide the target vocabulary size 13"):
        _model(linear=LinearSpec("phm", n=2))
    linear_maps = [m for m in phm.modules() if isinstance(m, (nn.Linear, PHMLinear))]
    assert linear_maps and all(isinstance(m, PHMLinear) and m.n == 4 for m in linear_maps)

    def count(m):
        return sum(p.numel() for p in m.parameters())

    assert count(phm) < count(dense)
    quaternion = _model(linear=LinearSpec("quaternion"), dense_output_layer=True)
    assert type(quaternion.output_layer) is nn.Linear
    assert all(not m.rule_is_learned for m in quaternion.modules() if isinstance(m, PHMLinear))


def test_tied_embeddings_share_the_matrix():
    model = _model(tie_embeddings=True)
    assert model.output_layer.weight is model.tgt_embed.weight


def test_config_errors():
    with pytest.raises(ValueError, match="attention: unknown 'bahdanau'"):
        RNNTranslatorConfig(attention="bahdanau")
    with pytest.raises(ValueError, match="tie_embeddings needs embedding_dim == hidden_size"):
        RNNTranslatorConfig(embedding_dim=8, hidden_size=16, tie_embeddings=True)
    with pytest.raises(ValueError, match="hidden_size must be even"):
        RNNTranslatorConfig(hidden_size=7)
    with pytest.raises(ValueError, match="n=4 does not divide size 6"):
        RNNTranslator(RNNTranslatorConfig(embedding_dim=6, hidden_size=8, linear=LinearSpec("phm", n=4)), 8, 8)
    model = _model()
    src, src_lengths, tgt_in = _batch()
    with pytest.raises(ValueError, match=r"src_lengths must lie in \[1, 6\]"):
        model(src, torch.tensor([7, 1, 1]), tgt_in)


def test_tiny_model_overfits_toy_corpus():
    # 8 pairs: the target is the source reversed (ids 4..11), with EOS = 3.
    torch.manual_seed(0)
    sources = [[4, 5, 6], [7, 8, 9, 10], [11, 4, 7], [5, 9], [6, 10, 8, 11], [9, 4], [10, 7, 5], [8, 11, 6, 4]]
    B, S = len(sources), 4
    src = torch.zeros(B, S, dtype=torch.long)
    tgt_in = torch.zeros(B, S + 1, dtype=torch.long)
    tgt_out = torch.zeros(B, S + 1, dtype=torch.long)
    for b, s in enumerate(sources):
        t = s[::-1]
        src[b, :len(s)] = torch.tensor(s)
        tgt_in[b, :len(t) + 1] = torch.tensor([2] + t)
        tgt_out[b, :len(t) + 1] = torch.tensor(t + [3])
    src_lengths = torch.tensor([len(s) for s in sources])
    config = RNNTranslatorConfig(embedding_dim=16, hidden_size=32, encoder_layers=1, decoder_layers=1, dropout=0.0,
                                 attention="general", input_feeding=True)
    model = RNNTranslator(config, 12, 12)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    loss_fn = nn.CrossEntropyLoss(ignore_index=0)
    for _ in range(150):
        optimizer.zero_grad()
        loss = loss_fn(model(src, src_lengths, tgt_in).flatten(0, 1), tgt_out.flatten())
        loss.backward()
        optimizer.step()
    model.eval()
    outputs = [hyps[0].tokens for hyps in greedy_search(model, src, src_lengths, max_output_length=8)]
    assert outputs == [s[::-1] for s in sources]
