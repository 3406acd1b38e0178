"""A distillation corpus: many distinct English sentences from the project's data folder, none of them an
evaluation sentence.

:func:`build_corpus` reads the sources of :data:`SOURCES` (SNLI premises and hypotheses, Tatoeba English,
IMDb reviews split into sentences, WikiQA questions and answers, Shakespeare, Multi30k captions), drops
sentences that :func:`normalize_text` makes equal to one seen before (duplicates), and those whose letters
and digits (after that folding) are those of a sentence of an evaluation file (:data:`DEFAULT_EXCLUDES`
plus any given), so no evaluation sentence survives in another case, spacing, punctuation or
tokenisation (``It's dangerous.`` / ``It's dangerous!``, ``do n't`` / ``don't``); it shuffles the rest
with a fixed seed, so any prefix of the output is a sample of every source. :func:`write_corpus` writes
it (one sentence per line, gzip when the name ends ``.gz``, byte-identical for the same inputs) and a JSON
report beside it.

SST-2 is an exclusion file, not a source: the SST-2 probe draws its sentences from that file, and every
other row of it is a phrase cut from one of those sentences, so no row of it is clean training text.

:func:`normalize_text` is the comparison key of the distillation task's check of its training text
against evaluation sentences (:class:`HeldOut`): case, accents, Unicode compatibility forms, punctuation
spacing and whitespace are folded the way BERT's uncased tokenizer folds them before it splits words. The
corpus build's exclusion is coarser still, so a corpus it wrote passes that check.
"""

from __future__ import annotations

import gzip
import html
import json
import os
import random
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hyperplex.data.readers import DataError, DataFileNotFoundError, read_jsonl, read_lines, read_tsv

__all__ = ["CorpusError", "CorpusSource", "HeldOut", "SourceCount", "CorpusReport", "SOURCES", "FALLBACK_SOURCES",
           "DEFAULT_EXCLUDES", "DEFAULT_MIN_SENTENCES", "MAX_WORDS", "clean_text", "normalize_text", "split_sentences",
           "evaluation_sentences", "build_corpus", "write_corpus", "report_path"]

#: The fewest distinct sentences a corpus may have (``--min-sentences``).
DEFAULT_MIN_SENTENCES = 500_000
#: Sentences longer than this many whitespace words are dropped (run-on review text, tables).
MAX_WORDS = 100


class CorpusError(DataError):
    """The corpus cannot be built as asked (too few sentences, a bad option); nothing was written."""


# ---------------------------------------------------------------------------------------- normalising
_ASCII_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
_ASCII_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _spaced(match: re.Match) -> str:
    return f" {match.group()} "


def _is_punctuation(char: str) -> bool:
    code = ord(char)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_cjk(code: int) -> bool:
    return (0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF or 0x20000 <= code <= 0x2A6DF
            or 0x2A700 <= code <= 0x2B73F or 0x2B740 <= code <= 0x2B81F or 0x2B820 <= code <= 0x2CEAF
            or 0xF900 <= code <= 0xFAFF or 0x2F800 <= code <= 0x2FA1F)


def normalize_text(text: str) -> str:
    """The key under which two texts count as the same sentence for an uncased BERT tokenizer.

    Unicode NFKC, lower case, accents removed (NFD without combining marks), control characters dropped,
    every punctuation character and CJK ideograph made a word of its own, whitespace runs collapsed to
    one space, ends stripped: ``"  The CAFÉ’s  menu!"`` → ``"the cafe ’ s menu !"``. Texts with equal keys
    give the same word pieces to MiniLM's tokenizer (the key folds a little more: NFKC compatibility
    forms, e.g. full-width letters, also compare equal).
    """
    if text.isascii():  # the common case, without a loop over characters
        text = _ASCII_CONTROL.sub("", text).lower()
        return " ".join(_ASCII_PUNCTUATION.sub(_spaced, text).split())
    text = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text).lower())
    out = []
    for char in text:
        code = ord(char)
        category = unicodedata.category(char)
        if category == "Mn" or code == 0 or code == 0xFFFD:
            continue
        if char.isspace():
            out.append(" ")
        elif category in ("Cc", "Cf"):
            continue
        elif _is_punctuation(char) or _is_cjk(code):
            out.append(f" {char} ")
        else:
            out.append(char)
    return " ".join("".join(out).split())


