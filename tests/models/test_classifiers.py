import random

import pytest
import torch
import torch.nn.functional as F

from hyperplex.algebra import hamilton
from hyperplex.data.glove import load_glove
from hyperplex.models.classifiers import (
    DecomposableAttention,
    DecomposableAttentionConfig,
    NLIEncoderClassifier,
    NLIEncoderConfig,
    QuaternionAttentionConfig,
    QuaternionAttentionModel,
    _component_cat,
    hamilton_alignment_scores,
)
from hyperplex.nn import LinearSpec

VOCAB = 12


def tiny(kind: str, num_outputs: int = 3, **overrides):
    """Tiny model of each kind (dropout 0 so eval and train agree)."""
    if kind == "nli":
        config = NLIEncoderConfig(embedding_dim=8, hidden_size=8, mlp_dim=8, dropout=0.0, **overrides)
        return NLIEncoderClassifier(config, VOCAB, num_outputs)
    if kind == "nli-bi":
        config = NLIEncoderConfig(embedding_dim=8, hidden_size=8, mlp_dim=8, dropout=0.0, bidirectional=True,
                                  num_layers=2, **overrides)
        return NLIEncoderClassifier(config, VOCAB, num_outputs)
    if kind == "deatt":
        return DecomposableAttention(DecomposableAttentionConfig(
            embedding_dim=8, hidden_size=8, dropout=0.0, **overrides), VOCAB, num_outputs)
    return QuaternionAttentionModel(QuaternionAttentionConfig(
        embedding_dim=8, hidden_size=8, dropout=0.0, **overrides), VOCAB, num_outputs)


KINDS = ["nli", "nli-bi", "deatt", "qatt"]


def random_batch(generator, batch=4, ta=5, tb=4):
    a = torch.randint(4, VOCAB, (batch, ta), generator=generator)
    b = torch.randint(4, VOCAB, (batch, tb), generator=generator)
    la = torch.randint(1, ta + 1, (batch,), generator=generator)
    lb = torch.randint(1, tb + 1, (batch,), generator=generator)
    la[0], lb[0] = ta, tb  # at least one full row
    a[torch.arange(ta)[None] >= la[:, None]] = 0
    b[torch.arange(tb)[None] >= lb[:, None]] = 0
    return a, la, b, lb


# --------------------------------------------------------------------------- Q-Att maths
def test_alignment_scores_match_hamilton_loop():
    torch.manual_seed(0)
    m = 3
    a, b = torch.randn(2, 4, 4 * m, dtype=torch.float64), torch.randn(2, 5, 4 * m, dtype=torch.float64)
    scores = hamilton_alignment_scores(a, b)  # (B, 4, Ta, Tb)
    assert scores.shape == (2, 4, 4, 5)
    for n in range(2):
        for i in range(4):
            for j in range(5):
                product = hamilton(a[n, i], b[n, j]).view(4, m).sum(-1)  # Σ_k A_ik ⊗ B_jk
                torch.testing.assert_close(scores[n, :, i, j], product)


def test_alignment_scores_single_quaternion_by_hand():
    # i ⊗ j = k, j ⊗ i = -k (Hamilton 1843): scores are the components of the product
    i_unit, j_unit = torch.tensor([[[0.0, 1, 0, 0]]]), torch.tensor([[[0.0, 0, 1, 0]]])
    assert hamilton_alignment_scores(i_unit, j_unit)[0, :, 0, 0].tolist() == [0, 0, 0, 1]
    assert hamilton_alignment_scores(j_unit, i_unit)[0, :, 0, 0].tolist() == [0, 0, 0, -1]


