"""Vocabulary: fixed specials, top-K with alphabetical tie-breaking, encode/decode, JSON round trip."""

import json

import pytest

from hyperplex.data.readers import DataError
from hyperplex.data.vocab import BOS_INDEX, EOS_INDEX, PAD_INDEX, SPECIALS, UNK_INDEX, Vocabulary


def test_specials_fixed():
    vocab = Vocabulary()
    assert vocab.itos == ["<pad>", "<unk>", "<s>", "</s>"] == list(SPECIALS)
    assert (PAD_INDEX, UNK_INDEX, BOS_INDEX, EOS_INDEX) == (0, 1, 2, 3)
    assert (vocab.pad_index, vocab.unk_index, vocab.bos_index, vocab.eos_index) == (0, 1, 2, 3)
    assert len(vocab) == 4


def test_build_top_k_and_ties():
    data = [["b", "a", "c", "a"], ["c", "d", "a", "e"], ["e", "<s>", "b"]]
    # counts: a 3, b 2, c 2, e 2, d 1; ties alphabetical; the special <s> in the data is not added again
    vocab = Vocabulary.build(data)
    assert vocab.itos[4:] == ["a", "b", "c", "e", "d"]
    assert Vocabulary.build(data, max_size=3).itos[4:] == ["a", "b", "c"]
    assert Vocabulary.build(data, min_freq=2).itos[4:] == ["a", "b", "c", "e"]
    assert Vocabulary.build(data, max_size=0).itos == list(SPECIALS)
    # independent of data order
    assert Vocabulary.build(list(reversed(data))) == vocab


def test_encode_decode():
    vocab = Vocabulary(["the", "cat", "sat"])
    assert vocab.encode(["the", "dog", "sat"]) == [4, UNK_INDEX, 6]
    assert vocab.encode(["cat"], add_bos=True, add_eos=True) == [2, 5, 3]
    assert vocab.decode([2, 4, 1, 5, 3, 6, 0]) == ["the", "<unk>", "cat"]  # stops at EOS, keeps <unk>
    assert vocab.decode([2, 4, 0, 0]) == ["the"]
    assert vocab.decode([2, 4, 3, 5], strip_specials=False) == ["<s>", "the", "</s>", "cat"]
    assert vocab.token_to_id("sat") == 6 and vocab.token_to_id("zzz") == 1 and vocab.id_to_token(5) == "cat"
    assert "cat" in vocab and "dog" not in vocab
    with pytest.raises(ValueError, match="token id 9 out of range for a vocabulary of size 7"):
        vocab.decode([9])


def test_constructor_validation():
    with pytest.raises(ValueError, match="duplicate vocabulary token 'a'"):
        Vocabulary(["a", "b", "a"])
    with pytest.raises(ValueError, match="duplicate vocabulary token '<unk>'"):
        Vocabulary(["<unk>"])
    with pytest.raises(ValueError, match="must start with the specials"):
        Vocabulary.from_tokens(["<unk>", "<pad>", "<s>", "</s>", "x"])
    assert Vocabulary.from_tokens(["<pad>", "<unk>", "<s>", "</s>", "x"]).itos[4:] == ["x"]
    with pytest.raises(ValueError, match="max_size"):
        Vocabulary.build([], max_size=-1)
    with pytest.raises(ValueError, match="min_freq"):
        Vocabulary.build([], min_freq=0)


def test_save_load_roundtrip(tmp_path):
    vocab = Vocabulary(["Straße", "naïve", " ", "\"quoted\""])
    path = tmp_path / "vocab.json"
    vocab.save(path)
    loaded = Vocabulary.load(path)
    assert loaded == vocab and loaded.itos == vocab.itos
    assert loaded.encode(["naïve", " "]) == vocab.encode(["naïve", " "]) == [5, 6]
    assert [p.name for p in tmp_path.iterdir()] == ["vocab.json"]  # no temporary file left behind


def test_load_errors(tmp_path):
    with pytest.raises(DataError, match="file not found: .*missing.json"):
        Vocabulary.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"tokens": ["<pad>",\n oops]}')
    with pytest.raises(DataError, match=r"bad.json, line 2: invalid vocabulary JSON"):
        Vocabulary.load(bad)
    bad.write_text(json.dumps({"tokens": ["<pad>", "x", "<s>", "</s>"]}))
    with pytest.raises(DataError, match=r"bad.json: invalid vocabulary: .*must start with the specials"):
        Vocabulary.load(bad)
    bad.write_text(json.dumps(["<pad>"]))
    with pytest.raises(DataError, match=r"bad.json: not a hyperplex vocabulary"):
        Vocabulary.load(bad)
    bad.write_bytes(b'{"tokens": ["\xff"]}')
    with pytest.raises(DataError, match=r"bad.json: vocabulary file is not UTF-8"):
        Vocabulary.load(bad)
