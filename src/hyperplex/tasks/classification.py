"""Classification tasks: one text → label (:class:`ClassificationTask`: sentiment, agreement), two texts →
label (:class:`PairClassificationTask`: NLI), and question/answer ranking (:class:`RankingTask`: WikiQA,
scored per question with MAP/MRR). :class:`LabelledTextTask` holds what the three share.

Tokenisation: a tokenizer and vocabulary built from the training split (``data.tokenizer``) and saved in
the model folder (:class:`SavedVocabulary`), unless the architecture's model class brings its own — the
:class:`~hyperplex.train.protocols.OwnTokenizer` hook, e.g.
:meth:`hyperplex.models.pretrained_classifier.PretrainedClassifier.text_tokenizer` (:class:`ModelTokenizer`).
The text is then passed to that tokenizer as written (``data.lowercase``, ``data.tokenizer``,
``data.vocab_size`` and ``data.truncate`` do not apply), and nothing is saved: loading rebuilds it from the
model config. For the pair tasks such a tokenizer must also join pairs
(:class:`~hyperplex.train.protocols.PairTextTokenizer`): each pair is joined into one sequence as the encoder
expects (a cross-encoder; :class:`~hyperplex.data.datasets.JointPairDataset`) and the model is called as
``model(tokens, lengths[, token_types])`` instead of with the two texts apart.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyperplex.config.core import ConfigError
from hyperplex.config.experiment import DataConfig
from hyperplex.config.registry import get_architecture
from hyperplex.data.datasets import ClassificationDataset, JointPairDataset, PairDataset
from hyperplex.data.phrases import carve_sentences
from hyperplex.data.readers import DataError, DropReport, check_labels, read_agreement, read_jsonl, read_tsv
from hyperplex.data.tokenizers import Tokenizer
from hyperplex.data.vocab import PAD_INDEX, Vocabulary
from hyperplex.metrics import accuracy, ranking_metrics
from hyperplex.tasks.common import (
    carve_groups,
    carve_random,
    carve_seed,
    data_file,
    load_saved_vocabularies,
    lowercase_if,
    subset,
    tokenizer_and_vocab,
    vocabulary_files,
)
from hyperplex.train.protocols import Describes, OwnTokenizer, PairTextTokenizer, PretrainedEmbeddings, TextTokenizer
from hyperplex.train.task import Task


# ---------------------------------------------------------------------------- text → ids
class SavedVocabulary:
    """Text → ids with the tokenizer and vocabulary built from the training split and saved in the model
    folder: lowercased as ``data.lowercase`` says, cut at ``data.truncate`` tokens."""

    pad_index = PAD_INDEX

    def __init__(self, data: DataConfig, tokenizer: Tokenizer, vocab: Vocabulary) -> None:
        self.data, self.tokenizer, self.vocab = data, tokenizer, vocab

    def __len__(self) -> int:
        return len(self.vocab)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        out = []
        for text in texts:
            ids = self.vocab.encode(self.tokenizer.tokenize(lowercase_if(self.data, text)))
            out.append(ids[: self.data.truncate] if self.data.truncate else ids)
        return out

    def record(self) -> dict:
        """What a checkpoint records of the encoding: the files to copy with it."""
        return {"files": {"text": vocabulary_files(self.data, "text")}}


class ModelTokenizer:
    """Text → ids with the model's own tokenizer, the text as written; nothing is saved (loading rebuilds
    the tokenizer from the model config)."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self.pad_index = tokenizer.pad_index

    def __len__(self) -> int:
        return len(self.tokenizer)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer.encode_batch(texts) if texts else []

    def record(self) -> dict:
        return {"tokenizer": "model"}


