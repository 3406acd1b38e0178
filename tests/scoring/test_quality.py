"""quality: agreement, zero-shot WikiQA ranking and the SST-2 probe on hand-checkable data."""

import gzip
import json
import os

import pytest
import torch

from hyperplex.metrics import ranking_metrics
from hyperplex.scoring.quality import carve_train_test, embed_batched, mean_cosine, sst2_probe, wikiqa_ranking

VECTORS = {"q1": [1.0, 0.0], "right": [0.9, 0.1], "wrong": [0.0, 1.0], "half": [0.6, 0.8],
           "q2": [0.0, 1.0], "a": [1.0, 0.0], "b": [0.7, 0.7], "c": [0.1, 1.0]}


def lookup(sentences):
    return torch.tensor([VECTORS[s] for s in sentences])


def test_mean_cosine_hand_values():
    sentences = list(VECTORS)
    assert mean_cosine(lookup, lookup, sentences) == pytest.approx(1.0)
    assert mean_cosine(lookup, lambda s: -3 * lookup(s), sentences) == pytest.approx(-1.0)

    def rotated(s):
        return lookup(s) @ torch.tensor([[0.0, 1.0], [-1.0, 0.0]])  # 90 degrees: orthogonal

    assert mean_cosine(lookup, rotated, sentences, batch_size=3) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="disagree on shape"):
        mean_cosine(lookup, lambda s: torch.ones(len(s), 3), sentences)


def test_embed_batched_checks_rows():
    with pytest.raises(ValueError, match=r"shape \(1, 2\) for 2 sentences"):
        embed_batched(lambda s: torch.ones(1, 2), ["a", "b"])
    with pytest.raises(ValueError, match="non-finite row for sentence 1: 'b'"):
        embed_batched(lambda s: torch.tensor([[1.0], [float("nan")]]), ["a", "b"])


def write_jsonl(path, records):
    with gzip.open(path, "wt") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in records)


def test_wikiqa_ranking_known_answers(tmp_path):
    path = tmp_path / "dev.jsonl.gz"
    # q1: cosines right 0.99, half 0.6, wrong 0 -> the one correct answer first: AP = RR = 1.
    # q2: cosines c 0.995, b 0.707, a 0 with "b" and "a" correct -> ranks 2 and 3:
    #     AP = (1/2 + 2/3) / 2 = 7/12, RR = 1/2.  q3 has no correct answer: skipped.
    write_jsonl(path, [
        {"qid": 1, "question": "q1", "answer": "wrong", "label": 0},
        {"qid": 1, "question": "q1", "answer": "right", "label": 1},
        {"qid": 1, "question": "q1", "answer": "half", "label": 0},
        {"qid": 2, "question": "q2", "answer": "a", "label": 1},
        {"qid": 2, "question": "q2", "answer": "b", "label": 1},
        {"qid": 2, "question": "q2", "answer": "c", "label": 0},
        {"qid": 3, "question": "q2", "answer": "a", "label": 0},
    ])
    result = wikiqa_ranking(lookup, path)
    assert result["map"] == pytest.approx((1 + 7 / 12) / 2) and result["mrr"] == pytest.approx((1 + 1 / 2) / 2)
    assert (result["questions"], result["skipped"], result["candidates"]) == (2, 1, 7)
    first = wikiqa_ranking(lookup, path, limit_questions=1)
    assert first["map"] == first["mrr"] == 1.0 and first["candidates"] == 3


