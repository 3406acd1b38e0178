"""The thread-count rule of ``hyperplex.threads``: its decisions, not timings."""

import os

import pytest
import torch

from hyperplex.threads import (
    TOKENS_PER_SENTENCE,
    WORK_PER_THREAD,
    available_cores,
    choose_threads,
    model_width,
    parse_threads,
    set_threads,
)


@pytest.mark.parametrize("rows, width, cores, expected", [
    (256, 8, 2, 1),            # demo: the octonion fit, 16 K multiply-adds per product
    (64, 3, 16, 1),            # demo: the rotation
    (32 * 20, 16, 2, 1),       # the tests' tiny Transformer, 32 sentences of ~20 tokens
    (256, 256, 2, 1),          # 2²⁴ exactly: one thread's worth
    (512, 256, 2, 2),          # two threads' worth
    (512, 256, 1, 1),          # ... but only one core
    (4096, 512, 2, 2),         # Multi30k Transformer, 4,096-token batches: capped at the cores
    (4096, 512, 16, 16),       # 64 threads' worth on 16 cores
    (4096, 512, 64, 64),
    (32 * 5, 512, 16, 2),      # decoding 32 sentences × beam 5 of a 512-wide model: 41.9 M = 2.5 units
])
def test_rule_values(rows, width, cores, expected):
    assert choose_threads(rows, width, cores) == expected
    assert choose_threads(rows, width, cores) == max(1, min(cores, rows * width * width // WORK_PER_THREAD))


def test_rule_is_monotone_in_work_and_cores():
    for cores in (1, 2, 8):
        counts = [choose_threads(rows, 256, cores) for rows in (1, 100, 1000, 10_000, 100_000)]
        assert counts == sorted(counts) and counts[0] == 1 and counts[-1] == cores
    assert [choose_threads(100_000, 256, c) for c in (1, 2, 4, 8)] == [1, 2, 4, 8]


def test_rule_defaults_to_the_affinity_mask():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert available_cores() == cores
    assert choose_threads(10 ** 6, 4096) == cores


@pytest.mark.parametrize("bad", [0, -1, 2.0, "3"])
def test_rule_rejects_bad_inputs(bad):
    with pytest.raises(ValueError, match="rows must be a positive integer"):
        choose_threads(bad, 8)
    with pytest.raises(ValueError, match="cores must be a positive integer"):
        choose_threads(8, 8, cores=bad)


def test_model_width():
    from hyperplex.models.rnn_translator import RNNTranslatorConfig
    from hyperplex.models.transformer import TransformerConfig

    assert model_width(TransformerConfig(d_model=96, num_heads=2)) == 96
    assert model_width(RNNTranslatorConfig(hidden_size=40, embedding_dim=8)) == 40
    assert model_width(torch.nn.Sequential(torch.nn.Linear(12, 30), torch.nn.Linear(30, 5))) == 12
    assert model_width(object()) == 1
    assert TOKENS_PER_SENTENCE == 20


@pytest.mark.parametrize("text, expected", [("0", 0), ("3", 3), (" 2 ", 2), (4, 4)])
def test_parse_threads_accepts(text, expected):
    assert parse_threads(text) == expected


@pytest.mark.parametrize("text", ["-1", "two", "1.5", "", 1.0, True])
def test_parse_threads_refuses_naming_the_option(text):
    with pytest.raises(ValueError, match=r"^--threads must be an integer ≥ 0 \(0 = chosen"):
        parse_threads(text)
    with pytest.raises(ValueError, match=r"^training.num_threads must"):
        parse_threads(text, option="training.num_threads")


def test_set_threads_sets_torch():
    before = torch.get_num_threads()
    try:
        assert set_threads(0, 256, 8) == 1 and torch.get_num_threads() == 1
        assert set_threads(None, 256, 8) == 1
        assert set_threads(2, 256, 8) == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
