"""Tokenisers: word round trip, characters, sentencepiece train/encode/decode/save/load, registry."""

import json
import os
import random

import pytest

from hyperplex.data.readers import DataError
from hyperplex.data.tokenizers import (
    TOKENIZERS,
    CharTokenizer,
    SentencePieceTokenizer,
    WordTokenizer,
    build_tokenizer,
    load_tokenizer,
)
from hyperplex.data.vocab import SPECIALS

SENTENCES = [
    "A man sleeping in a green room on a couch.",
    "A boy wearing headphones sits on a woman's shoulders.",
    'He said "hello, world" (twice) and paid $3.50!',
    "Zwei Männer stehen am Herd und bereiten Essen zu.",
    "T-shirts: 10% off; 1,000 sold... really?",
]


def test_word_tokenize_splits_punctuation():
    tok = WordTokenizer()
    assert tok.tokenize(SENTENCES[0]) == ["A", "man", "sleeping", "in", "a", "green", "room", "on", "a", "couch", "."]
    assert tok.tokenize(SENTENCES[2]) == ["He", "said", '"', "hello", ",", "world", '"', "(", "twice", ")", "and",
                                          "paid", "$", "3.50", "!"]
    assert WordTokenizer(lowercase=True).tokenize("The Cat, sat.") == ["the", "cat", ",", "sat", "."]
    assert WordTokenizer(split_punctuation=False).tokenize(" kids , spirit  ") == ["kids", ",", "spirit"]


@pytest.mark.parametrize("sentence", SENTENCES)
def test_word_roundtrip(sentence):
    tok = WordTokenizer()
    assert tok.detokenize(tok.tokenize(sentence)) == sentence


def test_word_detokenize_pretokenised_text():
    assert WordTokenizer(split_punctuation=False).detokenize(["a", ",", "b"]) == "a , b"
    assert WordTokenizer().detokenize(["Hi", ",", "(", "you", ")", "!"]) == "Hi, (you)!"


def test_an_unknown_word_is_written_as_one_token_for_bleu():
    """``<unk>`` comes out as sentencepiece's ⁇, which sacreBLEU's 13a tokeniser keeps whole: a literal "<unk>" is
    three tokens there, lengthening the hypothesis (hyp_len 7 against 5 here) and lowering its BLEU."""
    from hyperplex.metrics import corpus_bleu

    hypothesis = WordTokenizer().detokenize(["ein", "<unk>", "mann", "geht", "."])
    assert hypothesis == "ein \u2047 mann geht."
    assert WordTokenizer(split_punctuation=False).detokenize(["a", "<unk>"]) == "a \u2047"
    assert CharTokenizer().detokenize(["1", "<unk>", "2"]) == "1\u20472"
    bleu = corpus_bleu([hypothesis], ["ein alter mann geht."])
    assert "hyp_len = 5 ref_len = 5" in bleu.text and round(bleu.score, 2) == 42.73


def test_char_tokenizer():
    tok = CharTokenizer()
    assert tok.tokenize("y=691,x=-999,y*x") == list("y=691,x=-999,y*x")
    assert tok.detokenize(tok.tokenize("a b")) == "a b"
    vocab = tok.build_vocab(["abba", "cab"])
    assert vocab.itos[4:] == ["a", "b", "c"]  # a 3, b 3 (alphabetical tie), c 1


def test_build_vocab_word_top_k():
    vocab = WordTokenizer(lowercase=True).build_vocab(["The cat.", "the dog."], max_size=2)
    assert vocab.itos[4:] == [".", "the"]


@pytest.mark.parametrize("tok", [WordTokenizer(lowercase=True, split_punctuation=False), CharTokenizer()])
def test_save_load_simple(tmp_path, tok):
    tok.save(tmp_path, name="src")
    loaded = load_tokenizer(tmp_path, name="src")
    assert type(loaded) is type(tok) and loaded.config() == tok.config()
    assert loaded.tokenize("Hello World") == tok.tokenize("Hello World")