# ---------------------------------------------------------------------------- the tasks
class LabelledTextTask(Task):
    """What the classification tasks share: records read from tsv/jsonl, a label set, the text encoding,
    datasets, the model built from the registry, accuracy. Subclasses say which texts a record has
    (:meth:`_fields`, :meth:`_texts`, :meth:`_record`) and how they reach the model (:meth:`logits`)."""

    metrics: tuple[str, ...] = ("accuracy", "loss")
    loss_unit = "examples"
    #: Added to the ``tokenizer:`` log line when the model's own tokenizer encodes the text.
    own_tokenizer_note = ""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fresh = False  # a new model folder: pretrained embeddings are loaded into the model it builds
        self.carve_counts: dict | None = None  # what data.carve: sentences held out (checkpoint metadata)
        self.text: SavedVocabulary | ModelTokenizer  # set by prepare / load_vocabularies

    # ------------------------------------------------------------------ reading
    def _fields(self) -> list[str]:
        """The columns every tsv/jsonl row must have."""
        raise NotImplementedError

    def _record(self, row: dict) -> dict:
        """The texts (and question id) of one row: ``{"text"}`` or ``{"a", "b"(, "group")}``."""
        raise NotImplementedError

    def _texts(self, rec: dict) -> list[str]:
        """The texts of a record, in the order the model reads them."""
        raise NotImplementedError

    def _read_agreement(self, file) -> list[dict]:
        """Records of a ``data.format: agreement`` file: single texts, so refused here."""
        raise DataError(f"data.format agreement is single-text; it cannot feed task {self.name!r}")

    def _read_file(self, key: str, path: str) -> list[dict]:
        """Records ``{"text"/"a"/"b", "label", "file", "line", ("group")}`` of one split file."""
        d = self.cfg.data
        file = data_file(path, self.data_root, key=key)
        if d.format == "agreement":
            return self._read_agreement(file)
        if d.format == "tsv":
            rows = read_tsv(file, self._fields())
        elif d.format == "jsonl":
            rows = read_jsonl(file, self._fields())
        else:
            raise DataError(f"data.format {d.format!r} cannot be used for task {self.name!r}; use tsv, jsonl "
                            f"or agreement")
        first_line = 2 if d.format == "tsv" else 1  # after the tsv header
        return [{"label": str(row[d.label_field]), "file": str(file), "line": i + first_line, **self._record(row)}
                for i, row in enumerate(rows)]

    def prepare(self, fresh: bool) -> None:
        d = self.cfg.data
        self.fresh = fresh
        train = self._read_file("data.train", d.train)
        if d.dev:
            dev = self._read_file("data.dev", d.dev)
        elif d.dev_fraction > 0:
            train, dev = self._carve(train, carve_seed(self.cfg, self.model_dir, fresh))
        else:
            raise DataError("no validation data: set data.dev or data.dev_fraction")
        if d.max_train_examples:
            train = subset(train, d.max_train_examples, self.cfg.seed)
            self.log.info(f"using a seeded subset of {len(train)} training examples")
        self.labels = self._labels(train, fresh)
        self._check_labels(train + dev)
        tokenizer = self._model_tokenizer()
        if tokenizer is not None:
            self.text = ModelTokenizer(tokenizer)
            self.log.info(f"tokenizer: {tokenizer.describe()}{self.own_tokenizer_note} (data.tokenizer, lowercase, "
                          f"vocab_size and truncate do not apply)")
        elif fresh:
            lines = [lowercase_if(d, t) for rec in train for t in self._texts(rec)]
            self.text = SavedVocabulary(d, *tokenizer_and_vocab(d, lines, self.model_dir, "text", fresh))
        else:
            self.text = self._saved_vocabulary()
        self.train_set, report = self._dataset(train, "training examples")
        self.log.info(str(report))
        self.dev_set, dev_report = self._dataset(dev, "validation examples")
        if dev_report.dropped:
            self.log.info(str(dev_report))
        self.log.info(f"vocabulary {self.vocab_size}; labels {self.labels}; {len(self.train_set)} training / "
                      f"{len(self.dev_set)} validation examples")

    def _labels(self, train: list[dict], fresh: bool) -> list[str]:
        """The classes in the order of the model's outputs: ``data.labels``, else the checkpoint's record
        (loading), else the sorted labels of the training records."""
        saved = [] if fresh else (self.checkpoint_record or {}).get("labels")
        return list(self.cfg.data.labels) or list(saved or []) or sorted({r["label"] for r in train})

    def _known_labels(self) -> list[str]:
        """The classes known without reading the training data: the checkpoint's record, else ``data.labels``."""
        return list((self.checkpoint_record or {}).get("labels") or self.cfg.data.labels)

    def _model_tokenizer(self) -> TextTokenizer | None:
        """The architecture's own tokenizer (:class:`~hyperplex.train.protocols.OwnTokenizer`), or ``None``."""
        _, model_class = get_architecture(self.cfg.model.architecture, self.name).load()
        return model_class.text_tokenizer(self.cfg.model) if issubclass(model_class, OwnTokenizer) else None

    @property
    def vocab_size(self) -> int:
        return len(self.text)

    def _saved_vocabulary(self) -> SavedVocabulary:
        """The tokenizer and vocabulary saved in the model folder, by the file names the checkpoint records."""
        record = (self.checkpoint_record or {}).get("files")
        loaded = load_saved_vocabularies(self.cfg.data, self.model_dir, ("text",), record)["text"]
        return SavedVocabulary(self.cfg.data, *loaded)

    def load_vocabularies(self) -> None:
        """Load the saved tokeniser, vocabulary and label order only, enough to score a file in the task's
        format (:meth:`use_evaluation_file`) without the training data. The labels are the checkpoint's
        record (the order of the model's outputs), else ``data.labels``; with neither, the training file
        is read for them (:meth:`prepare`)."""
        labels = self._known_labels()
        if not labels:
            self.prepare(fresh=False)
            return
        self.fresh = False
        self.labels = labels
        tokenizer = self._model_tokenizer()  # rebuilt from the model config: no files in the model folder
        self.text = ModelTokenizer(tokenizer) if tokenizer is not None else self._saved_vocabulary()

    def _carve(self, train: list[dict], seed: int) -> tuple[list[dict], list[dict]]:
        """(train, dev) records: ``data.dev_fraction`` of the training file held out with ``seed``
        (``data.split_seed``): whole sentences without their phrases in training for ``data.carve:
        sentences`` (:meth:`_carve_sentences`), whole groups sharing a first text for ``grouped``
        (:meth:`_carve_grouped`), else :meth:`_carve_random`."""
        if self.cfg.data.carve == "sentences":
            return self._carve_sentences(train, seed)
        if self.cfg.data.carve == "grouped":
            return self._carve_grouped(train, seed)
        return self._carve_random(train, seed)

    def _carve_grouped(self, train: list[dict], seed: int) -> tuple[list[dict], list[dict]]:
        """Whole groups of examples with the same first text (case-folded as ``data.lowercase`` says, spaces
        collapsed) held out together: an NLI premise with every hypothesis written for it, every copy of a repeated
        text. With ``random``, SNLI's validation premises are nearly all in training, beside the premise's other
        hypotheses and their labels."""
        d = self.cfg.data
        def key(record: dict) -> str:
            return " ".join(lowercase_if(d, self._texts(record)[0]).split())

        keys = [key(r) for r in train]
        try:
            kept, dev = carve_groups(train, keys, d.dev_fraction, seed)
        except DataError as err:
            raise DataError(f"{d.train}: data.carve grouped: {err} groups") from None
        self.log.info(f"carved {len(dev)} of {len(train)} examples as validation: {len({key(r) for r in dev})} of "
                      f"{len(set(keys))} groups sharing a first text (dev_fraction {d.dev_fraction} of the groups, "
                      f"split_seed {seed})")
        return kept, dev

    def _carve_sentences(self, train: list[dict], seed: int) -> tuple[list[dict], list[dict]]:
        """``data.carve: sentences`` is for single-text phrase files, so refused here."""
        raise DataError(f"data.carve sentences is for single-text phrase files (SST-2), not task {self.name!r}")

    def _carve_random(self, train: list[dict], seed: int) -> tuple[list[dict], list[dict]]:
        """Random examples held out (``data.carve: random``)."""
        return carve_random(train, self.cfg.data.dev_fraction, seed)

    def use_evaluation_file(self, path: str) -> None:
        """Make the file ``path`` (same format as the training data) the split :meth:`validate` scores."""
        records = self._read_file("--split", path)
        self._check_labels(records)
        self.dev_set, report = self._dataset(records, f"examples of {path}")
        if report.dropped:
            self.log.info(str(report))

    def _check_labels(self, records: list[dict]) -> None:
        """A label outside :attr:`labels` is an error naming it, the known set, the file and the line."""
        for rec in records:
            check_labels([rec["label"]], self.labels, rec["file"], [rec["line"]])

    def _dataset(self, records: list[dict], what: str):
        """(dataset, drop report) of ``records``, each text encoded apart; a record with an empty text is dropped."""
        report = DropReport(total=len(records), source=what)
        columns: list[list] = [[] for _ in self._texts(records[0])] if records else [[]]
        kept = []
        per_record = len(columns)
        flat = self.text.encode_batch([t for rec in records for t in self._texts(rec)])
        for r, rec in enumerate(records):
            encoded = flat[r * per_record: (r + 1) * per_record]
            if any(not e for e in encoded):
                report.empty += 1
                continue
            for column, e in zip(columns, encoded):
                column.append(e)
            kept.append(rec)
        labels, groups = self._targets(kept, what, report)
        return self._encoded_dataset(columns, labels, groups), report

    def _encoded_dataset(self, columns: list[list], labels: list, groups: list[int] | None):
        """The dataset of the encoded text ``columns`` (one per text of a record)."""
        raise NotImplementedError

    def _targets(self, kept: list[dict], what: str, report: DropReport) -> tuple[list, list[int] | None]:
        """(:meth:`_labels_and_groups` of the records kept); ``DataError`` when none is left."""
        if not kept:
            raise DataError(f"no {what} left: every example has an empty text ({report})")
        return self._labels_and_groups(kept)

    def _labels_and_groups(self, kept: list[dict]) -> tuple[list, list[int] | None]:
        """(class index of each record, ``None``: no question ids)."""
        return [self.labels.index(rec["label"]) for rec in kept], None

    def train_batches(self, epoch: int) -> list:
        t = self.cfg.training
        return self.train_set.batches(t.batch_size, t.batch_type, shuffle=t.shuffle, seed=self.cfg.seed,
                                      epoch=epoch, bucket=t.bucket)

    # ------------------------------------------------------------------ model
    @property
    def num_outputs(self) -> int:
        return len(self.labels)

    def build_model(self) -> nn.Module:
        _, model_class = get_architecture(self.cfg.model.architecture, self.name).load()
        model = model_class(self.cfg.model, self.vocab_size, self.num_outputs, pad_index=PAD_INDEX)
        if self.cfg.data.embeddings and self.fresh:
            self._load_embeddings(model)
        if isinstance(model, Describes):  # e.g. a pretrained encoder's trainable parameters
            self.log.info(model.describe())
        return model

    def _load_embeddings(self, model: nn.Module) -> None:
        """Initialise the word embeddings from ``data.embeddings`` (GloVe text format)."""
        from hyperplex.data.glove import load_glove

        if not isinstance(model, PretrainedEmbeddings):
            raise ValueError(f"data.embeddings is set but model {self.cfg.model.architecture!r} cannot load "
                             f"pre-trained embeddings")
        path = data_file(self.cfg.data.embeddings, self.data_root, key="data.embeddings")
        dim = getattr(self.cfg.model, "embedding_dim", None)
        if not isinstance(self.text, SavedVocabulary):
            raise ValueError(f"data.embeddings is set but model {self.cfg.model.architecture!r} brings its own "
                             f"tokenizer: GloVe vectors are looked up by the words of a vocabulary built from the data")
        vocab = self.text.vocab
        vectors, mask = load_glove(path, vocab.itos, dim)
        model.load_pretrained_embeddings(vectors, mask)
        self.log.info(f"embeddings: {int(mask.sum())} of {len(vocab)} words initialised from {path}")

    def logits(self, model: nn.Module, batch) -> Tensor:
        return model(batch["tokens"], batch["lengths"])

    def loss(self, model: nn.Module, batch) -> Tensor:
        return F.cross_entropy(self.logits(model, batch).float(), batch["labels"], reduction="sum",
                               label_smoothing=self.cfg.training.label_smoothing)

    @torch.no_grad()
    def predict(self, model: nn.Module, dataset) -> tuple[Tensor, Tensor, Tensor | None]:
        """(scores or logits (N, C), labels (N,), groups (N,) or None) in dataset order."""
        device = next(model.parameters()).device
        n = len(dataset)
        out = torch.zeros(n, self.num_outputs)
        for batch in dataset.batches(self.cfg.testing.batch_size):
            out[torch.tensor(batch.indices)] = self.logits(model, batch.to(device)).float().cpu().reshape(
                len(batch), self.num_outputs)
        return out, dataset.labels, dataset.groups

    @torch.no_grad()
    def validate(self, model: nn.Module) -> dict[str, float]:
        logits, labels, _ = self.predict(model, self.dev_set)
        loss = F.cross_entropy(logits, labels).item()
        return {"accuracy": 100.0 * accuracy(logits.argmax(-1).tolist(), labels.tolist()), "loss": loss}

    def metadata(self) -> dict:
        meta = {"vocab_size": self.vocab_size, "labels": self.labels, **self.text.record()}
        if self.carve_counts:
            meta["carve"] = self.carve_counts
        return meta


