"""What every task shares (hyperplex.tasks.common): finding data files, carving validation splits and
subsets, the carve seed of old model folders, and the tokeniser options a config implies."""

from pathlib import Path

import pytest
import yaml

from hyperplex.config.experiment import DataConfig, load_experiment
from hyperplex.data.readers import DataError
from hyperplex.tasks.common import carve_random, carve_seed, data_file, subset, tokenizer_and_vocab, tokenizer_options


# --------------------------------------------------------------------------- data_file
def test_data_file_under_the_data_root_with_suffix_and_gz(tmp_path, monkeypatch):
    root = tmp_path / "root"
    (root / "wmt").mkdir(parents=True)
    (root / "wmt" / "train.en").write_text("x\n")
    (root / "wmt" / "train.de.gz").write_bytes(b"")
    monkeypatch.chdir(tmp_path)  # relative paths must not be found through the working directory
    assert data_file("wmt/train", str(root), "en") == root / "wmt" / "train.en"
    assert data_file("wmt/train", str(root), "de") == root / "wmt" / "train.de.gz"  # PATH.SUFFIX.gz fallback
    absolute = root / "wmt" / "train.en"
    assert data_file(str(absolute), "/nonexistent-root") == absolute  # absolute paths ignore the root
    (tmp_path / "local.tsv").write_text("a\n")
    assert data_file("local.tsv", None) == Path("local.tsv")  # no root: the working directory


def test_data_file_prefers_the_plain_file_over_gz(tmp_path):
    (tmp_path / "a.tsv").write_text("plain\n")
    (tmp_path / "a.tsv.gz").write_bytes(b"")
    assert data_file(str(tmp_path / "a.tsv"), None) == tmp_path / "a.tsv"


def test_data_file_errors_name_the_key_the_candidates_and_the_root(tmp_path):
    with pytest.raises(DataError, match=r"^data\.dev is empty: the config must name a file$"):
        data_file("", str(tmp_path), key="data.dev")
    missing = tmp_path / "missing"
    with pytest.raises(DataError) as err:
        data_file(str(missing), str(tmp_path), "en", key="data.train")
    assert str(err.value) == f"data.train: file not found: {missing}.en or {missing}.en.gz (data root {tmp_path})"
    with pytest.raises(DataError) as err:
        data_file(str(missing) + ".gz", None, key="data.embeddings")
    assert str(err.value) == (f"data.embeddings: file not found: {missing}.gz "
                              f"(no data root: set --data-root or HYPERPLEX_DATA)")


# --------------------------------------------------------------------------- carve_random / subset
def test_carve_random_sizes_disjoint_and_in_corpus_order():
    examples = [f"e{i}" for i in range(10)]
    train, dev = carve_random(examples, 0.3, seed=4)
    assert (len(train), len(dev)) == (7, 3)  # round(10 × 0.3)
    assert sorted(train + dev) == sorted(examples) and not set(train) & set(dev)
    assert train == sorted(train, key=examples.index) and dev == sorted(dev, key=examples.index)
    assert carve_random(examples, 0.3, seed=4) == (train, dev)  # the seed fixes the split
    assert len(carve_random(examples, 0.01, seed=4)[1]) == 1  # at least one validation example


def test_carve_random_depends_on_the_seed_and_refuses_to_empty_training():
    examples = list(range(100))
    dev_by_seed = {seed: tuple(carve_random(examples, 0.1, seed)[1]) for seed in range(5)}
    assert len(set(dev_by_seed.values())) == 5  # five seeds, five different held-out sets
    assert all(len(dev) == 10 for dev in dev_by_seed.values())
    with pytest.raises(DataError, match="dev_fraction 0.5 leaves no training examples out of 1"):
        carve_random(["only"], 0.5, seed=1)


def test_subset_is_seeded_in_order_and_all_when_too_large():
    examples = [f"e{i}" for i in range(10)]
    assert subset(examples, 0, seed=1) is examples and subset(examples, 10, seed=1) is examples
    assert subset(examples, 25, seed=1) is examples
    picked = subset(examples, 4, seed=1)
    assert len(picked) == 4 == len(set(picked)) and set(picked) <= set(examples)
    assert picked == sorted(picked, key=examples.index)  # corpus order kept
    assert subset(examples, 4, seed=1) == picked
    assert len({tuple(subset(list(range(100)), 10, seed)) for seed in range(5)}) == 5


