"""Readers for the corpora formats of ``../shared/data/README.md`` with precise errors.

Every reader takes a path (plain text or gzip, detected by the ``.gz`` suffix or the gzip
magic bytes), decodes it as strict UTF-8 and raises :class:`DataError` naming the file and
the 1-based line of the first problem. Nothing is dropped here except blank lines of the
record formats (jsonl, tsv, agreement), which are logged with their count; dropping empty or
over-long *examples* is :func:`filter_examples`' job, which returns a :class:`DropReport`.

Line handling: lines are split on ``\\n`` only (not on the Unicode separators that
``str.splitlines`` honours, which occur inside real sentences), a trailing ``\\r`` (CRLF files)
is removed, a UTF-8 byte-order mark at the start of the file is ignored, and text lines are
stripped of surrounding whitespace (SST-2 sentences end with a space).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import zlib
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_GZIP_MAGIC = b"\x1f\x8b"

#: Labels of the Linzen et al. (2016) number-prediction files: singular / plural present verb.
AGREEMENT_LABELS = ("VBZ", "VBP")


class DataError(ValueError):
    """A problem with an input data file; the message names the file and, where known, the line.

    Attributes ``path`` and ``line`` (1-based, or ``None``) hold the location.
    """

    def __init__(self, message: str, path: str | os.PathLike | None = None, line: int | None = None):
        self.path = None if path is None else os.fspath(path)
        self.line = line
        self.reason = message
        where = ""
        if self.path is not None:
            where = f"{self.path}, line {line}: " if line is not None else f"{self.path}: "
        super().__init__(where + message)


class DataFileNotFoundError(DataError, FileNotFoundError):
    """A data file does not exist (both a :class:`DataError` and a ``FileNotFoundError``)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.line = None
        self.reason = f"file not found: {self.path}"
        ValueError.__init__(self, self.reason)
        self.filename = self.path

    def __str__(self) -> str:
        return self.reason


def _read_bytes(path: str | os.PathLike) -> bytes:
    """Raw (decompressed) bytes of ``path``; gzip detected by suffix or magic bytes."""
    from hyperplex.guards import input_file_problem

    path = os.fspath(path)
    problem = input_file_problem(path)
    if problem == "does not exist":
        raise DataFileNotFoundError(path)
    if problem is not None:  # a FIFO would block the read; a folder or a device is no text file
        raise DataError(f"{problem}; a text file is expected", path)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as err:
        raise DataError(f"cannot read file: {err.strerror or err}", path) from err
    if path.endswith(".gz") or data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:
            raise DataError(f"not a valid gzip file ({err})", path) from err
    return data


def _raw_lines(path: str | os.PathLike) -> list[str]:
    """Lines of ``path`` decoded as strict UTF-8, without line terminators (``\\n`` / ``\\r\\n``)."""
    return decode_lines(_read_bytes(path), path)


def decode_lines(data: bytes, path: str | os.PathLike) -> list[str]:
    """``data`` (the bytes of ``path``, e.g. ``"<stdin>"``) decoded as strict UTF-8 and split into lines
    as the module doc says (BOM and CR removed); :class:`DataError` naming ``path`` and the line."""
    if data.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte-order mark
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        bad = data[err.start:err.end].hex(" ")
        raise DataError(f"invalid UTF-8 (byte {bad} at column {column}); the file must be UTF-8 text",
                        path, line) from None
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":  # final newline
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_lines(path: str | os.PathLike, strip: bool = True, allow_empty: bool = False) -> list[str]:
    """All lines of a plain or gzipped UTF-8 text file, one string per line.

    ``strip`` removes surrounding whitespace (CR of CRLF files is always removed). Blank lines
    are kept so that parallel files stay aligned. An empty file raises :class:`DataError`
    unless ``allow_empty``.
    """
    lines = _raw_lines(path)
    if not lines and not allow_empty:
        raise DataError("empty corpus: the file has no lines", path)
    return [line.strip() for line in lines] if strip else lines


