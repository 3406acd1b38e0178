"""How good is a compressed sentence encoder? Pure functions over an ``embed`` callable.

Every function takes ``embed(list[str]) -> Tensor (N, D)`` (one row per sentence), so the same
code scores the dense teacher and any student: :func:`sentence_transformer_embedder` wraps a
``SentenceTransformer``; any other encoder needs a one-line lambda.

* :func:`mean_cosine` — agreement of two embedders on the same sentences;
* :func:`wikiqa_ranking` — zero-shot answer selection: each question's candidates ranked by the
  cosine between question and answer embeddings, MAP/MRR by :mod:`hyperplex.metrics`;
* :func:`sst2_probe` — accuracy of a logistic-regression probe (scikit-learn) on frozen embeddings,
  on a carved train/test split of ``train.tsv.gz`` with a fixed split seed (``carve="sentences"``:
  whole sentences only, so no test sentence is seen by the probe as a phrase).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from hyperplex.data.readers import read_jsonl, read_tsv
from hyperplex.metrics import accuracy, ranking_metrics

__all__ = ["Embedder", "sentence_transformer_embedder", "embed_batched", "mean_cosine", "wikiqa_ranking",
           "sst2_probe", "carve_split"]

#: ``embed(sentences) -> (len(sentences), D)`` float tensor.
Embedder = Callable[[list[str]], Tensor]


def sentence_transformer_embedder(model, batch_size: int = 32) -> Embedder:
    """``embed`` for a ``SentenceTransformer`` (its own ``encode``, no normalisation added)."""
    def embed(sentences: list[str]) -> Tensor:
        return model.encode(list(sentences), batch_size=batch_size, convert_to_tensor=True,
                            show_progress_bar=False).detach().cpu().float()
    return embed


def embed_batched(embed: Embedder, sentences: Sequence[str], batch_size: int = 256) -> Tensor:
    """``embed`` applied in chunks of ``batch_size`` sentences; ``(N, D)`` float64 on the CPU.

    Checks that each chunk gives one finite row per sentence (errors name the first bad row).
    """
    sentences = list(sentences)
    if not sentences:
        raise ValueError("no sentences to embed")
    chunks = []
    for start in range(0, len(sentences), batch_size):
        part = sentences[start:start + batch_size]
        out = torch.as_tensor(embed(part)).detach().cpu().double()
        if out.ndim != 2 or out.shape[0] != len(part):
            raise ValueError(f"embed returned shape {tuple(out.shape)} for {len(part)} sentences; expected (N, D)")
        bad = (~torch.isfinite(out)).any(dim=1).nonzero()
        if len(bad):
            raise ValueError(f"embed returned a non-finite row for sentence {start + int(bad[0])}: "
                             f"{part[int(bad[0])]!r}")
        chunks.append(out)
    return torch.cat(chunks)


def mean_cosine(embed_a: Embedder, embed_b: Embedder, sentences: Sequence[str], batch_size: int = 256) -> float:
    """Mean over ``sentences`` of ``cos(embed_a(s), embed_b(s))``, in ``[-1, 1]`` (1: same directions).

    Both embedders must give the same dimension (a student and its teacher do).
    """
    a, b = embed_batched(embed_a, sentences, batch_size), embed_batched(embed_b, sentences, batch_size)
    if a.shape != b.shape:
        raise ValueError(f"the embedders disagree on shape: {tuple(a.shape)} vs {tuple(b.shape)}")
    return float(F.cosine_similarity(a, b, dim=1, eps=1e-12).mean())


def wikiqa_ranking(embed: Embedder, path: str | os.PathLike, batch_size: int = 256,
                   limit_questions: int | None = None) -> dict:
    """Zero-shot WikiQA answer selection by embedding cosine.

    Args:
        embed: the sentence embedder.
        path: a WikiQA JSON-lines file (``dev.jsonl.gz``): one record per candidate,
            ``{"qid", "question", "answer", "label": 0|1}``.
        limit_questions: keep only the first this many questions (in file order); ``None`` for all.

    Every distinct question and answer string is embedded once; a candidate's score is
    ``cos(question, answer)``. Questions without a correct candidate are excluded (standard).

    Returns:
        ``{"map", "mrr", "questions", "skipped", "candidates"}`` (see
        :func:`hyperplex.metrics.ranking_metrics`).
    """
    records = read_jsonl(path, ("qid", "question", "answer", "label"), known={"label": {0, 1}})
    if limit_questions is not None:
        keep = set(list(dict.fromkeys(r["qid"] for r in records))[:limit_questions])
        records = [r for r in records if r["qid"] in keep]
    texts = list(dict.fromkeys([r["question"] for r in records] + [r["answer"] for r in records]))
    index = {t: i for i, t in enumerate(texts)}
    vectors = F.normalize(embed_batched(embed, texts, batch_size), dim=1, eps=1e-12)
    q = vectors[[index[r["question"]] for r in records]]
    a = vectors[[index[r["answer"]] for r in records]]
    scores = (q * a).sum(dim=1).numpy()
    result = ranking_metrics([r["qid"] for r in records], scores, [r["label"] for r in records])
    result["candidates"] = len(records)
    return result


def carve_split(count: int, train_size: int, test_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint index sets ``(train, test)`` drawn from ``range(count)`` by a seeded permutation.

    The same ``(count, seed)`` always gives the same permutation, so a larger ``train_size``
    extends the smaller one's training set and the test set depends only on ``train_size + test_size``.
    """
    if train_size < 1 or test_size < 1:
        raise ValueError(f"train_size and test_size must be positive, got {train_size} and {test_size}")
    if train_size + test_size > count:
        raise ValueError(f"train_size + test_size = {train_size + test_size} exceeds the {count} examples")
    order = np.random.default_rng(seed).permutation(count)
    return order[:train_size], order[train_size:train_size + test_size]


