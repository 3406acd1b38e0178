import math

import pytest
import torch
from sacrebleu.metrics import BLEU

from hyperplex.metrics import (
    accuracy,
    corpus_bleu,
    corpus_chrf,
    mean_average_precision,
    mean_reciprocal_rank,
    perplexity,
    ranking_metrics,
)


def test_bleu_identical_is_100():
    sents = ["the cat sat on the mat .", "a quick brown fox jumps over the lazy dog"]
    result = corpus_bleu(sents, sents)
    assert result.score == pytest.approx(100.0)
    assert "tok:13a" in result.signature and "nrefs:1" in result.signature
    assert result.text.startswith("BLEU = 100.00")


def test_bleu_known_value():
    hyps = ["the cat sat on the mat", "hello there"]
    refs = ["the cat sat on a mat", "hello there general"]
    # sacrebleu 2.x reference value: precisions 7/8, 4/6, 2/4, 1/3; BP = exp(1 - 9/8)
    expected = math.exp(1 - 9 / 8) * math.exp(sum(math.log(p) for p in (7 / 8, 4 / 6, 2 / 4, 1 / 3)) / 4) * 100
    result = corpus_bleu(hyps, refs)
    assert result.score == pytest.approx(expected, abs=1e-9)
    assert result.score == pytest.approx(BLEU().corpus_score(hyps, [refs]).score)
    assert result.score == pytest.approx(49.278, abs=1e-3)


def test_chrf():
    assert corpus_chrf(["abc def"], ["abc def"]).score == pytest.approx(100.0)
    r = corpus_chrf(["the cat sat on the mat"], ["the cat sat on a mat"])
    assert r.score == pytest.approx(72.08, abs=0.01) and "nc:6" in r.signature


def test_corpus_metric_errors():
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        corpus_bleu(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="no sentences"):
        corpus_chrf([], [])
    with pytest.raises(ValueError, match=r"hypotheses\[0\] is list"):
        corpus_bleu([["a"]], ["a"])


def test_perplexity():
    nll = [0.5, 1.0, 2.0, 0.1]
    assert perplexity(sum(nll), len(nll)) == pytest.approx(math.exp(sum(nll) / 4))
    assert perplexity(0.0, 3) == 1.0
    assert perplexity(1e6, 1) == math.inf
    with pytest.raises(ValueError, match="total_tokens"):
        perplexity(1.0, 0)
    with pytest.raises(ValueError, match="non-negative"):
        perplexity(float("nan"), 3)


def test_accuracy():
    assert accuracy([1, 0, 2, 2], [1, 1, 2, 0]) == 0.5
    assert accuracy(torch.tensor([3, 3]), torch.tensor([3, 3])) == 1.0
    with pytest.raises(ValueError, match="3 predictions but 2 labels"):
        accuracy([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="no examples"):
        accuracy([], [])


# Four questions, candidates interleaved to check grouping by id rather than by position.
#   q1: ranked scores 0.9(0) 0.8(1) 0.1(0)            AP = 1/2,            RR = 1/2
#   q2: ranked 0.7(1) 0.6(0) 0.5(1) 0.4(1)            AP = (1 + 2/3 + 3/4)/3, RR = 1
#   q3: no positive                                    skipped
#   q4: tie 0.3(0), 0.3(1) — the wrong answer first   AP = 1/2,            RR = 1/2
GROUPS = ["q1", "q2", "q1", "q3", "q2", "q1", "q2", "q3", "q2", "q4", "q4"]
SCORES = [0.9, 0.5, 0.1, 0.2, 0.7, 0.8, 0.6, 0.3, 0.4, 0.3, 0.3]
LABELS = [0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1]


def test_map_mrr_hand_computed():
    ap = [1 / 2, (1 + 2 / 3 + 3 / 4) / 3, 1 / 2]
    rr = [1 / 2, 1.0, 1 / 2]
    assert mean_average_precision(GROUPS, SCORES, LABELS) == pytest.approx(sum(ap) / 3)
    assert mean_reciprocal_rank(GROUPS, SCORES, LABELS) == pytest.approx(sum(rr) / 3)
    result = ranking_metrics(GROUPS, SCORES, LABELS)
    assert result == {"map": pytest.approx(sum(ap) / 3), "mrr": pytest.approx(sum(rr) / 3), "questions": 3,
                      "skipped": 1}


def test_ties_rank_the_wrong_answers_first_whatever_the_input_order():
    # a tie is ranked pessimistically, so the order the candidates come in (WikiQA's lists the answer early) cannot
    # lift a model that scores them alike
    assert mean_reciprocal_rank(["q", "q"], [0.3, 0.3], [1, 0]) == 0.5
    assert mean_reciprocal_rank(["q", "q"], [0.3, 0.3], [0, 1]) == 0.5
    constant = ranking_metrics(["q"] * 4 + ["r"] * 3, [1.0] * 7, [1, 0, 0, 0, 0, 1, 0])
    assert constant["map"] == pytest.approx((1 / 4 + 1 / 3) / 2)  # each answer last among its tied candidates
    assert mean_reciprocal_rank(["q", "q", "q"], [0.9, 0.3, 0.3], [0, 1, 0]) == pytest.approx(1 / 3)


def test_ranking_accepts_tensors():
    r = ranking_metrics(torch.tensor([1, 1, 2]), torch.tensor([0.1, 0.9, 0.5]), torch.tensor([1, 0, 1]))
    assert r["map"] == pytest.approx((0.5 + 1.0) / 2) and r["questions"] == 2


def test_ranking_errors():
    with pytest.raises(ValueError, match="equal lengths"):
        ranking_metrics(["a"], [0.1, 0.2], [1, 0])
    with pytest.raises(ValueError, match="no candidates"):
        ranking_metrics([], [], [])
    with pytest.raises(ValueError, match="none of the 2 questions"):
        ranking_metrics(["a", "b"], [0.1, 0.2], [0, 0])
    with pytest.raises(ValueError, match="0 or 1"):
        ranking_metrics(["a"], [0.1], [2])
    with pytest.raises(ValueError, match="NaN"):
        ranking_metrics(["a"], [float("nan")], [1])
