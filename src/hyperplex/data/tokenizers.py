"""Tokenisers: word level (the thesis), characters (arithmetic task) and sentencepiece (BPE/unigram).

Every tokeniser has ``tokenize(text) -> list[str]``, ``detokenize(tokens) -> str``,
``build_vocab(lines, ...) -> Vocabulary`` and ``save(model_dir, name)``; :func:`load_tokenizer`
reads any of them back from the model folder (``{name}.json``, plus ``{name}.model`` for
sentencepiece), so ``translate``/``evaluate`` need nothing but the model folder.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterable, Sequence
from typing import ClassVar

from hyperplex.data.readers import DataError, DataFileNotFoundError
from hyperplex.data.vocab import BOS, EOS, PAD, UNK, Vocabulary
from hyperplex.fileio import atomic_write_bytes, atomic_write_text


class Tokenizer:
    """Common interface; subclasses set :attr:`kind` and implement tokenize/detokenize."""

    kind: ClassVar[str] = ""

    def tokenize(self, text: str) -> list[str]:
        """Split a raw sentence into tokens."""
        raise NotImplementedError

    def detokenize(self, tokens: Sequence[str]) -> str:
        """Join tokens back into a plain sentence (what sacreBLEU scores)."""
        raise NotImplementedError

    def build_vocab(self, lines: Iterable[str], max_size: int | None = None, min_freq: int = 1) -> Vocabulary:
        """Vocabulary of the tokenised ``lines`` (top-``max_size`` by frequency)."""
        return Vocabulary.build((self.tokenize(line) for line in lines), max_size=max_size, min_freq=min_freq)

    def config(self) -> dict:
        """Constructor options, saved beside the model."""
        return {}

    def save(self, model_dir: str | os.PathLike, name: str = "tokenizer") -> None:
        """Write ``{model_dir}/{name}.json`` describing this tokeniser."""
        os.makedirs(model_dir, exist_ok=True)
        atomic_write_text(os.path.join(model_dir, f"{name}.json"),
                          json.dumps({"type": self.kind, **self.config()}, indent=2) + "\n")

    @classmethod
    def from_config(cls, config: dict, model_dir: str, name: str) -> Tokenizer:
        """Rebuild from the saved options (``model_dir``/``name`` locate extra files)."""
        return cls(**config)

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({options})"


# Word tokens: numbers with separators (3.5, 1,000), words with inner apostrophes or hyphens
# (woman's, T-shirt), otherwise any single non-space symbol, so raw Multi30k text splits
# like Moses-tokenised text while staying reversible by detokenize(). Combining marks (a decomposed
# "é" = e + U+0301), variation selectors, skin-tone modifiers and zero-width (non-)joiners stay with
# the character before them, so "café" or an emoji ZWJ sequence such as 👩‍💻 is one token, not three.
_MARK = "\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f\ufe00-\ufe0f\u200c\U0001f3fb-\U0001f3ff"
_LETTER = f"[\\w{_MARK}]"
_WORD_RE = re.compile(rf"\d+(?:[.,:]\d+)+|\w{_LETTER}*(?:['’\-]\w{_LETTER}*)*(?:\u200d\w{_LETTER}*)*"
                      rf"|[^\w\s{_MARK}\u200d][{_MARK}]*(?:\u200d[^\w\s][{_MARK}]*)*|\S")
_NO_SPACE_BEFORE = set(".,!?;:%)]}»”’…'")
_NO_SPACE_AFTER = set("([{«“„‘¿¡$#")
#: How detokenised text writes an unknown word: sentencepiece's surface for its unknown piece, one token to
#: sacreBLEU's 13a tokeniser (which splits a literal "<unk>" into three tokens that lengthen the hypothesis and
#: never match, so every <unk> of a word-level model would cost it BLEU that its BPE twin does not lose).
UNK_SURFACE = "\u2047"


class WordTokenizer(Tokenizer):
    """Whitespace/punctuation word tokeniser (the thesis' word-level setup).

    Args:
        lowercase: lower-case the text before splitting.
        split_punctuation: split punctuation off words with a regex (for raw text such as
            Multi30k); ``False`` splits on whitespace only (for pre-tokenised corpora).
    """

    kind = "word"

    def __init__(self, lowercase: bool = False, split_punctuation: bool = True):
        self.lowercase = lowercase
        self.split_punctuation = split_punctuation

    def config(self) -> dict:
        return {"lowercase": self.lowercase, "split_punctuation": self.split_punctuation}

    def tokenize(self, text: str) -> list[str]:
        if self.lowercase:
            text = text.lower()
        return _WORD_RE.findall(text) if self.split_punctuation else text.split()

    def detokenize(self, tokens: Sequence[str]) -> str:
        """Join with spaces, re-attaching closing punctuation to the left and opening brackets to
        the right; straight double quotes alternate between opening and closing. ``<unk>`` is written
        :data:`UNK_SURFACE` (``⁇``), as sentencepiece writes its unknown piece."""
        tokens = [UNK_SURFACE if token == UNK else token for token in tokens]
        if not self.split_punctuation:
            return " ".join(tokens)
        out: list[str] = []
        glue_next = False  # the previous token was an opening symbol
        open_quote = False
        for token in tokens:
            if token == '"':
                attach = open_quote  # a closing quote attaches to the left
                open_quote = not open_quote
                after = open_quote
            else:
                attach = token in _NO_SPACE_BEFORE
                after = token in _NO_SPACE_AFTER
            if out and not attach and not glue_next:
                out.append(" ")
            out.append(token)
            glue_next = after
        return "".join(out)


class CharTokenizer(Tokenizer):
    """Every character is a token (the character-level arithmetic task, Quaternion Table 4)."""

    kind = "char"

    def tokenize(self, text: str) -> list[str]:
        return list(text)

    def detokenize(self, tokens: Sequence[str]) -> str:
        """The characters joined; ``<unk>`` (an unseen character) written :data:`UNK_SURFACE`."""
        return "".join(UNK_SURFACE if token == UNK else token for token in tokens)


class SentencePieceTokenizer(Tokenizer):
    """Subword tokeniser backed by a trained sentencepiece model (BPE or unigram).

    Piece ids equal :class:`Vocabulary` ids: the model is trained with ``<pad>``=0, ``<unk>``=1,
    ``<s>``=2, ``</s>``=3, and :meth:`build_vocab` lists the pieces in id order.

    Args:
        model_proto: the serialised sentencepiece model (bytes of a ``.model`` file).
    """

    kind = "sentencepiece"

    def __init__(self, model_proto: bytes):
        import sentencepiece as spm

        self.model_proto = bytes(model_proto)
        try:
            self.processor = spm.SentencePieceProcessor(model_proto=self.model_proto)
        except (RuntimeError, OSError) as err:
            raise DataError(f"not a valid sentencepiece model ({err})") from None
        pieces = [self.processor.id_to_piece(i) for i in range(4)] if self.processor.get_piece_size() >= 4 else []
        if pieces != [PAD, UNK, BOS, EOS]:
            raise DataError(f"sentencepiece model must have ids 0-3 = {[PAD, UNK, BOS, EOS]}, found {pieces}")

    @classmethod
    def train(cls, lines: Iterable[str], vocab_size: int, model_type: str = "bpe",
              character_coverage: float = 1.0, hard_vocab_limit: bool = True,
              max_sentence_length: int = 4192, num_threads: int = 1, **options) -> SentencePieceTokenizer:
        """Train a model on the training-split ``lines`` (deterministic: no sampling, no shuffling).

        ``vocab_size`` counts every piece including the four specials. With ``hard_vocab_limit``
        (default) a ``vocab_size`` larger than the corpus supports is a ValueError saying the
        largest possible size; ``False`` lets sentencepiece stop below it. ``options`` go to
        ``SentencePieceTrainer.train`` unchanged. Save with :meth:`save`.
        """
        import sentencepiece as spm

        if model_type not in ("bpe", "unigram"):
            raise ValueError(f"sentencepiece model_type must be 'bpe' or 'unigram', got {model_type!r}")
        lines = [line for line in lines if line.strip()]
        if not lines:
            raise DataError("cannot train sentencepiece on an empty corpus")
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size, model_type=model_type,
                character_coverage=character_coverage, hard_vocab_limit=hard_vocab_limit,
                pad_id=0, unk_id=1, bos_id=2, eos_id=3, pad_piece=PAD, unk_piece=UNK, bos_piece=BOS, eos_piece=EOS,
                # Determinism: use every sentence in file order, single-threaded.
                input_sentence_size=0, shuffle_input_sentence=False, num_threads=num_threads,
                max_sentence_length=max_sentence_length, minloglevel=2, **options)
        except RuntimeError as err:
            message = str(err)
            hint = re.search(r"Vocabulary size too high.*", message)
            detail = hint.group(0) if hint else message.strip().splitlines()[-1]
            raise ValueError(f"sentencepiece could not train a {model_type} model with vocab_size={vocab_size} "
                             f"on {len(lines)} lines: {detail.rstrip('.')}; lower vocab_size or pass "
                             f"hard_vocab_limit=False to accept a smaller vocabulary") from None
        return cls(model.getvalue())

    def tokenize(self, text: str) -> list[str]:
        return self.processor.encode(text, out_type=str)

    def encode_ids(self, text: str) -> list[int]:
        """Piece ids of ``text`` (equal to ``build_vocab().encode(tokenize(text))``)."""
        return self.processor.encode(text, out_type=int)

    def detokenize(self, tokens: Sequence[str]) -> str:
        """Plain text: pieces joined and the ``▁`` word markers turned back into spaces."""
        return self.processor.decode(list(tokens))

    def build_vocab(self, lines: Iterable[str] = (), max_size: int | None = None, min_freq: int = 1) -> Vocabulary:
        """The model's pieces in id order (``lines``, ``max_size`` and ``min_freq`` are ignored:
        the subword inventory is fixed at training time)."""
        return Vocabulary.from_tokens([self.processor.id_to_piece(i) for i in range(self.processor.get_piece_size())])

    def __len__(self) -> int:
        return self.processor.get_piece_size()

    def config(self) -> dict:
        return {}

    def save(self, model_dir: str | os.PathLike, name: str = "tokenizer") -> None:
        """Write ``{name}.model`` (the sentencepiece model) and ``{name}.json`` into ``model_dir``."""
        os.makedirs(model_dir, exist_ok=True)
        path = os.path.join(model_dir, f"{name}.model")
        atomic_write_bytes(path, self.model_proto)
        atomic_write_text(os.path.join(model_dir, f"{name}.json"),
                          json.dumps({"type": self.kind, "model_file": f"{name}.model"}, indent=2) + "\n")

    @classmethod
    def from_config(cls, config: dict, model_dir: str, name: str) -> SentencePieceTokenizer:
        from hyperplex.fileio import UnsafePathError, inside, read_bounded

        where = os.path.join(model_dir, f"{name}.json")
        try:  # a name read from a file stays inside the model folder
            path = inside(model_dir, config.get("model_file", f"{name}.model"), f"{where}: key 'model_file'")
        except UnsafePathError as err:
            raise DataError(str(err)) from None
        if not os.path.exists(path):
            raise DataFileNotFoundError(path)
        try:
            proto = read_bounded(path, MAX_TOKENIZER_BYTES)
        except UnsafePathError as err:  # a FIFO, a folder, a huge file
            raise DataError(str(err)) from None
        try:
            return cls(proto)
        except DataError as err:
            raise DataError(err.reason, path) from None

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer(pieces={len(self)})"


#: The largest tokeniser file read (its JSON options, a SentencePiece model).
MAX_TOKENIZER_BYTES = 256 << 20

#: Tokeniser classes by their ``type`` name in configs and saved ``{name}.json`` files.
TOKENIZERS: dict[str, type[Tokenizer]] = {cls.kind: cls for cls in (WordTokenizer, CharTokenizer,
                                                                       SentencePieceTokenizer)}


def build_tokenizer(kind: str, train_lines: Iterable[str] | None = None, **options) -> Tokenizer:
    """Tokeniser of type ``kind`` (a :data:`TOKENIZERS` key) from config ``options``.

    ``sentencepiece`` is trained on ``train_lines`` (the training split) with
    :meth:`SentencePieceTokenizer.train`; the other kinds ignore ``train_lines``.
    """
    if kind not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {kind!r}; choices: {sorted(TOKENIZERS)}")
    if kind == SentencePieceTokenizer.kind:
        if train_lines is None:
            raise ValueError("a sentencepiece tokenizer needs the training lines to be trained on")
        return SentencePieceTokenizer.train(train_lines, **options)
    return TOKENIZERS[kind](**options)


def load_tokenizer(model_dir: str | os.PathLike, name: str = "tokenizer") -> Tokenizer:
    """Read a tokeniser saved by ``save(model_dir, name)``; :class:`DataError` naming the file if invalid."""
    from hyperplex.fileio import UnsafePathError, read_bounded

    model_dir = os.fspath(model_dir)
    path = os.path.join(model_dir, f"{name}.json")
    if not os.path.exists(path):
        raise DataFileNotFoundError(path)
    try:
        config = json.loads(read_bounded(path, MAX_TOKENIZER_BYTES).decode("utf-8"))
    except UnsafePathError as err:  # a FIFO, a folder, a huge file
        raise DataError(str(err)) from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise DataError(f"invalid tokenizer JSON ({err})", path) from None
    if not isinstance(config, dict) or config.get("type") not in TOKENIZERS:
        found = config.get("type") if isinstance(config, dict) else None
        raise DataError(f"unknown tokenizer type {found!r}; known types: {sorted(TOKENIZERS)}", path)
    cls = TOKENIZERS[config.pop("type")]
    try:
        return cls.from_config(config, model_dir, name)
    except TypeError as err:
        raise DataError(f"invalid tokenizer options: {err}", path) from None
    except (ValueError, KeyError, AttributeError) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"invalid tokenizer ({type(err).__name__}: {err})", path) from None