# --------------------------------------------------------------------------- carve_seed
def _config(tmp_path: Path, seed: int = 5, split_seed: int = 9):
    from conftest import write_tiny_config

    path = write_tiny_config(tmp_path)
    return load_experiment(path, [f"--seed={seed}", f"--data.split_seed={split_seed}"], str(tmp_path / "model"))


def test_carve_seed_is_split_seed_for_new_runs_and_seed_for_old_folders(tmp_path):
    cfg = _config(tmp_path)
    folder = tmp_path / "model"
    assert carve_seed(cfg, folder, fresh=True) == 9
    assert carve_seed(cfg, folder, fresh=False) == 9  # no saved config: the current key
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump({"seed": 5, "data": {"task": "translation"}}))
    assert carve_seed(cfg, folder, fresh=False) == 5  # a saved config without data.split_seed: carved with seed
    assert carve_seed(cfg, folder, fresh=True) == 9  # a fresh run overwrites that folder's config
    (folder / "config.yaml").write_text(yaml.safe_dump({"seed": 5, "data": {"split_seed": 9}}))
    assert carve_seed(cfg, folder, fresh=False) == 9


# --------------------------------------------------------------------------- tokenisers
def _data(**keys) -> DataConfig:
    return DataConfig(task="classification", format="tsv", **keys)


@pytest.mark.parametrize("tokenizer,expected", [
    ("bpe", {"vocab_size": 700, "model_type": "bpe"}),
    ("unigram", {"vocab_size": 700, "model_type": "unigram"}),
    ("word", {"lowercase": True}),
    ("char", {}),
])
def test_tokenizer_options(tokenizer, expected):
    assert tokenizer_options(_data(tokenizer=tokenizer, vocab_size=700, lowercase=True)) == expected
    if tokenizer == "word":
        assert tokenizer_options(_data(tokenizer="word", lowercase=False)) == {"lowercase": False}


def test_tokenizer_and_vocab_saved_then_loaded_encode_alike(tmp_path):
    cfg = _data(tokenizer="word", vocab_size=2)  # word: the 2 most frequent words
    lines = ["the cat sat", "the cat ran", "the dog"]
    tok, vocab = tokenizer_and_vocab(cfg, lines, tmp_path, "text", fresh=True)
    assert vocab.itos[4:] == ["the", "cat"]  # after the four specials
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.json", "text_vocab.json"]
    loaded_tok, loaded_vocab = tokenizer_and_vocab(cfg, None, tmp_path, "text", fresh=False)
    assert loaded_vocab.itos == vocab.itos
    for line in lines + ["a cat never seen"]:
        assert loaded_vocab.encode(loaded_tok.tokenize(line)) == vocab.encode(tok.tokenize(line))


@pytest.mark.parametrize("tokenizer", ["word", "bpe"])
def test_tokenizer_and_vocab_on_a_rank_other_than_0_builds_the_same_and_writes_nothing(tmp_path, monkeypatch,
                                                                                        tokenizer):
    """Under torchrun a rank other than 0 could reach this before rank 0 had made the model folder (a second
    train() in one process failed there): it builds what rank 0 builds and leaves the files to rank 0."""
    import hyperplex.tasks.common as common

    cfg = _data(tokenizer=tokenizer, vocab_size=40)
    lines = [f"the cat {w} sat on the mat" for w in ("black", "white", "grey", "small", "old")] * 20
    main_tok, main_vocab = tokenizer_and_vocab(cfg, lines, tmp_path / "rank0", "src", fresh=True)
    monkeypatch.setattr(common, "is_main_process", lambda: False)
    folder = tmp_path / "not-made-yet"
    tok, vocab = tokenizer_and_vocab(cfg, lines, folder, "src", fresh=True)
    assert not folder.exists()
    assert vocab.itos == main_vocab.itos
    assert tok.tokenize("the grey cat") == main_tok.tokenize("the grey cat")
