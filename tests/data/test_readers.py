"""Readers: plain/gzip, CRLF, every error path names file and line, cleaning reports, real corpora."""

import gzip
import json
import logging
import os

import pytest

from hyperplex.data.readers import (
    DataError,
    DataFileNotFoundError,
    DropReport,
    check_labels,
    filter_examples,
    read_agreement,
    read_jsonl,
    read_lines,
    read_parallel,
    read_tsv,
)


def write(path, text: str, gz: bool = False, raw: bytes | None = None):
    data = raw if raw is not None else text.encode("utf-8")
    if gz:
        data = gzip.compress(data)
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("gz", [False, True])
def test_read_lines_plain_and_gzip(tmp_path, gz):
    path = write(tmp_path / ("a.txt.gz" if gz else "a.txt"), "one\n two \n\nthree\n", gz=gz)
    assert read_lines(path) == ["one", "two", "", "three"]
    assert read_lines(path, strip=False) == ["one", " two ", "", "three"]


def test_gzip_detected_by_magic_without_suffix(tmp_path):
    path = write(tmp_path / "corpus.txt", "x\ny\n", gz=True)
    assert read_lines(path) == ["x", "y"]


def test_crlf_bom_no_final_newline_and_unicode_separators(tmp_path):
    # \u2028 and \x85 are line breaks for str.splitlines but ordinary characters in a corpus line
    path = write(tmp_path / "a.txt", "\ufeffhello \r\nwo\x85r\u2028ld\r\nend")
    assert read_lines(path) == ["hello", "wo\x85r\u2028ld", "end"]


def test_missing_file(tmp_path):
    path = str(tmp_path / "nope.en")
    with pytest.raises(DataError, match="file not found: .*nope.en") as info:
        read_lines(path)
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, DataFileNotFoundError)
    assert str(info.value) == f"file not found: {path}"


@pytest.mark.parametrize("gz", [False, True])
def test_invalid_utf8_names_file_and_line(tmp_path, gz):
    path = write(tmp_path / ("bad.txt.gz" if gz else "bad.txt"), "", gz=gz, raw=b"ok\nfine\nbad \xff byte\n")
    with pytest.raises(DataError) as info:
        read_lines(path)
    message = str(info.value)
    assert path in message and "line 3" in message and "invalid UTF-8" in message and "ff" in message
    assert info.value.line == 3 and info.value.path == path


def test_corrupt_gzip(tmp_path):
    path = write(tmp_path / "c.gz", "", raw=gzip.compress(b"hello world\n" * 50)[:-20])
    with pytest.raises(DataError, match="c.gz.*not a valid gzip"):
        read_lines(path)


def test_empty_corpus(tmp_path):
    path = write(tmp_path / "empty.txt", "")
    with pytest.raises(DataError, match="empty.txt.*empty corpus"):
        read_lines(path)
    assert read_lines(path, allow_empty=True) == []
    with pytest.raises(DataError, match="empty.txt.*empty corpus"):
        read_parallel(path, path)


def test_read_parallel_pairs_and_mismatch(tmp_path):
    src = write(tmp_path / "train.en", "a b\nc\r\n")
    tgt = write(tmp_path / "train.de.gz", "x\ny z\n", gz=True)
    assert read_parallel(src, tgt) == [("a b", "x"), ("c", "y z")]
    short = write(tmp_path / "short.de", "x\n")
    with pytest.raises(DataError) as info:
        read_parallel(src, short)
    message = str(info.value)
    assert "train.en has 2 lines" in message and "short.de has 1 lines" in message