@functools.lru_cache(maxsize=4)
def _sentence_rows(path: str, mtime_ns: int) -> tuple[int, ...]:
    """Indices of the rows of an SST-2 file whose text is a whole sentence: inside no other text of the
    file (token boundaries, :func:`hyperplex.data.phrases.contained_texts`), first occurrence only.
    Cached per file version (≈ 7 s for SST-2's 67K rows)."""
    from hyperplex.data.phrases import contained_texts

    keys = [tuple(row["sentence"].split()) for row in read_tsv(path, ("sentence", "label"))]
    inside = contained_texts(set(keys) - {()})
    first: dict[tuple[str, ...], int] = {}
    for i, key in enumerate(keys):
        if key and key not in inside and key not in first:
            first[key] = i
    return tuple(first.values())


def sst2_probe(embed: Embedder, path: str | os.PathLike, train_size: int = 2000, test_size: int = 1000,
               split_seed: int = 0, C: float = 1.0, batch_size: int = 256, carve: str = "random") -> dict:
    """Accuracy of a logistic-regression probe on frozen sentence embeddings (SST-2).

    Args:
        embed: the sentence embedder (frozen: only the probe is fitted).
        path: SST-2 ``train.tsv.gz`` (tab-separated, header ``sentence<TAB>label``, labels 0/1).
        train_size, test_size: examples carved from the file by :func:`carve_split` with ``split_seed``;
            the test rows are never seen by the probe.
        C: inverse L2 strength of scikit-learn's ``LogisticRegression`` (lbfgs, max 2000 iterations).
        carve: ``random`` draws from every row. GLUE's SST-2 train file holds every phrase of each
            sentence as its own row, so a random test row is often a phrase of a training row, or the
            other way round. ``sentences`` draws both sets from the whole sentences only (rows whose text
            is inside no other row's text, compared on token boundaries, first occurrence of each): no
            test sentence occurs in any probe training text, and every example is a full sentence.

    Embeddings are standardised with the training rows' mean and std before the fit, so the probe
    is not at the mercy of the encoder's scale.

    Returns:
        ``{"accuracy", "train", "test", "split_seed", "carve", "pool"}`` (accuracy on a 0–1 scale;
        ``pool``: the rows drawn from).
    """
    from sklearn.linear_model import LogisticRegression

    if carve not in ("random", "sentences"):
        raise ValueError(f"carve must be 'random' or 'sentences', got {carve!r}")
    rows = read_tsv(path, ("sentence", "label"), known={"label": {"0", "1"}})
    pool = np.arange(len(rows)) if carve == "random" else \
        np.array(_sentence_rows(os.fspath(path), os.stat(path).st_mtime_ns))
    train_idx, test_idx = carve_split(len(pool), train_size, test_size, split_seed)
    chosen = pool[np.concatenate([train_idx, test_idx])]
    sentences = [rows[i]["sentence"] for i in chosen]
    labels = np.array([int(rows[i]["label"]) for i in chosen])
    features = embed_batched(embed, sentences, batch_size).numpy()
    x_train, x_test = features[:train_size], features[train_size:]
    mean, std = x_train.mean(axis=0), x_train.std(axis=0) + 1e-8
    probe = LogisticRegression(C=C, max_iter=2000)
    probe.fit((x_train - mean) / std, labels[:train_size])
    predictions = probe.predict((x_test - mean) / std)
    return {"accuracy": accuracy(predictions, labels[train_size:]), "train": train_size, "test": test_size,
            "split_seed": split_seed, "carve": carve, "pool": len(pool)}
