"""How good is a compressed sentence encoder? Pure functions over an ``embed`` callable.

Every function takes ``embed(list[str]) -> Tensor (N, D)`` (one row per sentence), so the same
code scores the dense teacher and any student: :func:`sentence_transformer_embedder` wraps a
``SentenceTransformer``; any other encoder needs a one-line lambda.

* :func:`mean_cosine` — agreement of two embedders on the same sentences;
* :func:`wikiqa_ranking` — zero-shot answer selection: each question's candidates ranked by the
  cosine between question and answer embeddings, MAP/MRR by :mod:`hyperplex.metrics`;
* :func:`sst2_probe` — accuracy of a logistic-regression probe (scikit-learn) on frozen embeddings,
  on a carved train/test split of ``train.tsv.gz`` with a fixed split seed (``carve="sentences"``:
  whole sentences only, so no test sentence is seen by the probe as a phrase);
* :func:`score_embedder` — those three for one embedder, against the teacher's rows of the agreement
  sentences (:func:`teacher_agreement`, embedded once per process);
* :func:`encoder_size` — the size columns: converted layers, parameters of the selected layers, bytes
  written and held.

``hyperplex score-encoder`` (:mod:`hyperplex.scoring`) and the ``quality:`` key of experiment plans
(:mod:`hyperplex.scoring.plan_metrics`) both score through :func:`teacher_agreement`, :func:`score_embedder`
and :func:`encoder_size`.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from hyperplex.data.readers import read_jsonl, read_tsv
from hyperplex.metrics import accuracy, ranking_metrics

__all__ = [
    "BATCH_SIZE",
    "Embedder",
    "carve_train_test",
    "embed_batched",
    "encoder_size",
    "layer_parameters",
    "saved_quantized_file_bytes",
    "weight_file_bytes",
    "lookup_embedder",
    "mean_cosine",
    "read_sentences",
    "saved_file_bytes",
    "score_embedder",
    "sentence_transformer_embedder",
    "sst2_pool",
    "sst2_probe",
    "teacher_agreement",
    "wikiqa_ranking",
]

#: Sentences embedded per call when an encoder is scored.
BATCH_SIZE = 64

#: ``embed(sentences) -> (len(sentences), D)`` float tensor.
Embedder = Callable[[list[str]], Tensor]


def sentence_transformer_embedder(model, batch_size: int = 32) -> Embedder:
    """``embed`` for a ``SentenceTransformer`` (its own ``encode``, no normalisation added); an int8 model encodes one
    sentence per forward (:func:`~hyperplex.int8.layers.has_int8_layers`: with batches, its scores would depend on
    which sentences share a batch)."""
    from hyperplex.int8.layers import has_int8_layers

    if has_int8_layers(model):
        batch_size = 1

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


def carve_train_test(count: int, train_size: int, test_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
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


def sst2_pool(path: str | os.PathLike, carve: str = "random", count: int | None = None) -> np.ndarray:
    """Row indices of an SST-2 file that :func:`sst2_probe` draws from with ``carve`` (``random``: every
    row; ``sentences``: the whole sentences). ``count``: the file's rows when already known. Its length
    bounds ``train_size + test_size``, so a caller can check the sizes before embedding anything."""
    if carve not in ("random", "sentences"):
        raise ValueError(f"carve must be 'random' or 'sentences', got {carve!r}")
    if carve == "random":
        return np.arange(len(read_tsv(path, ("sentence", "label"))) if count is None else count)
    return np.array(_sentence_rows(os.fspath(path), os.stat(path).st_mtime_ns))


def sst2_probe(embed: Embedder, path: str | os.PathLike, train_size: int = 2000, test_size: int = 1000,
               split_seed: int = 0, C: float = 1.0, batch_size: int = 256, carve: str = "random") -> dict:
    """Accuracy of a logistic-regression probe on frozen sentence embeddings (SST-2).

    Args:
        embed: the sentence embedder (frozen: only the probe is fitted).
        path: SST-2 ``train.tsv.gz`` (tab-separated, header ``sentence<TAB>label``, labels 0/1).
        train_size, test_size: examples carved from the file by :func:`carve_train_test` with ``split_seed``;
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

    rows = read_tsv(path, ("sentence", "label"), known={"label": {"0", "1"}})
    pool = sst2_pool(path, carve, len(rows))
    train_idx, test_idx = carve_train_test(len(pool), train_size, test_size, split_seed)
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