class ClassificationTask(LabelledTextTask):
    """One text → label (``data.task: classification``): sentiment (tsv/jsonl, SST-2 phrase files carved by
    sentence), subject–verb agreement (``data.format: agreement``)."""

    name = "classification"

    def _fields(self) -> list[str]:
        return [self.cfg.data.text_field, self.cfg.data.label_field]

    def _record(self, row: dict) -> dict:
        return {"text": str(row[self.cfg.data.text_field])}

    def _texts(self, rec: dict) -> list[str]:
        return [rec["text"]]

    def _read_agreement(self, file) -> list[dict]:
        return [{"text": prefix, "label": label, "file": str(file), "line": i + 1}
                for i, (label, prefix) in enumerate(read_agreement(file))]

    def _carve_sentences(self, train: list[dict], seed: int) -> tuple[list[dict], list[dict]]:
        """Whole sentences held out, and every phrase of a held-out sentence dropped from training."""
        d = self.cfg.data
        try:
            carve = carve_sentences([lowercase_if(d, r["text"]) for r in train], d.dev_fraction, seed)
        except ValueError as err:
            raise DataError(f"{d.train}: {err}") from None
        self.log.info(f"{carve} (dev_fraction {d.dev_fraction} of the sentences, split_seed {seed})")
        self.carve_counts = {"texts": carve.texts, "sentences": carve.sentences, "validation": len(carve.dev),
                             "dropped_from_training": carve.dropped, "training": len(carve.train)}
        return [train[i] for i in carve.train], [train[i] for i in carve.dev]

    def _encoded_dataset(self, columns: list[list], labels: list, groups: list[int] | None):
        return ClassificationDataset(columns[0], labels, pad_index=self.text.pad_index)


