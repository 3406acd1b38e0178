import math

import pytest
import torch

from hyperplex.models.rnn_translator import RNNTranslator, RNNTranslatorConfig
from hyperplex.models.search import (
    Hypothesis,
    beam_search,
    decode,
    greedy_search,
    length_penalty,
    load_unk_dictionary,
    reorder_state,
    replace_unk,
)

EOS, A, B = 3, 4, 5


class TableModel:
    """Seq2seq protocol with a hand-built distribution: ``table[(first source token, prefix)]``.

    Unlisted prefixes put all mass on EOS. The attention at step t is one-hot on source position
    ``t mod S_len``, so hypotheses' attention rows can be checked.
    """

    pad_index, unk_index, bos_index, eos_index = 0, 1, 2, 3
    vocab_size = 6

    def __init__(self, table):
        self.table = table

    def encode(self, src, src_lengths):
        return {"first": src[:, 0].clone(), "prefix": torch.zeros(src.shape[0], 0, dtype=torch.long),
                "lengths": src_lengths.clone(), "nested": [src.clone(), (src_lengths.clone(),)]}

    def decode_step(self, prev, state, step):
        prefix = state["prefix"] if step == 0 else torch.cat([state["prefix"], prev[:, None]], dim=1)
        probs = torch.full((prev.shape[0], self.vocab_size), 1e-12, dtype=torch.double)
        for b in range(prev.shape[0]):
            dist = self.table.get((int(state["first"][b]), tuple(prefix[b].tolist())), {EOS: 1.0})
            for token, p in dist.items():
                probs[b, token] = p
        S = state["nested"][0].shape[1]
        attention = torch.nn.functional.one_hot(step % state["lengths"], S).double()
        return (probs / probs.sum(-1, keepdim=True)).log(), dict(state, prefix=prefix), attention


# source token 7: greedy takes A (0.6) then EOS (0.4) = 0.24, beam finds B EOS = 0.4 · 0.9 = 0.36
TABLE = {(7, ()): {A: 0.6, B: 0.4}, (7, (A,)): {EOS: 0.4, A: 0.3, B: 0.3}, (7, (B,)): {EOS: 0.9, A: 0.05, B: 0.05},
         # source token 8: a plain chain A B A EOS
         (8, ()): {A: 1.0}, (8, (A,)): {B: 1.0}, (8, (A, B)): {A: 1.0}}


def _src(*rows):
    src = torch.tensor([list(r) + [0] * (3 - len(r)) for r in rows])
    return src, torch.tensor([len(r) for r in rows])


def test_length_penalty_value():
    assert length_penalty(3, 0.6) == pytest.approx((8 / 6) ** 0.6)
    assert length_penalty(1, 0.6) == 1.0 and length_penalty(10, 0.0) == 1.0


def test_beam_finds_what_greedy_misses():
    model = TableModel(TABLE)
    src, lengths = _src([7, 9])
    greedy = greedy_search(model, src, lengths, max_output_length=5)[0][0]
    assert greedy.tokens == [A] and greedy.score == pytest.approx(math.log(0.24))
    for alpha in (0.0, 0.6):
        best = beam_search(model, src, lengths, beam_size=2, beam_alpha=alpha, max_output_length=5)[0]
        assert len(best) == 1 and best[0].tokens == [B]
        assert best[0].score == pytest.approx(math.log(0.36) / ((5 + 2) / 6) ** alpha)  # |Y| = 2 with EOS
    both = beam_search(model, src, lengths, beam_size=2, beam_alpha=0.0, n_best=2)[0]
    assert [h.tokens for h in both] == [[B], [A]]
    assert [h.score for h in both] == pytest.approx([math.log(0.36), math.log(0.24)])


