"""Evaluation metrics: sacreBLEU BLEU and chrF, perplexity, accuracy, MAP/MRR for answer ranking.

BLEU and chrF are computed by sacreBLEU on *detokenised* text (subword markers removed, the
tokeniser's detokeniser applied by the caller), with sacreBLEU's default ``13a`` tokenisation, and
are reported with sacreBLEU's signature so numbers are comparable across papers (Post 2018).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from sacrebleu.metrics import BLEU, CHRF

__all__ = [
    "CorpusScore", "BleuResult", "ChrfResult", "corpus_bleu", "corpus_chrf", "perplexity", "accuracy",
    "mean_average_precision", "mean_reciprocal_rank", "ranking_metrics",
]


@dataclass(frozen=True)
class CorpusScore:
    """A corpus-level sacreBLEU score.

    Attributes:
        score: the score on a 0–100 scale.
        signature: sacreBLEU's signature, e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``.
        text: sacreBLEU's one-line summary, e.g. ``BLEU = 27.31 58.1/33.0/20.9/13.6 (BP = ...)``.
    """

    score: float
    signature: str
    text: str

    def __str__(self) -> str:
        return f"{self.text} | {self.signature}"


class BleuResult(CorpusScore):
    """Result of :func:`corpus_bleu`."""


class ChrfResult(CorpusScore):
    """Result of :func:`corpus_chrf`."""


def _check_pairs(hypotheses: Sequence[str], references: Sequence[str], what: str) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(f"{what}: {len(hypotheses)} hypotheses but {len(references)} references; "
                         f"expected one reference per hypothesis")
    if not hypotheses:
        raise ValueError(f"{what}: no sentences to score (empty hypotheses and references)")
    for name, seq in (("hypotheses", hypotheses), ("references", references)):
        for i, s in enumerate(seq):
            if not isinstance(s, str):
                raise ValueError(f"{what}: {name}[{i}] is {type(s).__name__}, expected a detokenised str")


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], lowercase: bool = False) -> BleuResult:
    """Corpus BLEU of detokenised ``hypotheses`` against one detokenised reference each.

    sacreBLEU defaults: ``13a`` tokenisation, mixed case, exponential smoothing; ``lowercase`` compares
    lower-cased text (the signature then says ``case:lc``), as a model trained on lower-cased data is scored.

    Raises:
        ValueError: different lengths, empty input, or non-string items.
    """
    _check_pairs(hypotheses, references, "corpus_bleu")
    metric = BLEU(lowercase=lowercase)
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return BleuResult(float(result.score), str(metric.get_signature()), str(result))


def corpus_chrf(hypotheses: Sequence[str], references: Sequence[str], lowercase: bool = False) -> ChrfResult:
    """Corpus chrF (sacreBLEU defaults: character 6-grams, β = 2, no word n-grams) on detokenised text;
    ``lowercase`` as for :func:`corpus_bleu`.

    Raises:
        ValueError: different lengths, empty input, or non-string items.
    """
    _check_pairs(hypotheses, references, "corpus_chrf")
    metric = CHRF(lowercase=lowercase)
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return ChrfResult(float(result.score), str(metric.get_signature()), str(result))


def perplexity(total_nll: float, total_tokens: int) -> float:
    """``exp(total_nll / total_tokens)``: perplexity from a summed negative log-likelihood (nats).

    ``total_nll`` is the sum over target tokens of ``−log p`` (natural log), padding excluded;
    returns ``inf`` when the exponent overflows.

    Raises:
        ValueError: ``total_tokens <= 0``, or ``total_nll`` negative or NaN.
    """
    if total_tokens <= 0:
        raise ValueError(f"perplexity: total_tokens must be > 0, got {total_tokens}")
    if math.isnan(total_nll) or total_nll < 0:
        raise ValueError(f"perplexity: total_nll must be a non-negative sum of -log p, got {total_nll}")
    mean = total_nll / total_tokens
    return math.exp(mean) if mean < 709.0 else math.inf  # exp overflows a double just above 709.78


def _as_array(values, what: str) -> np.ndarray:
    if hasattr(values, "detach"):  # torch.Tensor, without importing torch here
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional (one value per example), got shape {array.shape}")
    return array


def accuracy(predictions, labels) -> float:
    """Fraction (0–1) of positions where ``predictions[i] == labels[i]``.

    Args:
        predictions, labels: 1-D sequences, arrays or tensors of the same length ``N`` (class ids).

    Raises:
        ValueError: different lengths or empty input.
    """
    pred, gold = _as_array(predictions, "accuracy: predictions"), _as_array(labels, "accuracy: labels")
    if len(pred) != len(gold):
        raise ValueError(f"accuracy: {len(pred)} predictions but {len(gold)} labels; expected equal lengths")
    if len(pred) == 0:
        raise ValueError("accuracy: no examples (empty predictions and labels)")
    return float(np.mean(pred == gold))


def _ranked_groups(groups: Sequence[Hashable], scores, labels, what: str) -> tuple[list[list[int]], int]:
    """Group candidates by question; return each question's relevance list in rank order, and the skipped count.

    Candidates are sorted by descending score; among tied scores the wrong answers come first (pessimistic).
    """
    score_array, label_array = _as_array(scores, f"{what}: scores"), _as_array(labels, f"{what}: labels")
    groups = groups.tolist() if hasattr(groups, "tolist") else list(groups)  # tensors/arrays → hashable ids
    if not (len(groups) == len(score_array) == len(label_array)):
        raise ValueError(f"{what}: groups, scores and labels must have equal lengths, "
                         f"got {len(groups)}, {len(score_array)}, {len(label_array)}")
    if not groups:
        raise ValueError(f"{what}: no candidates (empty groups, scores and labels)")
    score_array = score_array.astype(np.float64)
    if np.isnan(score_array).any():
        raise ValueError(f"{what}: scores[{int(np.flatnonzero(np.isnan(score_array))[0])}] is NaN")
    bad = [i for i, y in enumerate(label_array.tolist()) if y not in (0, 1)]
    if bad:
        raise ValueError(f"{what}: labels must be 0 or 1, got labels[{bad[0]}] = {label_array[bad[0]]!r}")
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):  # dicts keep first-appearance order of questions
        members.setdefault(g, []).append(i)
    ranked, skipped = [], 0
    for idx in members.values():
        # ties pessimistically: input order would reward WikiQA's file order, where the answer tends to come early
        # (a model scoring every candidate alike would get its dev MAP 0.673 from that order alone)
        order = sorted(idx, key=lambda i: (-score_array[i], label_array[i]))
        relevance = [int(label_array[i]) for i in order]
        if any(relevance):
            ranked.append(relevance)
        else:
            skipped += 1
    if not ranked:
        raise ValueError(f"{what}: none of the {skipped} questions has a positive answer; MAP/MRR are undefined")
    return ranked, skipped


def _average_precision(relevance: list[int]) -> float:
    hits, total = 0, 0.0
    for rank, rel in enumerate(relevance, start=1):
        if rel:
            hits += 1
            total += hits / rank  # precision at the rank of each positive
    return total / hits


def _reciprocal_rank(relevance: list[int]) -> float:
    return 1.0 / (relevance.index(1) + 1)


def ranking_metrics(groups: Sequence[Hashable], scores, labels) -> dict:
    """MAP and MRR of answer ranking, the standard WikiQA / TrecQA evaluation.

    Args:
        groups: length ``N``; the question id of each candidate answer (any hashable; a question's
            candidates need not be contiguous).
        scores: length ``N`` model scores, higher = more relevant.
        labels: length ``N``, 1 for a correct answer, 0 otherwise.

    Each question's candidates are ranked by descending score; **among tied scores the wrong answers
    rank first** (pessimistic, and independent of the input order, which in WikiQA tends to list the
    answer early) — models with continuous scores rarely tie, a collapsed model or low precision
    does. AP = mean over the question's positives of precision at that
    positive's rank; RR = 1 / rank of the first positive. **Questions without any positive answer
    are excluded** from both averages, as in the WikiQA evaluation (Yang et al. 2015) — their AP is
    undefined.

    Returns:
        ``{"map": float, "mrr": float, "questions": counted, "skipped": questions without a positive}``
        (MAP and MRR on a 0–1 scale).

    Raises:
        ValueError: length mismatch, empty input, NaN score, label other than 0/1, or no question
        with a positive answer.
    """
    ranked, skipped = _ranked_groups(groups, scores, labels, "ranking_metrics")
    return {
        "map": float(np.mean([_average_precision(r) for r in ranked])),
        "mrr": float(np.mean([_reciprocal_rank(r) for r in ranked])),
        "questions": len(ranked),
        "skipped": skipped,
    }


def mean_average_precision(groups: Sequence[Hashable], scores, labels) -> float:
    """Mean average precision over questions with a positive answer; see :func:`ranking_metrics`."""
    ranked, _ = _ranked_groups(groups, scores, labels, "mean_average_precision")
    return float(np.mean([_average_precision(r) for r in ranked]))


def mean_reciprocal_rank(groups: Sequence[Hashable], scores, labels) -> float:
    """Mean reciprocal rank over questions with a positive answer; see :func:`ranking_metrics`."""
    ranked, _ = _ranked_groups(groups, scores, labels, "mean_reciprocal_rank")
    return float(np.mean([_reciprocal_rank(r) for r in ranked]))