class PairClassificationTask(LabelledTextTask):
    """Two texts → label (``data.task: pair_classification``, NLI): the two texts apart for the sentence-pair
    models, or joined into one sequence by a pretrained encoder's own tokenizer (a cross-encoder)."""

    name = "pair_classification"
    own_tokenizer_note = " per pair, both texts joined into one sequence, the longer cut first"

    def _fields(self) -> list[str]:
        d = self.cfg.data
        return [d.a_field, d.b_field, d.label_field]

    def _record(self, row: dict) -> dict:
        return {"a": str(row[self.cfg.data.a_field]), "b": str(row[self.cfg.data.b_field])}

    def _texts(self, rec: dict) -> list[str]:
        return [rec["a"], rec["b"]]

    def _model_tokenizer(self) -> TextTokenizer | None:
        tokenizer = super()._model_tokenizer()
        if tokenizer is not None and not isinstance(tokenizer, PairTextTokenizer):
            raise ConfigError(f"model.architecture {self.cfg.model.architecture!r} brings its own tokenizer, which "
                              f"cannot encode text pairs (no encode_pair_batch) for task {self.name!r}")
        return tokenizer

    @property
    def joint_pairs(self) -> bool:
        """Whether each pair is joined into one sequence by the model's own tokenizer (a cross-encoder)."""
        return isinstance(self.text, ModelTokenizer)

    def _dataset(self, records: list[dict], what: str):
        return self._joint_dataset(records, what) if self.joint_pairs else super()._dataset(records, what)

    def _joint_dataset(self, records: list[dict], what: str):
        """A cross-encoder's pairs: each ``(a, b)`` joined by the model's own tokenizer (its
        ``encode_pair_batch``: separators, token types, cut at the model's ``max_length``, longer text first).
        A pair with an empty (blank) text is dropped, as the two-text models drop it."""
        report = DropReport(total=len(records), source=what)
        kept = [rec for rec in records if rec["a"].strip() and rec["b"].strip()]
        report.empty = len(records) - len(kept)
        labels, groups = self._targets(kept, what, report)
        tokenizer = self.text.tokenizer if isinstance(self.text, ModelTokenizer) else None
        assert isinstance(tokenizer, PairTextTokenizer)  # joint_pairs, and _model_tokenizer refused any other
        ids, token_types = tokenizer.encode_pair_batch([r["a"] for r in kept], [r["b"] for r in kept])
        return JointPairDataset(ids, labels, token_types, groups, pad_index=self.text.pad_index), report

    def _encoded_dataset(self, columns: list[list], labels: list, groups: list[int] | None):
        return PairDataset(columns[0], columns[1], labels, groups, pad_index=self.text.pad_index)

    def logits(self, model: nn.Module, batch) -> Tensor:
        if not self.joint_pairs:
            return model(batch["a"], batch["a_lengths"], batch["b"], batch["b_lengths"])
        if "token_types" in batch.tensors:  # a pair joined into one sequence, with its segment ids
            return model(batch["tokens"], batch["lengths"], batch["token_types"])
        return model(batch["tokens"], batch["lengths"])