def test_batch_mixes_sentences_correctly_and_records_attention():
    model = TableModel(TABLE)
    src, lengths = _src([8, 9, 9], [7, 9])
    results = beam_search(model, src, lengths, beam_size=3, beam_alpha=0.6, max_output_length=6)
    assert [r[0].tokens for r in results] == [[A, B, A], [B]]
    assert results[0][0].score == pytest.approx(0.0, abs=1e-9)
    # attention row t is one-hot on t mod S_len, cut to the true source length
    torch.testing.assert_close(results[0][0].attention, torch.eye(3))
    torch.testing.assert_close(results[1][0].attention, torch.tensor([[1.0, 0.0]]))
    greedy = greedy_search(model, src, lengths)
    assert [g[0].tokens for g in greedy] == [[A, B, A], [A]]
    torch.testing.assert_close(greedy[0][0].attention, torch.eye(3))


def test_max_output_length_cuts():
    model = TableModel(TABLE)
    src, lengths = _src([8, 9, 9])
    greedy = greedy_search(model, src, lengths, max_output_length=2)[0][0]
    beam = beam_search(model, src, lengths, beam_size=2, beam_alpha=0.6, max_output_length=2)[0][0]
    assert greedy.tokens == beam.tokens == [A, B]
    assert beam.attention.shape == (2, 3)


def _translator(**overrides):
    torch.manual_seed(0)
    config = RNNTranslatorConfig(**{"embedding_dim": 8, "hidden_size": 8, "encoder_layers": 1, "decoder_layers": 1,
                                    "window": 2, **overrides})
    return RNNTranslator(config, 10, 9).eval()


def _batch():
    src = torch.tensor([[4, 5, 6, 7], [8, 4, 0, 0], [9, 9, 5, 0]])
    return src, torch.tensor([4, 2, 3])


@pytest.mark.parametrize("attention", ["none", "general", "local-p"])
def test_beam_size_one_equals_greedy(attention):
    model = _translator(attention=attention)
    src, lengths = _batch()
    greedy = greedy_search(model, src, lengths, max_output_length=7)
    beam = beam_search(model, src, lengths, beam_size=1, beam_alpha=0.0, max_output_length=7)
    dispatched = decode(model, src, lengths, beam_size=1, max_output_length=7)
    for g, b, d in zip(greedy, beam, dispatched):
        assert g[0].tokens == b[0].tokens == d[0].tokens
        assert g[0].score == pytest.approx(b[0].score, abs=1e-5)
        if attention != "none":
            torch.testing.assert_close(g[0].attention, b[0].attention)
        else:
            assert g[0].attention is None and b[0].attention is None


@pytest.mark.parametrize("kind", ["transformer", "lstm"])
@pytest.mark.parametrize("beam_size,n_best", [(1, 1), (4, 1), (4, 4)])
def test_without_attention_the_same_hypotheses_and_no_rows(kind, beam_size, n_best):
    model = _transformer() if kind == "transformer" else _translator(attention="general")
    src, lengths = _batch()
    for max_output_length in (3, 9):  # cut by the limit, and ended by </s>
        kept = decode(model, src, lengths, beam_size, 0.6, max_output_length, n_best)
        dropped = decode(model, src, lengths, beam_size, 0.6, max_output_length, n_best, attention=False)
        for a, b in zip(kept, dropped, strict=True):
            assert [h.tokens for h in a] == [h.tokens for h in b] and [h.score for h in a] == [h.score for h in b]
            assert all(h.attention is not None for h in a) and all(h.attention is None for h in b)


def test_beam_attention_rows_of_hypotheses_finished_at_different_steps():
    # source 7 finishes [B] at step 2 and (n_best 2) [A] at step 2; the rows are those of the tokens, not of </s>
    model = TableModel(TABLE)
    src, lengths = _src([7, 9, 9], [8, 9])
    results = beam_search(model, src, lengths, beam_size=2, beam_alpha=0.0, max_output_length=6, n_best=2)
    assert [h.tokens for h in results[0]] == [[B], [A]]
    for hyp in results[0]:
        torch.testing.assert_close(hyp.attention, torch.tensor([[1.0, 0.0, 0.0]]))
    assert results[1][0].tokens == [A, B, A]
    torch.testing.assert_close(results[1][0].attention, torch.eye(2)[[0, 1, 0]])