def test_align_matches_component_softmax_loop():
    torch.manual_seed(1)
    m, ta, tb = 2, 4, 3
    a, b = torch.randn(1, ta, 4 * m, dtype=torch.float64), torch.randn(1, tb, 4 * m, dtype=torch.float64)
    mask_a, mask_b = torch.tensor([[True, True, True, False]]), torch.tensor([[True, True, False]])
    b_aligned, a_aligned = QuaternionAttentionModel.align(a, b, mask_a, mask_b)
    E = [[hamilton(a[0, i], b[0, j]).view(4, m).sum(-1) for j in range(tb)] for i in range(ta)]
    A, B = a[0].view(ta, 4, m), b[0].view(tb, 4, m)
    for i in range(ta):  # B′_i = Σ_c G_c B_c, softmax over valid b positions per component
        expected = torch.stack([
            sum(w * B[j, c] for w, j in zip(torch.softmax(torch.stack([E[i][j][c] for j in range(2)]), 0), range(2)))
            for c in range(4)])
        torch.testing.assert_close(b_aligned[0, i], expected.reshape(-1))
    for j in range(tb):  # A′_j = Σ_c F_c A_c, softmax over valid a positions
        expected = torch.stack([
            sum(w * A[i, c] for w, i in zip(torch.softmax(torch.stack([E[i][j][c] for i in range(3)]), 0), range(3)))
            for c in range(4)])
        torch.testing.assert_close(a_aligned[0, j], expected.reshape(-1))


def test_component_cat_layout():
    p, q = torch.arange(8.0), 100 + torch.arange(4.0)  # 2 and 1 quaternions
    out = _component_cat([p, q]).view(4, 3)
    assert out.tolist() == [[0, 1, 100], [2, 3, 101], [4, 5, 102], [6, 7, 103]]


def compcat(parts):
    return torch.cat([x.view(4, -1) for x in parts], dim=1).reshape(-1)


def test_qatt_forward_matches_reference_loop():
    torch.manual_seed(2)
    model = tiny("qatt", num_outputs=2).double().eval()
    a, la, b, lb = random_batch(torch.Generator().manual_seed(3))
    logits = model(a, la, b, lb)
    for n in range(a.shape[0]):
        A = model.projection(model.embedding(a[n, :la[n]]))  # (La, 8) = 2 quaternions
        B = model.projection(model.embedding(b[n, :lb[n]]))
        E = torch.stack([torch.stack([hamilton(x, y).view(4, 2).sum(-1) for y in B]) for x in A])  # (La, Lb, 4)
        G, Fw = torch.softmax(E, dim=1), torch.softmax(E, dim=0)
        Bq, Aq = B.view(-1, 4, 2), A.view(-1, 4, 2)
        B_al = torch.stack([torch.stack([(G[i, :, c, None] * Bq[:, c]).sum(0) for c in range(4)]).reshape(-1)
                            for i in range(len(A))])
        A_al = torch.stack([torch.stack([(Fw[:, j, c, None] * Aq[:, c]).sum(0) for c in range(4)]).reshape(-1)
                            for j in range(len(B))])
        c1 = sum(model.compare(compcat([A_al[j], B[j], hamilton(A_al[j], B[j]), A_al[j] - B[j]]))
                 for j in range(len(B)))
        c2 = sum(model.compare(compcat([B_al[i], A[i], hamilton(B_al[i], A[i]), B_al[i] - A[i]]))
                 for i in range(len(A)))
        y = model.aggregate(compcat([c1, c2, hamilton(c1, c2), c1 - c2]))
        torch.testing.assert_close(logits[n], model.output(y))


def test_deatt_forward_matches_reference_loop():
    torch.manual_seed(4)
    model = tiny("deatt").double().eval()
    a, la, b, lb = random_batch(torch.Generator().manual_seed(5))
    logits = model(a, la, b, lb)
    for n in range(a.shape[0]):
        A = model.projection(model.embedding(a[n, :la[n]]))
        B = model.projection(model.embedding(b[n, :lb[n]]))
        e = model.attend(A) @ model.attend(B).T
        beta, alpha = torch.softmax(e, 1) @ B, torch.softmax(e, 0).T @ A
        v1 = model.compare(torch.cat([A, beta, A * beta, A - beta], -1)).sum(0)
        v2 = model.compare(torch.cat([B, alpha, B * alpha, B - alpha], -1)).sum(0)
        torch.testing.assert_close(logits[n], model.output(model.aggregate(torch.cat([v1, v2]))))