def read_sentences(path: str | os.PathLike, limit: int = 0) -> list[str]:
    """Distinct non-blank lines of a text file (``.gz`` too), stripped, in file order; the first ``limit``
    of them (0 = all). The agreement sentences of :func:`score_embedder`."""
    from hyperplex.data.readers import read_lines

    lines = list(dict.fromkeys(line.strip() for line in read_lines(path) if line.strip()))
    return lines[:limit] if limit else lines


_TEACHER_ROWS: dict[tuple, Tensor] = {}  # (teacher, file, its mtime, limit) → (N, D) teacher embeddings


def teacher_agreement(teacher, name: str, path: str | os.PathLike, limit: int = 0,
                      batch_size: int = BATCH_SIZE) -> tuple[list[str], Tensor]:
    """``(sentences, rows)`` for :func:`score_embedder`'s ``agreement``: the distinct lines of ``path``
    (:func:`read_sentences`, the first ``limit``) and the ``(N, D)`` embeddings the ``teacher``
    SentenceTransformer gives them. ``name`` identifies the teacher (its ``model.path``): the rows are
    embedded once per process for each teacher, file version and limit, and reused for every student."""
    sentences = read_sentences(path, limit)
    key = (name, os.fspath(path), os.stat(path).st_mtime_ns, limit)
    if key not in _TEACHER_ROWS:
        with torch.no_grad():
            _TEACHER_ROWS[key] = embed_batched(sentence_transformer_embedder(teacher, batch_size), sentences,
                                               batch_size)
    return sentences, _TEACHER_ROWS[key]


def lookup_embedder(sentences: Sequence[str], rows: Tensor) -> Embedder:
    """An ``embed`` that returns precomputed ``rows`` ``(N, D)`` for the ``N`` ``sentences`` (a teacher
    embedded once and compared with many students); a sentence not among them is a ``KeyError``."""
    index = {s: i for i, s in enumerate(sentences)}
    if len(index) != len(rows):
        raise ValueError(f"lookup_embedder: {len(index)} distinct sentences but {len(rows)} rows")
    return lambda batch: rows[[index[s] for s in batch]]


def score_embedder(embed: Embedder, agreement: tuple[Sequence[str], Tensor] | None = None,
                   wikiqa: dict | None = None, sst2: dict | None = None, batch_size: int = 64,
                   progress: Callable[[str], None] | None = None) -> tuple[dict[str, float], dict[str, dict]]:
    """The quality metrics of one sentence encoder, each computed only when its argument is given.

    Args:
        embed: the encoder under test.
        agreement: ``(sentences, teacher_rows)``: the sentences and the teacher's ``(N, D)`` embeddings of
            them (e.g. :func:`embed_batched`); gives ``agreement`` = :func:`mean_cosine` of the two.
        wikiqa: keyword arguments of :func:`wikiqa_ranking` (``path``, optional ``limit_questions``);
            gives ``wikiqa_map`` and ``wikiqa_mrr``.
        sst2: keyword arguments of :func:`sst2_probe` (``path``, ``train_size``, ``test_size``,
            ``split_seed``, ``C``, ``carve``); gives ``sst2_probe`` (accuracy, 0–1).
        batch_size: sentences per ``embed`` call.
        progress: called with ``agreement`` / ``wikiqa`` / ``sst2_probe`` before each metric.

    Returns:
        ``({metric: value}, {kind: counts})``: the counts are the sentences, the WikiQA questions,
        skipped questions and candidates, and the probe's sizes, split seed, carve and pool.
    """
    metrics: dict[str, float] = {}
    details: dict[str, dict] = {}
    with torch.no_grad():
        if agreement is not None:
            progress and progress("agreement")
            sentences, rows = agreement
            metrics["agreement"] = mean_cosine(embed, lookup_embedder(sentences, rows), sentences, batch_size)
            details["agreement"] = {"sentences": len(sentences)}
        if wikiqa is not None:
            progress and progress("wikiqa")
            result = wikiqa_ranking(embed, batch_size=batch_size, **wikiqa)
            metrics["wikiqa_map"], metrics["wikiqa_mrr"] = float(result["map"]), float(result["mrr"])
            details["wikiqa"] = {k: result[k] for k in ("questions", "skipped", "candidates")}
        if sst2 is not None:
            progress and progress("sst2_probe")
            result = sst2_probe(embed, batch_size=batch_size, **sst2)
            metrics["sst2_probe"] = float(result["accuracy"])
            details["sst2_probe"] = {k: v for k, v in result.items() if k != "accuracy"}
    return metrics, details


def saved_file_bytes(model) -> int:
    """Bytes of the ``model.safetensors`` that :func:`hyperplex.convert.save_converted` writes for ``model``
    (written to a scratch folder and removed): the same writer for a teacher and its students."""
    from hyperplex.convert.serialize import WEIGHTS_NAME, save_converted

    with tempfile.TemporaryDirectory(prefix="hyperplex-size-") as folder:
        save_converted(model, folder)
        return os.path.getsize(os.path.join(folder, WEIGHTS_NAME))