def test_beam_batch_equals_sentence_by_sentence():
    model = _translator(attention="general", bidirectional_encoder=True)
    src, lengths = _batch()
    batched = decode(model, src, lengths, beam_size=4, beam_alpha=0.6, max_output_length=6, n_best=3)
    for b in range(3):
        alone = beam_search(model, src[b:b + 1, :lengths[b]], lengths[b:b + 1], 4, 0.6, 6, n_best=3)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in batched[b]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in batched[b]], abs=1e-5)
        scores = [h.score for h in batched[b]]
        assert scores == sorted(scores, reverse=True) and len(scores) == 3


def test_search_argument_errors():
    model = TableModel(TABLE)
    src, lengths = _src([7])
    with pytest.raises(ValueError, match="beam_size must be an integer >= 1"):
        decode(model, src, lengths, beam_size=0)
    with pytest.raises(ValueError, match=r"n_best must be in \[1, beam_size=2\]"):
        decode(model, src, lengths, beam_size=2, n_best=3)
    with pytest.raises(ValueError, match=r"n_best must be in \[1, beam_size=1\]"):
        decode(model, src, lengths, beam_size=1, n_best=2)
    with pytest.raises(ValueError, match="max_output_length must be a positive integer"):
        greedy_search(model, src, lengths, max_output_length=0)


def test_reorder_state_handles_nesting():
    state = {"a": torch.arange(3), "b": [torch.arange(6).view(3, 2), (torch.arange(3),)], "c": None}
    out = reorder_state(state, torch.tensor([2, 2, 0]))
    assert out["a"].tolist() == [2, 2, 0] and out["b"][0].tolist() == [[4, 5], [4, 5], [0, 1]]
    assert out["b"][1][0].tolist() == [2, 2, 0] and out["c"] is None


def test_replace_unk():
    source = ["the", "Nguyen", "house", "<pad>"]
    output = ["das", "<unk>", "Haus", "<unk>"]
    attention = torch.tensor([[0.8, 0.1, 0.1, 0.0],
                              [0.1, 0.7, 0.2, 0.0],
                              [0.1, 0.1, 0.8, 0.0],
                              [0.2, 0.1, 0.3, 0.9],  # the padding column is ignored
                              [1.0, 0.0, 0.0, 0.0]])  # extra row (EOS step) is ignored
    assert replace_unk(output, source[:3], attention) == ["das", "Nguyen", "Haus", "house"]
    assert replace_unk(output, source[:3], attention, dictionary={"house": "Haus", "the": "die"}) == \
        ["das", "Nguyen", "Haus", "Haus"]
    assert replace_unk(["<u>"], ["x"], torch.ones(1, 1), unk_token="<u>") == ["x"]
    with pytest.raises(ValueError, match="needs attention weights"):
        replace_unk(output, source, None)
    with pytest.raises(ValueError, match="T >= 4 output tokens"):
        replace_unk(output, source[:3], attention[:2])


def test_replace_unk_on_search_output():
    model = TableModel(TABLE)
    src, lengths = _src([8, 9, 9])
    hyp = greedy_search(model, src, lengths)[0][0]
    words = {A: "<unk>", B: "b"}
    assert replace_unk([words[t] for t in hyp.tokens], ["x", "y", "z"], hyp.attention) == ["x", "b", "z"]


def test_load_unk_dictionary(tmp_path):
    path = tmp_path / "dict.txt"
    path.write_text("# comment\nhouse\tHaus\nNew York\tNew York\n\nthe die\nhouse Gebäude\n", encoding="utf-8")
    assert load_unk_dictionary(path) == {"house": "Haus", "New York": "New York", "the": "die"}
    bad = tmp_path / "bad.txt"
    bad.write_text("house\tHaus\nonlyone\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.txt:2: expected 'source<TAB>target'.*'onlyone'"):
        load_unk_dictionary(bad)
    bad.write_text("a\tb\tc\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.txt:1"):
        load_unk_dictionary(bad)
    bad.write_text("a b c\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.txt:1"):
        load_unk_dictionary(bad)