@pytest.mark.parametrize("kind", ["nli", "nli-bi"])
def test_nli_forward_matches_reference(kind):
    torch.manual_seed(6)
    model = tiny(kind).double().eval()
    a, la, b, lb = random_batch(torch.Generator().manual_seed(7))
    logits = model(a, la, b, lb)
    for n in range(a.shape[0]):
        def pooled(tokens):
            states, _ = model.encoder(model.embedding(tokens)[None])  # unpadded sequence
            return torch.cat([states[0].amax(0), states[0].mean(0)])
        u, v = pooled(a[n, :la[n]]), pooled(b[n, :lb[n]])
        expected = model.output(model.mlp(torch.cat([u, v, (u - v).abs(), u * v])))
        torch.testing.assert_close(logits[n], expected)


# --------------------------------------------------------------------------- protocol properties
@pytest.mark.parametrize("kind", KINDS)
def test_padding_invariance(kind):
    torch.manual_seed(8)
    model = tiny(kind).eval()
    gen = torch.Generator().manual_seed(9)
    a, la, b, lb = random_batch(gen)
    logits = model(a, la, b, lb)
    assert logits.shape == (4, 3)
    # append pad columns, and garbage tokens in the padded area: neither may change the logits
    a_pad = torch.cat([a, torch.zeros(4, 3, dtype=torch.long)], 1)
    b_pad = torch.cat([b, torch.zeros(4, 2, dtype=torch.long)], 1)
    torch.testing.assert_close(model(a_pad, la, b_pad, lb), logits, atol=1e-6, rtol=0)
    a_junk, b_junk = a_pad.clone(), b_pad.clone()
    a_junk[torch.arange(8)[None] >= la[:, None]] = torch.randint(1, VOCAB, (1,), generator=gen)
    b_junk[torch.arange(6)[None] >= lb[:, None]] = 5
    torch.testing.assert_close(model(a_junk, la, b_junk, lb), logits, atol=1e-6, rtol=0)
    # each row alone gives the same logits as in the batch
    for n in range(4):
        single = model(a[n:n + 1, :la[n]], la[n:n + 1], b[n:n + 1, :lb[n]], lb[n:n + 1])
        torch.testing.assert_close(single[0], logits[n], atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind,linear", [("nli", LinearSpec("phm", n=2)), ("nli-bi", LinearSpec("phm", n=2)),
                                         ("deatt", LinearSpec("phm", n=2)), ("qatt", LinearSpec("quaternion")),
                                         ("qatt", LinearSpec("phm", n=4))],
                         ids=["nli-phm2", "nli-bi-phm2", "deatt-phm2", "qatt-quaternion", "qatt-phm4"])
def test_gradients_match_finite_differences(kind, linear):
    # Backprop through the whole model (masks, pooling, Hamilton alignment, PHM rules and weights)
    # against central differences in float64, w.r.t. every parameter: a parameter cut off from
    # the graph, or a wrong hand-written backward, gives a mismatch. fast_mode compares random
    # projections vᵀJu per parameter instead of the full Jacobian, so this takes seconds, not minutes.
    torch.manual_seed(10)
    model = tiny(kind, linear=linear).double().eval()
    a, la, b, lb = random_batch(torch.Generator().manual_seed(11))
    names, params = zip(*[(n, p.detach().clone().requires_grad_()) for n, p in model.named_parameters()])
    assert any(n.endswith("phm_rule") for n in names) == (linear.kind == "phm")  # the rules are checked too

    def logits(*values):
        return torch.func.functional_call(model, dict(zip(names, values)), (a, la, b, lb))

    assert torch.autograd.gradcheck(logits, params, eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=True)


def test_frozen_embeddings_and_ranking_output():
    model = tiny("qatt", num_outputs=1, freeze_embeddings=True)
    assert not model.embedding.weight.requires_grad
    a, la, b, lb = random_batch(torch.Generator().manual_seed(12))
    assert model(a, la, b, lb).shape == (4, 1)