def weight_file_bytes(model) -> int:
    """Bytes of the weight files ``model`` is written to: :func:`saved_quantized_file_bytes` for an int8 model,
    else :func:`saved_file_bytes`."""
    from hyperplex.int8 import is_quantized

    return saved_quantized_file_bytes(model) if is_quantized(model) else saved_file_bytes(model)


def saved_quantized_file_bytes(model) -> int:
    """Bytes of the weight files (``*.safetensors``) that :func:`hyperplex.int8.save_quantized`
    writes for an int8 ``model`` (written to a scratch folder and removed)."""
    from pathlib import Path

    from hyperplex.int8 import save_quantized

    with tempfile.TemporaryDirectory(prefix="hyperplex-size-") as folder:
        save_quantized(model, os.path.join(folder, "model"))
        return sum(path.stat().st_size for path in Path(folder).rglob("*.safetensors"))


def layer_parameters(model: torch.nn.Module, names: Sequence[str]) -> int:
    """Parameters (bias included) of the modules of ``model`` with these dotted ``names``, each counted
    once; an int8 layer (:func:`hyperplex.int8`) counts the weights it holds. ``KeyError``
    naming a module that does not exist."""
    from hyperplex.int8 import factorised_layers, is_quantized

    modules = dict(model.named_modules())
    int8 = {entry["name"]: entry["params"] for entry in factorised_layers(model)} if is_quantized(model) else {}
    seen: set[int] = set()
    total = 0
    for name in names:
        if name not in modules:
            raise KeyError(f"{type(model).__name__} has no module {name!r}")
        if name in int8:
            total += int8[name]
            continue
        params = list(modules[name].parameters())
        if not params and hasattr(modules[name], "in_features"):  # an int8 dense layer: its packed weight + bias
            layer = modules[name]
            total += layer.in_features * layer.out_features + layer.out_features * (layer.bias() is not None)
        for p in params:
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
    return total


def total_parameters(model: torch.nn.Module) -> int:
    """Parameters of the whole model, each counted once; an int8 layer (:func:`hyperplex.quantize`)
    counts the weights it holds (its packed int8 weights are no ``Parameter``), so an int8 model has the count
    of the float model it was quantised from."""
    from hyperplex.int8.layers import quantized_layers
    from hyperplex.int8.transform import is_quantized

    if not is_quantized(model):
        return sum(p.numel() for p in model.parameters())
    layers = list(quantized_layers(model))
    outside = sum(p.numel() for name, p in model.named_parameters()
                  if not any(name.startswith(f"{layer}.") for layer in layers))
    return outside + layer_parameters(model, layers)


def encoder_size(model: torch.nn.Module, selected: Sequence[str] | None = None) -> dict:
    """The size columns of a sentence encoder (a SentenceTransformer, converted or not, float or int8):

    * ``converted_layers``: its PHM and low-rank layers;
    * ``selected_layers``, ``selected_params``: the layers a conversion selects and their parameters, bias
      included (:func:`layer_parameters`): ``selected`` (dotted names; for the dense teacher, the layers its
      students converted), else the converted layers themselves;
    * ``selected_params_dense``: the same layers as dense ``nn.Linear`` (``in · out + bias``);
    * ``file_bytes``: the weight files it is written to (:func:`weight_file_bytes`);
    * ``held_bytes``: parameters, buffers and packed int8 weights in memory
      (:func:`hyperplex.int8.model_bytes`); and ``quantized: "int8"`` for an int8 model.
    """
    from hyperplex.convert.linears import conversion_spec
    from hyperplex.int8 import factorised_layers, is_quantized, model_bytes

    quantized = is_quantized(model)
    spec = factorised_layers(model) if quantized else conversion_spec(model)
    names = list(selected) if selected is not None else [entry["name"] for entry in spec]
    converted = {entry["name"]: entry for entry in spec}
    dense = layer_parameters(model, [name for name in names if name not in converted])  # dense already
    for name in (name for name in names if name in converted):
        layer = converted[name]
        dense += layer["in_features"] * layer["out_features"] + layer["out_features"] * bool(layer["bias"])
    size = {"converted_layers": len(spec), "selected_layers": len(names),
            "selected_params": layer_parameters(model, names), "selected_params_dense": dense,
            "file_bytes": weight_file_bytes(model), "held_bytes": model_bytes(model)}
    return size | ({"quantized": "int8"} if quantized else {})

