"""Distillation: heal a converted pretrained encoder by matching its teacher's sentence embeddings.

Data: plain text, one sentence per line (``data.train``; ``data.dev``, or ``data.dev_fraction`` of train
carved with ``data.split_seed``). Blank lines are skipped. The training file is streamed, never held: the
task keeps the byte offsets of its lines (:class:`~hyperplex.data.lines.LineIndex`) and each batch is read
and tokenised when the trainer asks for it, so a corpus of 500,000 sentences costs a few MB. A training
sentence equal to a dev sentence or to a sentence of a ``data.exclude`` file, compared after
:func:`~hyperplex.data.corpus.normalize_text` (case, accents and spacing folded as the uncased tokenizer
folds them), is dropped from train and counted in the log (``data.leak_check: error``: refused instead),
so the dev cosine is measured on sentences the student never trained on; the files are never changed.

The teacher (the unconverted model at ``model.path``) is frozen and kept on the task, not in the model,
so checkpoints hold only the student. Each batch is ``training.batch_size`` sentences (``num_tokens`` =
sentences), tokenised with the teacher's tokenizer, in an order shuffled by (``seed``, epoch). The loss
(``model.distill_loss``) compares the normalised embeddings: ``cosine`` = 1 − cos, ``mse`` = ‖s − t‖²,
summed over sentences. Validation reports ``cosine`` (mean cos(student, teacher) on dev) and ``loss``.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from hyperplex.data.batching import make_batches
from hyperplex.data.corpus import HeldOut, evaluation_sentences
from hyperplex.data.datasets import Batch
from hyperplex.data.lines import LazyBatches, LineIndex
from hyperplex.data.readers import DataError, read_lines
from hyperplex.tasks.common import carve_random, carve_seed, data_file, subset
from hyperplex.train.task import Task

__all__ = ["DistillationTask", "attention_loss", "distill_loss", "hidden_state_loss"]

#: How many training sentences ``init: activation`` is calibrated on.
CALIBRATION_SENTENCES = 64


def distill_loss(student: Tensor, teacher: Tensor, kind: str) -> Tensor:
    """``(B,)`` per-sentence loss between ``(B, E)`` normalised embeddings."""
    if kind == "cosine":
        return 1.0 - (student * teacher).sum(-1)
    if kind == "mse":
        return (student - teacher).pow(2).sum(-1)
    raise ValueError(f"model.distill_loss: unknown {kind!r}; valid: cosine, mse")


def hidden_state_loss(student: list[Tensor], teacher: list[Tensor], mask: Tensor) -> Tensor:
    """``(B,)`` per sentence: the squared error between each student layer's output and its teacher layer's
    (lists of ``(B, S, H)``, matched pairwise), averaged over the sentence's real tokens (``mask`` ``(B, S)``
    = 1) and the ``H`` features, then over the layers. Padding positions add nothing."""
    m = mask.to(student[0].dtype)[..., None]  # (B, S, 1)
    count = (mask.sum(1).to(student[0].dtype) * student[0].shape[-1]).clamp_min(1.0)  # (B,)
    return torch.stack([((s - t).square() * m).sum((1, 2)) / count for s, t in zip(student, teacher)]).mean(0)


def attention_loss(student: list[Tensor], teacher: list[Tensor], mask: Tensor) -> Tensor:
    """``(B,)`` per sentence: KL(teacher ‖ student) of the attention distribution of every head and real query
    token (lists of ``(B, heads, S, S)`` log-probabilities, matched pairwise), summed over the keys, averaged
    over heads and real queries (``mask`` ``(B, S)``), then over the layers. Padded keys carry probability 0
    in both and add nothing; padded queries are left out."""
    keys = mask.bool()[:, None, None, :]  # (B, 1, 1, S)
    queries = mask.to(student[0].dtype)[:, None, :]  # (B, 1, S)
    count = (mask.sum(1).to(student[0].dtype) * student[0].shape[1]).clamp_min(1.0)  # (B,)
    per_layer = []
    for s, t in zip(student, teacher):
        kl = torch.where(keys, t.exp() * (t - s), torch.zeros((), dtype=s.dtype)).sum(-1)  # (B, h, S)
        per_layer.append((kl * queries).sum((1, 2)) / count)
    return torch.stack(per_layer).mean(0)


def _sentences(path, key: str) -> tuple[list[str], list[int]]:
    """Non-blank lines of ``path`` and their 1-based line numbers; DataError naming the file if none."""
    lines = read_lines(path)  # DataError for an empty file, naming it
    kept = [(line, i + 1) for i, line in enumerate(lines) if line]
    if not kept:
        raise DataError(f"{key}: {path} has no sentences (only blank lines)")
    return [s for s, _ in kept], [i for _, i in kept]


class DistillationTask(Task):
    """Student ← teacher embedding distillation (``data.task: distillation``, architecture ``pretrained_student``)."""

    name = "distillation"
    metrics = ("cosine", "loss")
    loss_unit = "sentences"

    # -- data -----------------------------------------------------------------
    def load_vocabularies(self) -> None:
        """The teacher alone (its tokenizer is the task's): enough to load a saved student."""
        from hyperplex.pretrained import load_sentence_transformer

        self.teacher = load_sentence_transformer(self.cfg.model.path)
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self._dev_targets: Tensor | None = None

    def prepare(self, fresh: bool) -> None:
        data = self.cfg.data
        train_path = data_file(data.train, self.data_root, key="data.train")
        lines = LineIndex(train_path)  # byte offsets only: the sentences stay in the file
        positions = np.arange(len(lines))
        held, carved = HeldOut(), HeldOut()
        if data.dev:
            dev_path = data_file(data.dev, self.data_root, key="data.dev")
            dev, _ = _sentences(dev_path, "data.dev")
            held.add(dev, f"data.dev {dev_path}")
        elif data.dev_fraction > 0:
            kept, dev_positions = carve_random(list(range(len(lines))), data.dev_fraction,
                                               carve_seed(self.cfg, self.model_dir, fresh))
            positions, dev = np.asarray(kept), [lines[i] for i in dev_positions]
            carved.add(dev, "the dev sentences carved from it")
        else:
            raise DataError("data.dev or data.dev_fraction is required: distillation validates on held-out sentences")
        for i, name in enumerate(data.exclude):
            path = data_file(name, self.data_root, key=f"data.exclude[{i}]")
            held.add(evaluation_sentences(path), f"data.exclude {path}")
        positions = self._drop_held_out(lines, positions, held, carved, strict=data.leak_check == "error")
        if not len(positions):
            raise DataError(f"data.train: every sentence of {train_path} is a dev or evaluation sentence")
        if data.max_train_examples and data.max_train_examples < len(positions):
            positions = np.asarray(subset(positions.tolist(), data.max_train_examples, self.cfg.seed))
            self.log.info(f"using a seeded subset of {len(positions)} training sentences (data.max_train_examples)")
        self.train_set, self.dev_set = lines.select(positions), dev
        self.load_vocabularies()
        self.log.info(f"distillation: {len(self.train_set)} training sentences (streamed from {train_path}) and "
                      f"{len(dev)} dev sentences; teacher "
                      f"{self.cfg.model.path}; loss {self.cfg.model.distill_loss}")

    def _drop_held_out(self, lines: LineIndex, positions: np.ndarray, held: HeldOut, carved: HeldOut,
                       strict: bool) -> np.ndarray:
        """``positions`` without the lines whose normalised text ``held`` or ``carved`` holds; logs how many
        went per file. ``strict``: a line ``held`` holds is a DataError naming the file, line and source."""
        if not len(held) and not len(carved):
            return positions
        keep = np.ones(len(positions), dtype=bool)
        counts: dict[str, int] = {}
        for j, position in enumerate(positions.tolist()):
            text = lines[position]
            source = held.source(text) if len(held) else None
            if source and strict:
                raise DataError(f"{text[:80]!r} is an evaluation sentence (it occurs in {source}, compared after "
                                f"folding case, accents and spacing), and data.leak_check: error says this file "
                                f"holds none; rebuild it without them (e.g. hyperplex corpus --exclude) or set "
                                f"data.leak_check: drop", lines.path, lines.line_number(position))
            source = source or (carved.source(text) if len(carved) else None)
            if source:
                keep[j] = False
                counts[source] = counts.get(source, 0) + 1
        if counts:
            detail = "; ".join(f"{n} of {source}" for source, n in counts.items())
            self.log.info(f"dropped {int((~keep).sum())} training sentence(s) equal to a dev or evaluation sentence "
                          f"(compared after folding case, accents and spacing as the uncased tokenizer does): {detail}")
        return positions[keep]

    def _batch(self, sentences: list[str], indices: list[int]) -> Batch:
        from hyperplex.models.pretrained_student import tokenize

        return Batch(tokenize(self.teacher, sentences), indices, len(sentences))

    def train_batches(self, epoch: int) -> LazyBatches:
        """The batches of ``epoch``: ``training.batch_size`` training sentences each, in an order shuffled by
        (``seed``, epoch); with ``training.bucket`` the sentences of each pool of
        :data:`~hyperplex.data.batching.POOL_BATCHES` batches are sorted by length (bytes of the line) before
        they are cut into batches, and the batches shuffled, so a batch pads to similar lengths. A lazy
        sequence whose batches are read from the file and tokenised when indexed."""
        cached = getattr(self, "_epoch_batches", None)
        if cached is not None and cached[0] == epoch:
            return cached[1]
        t = self.cfg.training

        def make(chunk: list[int]) -> Batch:
            return self._batch([self.train_set[i] for i in chunk], chunk)

        if t.bucket:
            lengths = self.train_set.byte_lengths().tolist()
            batches = LazyBatches.from_batches(
                make_batches(lengths, t.batch_size, shuffle=True, seed=self.cfg.seed, epoch=epoch), make)
        else:
            order = list(range(len(self.train_set)))
            random.Random(self.cfg.seed * 1_000_003 + epoch).shuffle(order)
            batches = LazyBatches(order, t.batch_size, make)
        self._epoch_batches = (epoch, batches)
        return batches

    # -- model ----------------------------------------------------------------
    def build_model(self) -> nn.Module:
        from hyperplex.models.pretrained_student import PretrainedStudent

        # a student whose weights come from a checkpoint next (a resumed run, a loaded model), or one without
        # training sentences, is built without the fits to them: the checkpoint replaces what they would give
        calibration = [] if self.weights_from_checkpoint else getattr(self, "train_set", [])[:CALIBRATION_SENTENCES]
        model = PretrainedStudent(self.cfg.model, calibration=calibration, structure_only=not calibration)
        cfg = self.cfg.model
        layer_map = model.layer_map or []  # resolved whenever layers are distilled or fitted
        if cfg.distill_hidden or cfg.distill_attention:
            pairs = ", ".join(f"{j}↔{t}" for j, t in enumerate(layer_map))
            self.log.info(f"loss per sentence: {cfg.distill_loss} on the embeddings + {cfg.distill_hidden} × "
                          f"hidden-state MSE + {cfg.distill_attention} × attention KL; "
                          f"student layer ↔ teacher layer: {pairs}")
        # the records keep what the conversion lost before any healing; a student whose weights come from a
        # checkpoint was converted only for its structure (an activation init falls back to svd), so says nothing
        if model.report is not None and calibration:
            for line in model.report.summary():
                self.log.info(f"conversion: {line}")
        for layer, before, after in model.blockwise:
            self.log.info(f"blockwise: layer {layer} fitted to teacher layer {layer_map[layer]}: relative output "
                          f"error on {len(calibration)} calibration sentences {before:.4f} → {after:.4f}")
        return model

    @torch.no_grad()
    def _teacher(self, batch: Batch, device: torch.device) -> Tensor:
        from hyperplex.models.pretrained_student import embed

        self.teacher.to(device).eval()
        return embed(self.teacher, batch.tensors)

    def loss(self, model: nn.Module, batch) -> Tensor:
        cfg = self.cfg.model
        if cfg.distill_hidden or cfg.distill_attention:
            return self._layered_loss(model, batch)
        target = self._teacher(batch, batch["input_ids"].device)
        student = model(**batch.tensors)
        return distill_loss(student, target.to(student.dtype), cfg.distill_loss).sum()

    def _layered_loss(self, model: nn.Module, batch) -> Tensor:
        """The embedding loss plus ``distill_hidden`` × :func:`hidden_state_loss` plus ``distill_attention`` ×
        :func:`attention_loss`, student layer ``j`` matched to teacher layer ``layer_map[j]``; summed over sentences."""
        from hyperplex.models.pretrained_student import embed, record_internals

        cfg = self.cfg.model
        inner: Any = getattr(model, "module", model)  # DDP wraps the student
        mask = batch["attention_mask"]
        with_attention = cfg.distill_attention > 0
        self.teacher.to(mask.device).eval()
        with torch.no_grad(), record_internals(self.teacher, attention=with_attention) as teacher:
            target = embed(self.teacher, batch.tensors)
            teacher_attention = teacher.attention_log_probs(mask) if with_attention else []
        with record_internals(inner.encoder, attention=with_attention) as student:
            output = model(**batch.tensors)
        mapped = inner.layer_map
        loss = distill_loss(output, target.to(output.dtype), cfg.distill_loss)
        if cfg.distill_hidden:
            loss = loss + cfg.distill_hidden * hidden_state_loss(
                student.hidden, [teacher.hidden[t].to(output.dtype) for t in mapped], mask)
        if with_attention:
            loss = loss + cfg.distill_attention * attention_loss(
                student.attention_log_probs(mask), [teacher_attention[t].to(output.dtype) for t in mapped], mask)
        return loss.sum()

    @torch.no_grad()
    def embed_dev(self, model: nn.Module) -> tuple[Tensor, Tensor]:
        """``(N, E)`` student and teacher embeddings of the dev sentences (the teacher's computed once); an int8 student
        one sentence per forward (:func:`~hyperplex.int8.layers.has_int8_layers`)."""
        from hyperplex.int8.layers import has_int8_layers

        device = next(model.parameters()).device
        size = 1 if has_int8_layers(model) else max(1, self.cfg.testing.batch_size)
        batches = [self._batch(self.dev_set[i:i + size], list(range(i, i + size)))
                   for i in range(0, len(self.dev_set), size)]
        targets = self._dev_targets
        if targets is None:
            targets = self._dev_targets = torch.cat([self._teacher(b.to(device), device).cpu() for b in batches])
        student = torch.cat([model(**b.to(device).tensors).float().cpu() for b in batches])
        return student, targets

    @torch.no_grad()
    def validate(self, model: nn.Module) -> dict[str, float]:
        student, teacher = self.embed_dev(model)
        cosine = nn.functional.cosine_similarity(student, teacher, dim=-1)
        loss = distill_loss(student, teacher, self.cfg.model.distill_loss)
        return {"cosine": float(cosine.mean()), "loss": float(loss.mean())}

    def describe_validation(self) -> str:
        return (f"validation: mean cosine of student and teacher embeddings on {len(self.dev_set)} dev sentences, "
                f"and the mean {self.cfg.model.distill_loss} loss")

    def metadata(self) -> dict:
        return {"teacher": self.cfg.model.path, "kind": self.cfg.model.kind,
                "distill_loss": self.cfg.model.distill_loss}
