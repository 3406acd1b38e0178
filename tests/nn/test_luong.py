import math

import pytest
import torch

from hyperplex.nn import LinearSpec
from hyperplex.nn.luong import ATTENTIONS, LuongAttention, make_attention

VARIANTS = [name for name in ATTENTIONS if name != "none"]


def _inputs(B=3, S=7, H=8, T=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(B, T, H, generator=g, dtype=torch.double)
    memory = torch.randn(B, S, H, generator=g, dtype=torch.double)
    lengths = torch.tensor([7, 3, 5])[:B]
    mask = torch.arange(S)[None] < lengths[:, None]
    return query, memory, mask, lengths


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("spec", [LinearSpec("dense"), LinearSpec("phm", n=2)], ids=["dense", "phm2"])
def test_weights_sum_to_one_and_zero_on_padding(name, spec):
    torch.manual_seed(0)
    attention = make_attention(name, 8, 8, spec, window=2).double()
    query, memory, mask, lengths = _inputs()
    memory_padded = memory.masked_fill(~mask[..., None], 1e4)  # padding values must not leak
    context, weights = attention(query, memory_padded, mask, step=0, lengths=lengths)
    assert weights.shape == (3, 4, 7) and context.shape == (3, 4, 8)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, dtype=torch.double))
    assert (weights.masked_select(~mask[:, None, :].expand_as(weights)) == 0).all()
    torch.testing.assert_close(context, weights @ memory.masked_fill(~mask[..., None], 0))


@pytest.mark.parametrize("name", VARIANTS)
def test_one_step_at_a_time_equals_all_steps(name):
    torch.manual_seed(1)
    attention = make_attention(name, 8, 8, window=1).double()
    query, memory, mask, lengths = _inputs()
    context, weights = attention(query, memory, mask, step=2, lengths=lengths)
    keys = attention.keys(memory)
    for t in range(4):
        c, w = attention(query[:, t], memory, mask, step=2 + t, lengths=lengths, keys=keys)
        torch.testing.assert_close(c, context[:, t])
        torch.testing.assert_close(w, weights[:, t])


def test_local_p_hand_computed():
    # Zero query: scores are 0 and W_p h = 0, so p_t = S_len · sigmoid(0) = S_len / 2 whatever the
    # weights; D = 2, σ = 1, so a_ts ∝ exp(−(s − p_t)² / 2) over the 2D + 1 = 5 positions |s − round(p_t)| ≤ 2
    # within the sentence.
    attention = make_attention("local-p", 2, 2, window=2).double()
    memory = torch.arange(10, dtype=torch.double).view(2, 5, 1).expand(2, 5, 2).contiguous()
    mask = torch.tensor([[True] * 4 + [False], [True] * 5])
    context, weights = attention(torch.zeros(2, 2, dtype=torch.double), memory, mask)
    e = math.exp
    row0 = [e(-2), e(-0.5), 1, e(-0.5), 0]  # S_len = 4: p = 2, s = 4 is padding
    # S_len = 5: p = 2.5, the window centred on round(2.5) = 2 (half to even): s = 0 … 4, five positions, where
    # |s − p_t| ≤ D would hold four
    row1 = [e(-3.125), e(-1.125), e(-0.125), e(-0.125), e(-1.125)]
    expected = torch.tensor([[w / sum(row) for w in row] for row in (row0, row1)], dtype=torch.double)
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(context[:, 0], (expected * memory[..., 0]).sum(-1))
    # eq. 3.9 literally: window softmax (uniform here) times the Gaussian, not renormalised
    literal = make_attention("local-p", 2, 2, window=2, normalize=False).double()
    _, w_literal = literal(torch.zeros(2, 2, dtype=torch.double), memory, mask)
    torch.testing.assert_close(w_literal, torch.tensor([[w / 4 for w in row0], [w / 5 for w in row1]],
                                                       dtype=torch.double))


def test_local_p_window_holds_2d_plus_1_positions_away_from_the_edges():
    """Thesis eq. 3.7: the local alignment vector has 2D + 1 entries, whatever the fraction of p_t."""
    torch.manual_seed(0)
    D, S = 3, 30
    attention = make_attention("local-p", 4, 4, window=D).double()
    query = torch.randn(1, 50, 4, dtype=torch.double)
    memory = torch.randn(1, S, 4, dtype=torch.double)
    mask = torch.ones(1, S, dtype=torch.bool)
    _, weights = attention(query, memory, mask)
    p = attention.position(query, torch.arange(50), torch.tensor([S]))[0]
    inside = (p >= D) & (p <= S - 1 - D)  # windows the sentence's edges do not clip
    assert inside.sum() > 10 and (p[inside] % 1).std() > 0.1  # fractions of every kind
    assert ((weights[0, inside] > 0).sum(-1) == 2 * D + 1).all()