def write_sst(path, rows):
    with gzip.open(path, "wt") as handle:
        handle.write("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))


def test_sst2_probe_separable_and_split(tmp_path):
    pytest.importorskip("sklearn")  # the probe is a scikit-learn logistic regression (extra `pretrained`)
    path = tmp_path / "train.tsv.gz"
    rows = [(f"good film {i}", 1) if i % 2 else (f"bad film {i}", 0) for i in range(60)]
    write_sst(path, rows)

    def by_word(s):
        return torch.tensor([[float("good" in x), float("bad" in x), len(x) / 10] for x in s])

    result = sst2_probe(by_word, path, train_size=40, test_size=20, split_seed=3)
    assert result == {"accuracy": 1.0, "train": 40, "test": 20, "split_seed": 3, "carve": "random", "pool": 60}

    def noise(s):
        return torch.randn(len(s), 4, generator=torch.Generator().manual_seed(len(s)))  # no signal

    assert sst2_probe(noise, path, train_size=40, test_size=20)["accuracy"] < 1.0
    with pytest.raises(ValueError, match="exceeds the 60 examples"):
        sst2_probe(by_word, path, train_size=50, test_size=20)


def test_carve_train_test_is_disjoint_and_seeded():
    train, test = carve_train_test(100, 30, 20, seed=7)
    assert len(set(train) | set(test)) == 50 and not set(train) & set(test)
    again, _ = carve_train_test(100, 40, 10, seed=7)
    assert list(again[:30]) == list(train)  # a larger train set extends the smaller one
    assert list(carve_train_test(100, 30, 20, seed=8)[0]) != list(train)


def test_wikiqa_dev_plumbing_on_real_file(shared_data):
    """On the real dev file: scores from a word-overlap embedder give what ranking_metrics gives on
    the same cosines computed independently."""
    from hyperplex.data.readers import read_jsonl

    path = os.path.join(shared_data, "wikiqa", "dev.jsonl.gz")
    if not os.path.exists(path):
        pytest.skip(f"{path} not found")
    vocab = {}

    def bag(sentences):
        out = torch.zeros(len(sentences), 4096, dtype=torch.float64)
        for i, s in enumerate(sentences):
            for w in s.split():
                out[i, vocab.setdefault(w, len(vocab) % 4096)] += 1
        return out

    records = read_jsonl(path, ("qid", "question", "answer", "label"))
    first = list(dict.fromkeys(r["qid"] for r in records))[:40]
    records = [r for r in records if r["qid"] in first]
    result = wikiqa_ranking(bag, path, limit_questions=40)
    assert result["candidates"] == len(records)
    q, a = bag([r["question"] for r in records]), bag([r["answer"] for r in records])
    scores = torch.nn.functional.cosine_similarity(q, a, dim=1)
    expected = ranking_metrics([r["qid"] for r in records], scores, [r["label"] for r in records])
    assert result["map"] == pytest.approx(expected["map"]) and result["mrr"] == pytest.approx(expected["mrr"])


def test_sst2_probe_sentence_carve_keeps_phrases_out(tmp_path):
    pytest.importorskip("sklearn")  # the probe is a scikit-learn logistic regression (extra `pretrained`)
    path = tmp_path / "train.tsv.gz"
    # 12 sentences (label by their first word), each followed by two of its phrases, one phrase twice
    words = ["good", "bad"]
    rows = []
    for i in range(12):
        sentence = f"{words[i % 2]} film number {i} of the year"
        rows += [(sentence, 1 - i % 2), (f"number {i} of", 1 - i % 2), (f"film number {i}", 1 - i % 2)]
    rows.append(("number 3 of", 0))
    write_sst(path, rows)
    seen = []

    def embed(sentences):
        seen.extend(sentences)
        return torch.tensor([[float(s.startswith("good")), float(s.startswith("bad")), len(s) / 40] for s in sentences])

    result = sst2_probe(embed, path, train_size=6, test_size=4, split_seed=5, carve="sentences")
    assert result == {"accuracy": 1.0, "train": 6, "test": 4, "split_seed": 5, "carve": "sentences", "pool": 12}
    assert len(seen) == 10 and all(s.endswith("of the year") for s in seen)  # whole sentences only
    assert len(set(seen)) == 10  # train and test disjoint
    with pytest.raises(ValueError, match="exceeds the 12 examples"):
        sst2_probe(embed, path, train_size=10, test_size=4, carve="sentences")
    with pytest.raises(ValueError, match="carve must be"):
        sst2_probe(embed, path, carve="phrases")


def test_an_int8_model_counts_the_parameters_of_its_float_model():
    """score-encoder's params column: the packed int8 weights are no Parameters, yet they are the model's."""
    import copy

    from torch import nn

    from hyperplex.int8 import quantize
    from hyperplex.layers import LowRankLinear, PHMLinear
    from hyperplex.scoring.quality import total_parameters

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 64), PHMLinear(64, 128, 4), LowRankLinear(128, 64, 8), nn.Linear(64, 16),
                          nn.LayerNorm(16))
    expected = sum(p.numel() for p in model.parameters())
    int8 = quantize(copy.deepcopy(model))
    assert sum(p.numel() for p in int8.parameters()) < expected  # what the column counted before
    assert total_parameters(int8) == total_parameters(model) == expected


def test_an_int8_sentence_encoder_is_scored_one_sentence_per_forward():
    """Its dynamic int8 layers quantise each call's input as one tensor, so a batch's other sentences would change a
    sentence's embedding (and so the scores); a float encoder keeps the batch size asked for."""
    from torch import nn

    from hyperplex.int8 import QuantizedLinear
    from hyperplex.scoring.quality import sentence_transformer_embedder

    class Encoder(nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.layer, self.sizes = layer, []

        def encode(self, sentences, batch_size, **options):
            self.sizes.append(batch_size)
            return torch.zeros(len(sentences), 4)

    float_encoder = Encoder(nn.Linear(4, 4))
    int8_encoder = Encoder(QuantizedLinear.from_weight(torch.eye(4), None))
    for encoder in (float_encoder, int8_encoder):
        assert sentence_transformer_embedder(encoder, batch_size=64)(["a", "b", "c"]).shape == (3, 4)
    assert float_encoder.sizes == [64] and int8_encoder.sizes == [1]