def test_read_jsonl(tmp_path):
    rows = [{"premise": "a", "hypothesis": "b", "label": "neutral", "extra": 1},
            {"premise": "c", "hypothesis": "d", "label": "entailment"}]
    path = write(tmp_path / "d.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    out = read_jsonl(path, ["premise", "hypothesis", "label"], known={"label": {"neutral", "entailment"}})
    assert out == [{"premise": "a", "hypothesis": "b", "label": "neutral"},
                   {"premise": "c", "hypothesis": "d", "label": "entailment"}]


@pytest.mark.parametrize("lines, pattern", [
    (['{"a": 1}', '{"a": 2'], r"d.jsonl, line 2: invalid JSON"),
    (['{"a": 1}', '[1, 2]'], r"d.jsonl, line 2: expected a JSON object"),
    (['{"a": 1}', '{"b": 1}'], r"d.jsonl, line 2: missing field 'a'"),
    (['{"a": 1}', '{"a": 7}'], r"d.jsonl, line 2: unknown label 7 in field 'a'; known labels: \{0, 1\}"),
])
def test_read_jsonl_errors(tmp_path, lines, pattern):
    path = write(tmp_path / "d.jsonl", "\n".join(lines) + "\n")
    with pytest.raises(DataError, match=pattern):
        read_jsonl(path, ["a"], known={"a": {0, 1}} if "label" in pattern else None)


def test_read_jsonl_check_uses_field_name(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"label": "x"}\n')
    with pytest.raises(DataError, match=r"line 1: unknown label 'x'; known labels: \{'a', 'b'\}"):
        read_jsonl(path, ["label"], known={"label": ["a", "b"]})


def test_read_tsv(tmp_path, caplog):
    path = write(tmp_path / "t.tsv", "sentence\tlabel\r\nit is good \t1\r\n\r\nbad\t0\r\n")
    with caplog.at_level(logging.WARNING):
        rows = read_tsv(path, ["label", "sentence"], known={"label": {"0", "1"}})
    assert rows == [{"label": "1", "sentence": "it is good"}, {"label": "0", "sentence": "bad"}]
    assert "skipped 1 blank line" in caplog.text  # never silently


def test_read_tsv_errors(tmp_path):
    path = write(tmp_path / "t.tsv", "text\tlabel\nfine\t1\ntoo\tmany\tcells\n")
    with pytest.raises(DataError, match=r"t.tsv, line 1: column 'sentence' not in the header \['text', 'label'\]"):
        read_tsv(path, ["sentence"])
    with pytest.raises(DataError, match=r"t.tsv, line 3: expected 2 tab-separated cells .* found 3"):
        read_tsv(path, ["text"])
    bad_label = write(tmp_path / "l.tsv", "text\tlabel\na\t1\nb\tpos\n")
    with pytest.raises(DataError, match=r"l.tsv, line 3: unknown label 'pos'; known labels: \{'0', '1'\}"):
        read_tsv(bad_label, ["text", "label"], known={"label": {"0", "1"}})
    header_only = write(tmp_path / "h.tsv", "text\tlabel\n")
    with pytest.raises(DataError, match="h.tsv.*empty corpus"):
        read_tsv(header_only, ["text"])


def test_read_agreement(tmp_path):
    path = write(tmp_path / "numpred.val", "VBZ\tthe dog\nVBP\tthe NNS near the house \n", gz=True)
    assert read_agreement(path) == [("VBZ", "the dog"), ("VBP", "the NNS near the house")]
    bad = write(tmp_path / "bad.val", "VBZ\tthe dog\nNN\tthe cat\n")
    with pytest.raises(DataError, match=r"bad.val, line 2: unknown label 'NN'; known labels: \{'VBP', 'VBZ'\}"):
        read_agreement(bad)
    no_tab = write(tmp_path / "notab.val", "VBZ the dog\n")
    with pytest.raises(DataError, match=r"notab.val, line 1: expected 'LABEL<TAB>prefix'"):
        read_agreement(no_tab)


def test_check_labels():
    check_labels(["a", "b", "a"], {"a", "b"})
    with pytest.raises(DataError, match=r"f.txt, line 12: unknown label 'c'; known labels: \{'a', 'b'\}"):
        check_labels(["a", "c"], ["a", "b"], "f.txt", line_numbers=[11, 12])
    with pytest.raises(DataError, match=r"f.txt: unknown label 'c' \(example 1\)"):
        check_labels(["a", "c"], ["a", "b"], "f.txt")


def test_filter_examples_reports_every_drop(caplog):
    pairs = [("a b", "x"), ("", "y"), ("c", "  "), ("one two three", "z"), ("d", "w")]
    with caplog.at_level(logging.INFO):
        kept, indices, report = filter_examples(pairs, max_length=2, source="train")
    assert kept == [("a b", "x"), ("d", "w")] and indices == [0, 4]
    assert (report.total, report.empty, report.too_long, report.kept, report.dropped) == (5, 2, 1, 2, 3)
    assert str(report) == "train: kept 2 of 5 examples (dropped 2 with an empty field, 1 longer than 2 tokens)"
    assert "kept 2 of 5" in caplog.text


def test_filter_examples_token_lists_labels_and_length_fn():
    examples = [([1, 2, 3], 0), ([], 1), ([4], 1)]
    kept, indices, report = filter_examples(examples, max_length=2)
    assert indices == [2] and report.empty == 1 and report.too_long == 1
    kept, indices, _ = filter_examples(["abc", "abcdef"], max_length=4, length_fn=len)  # character lengths
    assert kept == ["abc"]
    assert str(DropReport(total=3)) == "kept 3 of 3 examples (dropped 0 with an empty field, 0 over-length)"


def test_filter_examples_everything_dropped():
    with pytest.raises(DataError, match="empty corpus after cleaning.*dropped 2 with an empty field"):
        filter_examples(["", " "])
    with pytest.raises(ValueError, match="max_length"):
        filter_examples(["a"], max_length=0)


# README counts of ../shared/data (see /work/shared/data/README.md)
def test_real_corpora(shared_data):
    def p(*parts):
        return os.path.join(shared_data, *parts)

    multi30k = read_parallel(p("multi30k_en_de", "train.en.gz"), p("multi30k_en_de", "train.de.gz"))
    assert len(multi30k) == 29000
    assert len(read_parallel(p("multi30k_en_de", "val.en.gz"), p("multi30k_en_de", "val.de.gz"))) == 1014
    sst = read_tsv(p("sst2", "train.tsv.gz"), ["sentence", "label"], known={"label": {"0", "1"}})
    assert len(sst) == 67349
    snli = read_jsonl(p("snli_1.0", "dev.tok.jsonl.gz"), ["premise", "hypothesis", "label"],
                      known={"label": {"entailment", "neutral", "contradiction"}})
    assert len(snli) == 9842
    for split, pairs, questions in [("train", 8672, 873), ("dev", 1130, 126)]:
        wikiqa = read_jsonl(p("wikiqa", f"{split}.jsonl.gz"), ["qid", "question", "answer", "label"],
                            known={"label": {0, 1}})
        assert (len(wikiqa), len({r["qid"] for r in wikiqa})) == (pairs, questions)
    assert len(read_agreement(p("linzen_agreement", "numpred.val.gz"))) == 15772
    assert len(read_agreement(p("linzen_agreement", "numpred.test.1.gz"))) == 52599
