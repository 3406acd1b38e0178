"""Classification tasks: one text → label (sentiment, agreement), two texts → label (NLI), and
question/answer ranking (WikiQA, scored per question with MAP/MRR).

Tokenisation: a tokenizer and vocabulary built from the training split (``data.tokenizer``) and saved
in the model folder, unless the architecture's model class brings its own — a pretrained encoder's,
:meth:`hyperplex.models.pretrained_classifier.PretrainedClassifier.text_tokenizer`. That hook is a classmethod
``text_tokenizer(model_config)`` returning an object with ``encode_batch(texts) → list of id lists``
(special tokens added, cut at the model's ``max_length``), ``pad_index``, ``len()`` (vocabulary size) and
``describe()``; the text is then passed to it as written (``data.lowercase``, ``data.tokenizer``,
``data.vocab_size`` and ``data.truncate`` do not apply), and nothing is saved: loading rebuilds it from
the model config. For the pair tasks such a tokenizer must also have ``encode_pair_batch(firsts, seconds) →
(id lists, token-type lists or None)``: each pair is joined into one sequence as the encoder expects (a
cross-encoder; :class:`~hyperplex.data.datasets.JointPairDataset`) and the model is called as
``model(tokens, lengths[, token_types])`` instead of with the two texts apart.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyperplex.data.datasets import ClassificationDataset, JointPairDataset, PairDataset
from hyperplex.data.phrases import sentence_carve
from hyperplex.data.readers import DataError, DropReport, check_labels, read_agreement, read_jsonl, read_tsv
from hyperplex.data.vocab import PAD_INDEX
from hyperplex.config.core import ConfigError
from hyperplex.config.registry import get_architecture
from hyperplex.train.task import Task
from hyperplex.tasks.common import (
    carve_seed, data_file, load_saved_vocabularies, lowercase_if, split_off, subset, tokenizer_and_vocab,
    vocabulary_files,
)
from hyperplex.metrics import accuracy, ranking_metrics


class ClassificationTask(Task):
    """Single-text and text-pair classification, and ranking (``data.task: ranking``)."""

    #: The task metadata of the checkpoint being loaded (set by the runner before ``prepare(fresh=False)``
    #: or :meth:`load_vocabularies`): its ``"files"`` name the vocabulary files, its ``"labels"`` the classes.
    checkpoint_record: dict | None = None
    loss_unit = "examples"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.name = self.cfg.data.task
        self.pair = self.name in ("pair_classification", "ranking")
        self.ranking = self.name == "ranking"
        self.metrics = ("map", "mrr", "loss") if self.ranking else ("accuracy", "loss")

    # ------------------------------------------------------------------ reading
    def _fields(self) -> list[str]:
        d = self.cfg.data
        fields = [d.a_field, d.b_field] if self.pair else [d.text_field]
        fields.append(d.label_field)
        if self.ranking:
            fields.append(d.group_field)
        return fields

    def _read_file(self, key: str, path: str) -> list[dict]:
        """Records ``{"text"/"a"/"b", "label", "line", ("group")}`` of one split file."""
        d = self.cfg.data
        file = data_file(path, self.data_root, key=key)
        if d.format == "agreement":
            if self.pair:
                raise DataError(f"data.format agreement is single-text; it cannot feed task {self.name!r}")
            return [{"text": prefix, "label": label, "file": str(file), "line": i + 1}
                    for i, (label, prefix) in enumerate(read_agreement(file))]
        if d.format == "tsv":
            rows = read_tsv(file, self._fields())
        elif d.format == "jsonl":
            rows = read_jsonl(file, self._fields())
        else:
            raise DataError(f"data.format {d.format!r} cannot be used for task {self.name!r}; use tsv, jsonl "
                            f"or agreement")
        out = []
        for i, row in enumerate(rows):
            rec = {"label": str(row[d.label_field]), "file": str(file), "line": i + 2 if d.format == "tsv" else i + 1}
            if self.pair:
                rec["a"], rec["b"] = str(row[d.a_field]), str(row[d.b_field])
            else:
                rec["text"] = str(row[d.text_field])
            if self.ranking:
                rec["group"] = str(row[d.group_field])
            out.append(rec)
        return out

    def _texts(self, rec: dict) -> list[str]:
        return [rec["a"], rec["b"]] if self.pair else [rec["text"]]

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
        if self.ranking:
            self.labels = ["0", "1"]
        else:
            saved = [] if fresh else (self.checkpoint_record or {}).get("labels")  # the model's output order
            self.labels = list(d.labels) or list(saved or []) or sorted({r["label"] for r in train})
        self._check_labels(train + dev)
        self.own_tokenizer = self._model_tokenizer()
        if self.own_tokenizer is not None:
            self.tok, self.vocab = self.own_tokenizer, None
            joined = " per pair, both texts joined into one sequence, the longer cut first" if self.joint_pairs else ""
            self.log.info(f"tokenizer: {self.own_tokenizer.describe()}{joined} (data.tokenizer, lowercase, vocab_size "
                          f"and truncate do not apply)")
        elif fresh:
            lines = [lowercase_if(d, t) for rec in train for t in self._texts(rec)]
            self.tok, self.vocab = tokenizer_and_vocab(d, lines, self.model_dir, "text", fresh)
        else:
            self._load_vocabulary()
        self.train_set, report = self._dataset(train, "training examples")
        self.log.info(str(report))
        self.dev_set, dev_report = self._dataset(dev, "validation examples")
        if dev_report.dropped:
            self.log.info(str(dev_report))
        self.log.info(f"vocabulary {self.vocab_size}; labels {self.labels}; {len(self.train_set)} training / "
                      f"{len(self.dev_set)} validation examples")

    def _model_tokenizer(self):
        """The architecture's own tokenizer (its model class's ``text_tokenizer`` hook), or ``None``."""
        _, model_class = get_architecture(self.cfg.model.architecture, self.name).load()
        hook = getattr(model_class, "text_tokenizer", None)
        tokenizer = hook(self.cfg.model) if callable(hook) else None
        if self.pair and tokenizer is not None and not callable(getattr(tokenizer, "encode_pair_batch", None)):
            raise ConfigError(f"model.architecture {self.cfg.model.architecture!r} brings its own tokenizer, which "
                              f"cannot encode text pairs (no encode_pair_batch) for task {self.name!r}")
        return tokenizer

    @property
    def joint_pairs(self) -> bool:
        """Whether each pair is joined into one sequence by the model's own tokenizer (a cross-encoder)."""
        return self.pair and getattr(self, "own_tokenizer", None) is not None

    @property
    def vocab_size(self) -> int:
        return len(self.own_tokenizer) if getattr(self, "own_tokenizer", None) is not None else len(self.vocab)

    def _load_vocabulary(self) -> None:
        self.own_tokenizer = self._model_tokenizer()
        if self.own_tokenizer is not None:  # rebuilt from the model config: no files in the model folder
            self.tok, self.vocab = self.own_tokenizer, None
            return
        record = (self.checkpoint_record or {}).get("files")
        self.tok, self.vocab = load_saved_vocabularies(self.cfg.data, self.model_dir, ("text",), record)["text"]

    def load_vocabularies(self) -> None:
        """Load the saved tokeniser, vocabulary and label order only, enough to score a file in the task's
        format (:meth:`use_evaluation_file`) without the training data. The labels are the checkpoint's
        record (the order of the model's outputs), else ``data.labels``; with neither, the training file
        is read for them (:meth:`prepare`)."""
        labels = ["0", "1"] if self.ranking else \
            list((self.checkpoint_record or {}).get("labels") or self.cfg.data.labels)
        if not labels:
            self.prepare(fresh=False)
            return
        self.fresh = False
        self.labels = labels
        self._load_vocabulary()

    def _carve(self, train: list[dict], seed: int) -> tuple[list[dict], list[dict]]:
        """(train, dev) records: ``data.dev_fraction`` of the training file held out with ``seed``
        (``data.split_seed``): whole questions for ranking, whole sentences without their phrases
        in training for ``data.carve: sentences``, random examples otherwise."""
        d = self.cfg.data
        if d.carve == "sentences":
            if self.pair:
                raise DataError(f"data.carve sentences is for single-text phrase files (SST-2), not task {self.name!r}")
            try:
                carve = sentence_carve([lowercase_if(d, r["text"]) for r in train], d.dev_fraction, seed)
            except ValueError as err:
                raise DataError(f"{d.train}: {err}") from None
            self.log.info(f"{carve} (dev_fraction {d.dev_fraction} of the sentences, split_seed {seed})")
            self.carve_counts = {"texts": carve.texts, "sentences": carve.sentences, "validation": len(carve.dev),
                                 "dropped_from_training": carve.dropped, "training": len(carve.train)}
            return [train[i] for i in carve.train], [train[i] for i in carve.dev]
        if self.ranking:  # hold out whole questions, never half a ranking
            groups = sorted({r["group"] for r in train})
            _, dev_groups = split_off(groups, d.dev_fraction, seed)
            held = set(dev_groups)
            return [r for r in train if r["group"] not in held], [r for r in train if r["group"] in held]
        return split_off(train, d.dev_fraction, seed)

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

    def encode(self, text: str) -> list[int]:
        if getattr(self, "own_tokenizer", None) is not None:
            return self.own_tokenizer.encode_batch([text])[0]
        ids = self.vocab.encode(self.tok.tokenize(lowercase_if(self.cfg.data, text)))
        return ids[: self.cfg.data.truncate] if self.cfg.data.truncate else ids

    def _encode_all(self, texts: list[str]) -> list[list[int]]:
        """:meth:`encode` of every text (in one call of a model's own tokenizer, which is much faster)."""
        if getattr(self, "own_tokenizer", None) is not None:
            return self.own_tokenizer.encode_batch(texts) if texts else []
        return [self.encode(t) for t in texts]

    def _dataset(self, records: list[dict], what: str):
        if self.joint_pairs:
            return self._joint_dataset(records, what)
        report = DropReport(total=len(records), source=what)
        columns: list[list] = [[] for _ in self._texts(records[0])] if records else [[]]
        kept = []
        per_record = len(columns)
        flat = self._encode_all([t for rec in records for t in self._texts(rec)])
        for r, rec in enumerate(records):
            encoded = flat[r * per_record: (r + 1) * per_record]
            if any(not e for e in encoded):
                report.empty += 1
                continue
            for column, e in zip(columns, encoded):
                column.append(e)
            kept.append(rec)
        labels, groups = self._targets(kept, what, report)
        pad = self.own_tokenizer.pad_index if getattr(self, "own_tokenizer", None) is not None else PAD_INDEX
        if self.pair:
            return PairDataset(columns[0], columns[1], labels, groups, pad_index=pad), report
        return ClassificationDataset(columns[0], labels, pad_index=pad), report

    def _joint_dataset(self, records: list[dict], what: str):
        """A cross-encoder's pairs: each ``(a, b)`` joined by the model's own tokenizer (its
        ``encode_pair_batch``: separators, token types, cut at the model's ``max_length``, longer text first).
        A pair with an empty (blank) text is dropped, as the two-text models drop it."""
        report = DropReport(total=len(records), source=what)
        kept = [rec for rec in records if rec["a"].strip() and rec["b"].strip()]
        report.empty = len(records) - len(kept)
        labels, groups = self._targets(kept, what, report)
        ids, token_types = self.own_tokenizer.encode_pair_batch([r["a"] for r in kept], [r["b"] for r in kept])
        return JointPairDataset(ids, labels, token_types, groups, pad_index=self.own_tokenizer.pad_index), report

    def _targets(self, kept: list[dict], what: str, report: DropReport) -> tuple[list, list[int] | None]:
        """(labels: class indices, or relevance scores for ranking; integer question ids for ranking, else
        ``None``) of the records kept; ``DataError`` when none is left."""
        if not kept:
            raise DataError(f"no {what} left: every example has an empty text ({report})")
        labels = [float(rec["label"]) if self.ranking else self.labels.index(rec["label"]) for rec in kept]
        if not self.ranking:
            return labels, None
        group_ids: dict[str, int] = {}
        return labels, [group_ids.setdefault(rec["group"], len(group_ids)) for rec in kept]

    def train_batches(self, epoch: int) -> list:
        t = self.cfg.training
        return self.train_set.batches(t.batch_size, t.batch_type, shuffle=t.shuffle, seed=self.cfg.seed,
                                      epoch=epoch, bucket=t.bucket)

    # ------------------------------------------------------------------ model
    @property
    def num_outputs(self) -> int:
        return 1 if self.ranking else len(self.labels)

    def build_model(self) -> nn.Module:
        _, model_class = get_architecture(self.cfg.model.architecture, self.name).load()
        model = model_class(self.cfg.model, self.vocab_size, self.num_outputs, pad_index=PAD_INDEX)
        if self.cfg.data.embeddings and getattr(self, "fresh", False):
            self._load_embeddings(model)
        if callable(getattr(model, "describe", None)):  # e.g. a pretrained encoder's trainable parameters
            self.log.info(model.describe())
        return model

    def _load_embeddings(self, model: nn.Module) -> None:
        """Initialise the word embeddings from ``data.embeddings`` (GloVe text format)."""
        from hyperplex.data.glove import load_glove

        if not hasattr(model, "load_pretrained_embeddings"):
            raise ValueError(f"data.embeddings is set but model {self.cfg.model.architecture!r} cannot load "
                             f"pre-trained embeddings")
        path = data_file(self.cfg.data.embeddings, self.data_root, key="data.embeddings")
        dim = getattr(self.cfg.model, "embedding_dim", None)
        vectors, mask = load_glove(path, self.vocab.itos, dim)
        model.load_pretrained_embeddings(vectors, mask)
        self.log.info(f"embeddings: {int(mask.sum())} of {len(self.vocab)} words initialised from {path}")

    def logits(self, model: nn.Module, batch) -> Tensor:
        if self.pair and not self.joint_pairs:
            return model(batch["a"], batch["a_lengths"], batch["b"], batch["b_lengths"])
        if "token_types" in batch.tensors:  # a pair joined into one sequence, with its segment ids
            return model(batch["tokens"], batch["lengths"], batch["token_types"])
        return model(batch["tokens"], batch["lengths"])

    def loss(self, model: nn.Module, batch) -> Tensor:
        logits = self.logits(model, batch).float()
        if self.ranking:  # binary cross-entropy on the relevance label
            return F.binary_cross_entropy_with_logits(logits.reshape(-1), batch["labels"].float(), reduction="sum")
        return F.cross_entropy(logits, batch["labels"], reduction="sum",
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
        groups = getattr(dataset, "groups", None)
        return out, dataset.labels, groups

    @torch.no_grad()
    def validate(self, model: nn.Module) -> dict[str, float]:
        logits, labels, groups = self.predict(model, self.dev_set)
        if self.ranking:
            scores = logits.reshape(-1)
            loss = F.binary_cross_entropy_with_logits(scores, labels.float()).item()
            result = ranking_metrics(groups.tolist(), scores.tolist(), labels.long().tolist())
            return {"map": 100.0 * result["map"], "mrr": 100.0 * result["mrr"], "loss": loss}
        loss = F.cross_entropy(logits, labels).item()
        return {"accuracy": 100.0 * accuracy(logits.argmax(-1).tolist(), labels.tolist()), "loss": loss}

    def metadata(self) -> dict:
        if getattr(self, "own_tokenizer", None) is not None:  # nothing to copy: rebuilt from model.path
            meta = {"vocab_size": self.vocab_size, "labels": self.labels, "tokenizer": "model"}
        else:
            meta = {"vocab_size": len(self.vocab), "labels": self.labels,
                    "files": {"text": vocabulary_files(self.cfg.data, "text")}}
        if getattr(self, "carve_counts", None):
            meta["carve"] = self.carve_counts
        return meta