#: ASCII bytes that are not letters or digits: what :func:`_letters_and_digits` removes.
_NOT_ALNUM = bytes(range(0, 48)) + bytes(range(58, 65)) + bytes(range(91, 97)) + bytes(range(123, 128))


def _letters_and_digits(text: str) -> bytes:
    """A coarser key than :func:`normalize_text` (equal keys there give equal keys here): the UTF-8 bytes
    with ASCII letters lower-cased and every other ASCII byte removed. Computed at C speed."""
    return text.encode("utf-8").lower().translate(None, _NOT_ALNUM)


class HeldOut:
    """Evaluation sentences under their :func:`normalize_text` keys, each with the file it came from.

    ``held.source(text)`` is that file for a text whose key is held (else ``None``); ASCII texts whose
    letters and digits match no held sentence's are answered without normalising them, so checking a
    corpus of 500,000 sentences takes about a second.
    """

    def __init__(self) -> None:
        self.keys: dict[str, str] = {}
        self._coarse: set[bytes] = set()

    def add(self, texts: Iterable[str], source: str) -> int:
        """Hold ``texts`` as coming from ``source`` (a key held already keeps its first source); returns
        how many distinct non-empty keys ``texts`` have."""
        keys = {normalize_text(t) for t in texts} - {""}
        for key in keys:
            self.keys.setdefault(key, source)
            self._coarse.add(_letters_and_digits(key))
        return len(keys)

    def source(self, text: str) -> str | None:
        """The file ``text`` (normalised) occurs in, or ``None``."""
        if text.isascii() and _letters_and_digits(text) not in self._coarse:
            return None
        return self.keys.get(normalize_text(text))

    def __len__(self) -> int:
        return len(self.keys)


# ---------------------------------------------------------------------------------------- sentences
_TAG = re.compile(r"<[^>]{0,200}>")
_BOUNDARY = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_ABBREVIATIONS = frozenset("mr mrs ms dr st jr sr vs prof gen col lt sgt capt mt no vol etc e.g i.e u.s u.k".split())


def split_sentences(text: str) -> list[str]:
    """The sentences of a paragraph of running text (an IMDb review).

    HTML tags (``<br />``) become spaces and entities (``&amp;``) characters; a sentence ends after
    ``.``, ``!`` or ``?`` (and any closing quotes or brackets) followed by space and a capital letter or a
    digit, except after a title or a common abbreviation (``Mr.``, ``Dr.``, ``vs.``, ``U.S.``).
    """
    text = " ".join(html.unescape(_TAG.sub(" ", text)).split())
    pieces, start = [], 0
    for match in _BOUNDARY.finditer(text):
        head = text[start:match.start()]
        last = head.rsplit(" ", 1)[-1].rstrip(".!?\"')]").lower()
        if last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha()):  # "Mr. X", "J. R. R. Tolkien"
            continue
        sentence = text[start:match.end()].strip()
        if sentence:
            pieces.append(sentence)
        start = match.end()
    tail = text[start:].strip()
    if tail:
        pieces.append(tail)
    return pieces


# ---------------------------------------------------------------------------------------- sources
@dataclass(frozen=True)
class CorpusSource:
    """One input of the corpus: ``path`` (relative to the data root) read by ``kind``.

    kinds: ``lines`` (one sentence per line), ``jsonl`` (the string ``fields`` of each record),
    ``tsv`` (the ``fields`` columns of a tab-separated file with a header), ``reviews`` (a tsv column of
    paragraphs, split by :func:`split_sentences`), ``agreement`` (the prefix after ``LABEL<TAB>``).
    """

    name: str
    path: str
    kind: str = "lines"
    fields: tuple[str, ...] = ()


SOURCES: tuple[CorpusSource, ...] = (
    CorpusSource("snli", "snli_1.0/dev.tok.jsonl.gz", "jsonl", ("premise", "hypothesis")),
    CorpusSource("tatoeba", "tatoeba_en_fr/train.en.gz"),
    CorpusSource("imdb", "imdb/train.tsv.gz", "reviews", ("text",)),
    CorpusSource("wikiqa", "wikiqa/train.jsonl.gz", "jsonl", ("question", "answer")),
    CorpusSource("shakespeare_modern", "shakespeare_modern/train.modern.gz"),
    CorpusSource("shakespeare_original", "shakespeare_modern/train.original.gz"),
    CorpusSource("multi30k", "multi30k_en_de/train.en.gz"),
)