def test_local_p_with_fixed_weights():
    # Fixed W_a = W_p = I, v_p = (1, 0): p = S_len · sigmoid(tanh(h_0)); general score h·h̄_s.
    attention = make_attention("local-p", 2, 2, window=2).double()
    with torch.no_grad():
        attention.score.W_a.weight.copy_(torch.eye(2))
        attention.position.W_p.weight.copy_(torch.eye(2))
        attention.position.v_p.copy_(torch.tensor([1.0, 0.0]))
    h = [0.8, -0.3]
    mem = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.5], [0.2, 0.2], [9.0, 9.0]]  # last is padding
    S_len = 5
    p = S_len / (1 + math.exp(-math.tanh(h[0])))
    unnorm = [math.exp(h[0] * m[0] + h[1] * m[1] - (s - p) ** 2 / 2) if s < S_len and abs(s - round(p)) <= 2 else 0.0
              for s, m in enumerate(mem)]
    expected = torch.tensor([[u / sum(unnorm) for u in unnorm]], dtype=torch.double)
    _, weights = attention(torch.tensor([h], dtype=torch.double), torch.tensor([mem], dtype=torch.double),
                           torch.tensor([[True] * 5 + [False]]))
    torch.testing.assert_close(weights, expected)


def test_local_p_position_gets_gradient():
    torch.manual_seed(2)
    attention = make_attention("local-p", 8, 8, window=2).double()
    query, memory, mask, lengths = _inputs()
    context, _ = attention(query, memory, mask)
    context.sum().backward()
    assert attention.position.v_p.grad.abs().sum() > 0
    assert attention.position.W_p.weight.grad.abs().sum() > 0


def test_local_m_window_and_clamp():
    attention = make_attention("local-m", 8, 8, window=1).double()
    query, memory, mask, lengths = _inputs()
    _, weights = attention(query, memory, mask, step=3)  # t = 3..6
    # row 1 has 3 tokens: p_t clamps to 2, window {1, 2}
    assert (weights[1, :, :1] == 0).all() and (weights[1, :, 3:] == 0).all()
    # row 0, t = 3: window {2, 3, 4}
    assert torch.nonzero(weights[0, 0]).flatten().tolist() == [2, 3, 4]


def test_general_and_dot_scores_by_hand():
    dot = make_attention("dot", 2, 2)
    general = make_attention("general", 2, 2)
    with torch.no_grad():
        general.score.W_a.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, -1.0]]))
    q = torch.tensor([[1.0, 1.0]])
    m = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    _, w = dot(q, m)
    torch.testing.assert_close(w, torch.tensor([[0.5, 0.5]]))
    _, w = general(q, m)  # scores 2, −1
    torch.testing.assert_close(w, torch.softmax(torch.tensor([[2.0, -1.0]]), -1))


def test_concat_by_hand():
    attention = make_attention("concat", 2, 2)
    with torch.no_grad():
        attention.score.W_q.weight.copy_(torch.eye(2))
        attention.score.W_k.weight.copy_(torch.eye(2))
        attention.score.v_a.copy_(torch.tensor([1.0, -1.0]))
    q = torch.tensor([[0.5, 0.0]])
    m = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    scores = torch.tensor([[math.tanh(1.5) - math.tanh(0.0), math.tanh(0.5) - math.tanh(1.0)]])
    _, w = attention(q, m)
    torch.testing.assert_close(w, torch.softmax(scores, -1))


def test_registry_and_errors():
    assert make_attention("none", 4, 4) is None
    assert set(ATTENTIONS) == {"none", "dot", "general", "concat", "local-m", "local-p"}
    with pytest.raises(ValueError, match="unknown attention 'bahdanau'"):
        make_attention("bahdanau", 4, 4)
    with pytest.raises(ValueError, match="dot attention needs query size == memory size"):
        make_attention("dot", 4, 6)
    with pytest.raises(ValueError, match="window D must be an integer >= 1"):
        make_attention("local-m", 4, 4, window=0)
    with pytest.raises(ValueError, match="n=4 does not divide size 6 in general attention"):
        make_attention("general", 8, 6, LinearSpec("phm", n=4))
    attention = make_attention("general", 4, 4)
    with pytest.raises(ValueError, match=r"mask must have shape \(B, S\)"):
        attention(torch.randn(2, 4), torch.randn(2, 3, 4), torch.ones(2, 4, dtype=torch.bool))
    assert isinstance(attention, LuongAttention) and "general" in repr(attention)