def test_hypothesis_is_a_dataclass():
    h = Hypothesis([4, 5], -1.5)
    assert h.attention is None and h.tokens == [4, 5]


# ---------------------------------------------------------------------------- never <s> or <pad>
PAD, BOS = 0, 2


class FixedModel(TableModel):
    """Every step has the same distribution ``dist`` (token → probability); counts ``decode_step`` calls."""

    def __init__(self, dist):
        super().__init__({})
        self.dist, self.steps = dist, 0

    def decode_step(self, prev, state, step):
        self.steps += 1
        probs = torch.full((prev.shape[0], self.vocab_size), 1e-12, dtype=torch.double)
        for token, p in self.dist.items():
            probs[:, token] = p
        return (probs / probs.sum(-1, keepdim=True)).log(), state, None


def test_bos_and_pad_ranked_first_are_skipped_and_search_stops_at_eos_next_best():
    """An undertrained model that ranks <s> then <pad> first: unmasked, greedy would emit <s> for all
    max_output_length steps; masked, it takes </s> (the next best) at the first step."""
    dist = {BOS: 0.5, PAD: 0.3, EOS: 0.15, A: 0.05}
    src, lengths = _src([7, 9], [8])
    model = FixedModel(dist)
    greedy = greedy_search(model, src, lengths, max_output_length=100)
    assert [g[0].tokens for g in greedy] == [[], []] and model.steps == 1
    assert greedy[0][0].score == pytest.approx(math.log(0.15))  # the model's own log-probability
    model = FixedModel(dist)
    beams = beam_search(model, src, lengths, beam_size=3, beam_alpha=0.0, max_output_length=100, n_best=2)
    for hyps in beams:  # best: </s> at once; second: A then </s>; never a special
        assert [h.tokens for h in hyps] == [[], [A]]
        assert [h.score for h in hyps] == pytest.approx([math.log(0.15), math.log(0.05 * 0.15)])
    assert model.steps == 2


def test_bos_and_pad_ranked_first_with_a_real_token_next_best():
    dist = {BOS: 0.5, PAD: 0.3, A: 0.15, EOS: 0.05}
    src, lengths = _src([7])
    greedy = greedy_search(FixedModel(dist), src, lengths, max_output_length=6)[0][0]
    assert greedy.tokens == [A] * 6 and greedy.score == pytest.approx(6 * math.log(0.15))
    for hyp in beam_search(FixedModel(dist), src, lengths, beam_size=3, max_output_length=6, n_best=3)[0]:
        assert PAD not in hyp.tokens and BOS not in hyp.tokens and set(hyp.tokens) <= {A}


def _favour_specials(layer: torch.nn.Module, eos: float):
    """Add an output bias that makes <s> and <pad> the top two tokens everywhere, then </s> by ``eos``
    (a forward hook on the vocabulary projection, so it works with or without a bias parameter);
    returns the hook handle."""
    bias = torch.zeros(9)
    bias[BOS], bias[PAD], bias[EOS] = 60.0, 50.0, eos
    return layer.register_forward_hook(lambda module, inputs, output: output + bias)


def _transformer(max_positions=1024):
    from hyperplex.models.transformer import TransformerConfig, TransformerTranslator

    torch.manual_seed(0)
    config = TransformerConfig(d_model=16, num_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1, dropout=0.0,
                               max_positions=max_positions)
    return TransformerTranslator(config, 10, 9).eval()


