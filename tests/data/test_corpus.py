"""The distillation corpus (data/corpus.py) and `hyperplex corpus`, on a small generated data folder with
the real folder's layout: exact counts per source, normalised exclusion, byte-identical rebuilds, the
report, and errors that leave the disk as it was."""

from __future__ import annotations

import gzip
import json

import pytest

from hyperplex.cli.main import main
from hyperplex.data.corpus import (
    CorpusError,
    build_corpus,
    evaluation_sentences,
    normalize_text,
    report_path,
    split_sentences,
    write_corpus,
)
from hyperplex.data.readers import DataError, DataFileNotFoundError

FILES = {
    "snli_1.0/dev.tok.jsonl.gz": [
        '{"premise": "A man sleeps .", "hypothesis": "A man is awake .", "label": "contradiction"}',
        '{"premise": "A man sleeps .", "hypothesis": "Nobody sleeps .", "label": "neutral"}'],
    "tatoeba_en_fr/train.en.gz": ["Hello!", "hello !", "I like tea.", "Where is the station?",
                                  "Where is the station!!"],
    "tatoeba_en_fr/dev.en.gz": ["WHERE  is the  station ?"],
    "imdb/train.tsv.gz": ["label\trating\tid\ttext",
                          "1\t9\tpos_0\tGreat film.<br /><br />Mr. Smith was superb! I cried &amp; laughed. 12345"],
    "wikiqa/train.jsonl.gz": [
        '{"qid": 1, "question": "how are glacier caves formed ?", "answer": "ice melts .", "label": 1}',
        '{"qid": 1, "question": "how are glacier caves formed ?", "answer": "caves are dark .", "label": 0}'],
    "wikiqa/dev.jsonl.gz": ['{"qid": 2, "question": "what is a dog ?", "answer": "a dog is an animal .", "label": 1}'],
    "shakespeare_modern/train.modern.gz": ["You are kind ."],
    "shakespeare_modern/train.original.gz": ["Thou art kind .", "two dogs play ."],
    "multi30k_en_de/train.en.gz": ["Two dogs play.", "What is a dog?", "A cat in the Sun.", "A Cat Sleeps"],
    "multi30k_en_de/val.en.gz": ["a cat in the sun."],
    "sst2/train.tsv.gz": ["sentence\tlabel", "a cat sleeps \t1", "sleeps \t0"],
    "linzen_agreement/numpred.val.gz": ["VBZ\tthe dog that the cats"],
    "linzen_agreement/numpred.test.1.gz": ["VBP\tthe dogs near the cat"],
}

#: (name, read, kept, duplicates, evaluation, unusable) of FILES, sources in order.
EXPECTED = [("snli", 4, 3, 1, 0, 0), ("tatoeba", 5, 2, 1, 2, 0), ("imdb", 4, 3, 0, 0, 1), ("wikiqa", 4, 3, 1, 0, 0),
            ("shakespeare_modern", 1, 1, 0, 0, 0), ("shakespeare_original", 2, 2, 0, 0, 0),
            ("multi30k", 4, 0, 1, 3, 0)]  # "Two dogs play." came first (Shakespeare, other case)
KEPT = {"A man sleeps .", "A man is awake .", "Nobody sleeps .", "Hello!", "I like tea.", "Great film.",
        "Mr. Smith was superb!", "I cried & laughed.", "how are glacier caves formed ?", "ice melts .",
        "caves are dark .", "You are kind .", "Thou art kind .", "two dogs play ."}


@pytest.fixture
def data_root(tmp_path):
    root = tmp_path / "data"
    for name, lines in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return root


def listing(folder):
    return sorted(p.name for p in folder.iterdir())


def test_normalize_folds_case_accents_spacing_and_punctuation():
    assert normalize_text("  The CAFÉ’s\tmenu!! ") == "the cafe ’ s menu ! !"
    assert normalize_text("Where is the station?") == normalize_text("WHERE  is the  station ?") == \
        "where is the station ?"
    assert normalize_text("ﬁne ＡＢＣ") == "fine abc"  # NFKC: ligature and full-width letters
    assert normalize_text("naïve\u200b résumé\x00") == "naive resume"  # format/control characters dropped
    assert normalize_text("don't") == "don ' t" != normalize_text("do n't")  # as the tokenizer splits them
    assert normalize_text("北京 ok") == "北 京 ok" and normalize_text(" \n ") == ""