#: Read only when :data:`SOURCES` give fewer distinct sentences than asked for.
FALLBACK_SOURCES: tuple[CorpusSource, ...] = (
    CorpusSource("linzen_agreement_val", "linzen_agreement/numpred.val.gz", "agreement"),
    CorpusSource("linzen_agreement_test1", "linzen_agreement/numpred.test.1.gz", "agreement"),
)

#: The evaluation files of ``hyperplex score-encoder`` and the compress configs: the agreement sentences,
#: WikiQA dev (questions and answers), the Multi30k captions the distillation run validates on, and SST-2
#: (every row: the probe's sentences and the phrases cut from them).
DEFAULT_EXCLUDES: tuple[str, ...] = ("tatoeba_en_fr/dev.en.gz", "wikiqa/dev.jsonl.gz", "multi30k_en_de/val.en.gz",
                                     "sst2/train.tsv.gz")


def _read_source(source: CorpusSource, path: Path) -> Iterator[str]:
    """The raw texts of one source, in file order."""
    if source.kind == "lines":
        yield from read_lines(path)
    elif source.kind == "jsonl":
        for record in read_jsonl(path, source.fields):
            for name in source.fields:
                value = record[name]
                if not isinstance(value, str):
                    raise DataError(f"field {name!r}: expected a string, found {type(value).__name__}", path)
                yield value
    elif source.kind in ("tsv", "reviews"):
        for row in read_tsv(path, source.fields):
            for name in source.fields:
                yield from (split_sentences(row[name]) if source.kind == "reviews" else (row[name],))
    elif source.kind == "agreement":
        for number, line in enumerate(read_lines(path), start=1):
            label, tab, text = line.partition("\t")
            if not tab:
                raise DataError("expected LABEL<TAB>sentence prefix", path, number)
            yield text
    else:
        raise ValueError(f"corpus source {source.name}: unknown kind {source.kind!r}")


def evaluation_sentences(path: str | os.PathLike) -> list[str]:
    """Every text of an evaluation file, by its format (told by its name):

    ``*.jsonl[.gz]``: the string values of each record's ``question``, ``answer``, ``premise``,
    ``hypothesis``, ``sentence`` and ``text`` fields (at least one per record); ``*.tsv[.gz]``: the
    ``sentence`` (else ``text``) column of a file with a header; anything else: its non-blank lines.
    """
    path = Path(path)
    if not path.exists():
        raise DataFileNotFoundError(path)
    name = path.name.removesuffix(".gz")
    if name.endswith(".jsonl"):
        wanted = ("question", "answer", "premise", "hypothesis", "sentence", "text")
        texts = []
        for number, line in enumerate(read_lines(path), start=1):
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"invalid JSON ({err.msg} at column {err.colno})", path, number) from None
            found = [record[k] for k in wanted if isinstance(record, dict) and isinstance(record.get(k), str)]
            if not found:
                raise DataError(f"no text field: expected a JSON object with one of {', '.join(wanted)}", path, number)
            texts += found
        return texts
    if name.endswith(".tsv"):
        header = read_lines(path)[0].split("\t")
        column = "sentence" if "sentence" in header else "text"
        return [row[column] for row in read_tsv(path, (column,))]
    return [line for line in read_lines(path) if line]


# ---------------------------------------------------------------------------------------- building
@dataclass
class SourceCount:
    """What one source (or exclusion file) contributed; ``read`` = texts read (sentences for reviews)."""

    name: str
    path: str
    read: int = 0
    kept: int = 0
    duplicates: int = 0  # equal (normalised) to a sentence kept earlier
    evaluation: int = 0  # equal (normalised) to a sentence of an evaluation file
    unusable: int = 0  # no letter, or more than MAX_WORDS words


