"""Sequence-to-sequence tasks: translation, style transfer and the generated arithmetic task.

Validation during training reports teacher-forced ``loss``/``ppl`` and decodes the dev split
greedily for ``bleu``/``chrf`` (sacreBLEU on detokenised text) and exact-match ``accuracy``;
``hyperplex evaluate`` decodes with the configured beam.

Sequences longer than a Transformer's position table (``model.max_positions``) cannot be encoded:
such sources (and, for the loss, targets) are cut to fit with a warning naming their line numbers,
rather than failing the whole file. The LSTM translator has no position limit: it trains on whole pairs, and
decodes or scores at most :data:`UNPOSITIONED_LINE_LIMIT` tokens of a line (cut with the same warning).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyperplex.config.registry import get_architecture
from hyperplex.data.arithmetic import FILE_SUFFIXES as ARITHMETIC_SUFFIXES
from hyperplex.data.arithmetic import generate_arithmetic
from hyperplex.data.datasets import Seq2SeqDataset
from hyperplex.data.readers import DataError, DropReport, read_parallel
from hyperplex.data.vocab import BOS_INDEX, EOS_INDEX, PAD_INDEX, UNK, UNK_INDEX
from hyperplex.metrics import corpus_bleu, corpus_chrf, perplexity
from hyperplex.tasks.common import (
    carve_random,
    carve_seed,
    data_file,
    load_saved_vocabularies,
    lowercase_if,
    subset,
    tokenizer_and_vocab,
    vocabulary_files,
)
from hyperplex.train.task import Task

#: Most tokens of a line decoded by a model without a position table (an RNN translator); longer lines are cut
#: with a warning, as a Transformer's are at its ``max_positions``.
UNPOSITIONED_LINE_LIMIT = 4096


class TranslationTask(Task):
    """Sequence to sequence (``data.task: translation``): parallel files or the generated arithmetic task,
    scored by BLEU/chrF (with their sacreBLEU signatures) and exact match; it can score any parallel file and
    translate new text (the hooks :class:`~hyperplex.train.protocols.EvaluatesFiles`,
    :class:`~hyperplex.train.protocols.SignsMetrics`, :class:`~hyperplex.train.protocols.Translates`)."""

    name = "translation"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.signatures: dict[str, str] = {}  # sacreBLEU signatures of the last validation
        self.hypotheses: list[str] | None = None  # and the text it scored
        # The arithmetic task is judged by exact match; translation by BLEU.
        self.metrics = ("accuracy", "bleu", "chrf", "loss", "ppl") if self.cfg.data.format == "arithmetic" \
            else ("bleu", "chrf", "accuracy", "loss", "ppl")

    # ------------------------------------------------------------------ data
    def _read(self, fresh: bool) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        d = self.cfg.data
        split_seed = carve_seed(self.cfg, self.model_dir, fresh)  # the data, not the model: same for every seed
        if d.format == "arithmetic":
            train, dev = generate_arithmetic(d.arithmetic_train_size, d.arithmetic_dev_size, seed=split_seed)
            return list(train), list(dev)
        if d.format != "parallel":
            raise DataError(f"data.format {d.format!r} cannot be used for translation; use parallel or arithmetic")
        train = read_parallel(data_file(d.train, self.data_root, d.src, "data.train"),
                              data_file(d.train, self.data_root, d.tgt, "data.train"))
        if d.dev:
            dev = read_parallel(data_file(d.dev, self.data_root, d.src, "data.dev"),
                                data_file(d.dev, self.data_root, d.tgt, "data.dev"))
        elif d.dev_fraction > 0:
            train, dev = carve_random(train, d.dev_fraction, split_seed)
            blank = [p for p in dev if not (p[0].strip() and p[1].strip())]
            if blank:  # the training pool's own empty pairs: dropped as training drops them, not an error
                dev = [p for p in dev if p[0].strip() and p[1].strip()]
                self.log.info(f"validation pairs carved from data.train: dropped {len(blank)} with an empty side")
        else:
            raise DataError("no validation data: set data.dev or data.dev_fraction")
        return train, dev

    def _vocabulary_names(self) -> tuple[str, ...]:
        return ("src",) if self.cfg.data.shared_vocab else ("src", "tgt")

    def load_vocabularies(self) -> None:
        """Load the saved tokenisers/vocabularies only (enough to translate; no data is read), by the
        file names :attr:`checkpoint_record` lists, else the standard ones."""
        record = (self.checkpoint_record or {}).get("files")
        loaded = load_saved_vocabularies(self.cfg.data, self.model_dir, self._vocabulary_names(), record)
        self.src_tok, self.src_vocab = loaded["src"]
        self.tgt_tok, self.tgt_vocab = loaded.get("tgt", loaded["src"])

    def prepare(self, fresh: bool) -> None:
        d = self.cfg.data
        train, dev = self._read(fresh)
        if d.max_train_examples:
            train = subset(train, d.max_train_examples, self.cfg.seed)
            self.log.info(f"using a seeded subset of {len(train)} training pairs")
        train = [(lowercase_if(d, s), lowercase_if(d, t)) for s, t in train]
        if not fresh:
            self.load_vocabularies()
        elif d.shared_vocab:
            lines = [s for s, _ in train] + [t for _, t in train]
            self.src_tok, self.src_vocab = tokenizer_and_vocab(d, lines, self.model_dir, "src", fresh)
            self.tgt_tok, self.tgt_vocab = self.src_tok, self.src_vocab
        else:
            self.src_tok, self.src_vocab = tokenizer_and_vocab(d, [s for s, _ in train], self.model_dir, "src", fresh)
            self.tgt_tok, self.tgt_vocab = tokenizer_and_vocab(d, [t for _, t in train], self.model_dir, "tgt", fresh)
        src_ids, tgt_ids, _, _, report = self._encode_pairs(train, drop_long=True)
        self.log.info(str(report))
        if not src_ids:
            raise DataError(f"no training pairs left after filtering ({report})")
        self.train_set = Seq2SeqDataset(src_ids, tgt_ids)
        self._set_evaluation_pairs(dev, f"validation pairs of {d.dev}" if d.dev else
                                   "validation pairs carved from data.train")
        self.log.info(f"vocabularies: source {len(self.src_vocab)}, target {len(self.tgt_vocab)}; "
                      f"{len(self.train_set)} training / {len(self.dev_set)} validation pairs")

    def use_evaluation_file(self, prefix: str) -> None:
        """Make the parallel files ``PREFIX.SRC`` / ``PREFIX.TGT`` the split :meth:`validate` scores (for generated
        arithmetic, ``PREFIX.src`` / ``PREFIX.tgt`` as :func:`~hyperplex.data.arithmetic.write_arithmetic` writes)."""
        d = self.cfg.data
        src, tgt = (d.src, d.tgt)
        if d.format == "arithmetic":
            src, tgt = src or ARITHMETIC_SUFFIXES[0], tgt or ARITHMETIC_SUFFIXES[1]
        pairs = read_parallel(data_file(prefix, self.data_root, src, "--split"),
                              data_file(prefix, self.data_root, tgt, "--split"))
        self._set_evaluation_pairs(pairs, f"pairs of {prefix}")

    def _set_evaluation_pairs(self, pairs: list[tuple[str, str]], what: str) -> None:
        """Encode raw (source, reference) pairs as the split :meth:`validate` scores; the tokenised
        sources (for ``<unk>`` replacement) and references are kept so validation does not redo them."""
        d = self.cfg.data
        pairs = [(lowercase_if(d, s), lowercase_if(d, t)) for s, t in pairs]
        src_ids, tgt_ids, src_tokens, kept, report = self._encode_pairs(pairs, drop_long=False, what=what)
        if report.dropped:
            self.log.info(str(report))
        self.dev_set = Seq2SeqDataset(src_ids, tgt_ids)
        self.dev_src_tokens = src_tokens
        self.dev_refs = [pairs[i][1] for i in kept]

    def _encode_pairs(self, pairs, drop_long: bool, what: str = "training pairs"):
        """(source ids, target ids, source tokens, kept pair indices, DropReport) of ``pairs``. With ``drop_long``
        (training) empty pairs are dropped, and so are pairs with a side over ``data.max_length`` tokens; an
        evaluation split is scored whole, so an empty side there raises :class:`DataError` naming the pairs (a
        dropped pair would score fewer lines than the file holds, and misalign the saved hypotheses with it). A
        side longer than the model's positions (:meth:`token_limit`) is cut to fit, with a warning naming the
        pairs."""
        d = self.cfg.data
        # training pairs over data.max_length are dropped; evaluation pairs of a model without positions are cut
        limit = self.token_limit() or (None if drop_long else UNPOSITIONED_LINE_LIMIT)
        src_ids, tgt_ids, src_tokens, kept, cut, empty = [], [], [], [], [], []
        report = DropReport(total=len(pairs), max_length=d.max_length if drop_long else None, source=what)
        for i, (s, t) in enumerate(pairs):
            s_tok, t_tok = self.src_tok.tokenize(s), self.tgt_tok.tokenize(t)
            if not s_tok or not t_tok:
                report.empty += 1
                empty.append(i + 1)
                continue
            if drop_long and (len(s_tok) > d.max_length or len(t_tok) > d.max_length):
                report.too_long += 1
                continue
            if limit is not None and max(len(s_tok), len(t_tok)) > limit:
                cut.append((i + 1, f"{len(s_tok)} source / {len(t_tok)} target tokens"))
                s_tok, t_tok = s_tok[:limit], t_tok[:limit]
            src_ids.append(self.src_vocab.encode(s_tok, add_eos=True))
            tgt_ids.append(self.tgt_vocab.encode(t_tok))
            src_tokens.append(s_tok)
            kept.append(i)
        if empty and not drop_long:
            shown = ", ".join(map(str, empty[:10])) + (f" and {len(empty) - 10} more" if len(empty) > 10 else "")
            raise DataError(f"{what}: pair(s) {shown} (line numbers) have an empty source or reference, which an "
                            f"evaluation split cannot score; remove or fill those lines in both files")
        if cut:
            self.log.warning(self._cut_message(cut, f"{what}: pair", "cut to fit (the references are scored whole)"))
        return src_ids, tgt_ids, src_tokens, kept, report

    def token_limit(self) -> int | None:
        """Most tokens a source or target may have: the Transformer's ``max_positions`` less the one that
        ``</s>`` (source) or ``<s>`` (target input) takes; ``None`` for models without a position table."""
        limit = getattr(self.cfg.model, "max_positions", None)
        return limit - 1 if isinstance(limit, int) and limit > 1 else None

    def _cut_message(self, cut: list[tuple[int, str]], item: str, action: str, shown: int = 10) -> str:
        """One warning line for the ``(1-based number, length text)`` items in ``cut``."""
        limit = self.token_limit()
        listed = ", ".join(f"{item} {number} ({length})" for number, length in cut[:shown])
        more = f" and {len(cut) - shown} more" if len(cut) > shown else ""
        if limit is None:
            return (f"{listed}{more}: longer than the {UNPOSITIONED_LINE_LIMIT} tokens a line is decoded with by a "
                    f"model without a position table (hyperplex.tasks.translation.UNPOSITIONED_LINE_LIMIT); {action}")
        return (f"{listed}{more}: longer than the model's {limit} tokens (model.max_positions={limit + 1}, one "
                f"position kept for </s>); {action}")

    def train_batches(self, epoch: int) -> list:
        t = self.cfg.training
        return self.train_set.batches(t.batch_size, t.batch_type, shuffle=t.shuffle, seed=self.cfg.seed,
                                      epoch=epoch, bucket=t.bucket)

    # ------------------------------------------------------------------ model
    def build_model(self) -> nn.Module:
        _, model_class = get_architecture(self.cfg.model.architecture, self.name).load()
        return model_class(self.cfg.model, len(self.src_vocab), len(self.tgt_vocab), pad_index=PAD_INDEX,
                           unk_index=UNK_INDEX, bos_index=BOS_INDEX, eos_index=EOS_INDEX)

    @staticmethod
    def _summed_nll(model: nn.Module, batch, label_smoothing: float = 0.0) -> Tensor:
        """Teacher-forced cross-entropy of ``batch``, summed over non-pad target tokens (fp32)."""
        logits = model(batch["src"], batch["src_lengths"], batch["tgt_in"])  # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch["tgt_out"].reshape(-1),
                               ignore_index=PAD_INDEX, reduction="sum", label_smoothing=label_smoothing)

    def loss(self, model: nn.Module, batch) -> Tensor:
        return self._summed_nll(model, batch, self.cfg.training.label_smoothing)

    @torch.no_grad()
    def describe_validation(self) -> str:
        te = self.cfg.testing
        how = "greedily" if te.validation_beam_size == 1 else f"with beam {te.validation_beam_size}"
        return (f"validation BLEU/chrF decode {how} (testing.validation_beam_size={te.validation_beam_size}); "
                f"hyperplex evaluate decodes with testing.beam_size={te.beam_size}, alpha {te.beam_alpha}")

    @torch.no_grad()  # also when called outside the trainer (the final evaluation of the best checkpoint)
    def validate(self, model: nn.Module, beam_size: int | None = None, progress: bool = False) -> dict[str, float]:
        """Metrics on ``dev_set``, decoded with ``beam_size`` (``None``: ``testing.validation_beam_size``, what
        training uses; ``hyperplex evaluate`` passes ``testing.beam_size``); ``progress`` shows a bar on
        stderr while decoding (a terminal only)."""
        beam_size = self.cfg.testing.validation_beam_size if beam_size is None else beam_size
        tokens = 0
        device = next(model.parameters()).device
        summed = torch.zeros((), dtype=torch.float64, device=device)  # read once: one sync, not one per batch
        for batch in self.dev_set.batches(self.cfg.testing.batch_size):
            summed += self._summed_nll(model, batch.to(device)).double()
            tokens += batch.num_tokens
        nll = summed.item()
        hypotheses = self.translate_ids(model, self.dev_set.src_ids, beam_size=beam_size,
                                        src_tokens=self.dev_src_tokens, progress=progress)
        refs = self.dev_refs
        self.hypotheses = hypotheses  # the last validation's text, in the split's order: what was scored
        exact = sum(h.strip() == r.strip() for h, r in zip(hypotheses, refs)) / len(refs)
        # with data.lowercase the references were lower-cased (as the model's text is): the signatures say so
        case = self.cfg.data.lowercase
        bleu, chrf = corpus_bleu(hypotheses, refs, lowercase=case), corpus_chrf(hypotheses, refs, lowercase=case)
        if self.signatures != {"bleu": bleu.signature, "chrf": chrf.signature}:
            self.signatures = {"bleu": bleu.signature, "chrf": chrf.signature}
            self.log.info(f"sacreBLEU signatures: BLEU {bleu.signature}; chrF {chrf.signature}")
        return {"bleu": bleu.score, "chrf": chrf.score, "accuracy": 100.0 * exact, "loss": nll / max(tokens, 1),
                "ppl": perplexity(nll, tokens) if nll == nll else nll}  # a NaN loss: the trainer reports it

    # ------------------------------------------------------------------ decoding
    def source_tokens(self, lines: list[str], warn: bool = True) -> list[list[str]]:
        """Tokenised (and, as configured, lowercased) ``lines``, each cut to :meth:`token_limit` tokens;
        with ``warn`` a warning names the lines that were cut (1-based) and their lengths. A model without a
        position table (an RNN) reads at most :data:`UNPOSITIONED_LINE_LIMIT` tokens a line: its encoder and
        every step's attention are linear in the line, so one line of a million tokens would not end."""
        limit = self.token_limit() or UNPOSITIONED_LINE_LIMIT
        tokens = [self.src_tok.tokenize(lowercase_if(self.cfg.data, line)) for line in lines]
        cut = [(i + 1, f"{len(t)} tokens") for i, t in enumerate(tokens) if limit is not None and len(t) > limit]
        if cut:
            if warn:
                action = f"translated its first {limit} tokens" if len(cut) == 1 else \
                    f"translated the first {limit} tokens of each"
                self.log.warning(self._cut_message(cut, "line", action))
            tokens = [t[:limit] for t in tokens]
        return tokens

    def translate(self, model: nn.Module, lines: list[str], beam_size: int | None = None, **kwargs):
        """Raw source sentences → detokenised translations, one per line (see :meth:`translate_ids` for
        ``kwargs``). A line without tokens (empty or blank) translates to ``""`` without decoding; an
        over-long line is cut (:meth:`source_tokens`). With ``return_attention`` an empty line's
        details are ``None``."""
        tokens = self.source_tokens(lines)
        todo = [i for i, t in enumerate(tokens) if t]
        texts: list[str] = [""] * len(lines)
        details: list = [None] * len(lines)
        if todo:
            ids = [self.src_vocab.encode(tokens[i], add_eos=True) for i in todo]
            beam = self.cfg.testing.beam_size if beam_size is None else beam_size  # the default, resolved here only
            result = self.translate_ids(model, ids, beam, src_tokens=[tokens[i] for i in todo], **kwargs)
            decoded, found = result if kwargs.get("return_attention") else (result, None)
            for k, i in enumerate(todo):
                texts[i] = decoded[k]
                if found is not None:
                    details[i] = found[k]
        return (texts, details) if kwargs.get("return_attention") else texts

    @torch.no_grad()
    def translate_ids(self, model: nn.Module, src_ids: Sequence[Sequence[int]], beam_size: int,
                      src_tokens: list[list[str]] | None = None, return_attention: bool = False,
                      progress: bool = False):
        """Decode source id sequences in order; returns detokenised strings (and per-sentence
        ``(output tokens, attention (T, S))`` when ``return_attention``). ``src_tokens`` (the
        tokenised sources, before vocabulary lookup) are what ``<unk>`` replacement copies."""
        from hyperplex.models.search import decode, load_unk_dictionary, replace_unk

        te = self.cfg.testing
        dictionary = load_unk_dictionary(te.unk_dictionary) if te.replace_unk and te.unk_dictionary else None
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        data = Seq2SeqDataset(src_ids)
        outputs: list = [None] * len(src_ids)
        attentions: list = [None] * len(src_ids)
        batches = data.batches(te.batch_size, "sentence", bucket=True)
        bar = None
        if progress:  # on stderr, drawn only when it is a terminal (disable=None): redirected logs stay clean
            import sys

            from tqdm import tqdm

            bar = tqdm(total=len(src_ids), unit="sent", desc="decoding", file=sys.stderr, disable=None,
                       dynamic_ncols=True)
        for batch in batches:
            b = batch.to(device)
            results = decode(model, b["src"], b["src_lengths"], beam_size=beam_size, beam_alpha=te.beam_alpha,
                             max_output_length=te.max_output_length, attention=te.replace_unk or return_attention)
            for row, index in enumerate(batch.indices):
                hyp = results[row][0]
                tokens = self.tgt_vocab.decode(hyp.tokens)
                if te.replace_unk and hyp.attention is not None:
                    source = src_tokens[index] if src_tokens is not None else \
                        self.src_vocab.decode(src_ids[index], strip_specials=True)
                    # the source's words only: attention on its </s> column would copy "</s>" into the text
                    tokens = replace_unk(tokens, list(source), hyp.attention, unk_token=UNK,
                                         dictionary=dictionary)
                outputs[index] = tokens
                attentions[index] = hyp.attention
            if bar is not None:
                bar.update(len(batch.indices))
        if bar is not None:
            bar.close()
        model.train(was_training)
        texts = [self.tgt_tok.detokenize(t) for t in outputs]
        if return_attention:
            return texts, list(zip(outputs, attentions))
        return texts

    def metadata(self) -> dict:
        return {"src_vocab_size": len(self.src_vocab), "tgt_vocab_size": len(self.tgt_vocab),
                "files": {name: vocabulary_files(self.cfg.data, name) for name in self._vocabulary_names()}}