class RankingTask(PairClassificationTask):
    """Question/answer pairs with a 0/1 relevance label and a question id (``data.task: ranking``, WikiQA):
    the model scores each pair (one output, binary cross-entropy); validation ranks the answers of each
    question by score (MAP, MRR)."""

    name = "ranking"
    metrics = ("map", "mrr", "loss")
    #: The relevance labels, in the order of the model's one output.
    RELEVANCE = ("0", "1")

    def _fields(self) -> list[str]:
        return super()._fields() + [self.cfg.data.group_field]

    def _record(self, row: dict) -> dict:
        return {**super()._record(row), "group": str(row[self.cfg.data.group_field])}

    def _labels(self, train: list[dict], fresh: bool) -> list[str]:
        return list(self.RELEVANCE)

    def _known_labels(self) -> list[str]:
        return list(self.RELEVANCE)

    def _carve_grouped(self, train: list[dict], seed: int) -> tuple[list[dict], list[dict]]:
        """A ranking is always carved by question (:meth:`_carve_random`)."""
        return self._carve_random(train, seed)

    def _carve_random(self, train: list[dict], seed: int) -> tuple[list[dict], list[dict]]:
        """Whole questions held out, never half a ranking."""
        return carve_groups(train, [r["group"] for r in train], self.cfg.data.dev_fraction, seed)

    def _labels_and_groups(self, kept: list[dict]) -> tuple[list, list[int] | None]:
        """(relevance score of each record, its integer question id)."""
        group_ids: dict[str, int] = {}
        groups = [group_ids.setdefault(rec["group"], len(group_ids)) for rec in kept]
        return [float(rec["label"]) for rec in kept], groups

    @property
    def num_outputs(self) -> int:
        return 1

    def loss(self, model: nn.Module, batch) -> Tensor:  # binary cross-entropy on the relevance label
        logits = self.logits(model, batch).float()
        return F.binary_cross_entropy_with_logits(logits.reshape(-1), batch["labels"].float(), reduction="sum")

    @torch.no_grad()
    def validate(self, model: nn.Module) -> dict[str, float]:
        logits, labels, groups = self.predict(model, self.dev_set)
        if groups is None:
            raise ValueError(f"task {self.name!r}: the dev set has no query groups to rank within")
        scores = logits.reshape(-1)
        loss = F.binary_cross_entropy_with_logits(scores, labels.float()).item()
        result = ranking_metrics(groups.tolist(), scores.tolist(), labels.long().tolist())
        return {"map": 100.0 * result["map"], "mrr": 100.0 * result["mrr"], "loss": loss}