def test_loads_into_model_embedding(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("the 0.1 0.2 -0.3\ncat 1 2 3\n")
    vocab = ["<pad>", "<unk>", "the", "cat"]
    torch.manual_seed(0)
    model = DecomposableAttention(DecomposableAttentionConfig(embedding_dim=3, hidden_size=4), len(vocab), 3)
    before = model.embedding.weight.detach().clone()
    vectors, mask = load_glove(path, vocab, dim=3)
    model.load_pretrained_embeddings(vectors, mask)
    after = model.embedding.weight.detach()
    torch.testing.assert_close(after[2:], vectors[2:])
    torch.testing.assert_close(after[:2], before[:2])  # rows not found keep their init
    with pytest.raises(ValueError, match="expected \\(vocab_size, embedding_dim\\)"):
        model.load_pretrained_embeddings(torch.zeros(4, 5))


def test_config_errors():
    with pytest.raises(ValueError, match="linear n=7 does not divide size 8 in NLIEncoderConfig"):
        tiny("nli", linear=LinearSpec("phm", n=7))
    with pytest.raises(ValueError, match="hidden_size must be a multiple of 4"):
        QuaternionAttentionModel(QuaternionAttentionConfig(embedding_dim=8, hidden_size=10), VOCAB, 3)
    with pytest.raises(ValueError, match="projection=false needs hidden_size == embedding_dim"):
        DecomposableAttention(DecomposableAttentionConfig(embedding_dim=8, hidden_size=4, projection=False), VOCAB, 3)
    with pytest.raises(ValueError, match="num_outputs must be >= 1"):
        tiny("deatt", num_outputs=0)
    model = tiny("deatt")
    a, la, b, lb = random_batch(torch.Generator().manual_seed(13))
    with pytest.raises(ValueError, match=r"a_lengths must lie in \[1, 5\]"):
        model(a, la * 0, b, lb)
    with pytest.raises(ValueError, match="expected b \\(B, T\\)"):
        model(a, la, b[:2], lb[:2])


def test_phm_config_switch_shrinks_nli_model():
    dense = NLIEncoderClassifier(NLIEncoderConfig(embedding_dim=20, hidden_size=20, mlp_dim=20), 50, 3)
    phm = NLIEncoderClassifier(NLIEncoderConfig(embedding_dim=20, hidden_size=20, mlp_dim=20,
                                                linear=LinearSpec("phm", n=5)), 50, 3)
    count = lambda m: sum(p.numel() for n, p in m.named_parameters() if not n.startswith("embedding"))  # noqa: E731
    assert count(phm) < count(dense) / 2


# --------------------------------------------------------------------------- tiny overfit
def share_token_task(num_pairs=16, seed=0):
    """Pairs of short sentences; label 1 iff they share a token (balanced)."""
    rng = random.Random(seed)
    pairs, labels = [], []
    while len(pairs) < num_pairs:
        a = rng.sample(range(4, VOCAB), rng.randint(2, 4))
        b = rng.sample(range(4, VOCAB), rng.randint(2, 4))
        label = int(bool(set(a) & set(b)))
        if labels.count(label) < num_pairs // 2:
            pairs.append((a, b))
            labels.append(label)

    def pad(seqs):
        lengths = torch.tensor([len(s) for s in seqs])
        out = torch.zeros(len(seqs), int(lengths.max()), dtype=torch.long)
        for i, s in enumerate(seqs):
            out[i, :len(s)] = torch.tensor(s)
        return out, lengths

    (a, la), (b, lb) = pad([p[0] for p in pairs]), pad([p[1] for p in pairs])
    return a, la, b, lb, torch.tensor(labels)


@pytest.mark.parametrize("kind,num_outputs", [("nli", 2), ("deatt", 2), ("qatt", 2), ("qatt", 1), ("deatt", 1)])
def test_overfits_tiny_pair_task(kind, num_outputs):
    torch.manual_seed(0)
    model = tiny(kind, num_outputs)
    a, la, b, lb, y = share_token_task()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(300):
        logits = model(a, la, b, lb)
        if num_outputs == 1:  # ranking score, binary cross-entropy (Tay et al. §4.1)
            loss, predicted = F.binary_cross_entropy_with_logits(logits[:, 0], y.float()), (logits[:, 0] > 0).long()
        else:
            loss, predicted = F.cross_entropy(logits, y), logits.argmax(-1)
        if bool((predicted == y).all()) and loss.item() < 0.1:
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    logits = model(a, la, b, lb)
    predicted = (logits[:, 0] > 0).long() if num_outputs == 1 else logits.argmax(-1)
    assert (predicted == y).all()