@dataclass
class CorpusReport:
    """The counts of one build (written as JSON beside the corpus)."""

    sentences: int = 0
    seed: int = 0
    min_sentences: int = DEFAULT_MIN_SENTENCES
    max_words: int = MAX_WORDS
    sources: list[SourceCount] = field(default_factory=list)
    excludes: list[dict] = field(default_factory=list)  # {"path", "sentences"} per evaluation file
    fallback_used: bool = False
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The report as plain JSON-able data."""
        return asdict(self)

    def table(self) -> str:
        """A plain-text table of the per-source counts and the total."""
        rows = [f"{'source':<24} {'read':>9} {'kept':>9} {'duplicate':>9} {'eval':>7} {'unusable':>8}"]
        for s in self.sources:
            rows.append(f"{s.name:<24} {s.read:>9,} {s.kept:>9,} {s.duplicates:>9,} {s.evaluation:>7,} "
                        f"{s.unusable:>8,}")
        rows.append(f"{'total distinct':<24} {'':>9} {self.sentences:>9,}")
        excluded = ", ".join(f"{e['path']} ({e['sentences']:,})" for e in self.excludes)
        rows.append(f"evaluation sentences kept out (distinct, normalised): {excluded}")
        return "\n".join(rows + self.notes)


_C1 = re.compile(r"[\x80-\x9f]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _windows_1252(match: re.Match) -> str:
    try:  # text decoded as Latin-1 that was Windows-1252 (IMDb's "\x97" is an em dash)
        return bytes([ord(match.group())]).decode("cp1252")
    except UnicodeDecodeError:
        return ""


def clean_text(text: str) -> str:
    """``text`` with C1 control characters read as the Windows-1252 characters they stand for, other
    control characters removed and whitespace runs collapsed to one space."""
    if not text.isascii():
        text = _C1.sub(_windows_1252, text)
    return " ".join(_CONTROL.sub("", text).split())


def _has_letter(text: str) -> bool:
    return any(c.isalpha() for c in text)


def _resolve(root: Path, name: str | os.PathLike) -> Path:
    path = Path(name)
    return path if path.is_absolute() else root / path


def build_corpus(data_root: str | os.PathLike, excludes: Sequence[str | os.PathLike] = (),
                 min_sentences: int = DEFAULT_MIN_SENTENCES, seed: int = 0,
                 sources: Sequence[CorpusSource] = SOURCES, fallback: Sequence[CorpusSource] = FALLBACK_SOURCES,
                 default_excludes: Sequence[str] = DEFAULT_EXCLUDES,
                 progress: Callable[[str], None] | None = None) -> tuple[list[str], CorpusReport]:
    """The distinct, evaluation-free sentences of ``sources`` under ``data_root``, shuffled by ``seed``.

    Every source and exclusion file (``default_excludes`` plus ``excludes``; relative names are read
    from ``data_root``) is checked to exist before anything is read, and a missing one is one
    :class:`~hyperplex.data.readers.DataFileNotFoundError` naming it. A sentence is an evaluation
    sentence when its letters and digits, after :func:`normalize_text`, are those of a sentence of an
    exclusion file (punctuation and spacing ignored), and a duplicate when its :func:`normalize_text`
    key was kept before; it is kept in the form it first occurs (sources in order). ``fallback`` sources
    are read only when fewer than ``min_sentences`` are kept without them. Fewer than ``min_sentences`` in the end is a
    :class:`CorpusError`.

    Returns:
        ``(sentences, report)``: the sentences in their shuffled order, and the counts.
    """
    if min_sentences < 1:
        raise CorpusError(f"--min-sentences must be ≥ 1, got {min_sentences}")
    root = Path(data_root)
    exclude_paths = [_resolve(root, p) for p in (*default_excludes, *excludes)]
    wanted = [_resolve(root, s.path) for s in sources] + exclude_paths
    from hyperplex.guards import input_file_problem

    problems = [(p, input_file_problem(p)) for p in wanted]
    odd = next(((p, why) for p, why in problems if why not in (None, "does not exist")), None)
    if odd is not None:  # a FIFO would block, a folder is not "not found"
        raise DataError(f"{odd[0]}: {odd[1]}; a data file is expected")
    missing = [p for p, why in problems if why == "does not exist"]
    if missing:
        raise DataFileNotFoundError(missing[0]) if len(missing) == 1 else \
            DataError(f"files not found: {', '.join(map(str, missing))} (data root {root})")
    say = progress or (lambda _message: None)
    report = CorpusReport(seed=seed, min_sentences=min_sentences)
    if any(Path(p).parts[-2:] == ("sst2", "train.tsv.gz") for p in exclude_paths):
        report.notes.append("SST-2 is an exclusion file, not a source: the SST-2 probe draws its sentences from "
                            "sst2/train.tsv.gz and every other row is a phrase cut from one of them")
    held_out: set[bytes] = set()
    for path in exclude_paths:
        keys = {normalize_text(t) for t in evaluation_sentences(path)} - {""}
        report.excludes.append({"path": str(path), "sentences": len(keys)})
        held_out |= {_letters_and_digits(k) for k in keys} - {b""}
        say(f"evaluation file {path}: {len(keys):,} distinct sentences kept out")
    seen: set[str] = set()
    kept: list[str] = []

    def take(group: Iterable[CorpusSource]) -> None:
        for source in group:
            path = _resolve(root, source.path)
            count = SourceCount(source.name, str(path))
            for text in _read_source(source, path):
                count.read += 1
                text = clean_text(text)
                key = normalize_text(text)
                if not _has_letter(key) or len(text.split()) > MAX_WORDS:
                    count.unusable += 1
                elif _letters_and_digits(key) in held_out:
                    count.evaluation += 1
                elif key in seen:
                    count.duplicates += 1
                else:
                    seen.add(key)
                    kept.append(text)
                    count.kept += 1
            report.sources.append(count)
            say(f"{source.name}: {count.read:,} read, {count.kept:,} kept")

    take(sources)
    if len(kept) < min_sentences and fallback:
        fallback_missing = [_resolve(root, s.path) for s in fallback if not _resolve(root, s.path).is_file()]
        if fallback_missing:
            raise CorpusError(f"the sources give {len(kept):,} distinct sentences, fewer than {min_sentences:,}, "
                              f"and the fallback file {fallback_missing[0]} is missing; nothing was written")
        report.fallback_used = True
        report.notes.append(f"the listed sources gave {len(kept):,} distinct sentences (< {min_sentences:,}): "
                            f"{', '.join(s.name for s in fallback)} added")
        take(fallback)
    if len(kept) < min_sentences:
        raise CorpusError(f"only {len(kept):,} distinct sentences after removing duplicates and evaluation "
                          f"sentences, fewer than --min-sentences {min_sentences:,}; nothing was written")
    random.Random(seed).shuffle(kept)
    report.sentences = len(kept)
    return kept, report


def report_path(out: str | os.PathLike) -> Path:
    """Where the JSON report of the corpus ``out`` goes: ``corpus.txt.gz`` → ``corpus.report.json``."""
    out = Path(out)
    name = out.name
    for suffix in (".gz", ".txt"):
        name = name.removesuffix(suffix)
    return out.with_name(f"{name or out.name}.report.json")


def write_corpus(out: str | os.PathLike, sentences: Sequence[str], report: CorpusReport) -> Path:
    """Write ``sentences`` one per line to ``out`` (gzip if it ends ``.gz``, with no time stamp or name in
    the header, so equal inputs give equal bytes) and ``report`` to :func:`report_path`, as one set
    (:func:`hyperplex.guards.write_set`: a failure leaves both old files).
    Returns the report's path."""
    bad = next((i for i, s in enumerate(sentences) if "\n" in s or "\r" in s or not s.strip()), None)
    if bad is not None:
        raise CorpusError(f"sentence {bad + 1} is blank or holds a line break: {sentences[bad][:60]!r}")
    payload = "".join(f"{s}\n" for s in sentences).encode("utf-8")

    def write(tmp: str) -> None:
        with open(tmp, "wb") as handle:
            if str(out).endswith(".gz"):
                with gzip.GzipFile(filename="", mode="wb", fileobj=handle, mtime=0, compresslevel=6) as archive:
                    archive.write(payload)
            else:
                handle.write(payload)

    target = report_path(out)
    if Path(out).resolve() == target.resolve():
        raise CorpusError(f"{out}: the corpus would overwrite its own report; choose a name ending .txt or .gz")
    from hyperplex.guards import write_set

    text = json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n"
    write_set([(out, write), (target, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))])  # both or neither
    return target