def read_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike,
                  strip: bool = True) -> list[tuple[str, str]]:
    """Aligned sentence pairs from two line-aligned files (plain or gzip).

    Raises :class:`DataError` when the line counts differ (both counts and both files named)
    or the corpus is empty.
    """
    src = read_lines(src_path, strip=strip)
    tgt = read_lines(tgt_path, strip=strip)
    if len(src) != len(tgt):
        raise DataError(f"parallel files have different line counts: {os.fspath(src_path)} has {len(src)} "
                        f"lines, {os.fspath(tgt_path)} has {len(tgt)} lines; they must be line-aligned")
    return list(zip(src, tgt))


def _format_known(known: Collection) -> str:
    return "{" + ", ".join(repr(k) for k in sorted(known, key=str)) + "}"


def check_labels(values: Sequence, known: Collection, path: str | os.PathLike | None = None,
                 line_numbers: Sequence[int] | None = None, field: str = "label") -> None:
    """Raise :class:`DataError` for the first value not in ``known``.

    The message gives the label, the known set and, if given, the file and the line
    (``line_numbers[i]`` is the 1-based line of ``values[i]``; otherwise the example index).
    """
    known_set = set(known)
    for i, value in enumerate(values):
        if value not in known_set:
            line = line_numbers[i] if line_numbers is not None else None
            at = "" if line is not None else f" (example {i})"
            in_field = f" in field {field!r}" if field != "label" else ""
            raise DataError(f"unknown label {value!r}{in_field}{at}; known labels: {_format_known(known_set)}",
                            path, line)


def _log_blank(path, count: int) -> None:
    if count:
        logger.warning("%s: skipped %d blank line(s)", os.fspath(path), count)


def read_jsonl(path: str | os.PathLike, fields: Sequence[str],
               known: dict[str, Collection] | None = None) -> list[dict]:
    """Records of a JSON-lines file, each reduced to ``fields``.

    Every non-blank line must be a JSON object holding every name in ``fields``; ``known`` maps a
    field to its allowed values (e.g. ``{"label": {"entailment", "neutral", "contradiction"}}``).
    Errors name the file and line. Blank lines are skipped with a logged count.
    """
    records, blank = [], 0
    for number, line in enumerate(_raw_lines(path), start=1):
        if not line.strip():
            blank += 1
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"invalid JSON ({err.msg} at column {err.colno})", path, number) from None
        if not isinstance(obj, dict):
            raise DataError(f"expected a JSON object, found {type(obj).__name__}", path, number)
        missing = [f for f in fields if f not in obj]
        if missing:
            raise DataError(f"missing field {missing[0]!r}; the record has {sorted(obj)}, expected {list(fields)}",
                            path, number)
        record = {f: obj[f] for f in fields}
        for name, allowed in (known or {}).items():
            check_labels([record[name]], allowed, path, [number], field=name)
        records.append(record)
    _log_blank(path, blank)
    if not records:
        raise DataError("empty corpus: no records", path)
    return records


def read_tsv(path: str | os.PathLike, columns: Sequence[str],
             known: dict[str, Collection] | None = None) -> list[dict[str, str]]:
    """Rows of a tab-separated file with a header line, each reduced to ``columns`` (strings).

    The first line is the header and must name every column in ``columns``; every row must have as
    many cells as the header. Cells are stripped of surrounding whitespace. ``known`` maps a column
    to its allowed values (as strings). Blank lines are skipped with a logged count.
    """
    lines = _raw_lines(path)
    if not lines:
        raise DataError("empty corpus: the file has no header line", path)
    header = [cell.strip() for cell in lines[0].split("\t")]
    for column in columns:
        if column not in header:
            raise DataError(f"column {column!r} not in the header {header}; expected columns {list(columns)}",
                            path, 1)
    positions = [header.index(c) for c in columns]
    rows, blank = [], 0
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            blank += 1
            continue
        cells = line.split("\t")
        if len(cells) != len(header):
            raise DataError(f"expected {len(header)} tab-separated cells (header {header}), found {len(cells)}",
                            path, number)
        row = {c: cells[p].strip() for c, p in zip(columns, positions)}
        for name, allowed in (known or {}).items():
            check_labels([row[name]], allowed, path, [number], field=name)
        rows.append(row)
    _log_blank(path, blank)
    if not rows:
        raise DataError("empty corpus: the header is followed by no rows", path)
    return rows