def test_normalize_matches_bert_uncased_basic_tokenization():
    transformers = pytest.importorskip("transformers")
    basic = transformers.BasicTokenizer(do_lower_case=True)
    for text in ["Hello,  World!", "The CAFÉ’s menu (2nd ed.)", "Crème brûlée — \"yes\"?", "I'm here\x97now",
                 "naïve\u200b résumé", "tab\tand\nnewline", "中文 mixed", "a-b_c/d", "Ωmega ß straße"]:
        assert normalize_text(text) == " ".join(basic.tokenize(text)), text


def test_review_sentences_lose_html_and_keep_abbreviations():
    assert split_sentences("Great film.<br /><br />Mr. Smith was superb! I cried &amp; laughed. "
                           "J. R. R. Tolkien wrote it? \"Yes.\" 10 out of 10.") == \
        ["Great film.", "Mr. Smith was superb!", "I cried & laughed.", "J. R. R. Tolkien wrote it?", "\"Yes.\"",
         "10 out of 10."]
    assert split_sentences("<br />") == [] and split_sentences("no end") == ["no end"]


def test_evaluation_sentences_by_format(data_root):
    assert evaluation_sentences(data_root / "wikiqa/dev.jsonl.gz") == ["what is a dog ?", "a dog is an animal ."]
    assert evaluation_sentences(data_root / "sst2/train.tsv.gz") == ["a cat sleeps", "sleeps"]
    assert evaluation_sentences(data_root / "tatoeba_en_fr/dev.en.gz") == ["WHERE  is the  station ?"]
    bad = data_root / "bad.jsonl"
    bad.write_text('{"qid": 1}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl, line 1: no text field"):
        evaluation_sentences(bad)


def test_counts_per_source_dedup_and_normalised_exclusion(data_root):
    sentences, report = build_corpus(data_root, min_sentences=10)
    got = [(s.name, s.read, s.kept, s.duplicates, s.evaluation, s.unusable) for s in report.sources]
    assert got == EXPECTED
    assert set(sentences) == KEPT and len(sentences) == report.sentences == 14 and not report.fallback_used
    # nothing kept equals an evaluation sentence in its letters and digits ("Where is the station!!" went too)
    def letters(text):
        return "".join(c for c in normalize_text(text) if c.isalnum())

    held_out = {letters(t) for path in ("tatoeba_en_fr/dev.en.gz", "wikiqa/dev.jsonl.gz", "multi30k_en_de/val.en.gz",
                                        "sst2/train.tsv.gz") for t in evaluation_sentences(data_root / path)}
    assert not {letters(s) for s in sentences} & held_out
    assert [e["sentences"] for e in report.excludes] == [1, 2, 1, 2]
    # an extra --exclude file removes its sentences too (here: one SNLI and one IMDb sentence)
    extra = data_root / "extra.txt"
    extra.write_text("NOBODY sleeps.\ngreat   film .\n")
    fewer, report = build_corpus(data_root, excludes=[str(extra)], min_sentences=10)
    assert set(fewer) == KEPT - {"Nobody sleeps .", "Great film."}
    assert [s.evaluation for s in report.sources][:3] == [1, 2, 1]


def test_fallback_only_below_the_minimum_and_too_few_is_an_error(data_root):
    sentences, report = build_corpus(data_root, min_sentences=15)
    assert report.fallback_used and len(sentences) == 16
    assert {"the dog that the cats", "the dogs near the cat"} < set(sentences)
    assert report.notes[0].startswith("SST-2 is an exclusion file, not a source") and "added" in report.notes[1]
    with pytest.raises(CorpusError, match="only 16 distinct sentences .* fewer than --min-sentences 17"):
        build_corpus(data_root, min_sentences=17)


def test_builds_are_byte_identical_and_any_seed_keeps_the_same_set(data_root, tmp_path):
    outs = []
    for name in ("a", "b"):
        sentences, report = build_corpus(data_root, min_sentences=10, seed=0)
        write_corpus(tmp_path / f"{name}.txt.gz", sentences, report)
        outs.append(((tmp_path / f"{name}.txt.gz").read_bytes(), report_path(tmp_path / f"{name}.txt.gz").read_bytes()))
    assert outs[0] == outs[1]
    lines = gzip.decompress(outs[0][0]).decode().splitlines()
    other, _ = build_corpus(data_root, min_sentences=10, seed=1)
    assert sorted(other) == sorted(lines) and other != lines
    saved = json.loads(outs[0][1])
    assert saved["sentences"] == 14 and saved["seed"] == 0
    assert [(s["name"], s["read"], s["kept"], s["duplicates"], s["evaluation"], s["unusable"])
            for s in saved["sources"]] == EXPECTED
    # plain text when the name does not end in .gz
    write_corpus(tmp_path / "plain.txt", lines, report)
    assert (tmp_path / "plain.txt").read_text().splitlines() == lines
    assert report_path(tmp_path / "plain.txt").name == "plain.report.json"


def test_a_missing_source_or_exclusion_file_names_it_and_writes_nothing(data_root, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (data_root / "imdb/train.tsv.gz").unlink()
    with pytest.raises(DataFileNotFoundError, match=r"imdb/train\.tsv\.gz"):
        build_corpus(data_root, min_sentences=1)
    assert main(["corpus", str(out / "c.txt.gz"), "--data-root", str(data_root), "--min-sentences", "1"]) == 1
    err = capsys.readouterr().err
    assert "error: file not found:" in err and "imdb/train.tsv.gz" in err and len(err.strip().splitlines()) == 1
    assert listing(out) == []
    (data_root / "imdb/train.tsv.gz").write_bytes(gzip.compress(FILES["imdb/train.tsv.gz"][0].encode() + b"\n"))
    assert main(["corpus", str(out / "c.txt.gz"), "--data-root", str(data_root), "--exclude", "nope.txt"]) == 1
    assert "nope.txt" in capsys.readouterr().err and listing(out) == []


def test_cli_writes_the_corpus_and_report_and_refuses_too_few(data_root, tmp_path, capsys):
    out = tmp_path / "corpus.txt.gz"
    assert main(["corpus", str(out), "--data-root", str(data_root), "--min-sentences", "20", "--quiet"]) == 1
    assert "only 16 distinct sentences" in capsys.readouterr().err and listing(tmp_path) == ["data"]
    assert main(["corpus", str(out), "--data-root", str(data_root), "--min-sentences", "10", "--quiet",
                 "--shuffle-seed", "3"]) == 0
    printed = capsys.readouterr().out
    assert "multi30k" in printed and "14" in printed
    lines = gzip.decompress(out.read_bytes()).decode().splitlines()
    assert set(lines) == KEPT
    assert json.loads((tmp_path / "corpus.report.json").read_text())["seed"] == 3
    assert listing(tmp_path) == ["corpus.report.json", "corpus.txt.gz", "data"]


@pytest.mark.slow
def test_the_real_corpus_is_large_distinct_and_free_of_evaluation_sentences(shared_data):
    # about a minute and 0.6 GB: every source of ../shared/data
    sentences, report = build_corpus(shared_data)
    assert report.sentences == len(sentences) >= 500_000 and len(set(sentences)) == len(sentences)
    assert sum(s.kept for s in report.sources) == len(sentences)
    letters = {"".join(c for c in t.lower() if c.isalnum()) for path in ("tatoeba_en_fr/dev.en.gz",
               "wikiqa/dev.jsonl.gz", "multi30k_en_de/val.en.gz", "sst2/train.tsv.gz")
               for t in evaluation_sentences(f"{shared_data}/{path}")}
    assert not any("".join(c for c in s.lower() if c.isalnum()) in letters for s in sentences)