def corpus(n: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "table", "quickly", "slowly",
             "green", "house", "jumped", "over", "lazy", "brown", "fox", "sleeps"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 10))) + rng.choice([".", "!", "?"])
            for _ in range(n)]


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_sentencepiece_train_encode_decode_save_load(tmp_path, model_type):
    lines = corpus()
    tok = SentencePieceTokenizer.train(lines, vocab_size=50, model_type=model_type)
    vocab = tok.build_vocab()
    assert len(vocab) == len(tok) == 50 and vocab.itos[:4] == list(SPECIALS)
    for line in lines[:20]:
        pieces = tok.tokenize(line)
        assert tok.detokenize(pieces) == line  # ▁ markers removed
        assert "▁" not in tok.detokenize(pieces)
        assert vocab.encode(pieces) == tok.encode_ids(line)  # piece ids == vocabulary ids
        assert vocab.decode(vocab.encode(pieces, add_bos=True, add_eos=True)) == pieces
    # an unseen character maps to <unk> consistently in both
    assert vocab.encode(tok.tokenize("the 猫")) == tok.encode_ids("the 猫") and 1 in tok.encode_ids("the 猫")

    tok.save(tmp_path, name="tgt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tgt.json", "tgt.model"]
    loaded = load_tokenizer(tmp_path, name="tgt")
    assert isinstance(loaded, SentencePieceTokenizer)
    assert [loaded.encode_ids(s) for s in lines[:50]] == [tok.encode_ids(s) for s in lines[:50]]
    assert loaded.build_vocab() == vocab

    # deterministic training: same corpus, same model
    again = SentencePieceTokenizer.train(lines, vocab_size=50, model_type=model_type)
    assert again.model_proto == tok.model_proto


def test_sentencepiece_vocab_too_large():
    lines = corpus(50)
    with pytest.raises(ValueError, match=r"vocab_size=5000 on 50 lines: Vocabulary size too high .*<= \d+"):
        SentencePieceTokenizer.train(lines, vocab_size=5000, model_type="unigram")
    tok = SentencePieceTokenizer.train(lines, vocab_size=5000, model_type="bpe", hard_vocab_limit=False)
    assert 4 < len(tok) < 5000
    with pytest.raises(ValueError, match="model_type must be 'bpe' or 'unigram'"):
        SentencePieceTokenizer.train(lines, vocab_size=50, model_type="word")
    with pytest.raises(DataError, match="empty corpus"):
        SentencePieceTokenizer.train(["", "  "], vocab_size=50)


def test_sentencepiece_load_errors(tmp_path):
    with pytest.raises(DataError, match="file not found: .*tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps({"type": "sentencepiece", "model_file": "m.model"}))
    with pytest.raises(DataError, match="file not found: .*m.model"):
        load_tokenizer(tmp_path)
    (tmp_path / "m.model").write_bytes(b"not a model")
    with pytest.raises(DataError, match=r"m.model: not a valid sentencepiece model"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps({"type": "bpe-dropout"}))
    with pytest.raises(DataError, match=r"tokenizer.json: unknown tokenizer type 'bpe-dropout'; known types"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps({"type": "word", "lowercas": True}))
    with pytest.raises(DataError, match=r"tokenizer.json: invalid tokenizer options"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{oops")
    with pytest.raises(DataError, match=r"tokenizer.json: invalid tokenizer JSON"):
        load_tokenizer(tmp_path)


def test_registry_and_build_tokenizer():
    assert set(TOKENIZERS) == {"word", "char", "sentencepiece"}
    assert isinstance(build_tokenizer("word", lowercase=True), WordTokenizer)
    assert isinstance(build_tokenizer("char"), CharTokenizer)
    spm = build_tokenizer("sentencepiece", corpus(100), vocab_size=40, model_type="bpe")
    assert isinstance(spm, SentencePieceTokenizer) and len(spm) == 40
    with pytest.raises(ValueError, match="unknown tokenizer 'wordpiece'; choices"):
        build_tokenizer("wordpiece")
    with pytest.raises(ValueError, match="needs the training lines"):
        build_tokenizer("sentencepiece", vocab_size=40)


@pytest.mark.parametrize("content,match", [
    ('{"type": "sentencepiece", "model_file": "../outside.model"}', r"key 'model_file': '../outside.model' steps out"),
    ('{"type": "sentencepiece", "model_file": "/etc/passwd"}', r"key 'model_file': '/etc/passwd' is an absolute path"),
    ('{"type": "word", "lowercase": true, "bogus": 1}', r"src.json: invalid tokenizer options"),
    ("[1, 2", r"src.json: invalid tokenizer JSON"),
])
def test_a_damaged_tokenizer_file_names_the_file_and_reads_nothing_outside(tmp_path, content, match):
    from hyperplex.data.readers import DataError
    from hyperplex.data.tokenizers import load_tokenizer

    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "outside.model").write_bytes(b"not read")
    (folder / "src.json").write_text(content)
    with pytest.raises(DataError, match=match):
        load_tokenizer(folder, "src")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_tokenizer_file_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    from hyperplex.data.readers import DataError
    from hyperplex.data.tokenizers import load_tokenizer

    os.mkfifo(tmp_path / "src.json")
    with pytest.raises(DataError, match=r"src.json: not a regular file"):
        load_tokenizer(tmp_path, "src")