@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_real_translators_never_emit_bos_or_pad(kind):
    if kind == "transformer":
        model = _transformer()
        layer = model.output_projection
    else:
        model = _translator(attention="general", dense_output_layer=True)
        layer = model.output_layer
    src, lengths = _batch()
    # </s> third (bias 40 ≫ any other logit): every search ends at once with an empty sentence
    hook = _favour_specials(layer, eos=40.0)
    for hyps in greedy_search(model, src, lengths, max_output_length=9):
        assert hyps[0].tokens == [] and math.isfinite(hyps[0].score)
    for hyps in beam_search(model, src, lengths, beam_size=3, max_output_length=9, n_best=3):
        assert hyps[0].tokens == [] and all(PAD not in h.tokens and BOS not in h.tokens for h in hyps)
    # </s> not favoured: real tokens, still no special; and beam 1 is exactly greedy
    hook.remove()
    _favour_specials(layer, eos=0.0)
    greedy = greedy_search(model, src, lengths, max_output_length=9)
    beam1 = beam_search(model, src, lengths, beam_size=1, beam_alpha=0.0, max_output_length=9)
    beam4 = beam_search(model, src, lengths, beam_size=4, max_output_length=9, n_best=4)
    assert any(g[0].tokens for g in greedy)
    for g, b, many in zip(greedy, beam1, beam4):
        assert g[0].tokens == b[0].tokens and g[0].score == pytest.approx(b[0].score, abs=1e-4)
        for hyp in [g[0], *many]:
            assert PAD not in hyp.tokens and BOS not in hyp.tokens


def test_transformer_decodes_at_most_its_positions():
    """max_output_length beyond the position table stops there instead of failing in the embedding."""
    model = _transformer(max_positions=5)
    bias = torch.zeros(9)
    bias[EOS], bias[A] = -60.0, 30.0  # never </s>: every search runs to its step limit
    model.output_projection.register_forward_hook(lambda module, inputs, output: output + bias)
    src, lengths = torch.tensor([[4, 5, 3]]), torch.tensor([3])
    assert greedy_search(model, src, lengths, max_output_length=50)[0][0].tokens == [A] * 5
    assert beam_search(model, src, lengths, beam_size=2, max_output_length=50)[0][0].tokens == [A] * 5


def test_never_generated_ids():
    from hyperplex.models.search import max_positions, never_generated

    assert never_generated(TableModel(TABLE)) == [PAD, BOS]
    assert max_positions(TableModel(TABLE)) is None and max_positions(_transformer(7)) == 7


def _phm_transformer():
    from hyperplex.models.transformer import TransformerConfig, TransformerTranslator
    from hyperplex.nn.linear import LinearSpec

    torch.manual_seed(0)
    config = TransformerConfig(d_model=16, num_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1, dropout=0.0,
                               linear=LinearSpec(kind="phm", n=4))
    return TransformerTranslator(config, 10, 9).eval()


@pytest.mark.parametrize("beam_size", [1, 4])
def test_decode_with_shared_weights_gives_the_per_step_hypotheses(beam_size):
    """Each PHM layer's H formed once for the search (the CUDA default) decodes what the per-step paths decode."""
    model = _phm_transformer()
    src, lengths = _batch()
    per_step = decode(model, src, lengths, beam_size=beam_size, max_output_length=7, share_weights=False)
    shared = decode(model, src, lengths, beam_size=beam_size, max_output_length=7, share_weights=True)
    for a, b in zip(per_step, shared):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


def test_decode_shares_weights_on_cuda_only_by_default(monkeypatch):
    """The default asks the model's device: H is shared on CUDA (launch-bound steps) and not on the CPU (where
    the per-step paths read 1/n of the weights); the formed H are dropped after the search."""
    from hyperplex.layers import PHMLinear
    from hyperplex.models import search

    model = _phm_transformer()
    layers = [m for m in model.modules() if isinstance(m, PHMLinear)]
    seen = []
    hook = layers[-1].register_forward_pre_hook(lambda module, args: seen.append(module._shared_weight is not None))
    src, lengths = _batch()
    decode(model, src, lengths, max_output_length=3)
    assert seen and not any(seen)
    monkeypatch.setattr(search, "_on_cuda", lambda model: True)
    seen.clear()
    decode(model, src, lengths, max_output_length=3)
    assert seen and all(seen)
    hook.remove()
    assert all(m._shared_weight is None for m in layers)