def read_agreement(path: str | os.PathLike) -> list[tuple[str, str]]:
    """``(label, prefix)`` pairs of a Linzen et al. (2016) ``numpred`` file.

    Each line is ``VBZ|VBP<TAB>sentence prefix up to the verb``; the label is checked against
    :data:`AGREEMENT_LABELS`. Blank lines are skipped with a logged count.
    """
    examples, blank = [], 0
    for number, line in enumerate(_raw_lines(path), start=1):
        if not line.strip():
            blank += 1
            continue
        label, tab, prefix = line.partition("\t")
        if not tab:
            raise DataError("expected 'LABEL<TAB>prefix', found no tab", path, number)
        label, prefix = label.strip(), prefix.strip()
        check_labels([label], AGREEMENT_LABELS, path, [number])
        if not prefix:
            raise DataError(f"empty sentence prefix after label {label!r}", path, number)
        examples.append((label, prefix))
    _log_blank(path, blank)
    if not examples:
        raise DataError("empty corpus: no examples", path)
    return examples


@dataclass
class DropReport:
    """Counts of examples removed by :func:`filter_examples` (for the training log)."""

    total: int
    empty: int = 0
    too_long: int = 0
    max_length: int | None = None
    source: str = ""

    @property
    def kept(self) -> int:
        """Number of examples kept."""
        return self.total - self.empty - self.too_long

    @property
    def dropped(self) -> int:
        """Number of examples removed."""
        return self.empty + self.too_long

    def __str__(self) -> str:
        name = f"{self.source}: " if self.source else ""
        limit = f" longer than {self.max_length} tokens" if self.max_length is not None else " over-length"
        return (f"{name}kept {self.kept} of {self.total} examples "
                f"(dropped {self.empty} with an empty field, {self.too_long}{limit})")


def _default_length(value) -> int:
    return len(value.split()) if isinstance(value, str) else len(value)


def filter_examples(examples: Iterable, max_length: int | None = None,
                    length_fn: Callable[[object], int] = _default_length, source: str = "",
                    log: bool = True) -> tuple[list, list[int], DropReport]:
    """Drop examples with an empty text field or a text field longer than ``max_length``.

    An example is a string or a tuple of fields; fields that are strings or sequences (token
    lists) are checked, others (labels, ids) are ignored. ``length_fn`` measures a field
    (default: whitespace tokens of a string, ``len`` of a list), so subword lengths can be used.
    Returns ``(kept_examples, kept_indices, report)``; the report is logged unless ``log=False``.
    Raises :class:`DataError` if nothing is left.
    """
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length must be a positive integer or None, got {max_length!r}")
    kept, indices = [], []
    report = DropReport(total=0, max_length=max_length, source=source)
    for i, example in enumerate(examples):
        report.total += 1
        fields = example if isinstance(example, tuple) else (example,)
        texts = [f for f in fields if isinstance(f, (str, list, tuple))]
        if any(not (f.strip() if isinstance(f, str) else f) for f in texts):
            report.empty += 1
        elif max_length is not None and any(length_fn(f) > max_length for f in texts):
            report.too_long += 1
        else:
            kept.append(example)
            indices.append(i)
    if log and report.dropped:
        logger.info("%s", report)
    if not kept:
        raise DataError(f"empty corpus after cleaning: {report}")
    return kept, indices, report
