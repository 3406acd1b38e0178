"""Tiny random Hugging Face models for the conversion tests (built from configs: no download); the tiny BERT
folder is `bert_folder` of tests/conftest.py."""

import os
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="module")
def tiny_gpt2():
    """Factory: a fresh tiny random ``GPT2LMHeadModel`` (eval mode); same weights for the same seed."""
    transformers = pytest.importorskip("transformers")

    def build(seed: int = 0):
        torch.manual_seed(seed)
        config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                         bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(config).eval()
    return build


@pytest.fixture
def tiny_sentence_transformer(bert_folder):
    """Factory: a fresh SentenceTransformer (tiny BERT + mean pooling) built from modules."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    try:  # sentence-transformers 6 moved the modules; 3-5 have them in .models
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Pooling, Transformer

    def build():
        return sentence_transformers.SentenceTransformer(
            modules=[Transformer(os.fspath(bert_folder)), Pooling(32, "mean")], device="cpu")
    return build


def pytest_collection_modifyitems(items):
    """These tests drive the conversion through convert_linears, the deprecated entry point that takes every option
    as a keyword (hyperplex.compress is tested equal to it in tests/test_transforms.py): its warning is expected."""
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(pytest.mark.filterwarnings("ignore:hyperplex.convert.convert_linears is deprecated"))
